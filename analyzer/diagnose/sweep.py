"""Hit rate against block size (vLLM) and page size (SGLang), each a full replay."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from analyzer.diagnose.scenarios import Scenario, replay_many
from analyzer.replay import ReplaySettings
from cache_models.runs import RunWorkload
from cache_models.workload import Workload

SIZES = (1, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class SweepPoint:
    size: int
    hit_tokens: int


def size_sweep(
    workload: Workload,
    settings: ReplaySettings,
    known: dict[str, np.ndarray],
    servers: np.ndarray | None,
    runs: RunWorkload | None = None,
) -> dict[str, list[SweepPoint]]:
    """vLLM at every block size and SGLang at every page size of ``SIZES`` (capacity permitting);
    ``known`` holds the hits already replayed at the configured sizes. Unbounded and sequential,
    every point is one pass of the prefix trie, which reads ``runs`` (the workload as runs, when
    given) as it reads the tokens, only faster."""
    capacity = settings.capacity_tokens
    if runs is not None and capacity is None and settings.sequential:
        workload = runs  # type: ignore[assignment]  # the trie's replays read either
    sizes = [s for s in SIZES if capacity is None or s <= capacity]
    jobs = {
        ("vllm", s): Scenario(workload, replace(settings, block_size=s), ("vllm",), servers)
        for s in sizes
        if s != settings.block_size
    }
    jobs.update(
        {
            ("sglang", s): Scenario(workload, replace(settings, page_size=s), ("sglang",), servers)
            for s in sizes
            if s != settings.page_size
        }
    )
    results = dict(zip(jobs, replay_many(list(jobs.values())), strict=True))
    configured = {"vllm": settings.block_size, "sglang": settings.page_size}
    sweep: dict[str, list[SweepPoint]] = {}
    for engine, size in configured.items():
        points = {s: int(results[(engine, s)][engine].sum()) for s in sizes if s != size}
        points[size] = int(known[engine].sum())
        sweep[engine] = [SweepPoint(s, points[s]) for s in sorted(points)]
    return sweep
