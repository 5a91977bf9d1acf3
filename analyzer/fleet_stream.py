"""A sequential fleet run streamed chunk by chunk, as a single server's log is: the routing pass
(``Placer``) keeps its router's state between chunks, the replicas' caches and the single
instance's (the fleet's total capacity, for the ``routing`` cause) keep theirs, and each chunk is
dropped once replayed, so memory follows the caches and the prefix trie, not the log. Like a
streamed single-server log, the chunks are replayed in the order they are read (an unsorted log
is not sorted first: only a log held whole is). ``--what-if router=/replicas=/session-field=``
fleets stream beside it over the whole log; the measured router ranking and capacity advice
replay the diagnosed sample."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain
from typing import Any

import numpy as np
import polars as pl

from analyzer.errors import PrefixcheckError
from analyzer.fleet import FleetOptions, FleetReplays, Placed, Placement, Placer
from analyzer.fleet_keys import session_keys
from analyzer.fleet_run import (
    FleetRun,
    FleetSummary,
    fleet_fix,
    fleet_summary,
    log_placement,
    with_advice,
)
from analyzer.pool import CachePool, model_labels
from analyzer.replay import (
    Replayed,
    Replays,
    ReplaySettings,
    joined_replays,
    joined_rows,
    replay_chunk,
    rows_only,
    sample_of,
)
from analyzer.workload import LogTable, TokenizedLog
from cache_models.prefix_trie import PrefixTrie
from cache_models.result import ReplayResult
from cache_models.workload import Workload

Texts = list[np.ndarray] | None  # each request's routing text as code points (None: its tokens)


class RoutedFleet:
    """One fleet fed chunk by chunk: its routing pass and a pool of its replicas' caches."""

    def __init__(
        self,
        settings: ReplaySettings,
        options: FleetOptions,
        engines: tuple[str, ...] | None = None,
    ) -> None:
        self.settings, self.options = settings, options
        self.placer = Placer(settings, options, timed=False)  # streamed: sequential, untimed
        self.router = Placed(np.empty(0, np.int64))
        self.pool = CachePool(settings, engines or settings.engines, self.router)
        self.keyless = 0  # requests without a routing key (routed by their text)
        self.placed: list[np.ndarray] = []

    def route(
        self,
        log: TokenizedLog,
        texts: Texts,
        placed_by_log: np.ndarray | None = None,
    ) -> None:
        """Place the next chunk's requests; the pool's router sends them to their replicas."""
        keys, keyless = session_keys(
            log.requests, log.workload, self.options.session_field, self.settings.block_size
        )
        self.keyless += keyless
        self.router.replica = self.placer.place(log.workload, keys, placed_by_log, texts)
        self.placed.append(self.router.replica)

    def placement(self) -> Placement:
        return self.placer.placement(np.concatenate(self.placed))


class _WhatIf:
    """A ``--what-if`` change of the fleet, streamed beside it: only its hit totals are kept."""

    def __init__(self, settings: ReplaySettings, options: FleetOptions, text: str) -> None:
        self.text, self.options = text, fleet_fix(options, text)
        try:
            self.fleet = RoutedFleet(settings, self.options, ("vllm", "sglang"))
        except ValueError as exc:
            raise PrefixcheckError(f"--what-if {text!r}: {exc}") from None
        self.hits = {"vllm": 0, "sglang": 0}

    def feed(self, log: TokenizedLog, models: np.ndarray, texts: Texts) -> None:
        try:
            self.fleet.route(log, texts)
        except ValueError as exc:
            raise PrefixcheckError(f"--what-if {self.text!r}: {exc}") from None
        results, _ = self.fleet.pool.feed(log.workload, models)
        for engine in self.hits:
            self.hits[engine] += results[engine].total_hit_tokens

    def row(self, prompt_tokens: int) -> dict[str, Any]:
        """The what-if as ``run_fleet`` reports it."""
        placement = self.fleet.placement()
        return {
            "change": self.text,
            "replicas": self.options.replicas,
            "router": placement.router,
            "router_source": placement.source,
            "hit_rate": {
                e: h / prompt_tokens if prompt_tokens else 0.0 for e, h in self.hits.items()
            },
        }


def stream_fleet(
    sample: TokenizedLog,
    sample_texts: Texts,
    rest: Iterator[tuple[TokenizedLog, Texts]],
    settings: ReplaySettings,
    options: FleetOptions,
    what_ifs: tuple[str, ...] = (),
    namespace_labels: Callable[[], list[str]] | None = None,
    sample_trie: bool = True,
) -> FleetRun:
    """Route and replay ``sample`` and then every chunk of ``rest`` (each with its routing
    texts) through the fleet and the single instance, chunk by chunk; the diagnosis covers the
    sample. ``sample_trie`` False: the sample keeps the whole log's trie (nothing diagnoses it)."""
    fleet = RoutedFleet(settings, options)
    names: dict[str, int] = {}  # --replica-field: the replicas named so far
    if options.replica_field is not None:  # the sample's replicas size the single instance
        log_placement(sample.requests, options.replica_field, names)
    sized = max(options.replicas, len(names))
    total = None if settings.capacity_tokens is None else settings.capacity_tokens * sized
    single_settings = replace(settings, capacity_tokens=total)
    single_pool = CachePool(single_settings, settings.engines)
    changes = [_WhatIf(settings, options, text) for text in what_ifs]
    trie = PrefixTrie()
    fleet_chunks: list[dict[str, ReplayResult]] = []
    single_chunks: list[dict[str, ReplayResult]] = []
    tables: list[LogTable] = []
    for log, texts in chain([(sample, sample_texts)], rest):
        models = model_labels(log.requests["model"])
        placed_by_log = None
        if options.replica_field is not None:
            placed_by_log, _ = log_placement(log.requests, options.replica_field, names)
            if total is not None and len(names) > sized:
                raise _unsized(log, placed_by_log, sized, options.replica_field)
        fleet.route(log, texts, placed_by_log)
        fleet_chunks.append(replay_chunk(fleet.pool, trie, log.workload, models))
        single, _ = single_pool.feed(log.workload, models)
        single_chunks.append(single | {"ideal": fleet_chunks[-1]["ideal"]})
        for change in changes:
            change.feed(log, models, texts)
        tables.append(rows_only(log))
    replays = joined_replays(fleet_chunks, trie.nodes), joined_replays(single_chunks, trie.nodes)
    labels = namespace_labels() if namespace_labels else tables[-1].namespace_labels
    whole = joined_rows(tables, labels)
    lengths = whole.requests["prompt_tokens"].to_numpy()
    replicas = max(options.replicas, len(names))
    placement = fleet.placement()
    summary = fleet_summary(
        FleetReplays(*replays, placement),
        lengths,
        replicas,
        settings,
        fleet.keyless,
        list(names) if options.replica_field is not None else None,
    )
    summary = replace(summary, what_if=[c.row(int(lengths.sum())) for c in changes])
    sample_fleet = sample_of(replays[0], sample.workload, own_trie=sample_trie)
    sample_single = replace(
        sample_of(replays[1], sample.workload, own_trie=False), trie=sample_fleet.trie
    )
    if options.replica_field is not None:
        summary = replace(summary, advice_skipped="the log's own placement was replayed")
    else:
        advised = sample_single if sample_trie else sample_of(replays[1], sample.workload)
        summary = _sample_advice(summary, sample, sample_texts, settings, options, advised)
    return FleetRun(
        Replayed(whole, replays[0], None, sample, sample_fleet),
        replays[1],
        placement.replica,
        summary,
        single_settings,
        sample_single,
    )


def _sample_advice(
    summary: FleetSummary,
    sample: TokenizedLog,
    texts: Texts,
    settings: ReplaySettings,
    options: FleetOptions,
    single: Replays,
) -> FleetSummary:
    """The router ranking and capacity advice measured on the diagnosed sample (said so)."""
    workload: Workload = sample.workload
    requests: pl.DataFrame = sample.requests
    models = model_labels(requests["model"])
    advised = with_advice(summary, workload, requests, models, settings, options, single, texts)
    scope = {"requests": workload.n_requests, "prompt_tokens": int(workload.prompt_offsets[-1])}
    return replace(advised, advice_sample=scope)


def _unsized(log: TokenizedLog, placed: np.ndarray, sized: int, field: str) -> PrefixcheckError:
    """A replica first named past the diagnosed sample, once the single instance was sized."""
    i = int(np.argmax(placed >= sized))
    return PrefixcheckError(
        f"{log.requests['file'][i]}:{log.requests['line'][i]}: --replica-field {field!r} names "
        f"a replica past the {sized} of the diagnosed sample and --replicas; a streamed fleet "
        "sizes its single instance (replicas x --capacity-tokens) before the rest of the log "
        "is read: pass --replicas with the number of replicas the log names (or raise "
        "--diagnose-tokens to hold the log whole)"
    )
