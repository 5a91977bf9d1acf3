"""The replay step: every request of a log, in arrival order, through the pool of engine caches
(``analyzer.pool``) and the prefix trie, in memory or streamed chunk by chunk."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Protocol

import numpy as np
import polars as pl

from analyzer.errors import PrefixcheckError, SkipLog
from analyzer.pool import CacheFactory, CachePool, Router, concatenated, model_labels
from analyzer.progress import NoProgress, Progress
from analyzer.settings import ReplaySettings
from analyzer.token_cache import CacheStats
from analyzer.workload import LogTable, TokenizedLog
from cache_models.prefix_trie import PrefixTrie, TrieNodes, View
from cache_models.result import ReplayResult
from cache_models.runs import RunWorkload
from cache_models.workload import Workload


class Trie(Protocol):
    """The ceiling's prefix trie, fed a log chunk by chunk (``PrefixTrie``, or an executor's)."""

    def feed(self, chunk: Workload) -> list[np.ndarray]: ...

    @property
    def nodes(self) -> TrieNodes: ...


@dataclass(frozen=True)
class Replays:
    """Per-request results, all in the workload's order."""

    vllm: ReplayResult
    sglang: ReplayResult
    sglang_page1: ReplayResult  # the same run when page_size is 1
    ideal: ReplayResult
    trie: TrieNodes
    # Unbounded sequential hits of further views, read off the ceiling's trie as it was fed
    # (``replay_all``'s ``views``: the size sweep's); empty when none was asked for.
    views: dict[View, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        results: dict[str, ReplayResult],
        trie: TrieNodes,
        views: dict[View, np.ndarray] | None = None,
    ) -> Replays:
        sglang = results["sglang"]
        return cls(
            results["vllm"],
            sglang,
            results.get("sglang_page1", sglang),
            results["ideal"],
            trie,
            views or {},
        )

    def each(self) -> dict[str, ReplayResult]:
        return {
            "vllm": self.vllm,
            "sglang": self.sglang,
            "sglang_page1": self.sglang_page1,
            "ideal": self.ideal,
        }


@dataclass(frozen=True)
class Replayed:
    """The replay step's output: every request's row and results (input order), and the leading
    sample's, which the diagnosis covers (the whole log unless it was streamed)."""

    log: LogTable
    replays: Replays
    order: np.ndarray | None  # the arrival order an unsorted whole log was replayed in
    sample: TokenizedLog
    sample_replays: Replays

    @property
    def streamed(self) -> bool:
        return self.sample is not self.log


def replay_log(
    sample: TokenizedLog,
    rest: Iterator[TokenizedLog],
    settings: ReplaySettings,
    progress: Progress | None = None,
    router: Router | None = None,
    namespace_labels: Callable[[], list[str]] | None = None,
    sample_trie: bool = True,
    caches: CacheFactory | None = None,
    trie: Callable[[], Trie] | None = None,
    views: Sequence[View] = (),
) -> Replayed:
    """Replay ``sample`` and then every chunk of ``rest`` through one pool of caches and one
    prefix trie. Without a ``rest`` the log is whole: replayed in arrival order (sorted by
    timestamp when it is not), results put back in input order. With one, the log streams in the
    order it is read; ``namespace_labels()`` gives the whole stream's once it is read.
    ``sample_trie`` False: a streamed sample keeps the whole log's trie (nothing diagnoses it).
    ``trie`` makes a streamed log's prefix trie (an executor's, e.g. in a Ray actor; None:
    here). A whole log replayed in its own order also gives the hits of ``views``
    (``replay_all``)."""
    following = next(rest, None)
    if following is None:
        check_arrivals(sample.workload, settings)
        order = arrival_order(sample.workload)
        models = model_labels(sample.requests["model"])
        if order is None:
            own = () if isinstance(sample.workload, RunWorkload) else views  # runs: the sweep's own
            replays = replay_all(sample.workload, settings, progress, models, router, caches, own)
        else:
            ordered = replay_all(
                sample.workload.select(order), settings, progress, models[order], router, caches
            )
            replays = in_input_order(ordered, order)
        return Replayed(sample, replays, order, sample, replays)
    pool = CachePool(settings, settings.engines, router, caches)
    ceiling = PrefixTrie() if trie is None else trie()
    chunks: list[dict[str, ReplayResult]] = []
    tables: list[LogTable] = []
    for log in chain([sample, following], rest):  # the input's progress bar follows the chunks
        chunks.append(
            replay_chunk(pool, ceiling, log.workload, model_labels(log.requests["model"]))
        )
        tables.append(rows_only(log))
    replays = joined_replays(chunks, ceiling.nodes)
    labels = namespace_labels() if namespace_labels else tables[-1].namespace_labels
    whole = joined_rows(tables, labels)
    return Replayed(
        whole, replays, None, sample, sample_of(replays, sample.workload, own_trie=sample_trie)
    )


def replay_all(
    workload: Workload,
    settings: ReplaySettings,
    progress: Progress | None = None,
    models: np.ndarray | None = None,
    router: Router | None = None,
    caches: CacheFactory | None = None,
    views: Sequence[View] = (),
) -> Replays:
    """One workload, in its order, through a fresh pool (each model on its own caches when
    ``models`` labels the requests; ``caches`` makes them, in this process by default) and a
    fresh prefix trie, which also gives the unbounded sequential hits of ``views``
    (``Replays.views``) in the same pass; a log of one server's tokens walks that trie once
    for the ceiling and the unbounded caches (``CachePool.trie_with_ceiling``)."""
    progress = progress or NoProgress()
    pool = CachePool(settings, settings.engines, router, caches)
    ceiling = [View("ideal"), *views]
    shared = None
    if not isinstance(workload, RunWorkload):
        shared = pool.trie_with_ceiling(workload, models, ceiling)
    trie = PrefixTrie(ceiling) if shared is None else shared.trie  # one server: one walk

    def feed_ceiling() -> list[np.ndarray]:
        return trie.feed(workload) if shared is None else shared.feed_ceiling(workload)

    tokens = workload.prompt_token_count
    progress.stage("replaying (tokens × caches)", (len(pool.engines) + 1) * tokens)
    results, fed = pool.feed(workload, models, {"trie": feed_ceiling}, progress.advance)
    ideal, *more = fed["trie"]
    return Replays.of(
        results | {"ideal": ReplayResult("ideal", ideal)},
        trie.nodes,
        dict(zip(views, more, strict=True)),
    )


def joined_replays(chunks: list[dict[str, ReplayResult]], nodes: TrieNodes) -> Replays:
    """A streamed log's results: each chunk's replays, in order, with the nodes of the trie fed
    them all."""
    return Replays.of(
        {name: concatenated([chunk[name] for chunk in chunks]) for name in chunks[0]}, nodes
    )


def replay_chunk(
    pool: CachePool,
    trie: Trie,
    workload: Workload,
    models: np.ndarray | None,
    done: Callable[[int], None] | None = None,
) -> dict[str, ReplayResult]:
    """The pool's and the trie's results for the next requests of the log, replayed at once."""
    results, ideal = pool.feed(workload, models, {"ideal": lambda: trie.feed(workload)[0]}, done)
    return results | {"ideal": ReplayResult("ideal", ideal["ideal"])}


def check_arrivals(workload: Workload, settings: ReplaySettings) -> None:
    if settings.time_model is not None and workload.arrival_s is None:
        raise PrefixcheckError(
            "--replay-in-time needs an arrival time on every request (a timestamp field, or "
            "--time-field)"
        )


def sample_of(replays: Replays, sample: Workload, own_trie: bool = True) -> Replays:
    """The leading requests' results (a sequential replay's first k requests are the same alone),
    with a trie of the sample only, for the diagnosis of the sample (``own_trie`` False: the
    whole log's trie, when nothing diagnoses the sample)."""
    n = sample.n_requests

    def head(result: ReplayResult) -> ReplayResult:
        counters = {name: values[:n] for name, values in result.counters.items()}
        return replace(result, hit_tokens=result.hit_tokens[:n], counters=counters, metrics={})

    nodes = replays.trie
    if own_trie:
        trie = PrefixTrie()
        trie.replay(sample)
        nodes = trie.nodes
    return Replays.of({name: head(r) for name, r in replays.each().items()}, nodes)


ROW_COLUMNS = (  # the columns of a streamed chunk's rows that the report and per-request table read
    "file",
    "line",
    "model",
    "prompt_tokens",
    "output_tokens",
    "output_known",
    "server_cached_tokens",
    "server_prompt_tokens",
)


def rows_only(log: LogTable) -> LogTable:
    """A chunk's rows without its tokens, and without the columns only its reading and
    tokenizing read (salt, LoRA, tenant, finish, arrival, routing fields), so they can be
    freed: what a streamed log holds per request until the report."""
    return LogTable(
        requests=log.requests.select([c for c in ROW_COLUMNS if c in log.requests.columns]),
        skips=log.skips,
        namespace_labels=log.namespace_labels,
        from_text=log.from_text,
        assumed_stop_finish=log.assumed_stop_finish,
        token_cache=log.token_cache,
    )


def joined_rows(tables: list[LogTable], namespace_labels: list[str]) -> LogTable:
    return LogTable(
        requests=pl.concat([t.requests for t in tables], how="vertical_relaxed"),
        skips=sum((t.skips for t in tables), SkipLog()),
        namespace_labels=namespace_labels,
        from_text=any(t.from_text for t in tables),
        assumed_stop_finish=sum(t.assumed_stop_finish for t in tables),
        token_cache=CacheStats.total([t.token_cache for t in tables]),
    )


def arrival_order(workload: Workload) -> np.ndarray | None:
    """The replay order when the log is not in arrival order (stable by timestamp), else None."""
    arrival = workload.arrival_s
    if arrival is None or bool(np.all(np.diff(arrival) >= 0)):
        return None
    return np.argsort(arrival, kind="stable")


def in_input_order(replays: Replays, order: np.ndarray) -> Replays:
    """Per-request results of a replay in ``order``, put back in input order."""

    def unpermute(result: ReplayResult) -> ReplayResult:
        def back(values: np.ndarray) -> np.ndarray:
            restored = np.empty_like(values)
            restored[order] = values
            return restored

        counters = {name: back(values) for name, values in result.counters.items()}
        return replace(result, hit_tokens=back(result.hit_tokens), counters=counters)

    first = replays.trie.first_request
    trie = replace(replays.trie, first_request=np.where(first >= 0, order[first], first))
    return Replays.of({name: unpermute(r) for name, r in replays.each().items()}, trie)
