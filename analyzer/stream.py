"""Logs too big to hold in memory: replayed chunk by chunk through engine sessions, which keep
the caches' state between chunks; memory follows the caches and the prefix trie, not the log."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from analyzer.ingest import ChunkedIngest
from analyzer.per_model import merged_results, model_labels
from analyzer.progress import Progress
from analyzer.replay import Replays, ReplaySettings, in_parallel
from analyzer.token_cache import CacheStats
from analyzer.workload import LogTable, TokenizedLog
from cache_models.prefix_trie import PrefixTrie
from cache_models.result import ReplayResult
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload


@dataclass(frozen=True)
class Streamed:
    log: LogTable  # every request's row
    replays: Replays  # every request's results, the trie of the whole log


class _ServerSessions:
    """One model's server: its engines' caches, kept between chunks."""

    def __init__(self, settings: ReplaySettings) -> None:
        self.vllm = VllmPrefixCache(settings.vllm()).session()
        self.sglang = SglangRadixCache(settings.sglang()).session()
        self.sglang_page1 = (
            SglangRadixCache(settings.sglang(page_size=1)).session()
            if settings.page_size != 1
            else None
        )

    def feed(self, part: Workload) -> tuple[ReplayResult, ReplayResult, ReplayResult]:
        jobs = {"vllm": lambda: self.vllm.feed(part), "sglang": lambda: self.sglang.feed(part)}
        if self.sglang_page1 is not None:
            page1 = self.sglang_page1
            jobs["sglang_page1"] = lambda: page1.feed(part)
        results = in_parallel(jobs)
        return results["vllm"], results["sglang"], results.get("sglang_page1", results["sglang"])


def stream_replays(
    logs: Iterable[TokenizedLog],
    reader: ChunkedIngest,
    settings: ReplaySettings,
    progress: Progress,
) -> Streamed:
    """Replay consecutive parts of a log, each model on its own caches (kept between parts)."""
    servers: dict[str, _ServerSessions] = {}
    trie = PrefixTrie()
    results: list[list[ReplayResult]] = [[], [], [], []]
    tables = []

    def feed_servers(log: TokenizedLog) -> list[ReplayResult]:
        workload = log.workload
        models = model_labels(log.requests["model"])
        per_engine: list[list[tuple[np.ndarray, ReplayResult]]] = [[], [], []]
        for name in dict.fromkeys(models):
            indices = np.flatnonzero(models == name)
            part = workload if len(indices) == workload.n_requests else workload.select(indices)
            server = servers.setdefault(name, _ServerSessions(settings))
            for engine, result in enumerate(server.feed(part)):
                per_engine[engine].append((indices, result))
        return [merged_results(parts, workload.n_requests) for parts in per_engine]

    for log in logs:
        progress.stage("replaying (streamed)", None)
        done = in_parallel(
            {
                "servers": lambda log=log: feed_servers(log),
                "trie": lambda log=log: trie.feed(log.workload)[0],
            }
        )
        for engine, result in enumerate(done["servers"]):
            results[engine].append(result)
        results[3].append(ReplayResult("ideal", done["trie"]))
        tables.append(_table_only(log))
    vllm, sglang, page1, ideal = (_concatenated(parts) for parts in results)
    table = LogTable(
        requests=pl.concat([t.requests for t in tables], how="vertical_relaxed"),
        skips=[skip for t in tables for skip in t.skips],
        namespace_labels=reader.state.labels(),
        from_text=any(t.from_text for t in tables),
        assumed_stop_finish=sum(t.assumed_stop_finish for t in tables),
        token_cache=CacheStats.total([t.token_cache for t in tables]),
    )
    return Streamed(table, Replays(vllm, sglang, page1, ideal, trie.nodes))


def sample_of(replays: Replays, sample: Workload, own_trie: bool = True) -> Replays:
    """The leading requests' results (a sequential replay's first k requests are the same alone),
    with a trie of the sample only, for the diagnosis of the sample (``own_trie`` False: the
    whole log's trie, when nothing is diagnosed)."""
    n = sample.n_requests

    def head(result: ReplayResult) -> ReplayResult:
        counters = {name: values[:n] for name, values in result.counters.items()}
        return replace(result, hit_tokens=result.hit_tokens[:n], counters=counters, metrics={})

    nodes = replays.trie
    if own_trie:
        trie = PrefixTrie()
        trie.replay(sample)
        nodes = trie.nodes
    return Replays(
        head(replays.vllm),
        head(replays.sglang),
        head(replays.sglang_page1),
        head(replays.ideal),
        nodes,
    )


def _table_only(log: LogTable) -> LogTable:
    """A chunk's rows without its tokens (so they can be freed)."""
    return LogTable(
        requests=log.requests,
        skips=log.skips,
        namespace_labels=log.namespace_labels,
        from_text=log.from_text,
        assumed_stop_finish=log.assumed_stop_finish,
        token_cache=log.token_cache,
    )


def _concatenated(parts: list[ReplayResult]) -> ReplayResult:
    """The chunks' results of one engine as one, metrics summed."""
    first = parts[0]
    return replace(
        first,
        hit_tokens=np.concatenate([p.hit_tokens for p in parts]),
        counters={
            name: np.concatenate([p.counters[name] for p in parts]) for name in first.counters
        },
        metrics={name: sum(p.metrics.get(name, 0) for p in parts) for name in first.metrics},
    )
