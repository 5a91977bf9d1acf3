"""What ``prefixcheck measure`` found: per-request timings, fit, extrapolation (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from analyzer.measure.fit import CostModel, Extrapolation


@dataclass(frozen=True)
class EngineMeasurement:
    """One engine's cached-prefix prefill of a request; ``full_ms`` repeats the request's."""

    hit_tokens: int
    full_ms: float
    cached_ms: float
    cached_ms_min: float
    cached_ms_max: float
    logits_max_abs_diff: float
    logits_tolerance: float

    @property
    def logits_match(self) -> bool:
        return self.logits_max_abs_diff <= self.logits_tolerance


@dataclass(frozen=True)
class RequestMeasurement:
    request: int
    file: str
    line: int
    prompt_tokens: int
    full_ms: float
    full_ms_min: float
    full_ms_max: float
    engines: dict[str, EngineMeasurement]


@dataclass(frozen=True)
class SkippedRequest:
    request: int
    file: str
    line: int
    prompt_tokens: int
    reason: str


@dataclass(frozen=True)
class Measurement:
    device: str
    dtype: str
    model: dict[str, Any]  # the shape measured (ModelShape.to_dict)
    weights: str
    repeats: int
    warmup: int
    logits_rtol: float  # tolerance = logits_rtol · max(1, max |full-prefill logits|)
    sampled: int
    measurements: list[RequestMeasurement]
    skipped: list[SkippedRequest]
    fit: CostModel
    extrapolated: Extrapolation
    calibration: dict[str, Any] = field(default_factory=dict)

    @property
    def mismatches(self) -> list[str]:
        """Requests whose cached-prefix logits differ from the full prefill's beyond tolerance."""
        return [
            f"{m.file}:{m.line} ({engine}, {e.hit_tokens} of {m.prompt_tokens} tokens cached): "
            f"max |Δlogit| {e.logits_max_abs_diff:.3g} > {e.logits_tolerance:.3g}"
            for m in self.measurements
            for engine, e in m.engines.items()
            if not e.logits_match
        ]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["logits_mismatches"] = self.mismatches
        return data
