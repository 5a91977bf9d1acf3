"""Hit rate against block size (vLLM) and page size (SGLang), each a full replay."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from analyzer.diagnose.scenarios import Scenario, replay_many
from analyzer.replay import ReplaySettings
from cache_models.prefix_trie import View
from cache_models.runs import RunWorkload
from cache_models.workload import Workload

SIZES = (1, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class SweepPoint:
    size: int
    hit_tokens: int


def sweep_views(settings: ReplaySettings) -> tuple[View, ...]:
    """The sweep's replays as views of the prefix trie, when they are its unbounded sequential
    replays (the replay's trie can then give them in its own pass: ``replay_all``)."""
    if settings.capacity_tokens is not None or not settings.sequential:
        return ()
    return tuple(
        View(engine, s)
        for engine, configured in (("vllm", settings.block_size), ("sglang", settings.page_size))
        for s in SIZES
        if s != configured
    )


def size_sweep(
    workload: Workload,
    settings: ReplaySettings,
    known: dict[str, np.ndarray],
    servers: np.ndarray | None,
    runs: RunWorkload | None = None,
    views: dict[View, np.ndarray] | None = None,
) -> dict[str, list[SweepPoint]]:
    """vLLM at every block size and SGLang at every page size of ``SIZES`` (capacity permitting);
    ``known`` holds the hits already replayed at the configured sizes, ``views`` those of the
    sweep's views (``sweep_views``) that the replay's trie gave (one server's log only).
    Unbounded and sequential, every other point is one pass of the prefix trie, which reads
    ``runs`` (the workload as runs, when given) as it reads the tokens, only faster."""
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
    given = {} if servers is not None or not views else views
    results = {
        job: {job[0]: given[View(*job)]} for job in jobs if View(*job) in given
    }  # the trie's hits of a view are the unbounded sequential replay's
    rest = [job for job in jobs if job not in results]
    results |= dict(zip(rest, replay_many([jobs[job] for job in rest]), strict=True))
    configured = {"vllm": settings.block_size, "sglang": settings.page_size}
    sweep: dict[str, list[SweepPoint]] = {}
    for engine, size in configured.items():
        points = {s: int(results[(engine, s)][engine].sum()) for s in sizes if s != size}
        points[size] = int(known[engine].sum())
        sweep[engine] = [SweepPoint(s, points[s]) for s in sorted(points)]
    return sweep
