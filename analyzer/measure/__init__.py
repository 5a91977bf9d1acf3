"""GPU execution mode: real prefills with and without the cached prefix (needs the gpu extra).

Everything torch-free (the shape presets, the analytical estimate, sampling, the fit) imports
without torch; ``measurer`` imports torch only when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.errors import PrefixcheckError
from analyzer.progress import Progress

if TYPE_CHECKING:
    from analyzer.analysis import Analysis
    from analyzer.measure.result import Measurement

GPU_EXTRA_MISSING = (
    "prefixcheck measure needs the gpu extra ({missing} is not installed): "
    "pip install 'prefixcheck[gpu]' (for a CPU-only torch, pip install torch==2.13.0 first)"
)


@dataclass(frozen=True)
class MeasureOptions:
    model_preset: str | None = None  # None: llama-3.1-8b on CUDA, tiny on CPU
    model_path: Path | None = None  # a local Hugging Face folder instead of a preset
    layers: int | None = None
    device: str = "auto"  # auto, cuda or cpu
    dtype: str | None = None  # bf16, fp16 or fp32; None: bf16 on CUDA, fp32 on CPU
    sample: int = 64
    repeats: int = 5
    warmup: int = 1
    seed: int = 0


def measurer(options: MeasureOptions) -> Callable[[Analysis, Progress], Measurement]:
    """Check the gpu extra, the device, the dtype and the model now, before a long analysis;
    the function that then measures an analysis. Imports torch only here."""
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise PrefixcheckError(GPU_EXTRA_MISSING.format(missing=exc.name)) from None
    from analyzer.measure.run import Measurer

    return Measurer(options)
