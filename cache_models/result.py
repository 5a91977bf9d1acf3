"""What a replay returns: per-request hits and the counters that explain them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ReplayResult:
    """Per-request outcome of replaying a workload through one cache model.

    ``hit_tokens[i]`` is the number of prompt tokens of request i served from the prefix cache when
    it was first admitted (what the engine reports as cached tokens for it). ``counters`` holds
    per-request int64 arrays named by the model (for instance ``evicted_tokens``,
    ``inserted_tokens``); ``metrics`` holds run totals under the engine's own metric names (for
    instance ``vllm:prefix_cache_hits``), so users can put them next to their Prometheus numbers.
    """

    engine: str
    hit_tokens: np.ndarray
    counters: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)

    @property
    def total_hit_tokens(self) -> int:
        return int(self.hit_tokens.sum())
