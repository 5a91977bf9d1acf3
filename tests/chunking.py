"""Streaming checks: a workload cut into random chunks; chunk results against one replay."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from cache_models.result import ReplayResult
from cache_models.workload import Workload


def random_chunks(workload: Workload, seed: int) -> list[Workload]:
    """Consecutive chunks of random sizes covering the workload: some empty, some of one request."""
    rng = np.random.default_rng(seed)
    n = workload.n_requests
    cuts = rng.integers(0, n + 1, int(rng.integers(1, 16)))
    singles = rng.integers(0, n + 1, 3)  # chunks of one request
    edges = np.unique(np.minimum(np.concatenate([[0, n], cuts, singles, singles + 1]), n))
    edges = np.sort(np.concatenate([edges, rng.choice(edges, 2)]))  # repeated edges: empty chunks
    return [workload.select(np.arange(a, b)) for a, b in pairwise(edges)]


def assert_chunks_add_up(parts: list[ReplayResult], whole: ReplayResult) -> None:
    """The chunks' rows are the whole replay's, every counter too, and their metrics sum to its."""
    hits = np.concatenate([part.hit_tokens for part in parts])
    np.testing.assert_array_equal(hits, whole.hit_tokens)
    for name, values in whole.counters.items():
        chunked = np.concatenate([part.counters[name] for part in parts])
        np.testing.assert_array_equal(chunked, values, err_msg=name)
    for name, value in whole.metrics.items():
        assert sum(part.metrics[name] for part in parts) == value, name
