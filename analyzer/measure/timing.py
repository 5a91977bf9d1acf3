"""Timing one GPU or CPU call: warm-up, synchronised repeats, median and spread.

On CUDA each repeat sits between two CUDA events recorded on the current stream and the host
synchronises once after all repeats, so the times are the GPU's own; on CPU, where torch runs
synchronously, ``time.perf_counter`` brackets each call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds over the repeats."""

    median_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def of(cls, samples_ms: list[float]) -> Timing:
        return cls(float(np.median(samples_ms)), min(samples_ms), max(samples_ms))


class Timer:
    """Times calls on one device; the events are created once, outside any timed region."""

    def __init__(self, device: torch.device, repeats: int, warmup: int) -> None:
        self.device, self.repeats, self.warmup = device, repeats, warmup
        self._events = (
            [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(repeats)]
            if device.type == "cuda"
            else []
        )  # fmt: skip

    def time(self, call: Callable[[], torch.Tensor]) -> tuple[Timing, torch.Tensor]:
        """The timing of ``call`` and what its last run returned."""
        for _ in range(self.warmup):
            call()
        if self.device.type == "cuda":
            return self._time_cuda(call)
        samples = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            result = call()
            samples.append((time.perf_counter() - start) * 1e3)
        return Timing.of(samples), result

    def _time_cuda(self, call: Callable[[], torch.Tensor]) -> tuple[Timing, torch.Tensor]:
        torch.cuda.synchronize(self.device)
        for start, end in self._events:
            start.record()
            result = call()
            end.record()
        torch.cuda.synchronize(self.device)
        return Timing.of([start.elapsed_time(end) for start, end in self._events]), result
