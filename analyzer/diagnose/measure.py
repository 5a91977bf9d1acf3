"""Measured gains: replay a changed workload or configuration through the same cache models.

Independent replays run in forked worker processes when the log is big enough for that to pay.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.diagnose.fixes import select_requests
from analyzer.replay import ReplaySettings
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload

ENGINES = ("vllm", "sglang")
# Below this many prompt tokens per job, worker start-up costs more than it saves.
PARALLEL_MIN_TOKENS = 2_000_000


@dataclass(frozen=True)
class Scenario:
    """A workload and the engine flags to replay it with; ``engines`` says which to replay.

    ``servers`` labels each request with the server it goes to (one per model in the log): each
    server's requests are replayed on caches of their own.
    """

    workload: Workload
    settings: ReplaySettings
    engines: tuple[str, ...] = ENGINES
    servers: np.ndarray | None = None


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
            "hit_rate_before": _rate(self.hit_tokens_before, self.prompt_tokens_before),
            "hit_rate_after": _rate(self.hit_tokens_after, self.prompt_tokens_after),
            "prompt_tokens_before": self.prompt_tokens_before,
            "prompt_tokens_after": self.prompt_tokens_after,
            "recomputed_tokens_saved": self.recomputed_tokens_saved,
        }


def replay_hits(scenario: Scenario) -> dict[str, np.ndarray]:
    """Per-request hits of each engine the scenario names."""
    workload, settings = scenario.workload, scenario.settings
    parts = server_parts(scenario.servers, workload.n_requests)
    hits = {engine: np.zeros(workload.n_requests, np.int64) for engine in scenario.engines}
    for indices in parts:
        part = workload if len(parts) == 1 else select_requests(workload, indices)
        if "vllm" in hits:
            hits["vllm"][indices] = VllmPrefixCache(settings.vllm()).replay(part).hit_tokens
        if "sglang" in hits:
            hits["sglang"][indices] = SglangRadixCache(settings.sglang()).replay(part).hit_tokens
    return hits


def server_parts(servers: np.ndarray | None, n_requests: int) -> list[np.ndarray]:
    """The request indices of each server, in order of first appearance."""
    if servers is None:
        return [np.arange(n_requests)]
    _, first, inverse = np.unique(servers, return_index=True, return_inverse=True)
    return [np.flatnonzero(inverse == k) for k in np.argsort(first)]


def replay_many(scenarios: Sequence[Scenario]) -> list[dict[str, np.ndarray]]:
    """``replay_hits`` of every scenario, in parallel processes for big logs."""
    tokens = sum(int(s.workload.prompt_offsets[-1]) for s in scenarios)
    workers = min(len(scenarios), os.cpu_count() or 1)
    if workers < 2 or tokens < PARALLEL_MIN_TOKENS or "fork" not in _start_methods():
        return [replay_hits(s) for s in scenarios]
    global _PENDING
    _PENDING = list(scenarios)  # forked workers inherit them: no pickling of the workloads
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return list(pool.map(_replay_pending, range(len(scenarios))))
    finally:
        _PENDING = []


def gains(
    before: Workload,
    before_hits: dict[str, np.ndarray],
    after: Workload,
    after_hits: dict[str, np.ndarray],
) -> dict[str, Gain]:
    return {
        engine: Gain(
            prompt_tokens_before=int(before.prompt_offsets[-1]),
            hit_tokens_before=int(before_hits[engine].sum()),
            prompt_tokens_after=int(after.prompt_offsets[-1]),
            hit_tokens_after=int(after_hits[engine].sum()),
        )
        for engine in after_hits
    }


_PENDING: list[Scenario] = []


def _replay_pending(index: int) -> dict[str, np.ndarray]:
    return replay_hits(_PENDING[index])


def _start_methods() -> list[str]:
    return multiprocessing.get_all_start_methods()


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
