"""The prefill cost model fitted to measurements, and its extrapolation to a whole log.

    time_ms = a + b · new + c · new · context,   context = cached + (new + 1) / 2

``new`` tokens are prefilled on top of ``cached`` ones; ``context`` is the mean number of keys a
new token attends to, so ``b`` prices the linear layers per token and ``c`` the attention per
(query, key) pair, the two terms of the analytical FLOPs. The fit is least squares with
non-negative coefficients (every subset of the three terms is fitted and the best feasible one
kept), so an extrapolated time never goes below zero or shrinks with a longer prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import numpy as np

TTFT_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class CostModel:
    intercept_ms: float
    per_token_ms: float
    per_token_context_ms: float
    r_squared: float
    points: int

    def predict_ms(self, new_tokens: np.ndarray, cached_tokens: np.ndarray) -> np.ndarray:
        return _design(new_tokens, cached_tokens) @ np.array(
            [self.intercept_ms, self.per_token_ms, self.per_token_context_ms]
        )


@dataclass(frozen=True)
class EngineExtrapolation:
    prefill_seconds: float
    prefill_seconds_saved: float
    prefill_time_saved_share: float
    ttft_ms: dict[str, float]  # prefill-only time to first token, percentiles over requests


@dataclass(frozen=True)
class Extrapolation:
    """The cost model over every request of the log (prefill alone, one request at a time)."""

    requests: int
    prefill_seconds_without_cache: float
    ttft_ms_without_cache: dict[str, float]
    engines: dict[str, EngineExtrapolation]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_cost_model(
    new_tokens: np.ndarray, cached_tokens: np.ndarray, times_ms: np.ndarray
) -> CostModel:
    """Non-negative least squares of ``times_ms`` on the three terms."""
    design = _design(new_tokens, cached_tokens)
    times = np.asarray(times_ms, np.float64)
    scale = np.abs(design).max(axis=0)  # columns span orders of magnitude: solve them scaled
    scale[scale == 0] = 1.0
    best: tuple[float, np.ndarray] | None = None
    for size in (1, 2, 3):
        for columns in combinations(range(3), size):
            picked = list(columns)
            solution = np.linalg.lstsq(design[:, picked] / scale[picked], times, rcond=None)[0]
            solution = solution / scale[picked]
            if (solution < 0).any():
                continue
            coefficients = np.zeros(3)
            coefficients[picked] = solution
            residual = float(np.sum((design @ coefficients - times) ** 2))
            if best is None or residual < best[0] - 1e-12 * max(1.0, best[0]):
                best = (residual, coefficients)
    assert best is not None  # the intercept alone is the mean of positive times
    residual, (a, b, c) = best
    spread = float(np.sum((times - times.mean()) ** 2))
    return CostModel(
        intercept_ms=float(a),
        per_token_ms=float(b),
        per_token_context_ms=float(c),
        r_squared=1.0 - residual / spread if spread else 1.0,
        points=len(times),
    )


def extrapolate(
    model: CostModel, prompt_lengths: np.ndarray, hit_tokens: dict[str, np.ndarray]
) -> Extrapolation:
    """Prefill seconds for the whole log without a cache and with each engine's hits."""
    full_ms = model.predict_ms(prompt_lengths, np.zeros_like(prompt_lengths))
    full_s = float(full_ms.sum()) / 1e3
    engines = {}
    for engine, hits in hit_tokens.items():
        cached_ms = model.predict_ms(prompt_lengths - hits, hits)
        cached_s = float(cached_ms.sum()) / 1e3
        engines[engine] = EngineExtrapolation(
            prefill_seconds=cached_s,
            prefill_seconds_saved=full_s - cached_s,
            prefill_time_saved_share=(full_s - cached_s) / full_s if full_s else 0.0,
            ttft_ms=_percentiles(cached_ms),
        )
    return Extrapolation(
        requests=len(prompt_lengths),
        prefill_seconds_without_cache=full_s,
        ttft_ms_without_cache=_percentiles(full_ms),
        engines=engines,
    )


def _design(new_tokens: np.ndarray, cached_tokens: np.ndarray) -> np.ndarray:
    new = np.asarray(new_tokens, np.float64)
    context = np.asarray(cached_tokens, np.float64) + (new + 1) / 2
    return np.column_stack([np.ones_like(new), new, new * context])


def _percentiles(values_ms: np.ndarray) -> dict[str, float]:
    points = np.percentile(values_ms, TTFT_PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(TTFT_PERCENTILES, points, strict=True)}
