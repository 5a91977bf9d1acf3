"""Scenarios: a changed workload or configuration replayed through the same pool of caches, and
the gain it makes ("measured" in the report: replayed, not guessed; ``measure`` itself is the GPU
mode).

Independent replays run in forked worker processes (``forked``) when the log is big enough for
that to pay; the workers die with the run.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from analyzer.diagnose.fixes import EditedLog
from analyzer.diagnose.forked import forked_map
from analyzer.diagnose.reach import reached_rows, rows_reached
from analyzer.engines import ENGINES
from analyzer.pool import CacheKey, CachePool, Routes
from analyzer.replay import ReplaySettings
from analyzer.shares import share
from cache_models.prefix_trie import View, unbounded_hits
from cache_models.workload import Workload

# Below this many prompt tokens per job, worker start-up costs more than it saves.
PARALLEL_MIN_TOKENS = 2_000_000
# A fix that reaches more of the log than this is replayed whole: a copy of most of the log
# (held beside the trie it builds) would save little time and cost memory.
SUBSET_MAX_SHARE = 0.5


@dataclass(frozen=True)
class Scenario:
    """A workload and the engine flags to replay it with; ``engines`` says which to replay.

    ``servers`` labels each request with the server it goes to (one per model in the log): each
    server's requests are replayed on caches of their own.

    ``base`` is the workload that this one edits (the same requests, some of them changed) and
    ``base_hits`` its hits with these settings: an unbounded sequential replay then replays only
    the requests the edits can reach (``reach.reached_rows``), the others keep ``base_hits``.
    ``log`` may be ``base`` with edits (``EditedLog``): then only what is replayed is built.
    """

    log: Workload | EditedLog
    settings: ReplaySettings
    engines: tuple[str, ...] = ENGINES
    servers: np.ndarray | None = None
    base: Workload | None = None
    base_hits: dict[str, np.ndarray] | None = None

    @cached_property
    def workload(self) -> Workload:
        """The whole workload to replay (an edited log built here, once)."""
        return self.log.workload if isinstance(self.log, EditedLog) else self.log


@dataclass(frozen=True)
class Gain:
    """One engine before and after a fix, over the whole log."""

    prompt_tokens_before: int
    hit_tokens_before: int
    prompt_tokens_after: int
    hit_tokens_after: int

    @property
    def recomputed_tokens_saved(self) -> int:
        """Recomputed prompt tokens before minus after: tokens a fix adds count against it."""
        before = self.prompt_tokens_before - self.hit_tokens_before
        return before - (self.prompt_tokens_after - self.hit_tokens_after)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hit_tokens_before": self.hit_tokens_before,
            "hit_tokens_after": self.hit_tokens_after,
            "hit_rate_before": share(self.hit_tokens_before, self.prompt_tokens_before),
            "hit_rate_after": share(self.hit_tokens_after, self.prompt_tokens_after),
            "prompt_tokens_before": self.prompt_tokens_before,
            "prompt_tokens_after": self.prompt_tokens_after,
            "recomputed_tokens_saved": self.recomputed_tokens_saved,
        }


def replay_hits(scenario: Scenario) -> dict[str, np.ndarray]:
    """Per-request hits of each engine the scenario names."""
    return replay_many([scenario])[0]


def _model_replay(scenario: Scenario) -> dict[str, np.ndarray]:
    """``replay_hits`` through the cache models themselves: one pool, each server's requests on
    caches of their own."""
    pool = CachePool(scenario.settings, scenario.engines)
    results, _ = pool.feed(scenario.workload, scenario.servers)
    return {engine: results[engine].hit_tokens.astype(np.int64) for engine in scenario.engines}


def server_parts(servers: np.ndarray | None, n_requests: int) -> list[np.ndarray]:
    """The request indices of each server, in order of first appearance (the pool's routes)."""
    routes = Routes.one(n_requests) if servers is None else Routes.of_labels(servers, CacheKey)
    return routes.parts()


def replay_many(scenarios: Sequence[Scenario]) -> list[dict[str, np.ndarray]]:
    """``replay_hits`` of every scenario. Unbounded sequential ones on the same workload share one
    pass over the prefix trie (exactly the models' hits, with memory per trie node instead of per
    cached block); the others run in parallel processes for big logs."""
    results: list[dict[str, np.ndarray] | None] = [None] * len(scenarios)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, scenario in enumerate(scenarios):
        if _unbounded_sequential(scenario.settings):
            if scenario.base is not None and scenario.base_hits is not None:
                results[i] = _reached_replay(scenario)
            else:
                groups[(id(scenario.workload), id(scenario.servers))].append(i)
    for indices in groups.values():
        for i, hits in zip(indices, _trie_replays([scenarios[i] for i in indices]), strict=True):
            results[i] = hits
    rest = [i for i, hits in enumerate(results) if hits is None]
    for i, hits in zip(rest, _engine_replays([scenarios[i] for i in rest]), strict=True):
        results[i] = hits
    return [hits for hits in results if hits is not None]


def _unbounded_sequential(settings: ReplaySettings) -> bool:
    return settings.capacity_tokens is None and settings.sequential


def _trie_replays(scenarios: Sequence[Scenario]) -> list[dict[str, np.ndarray]]:
    """Unbounded sequential scenarios of one workload (and servers), in one trie pass."""
    workload, servers = scenarios[0].workload, scenarios[0].servers
    wanted = [
        (
            i,
            engine,
            View(engine, s.settings.block_size if engine == "vllm" else s.settings.page_size),
        )
        for i, s in enumerate(scenarios)
        for engine in s.engines
    ]
    views = list(dict.fromkeys(view for _, _, view in wanted))
    by_view = {view: np.zeros(workload.n_requests, np.int64) for view in views}
    parts = server_parts(servers, workload.n_requests)
    for indices in parts:
        part = workload if len(parts) == 1 else workload.select(indices)
        for view, hits in zip(views, unbounded_hits(part, views), strict=True):
            by_view[view][indices] = hits
    results: list[dict[str, np.ndarray]] = [{} for _ in scenarios]
    for i, engine, view in wanted:
        results[i][engine] = by_view[view]
    return results


def _views(scenario: Scenario) -> dict[str, View]:
    settings = scenario.settings
    return {
        engine: View(engine, settings.block_size if engine == "vllm" else settings.page_size)
        for engine in scenario.engines
    }


def _reached_replay(scenario: Scenario) -> dict[str, np.ndarray]:
    """An unbounded sequential scenario that edits ``base``: the requests the edits can reach
    replayed (in order, with every request they can share a block with), the rest as in
    ``base_hits``."""
    assert scenario.base is not None and scenario.base_hits is not None
    views = _views(scenario)
    finest = min(view.granularity for view in views.values())
    log, base, servers = scenario.log, scenario.base, scenario.servers
    if isinstance(log, EditedLog) and log.base is base:  # the edited requests alone are built
        rows = rows_reached(base, *log.changed, finest, servers)
    else:
        rows = reached_rows(base, scenario.workload, finest, servers)
    if len(rows) > SUBSET_MAX_SHARE * log.n_requests:
        return _trie_replays([replace(scenario, base=None, base_hits=None)])[0]
    if not isinstance(log, EditedLog):
        selected = scenario.workload.select(rows)
    elif np.array_equal(rows, log.changed[0]):  # the edits reach no other request
        selected = log.changed[1]
    else:
        selected = log.select(rows)
    part = Scenario(
        selected,
        scenario.settings,
        scenario.engines,
        None if servers is None else servers[rows],
    )
    replayed = _trie_replays([part])[0] if len(rows) else {}
    results = {}
    for engine in views:
        hits = np.array(scenario.base_hits[engine], np.int64)
        if len(rows):
            hits[rows] = replayed[engine]
        results[engine] = hits
    return results


def _engine_replays(scenarios: Sequence[Scenario]) -> list[dict[str, np.ndarray]]:
    """Replays through the cache models, in forked processes when the log is big."""
    tokens = sum(s.log.prompt_token_count for s in scenarios)
    workers = min(len(scenarios), os.cpu_count() or 1)
    if workers < 2 or tokens < PARALLEL_MIN_TOKENS or "fork" not in _start_methods():
        return [_model_replay(s) for s in scenarios]
    weights = [s.log.prompt_token_count for s in scenarios]
    return forked_map(lambda i: _model_replay(scenarios[i]), weights, workers)


def gains(
    before: Workload | EditedLog,
    before_hits: dict[str, np.ndarray],
    after: Workload | EditedLog,
    after_hits: dict[str, np.ndarray],
) -> dict[str, Gain]:
    return {
        engine: Gain(
            prompt_tokens_before=before.prompt_token_count,
            hit_tokens_before=int(before_hits[engine].sum()),
            prompt_tokens_after=after.prompt_token_count,
            hit_tokens_after=int(after_hits[engine].sum()),
        )
        for engine in after_hits
    }


def _start_methods() -> list[str]:
    return multiprocessing.get_all_start_methods()
