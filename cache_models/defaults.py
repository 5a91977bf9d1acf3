"""The engines' defaults that depend on the GPU: what a server started without the flag uses.

- vLLM 0.33 ``--max-num-batched-tokens`` (``EngineArgs.get_batch_defaults`` in
  ``engine/arg_utils.py``): 16384 on GPUs of 160 GiB or more (B200, B300) for both entry points;
  on GPUs of 70 GiB or more that are not A100s (H100, H200): 8192 for the OpenAI server, 16384
  for the ``LLM`` class; otherwise (A100, L40S, L4, T4, ...): 2048 for the server, 8192 for
  ``LLM``. ``--long-prefill-token-threshold`` defaults to 0 (off) everywhere.
- SGLang 0.5.23 ``--chunked-prefill-size`` (``_handle_gpu_memory_settings`` in
  ``arg_groups/memory_hook.py``, on the GPU's memory in MiB): 2048 below 20 GiB, 4096 below 60 GiB,
  8192 below 160 GiB, 16384 from 160 GiB; 4096 when the memory is unknown.

Both assume one GPU per engine (no data-parallel attention, no pipeline parallelism).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

VllmEntryPoint = Literal["server", "llm"]


@dataclass(frozen=True)
class Gpu:
    """A GPU as the engines' default logic sees it: its name and memory."""

    name: str
    memory_gib: float

    @property
    def is_a100(self) -> bool:
        return "a100" in self.name.lower()


# Memory as torch reports it (GiB), which is what both engines compare with their thresholds.
KNOWN_GPUS: dict[str, Gpu] = {
    "T4": Gpu("T4", 15.6),
    "L4": Gpu("L4", 22.0),
    "A10": Gpu("A10", 22.0),
    "A10G": Gpu("A10G", 22.0),
    "RTX4090": Gpu("RTX4090", 23.6),
    "L40S": Gpu("L40S", 44.4),
    "A100-40GB": Gpu("A100-40GB", 39.4),
    "A100": Gpu("A100", 79.1),
    "A100-80GB": Gpu("A100-80GB", 79.1),
    "H100": Gpu("H100", 79.1),
    "H800": Gpu("H800", 79.1),
    "H20": Gpu("H20", 95.0),
    "GH200": Gpu("GH200", 95.0),
    "H200": Gpu("H200", 139.8),
    "B200": Gpu("B200", 178.4),
    "MI300X": Gpu("MI300X", 191.5),
    "B300": Gpu("B300", 268.0),
}
DEFAULT_GPU = "H100"
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:g|gb|gib)?$", re.IGNORECASE)


def parse_gpu(text: str) -> Gpu:
    """A known GPU name (``H100``, ``A100-40GB``; case-insensitive) or a memory size (``80GB``,
    ``141``: GiB); ValueError otherwise."""
    by_name = {name.lower(): gpu for name, gpu in KNOWN_GPUS.items()}
    gpu = by_name.get(text.strip().lower())
    if gpu is not None:
        return gpu
    size = _MEMORY.match(text.strip())
    if size is None or float(size.group(1)) <= 0:
        known = ", ".join(KNOWN_GPUS)
        raise ValueError(f"not a GPU name ({known}) nor a memory size such as 80GB")
    return Gpu(f"{float(size.group(1)):g} GiB GPU", float(size.group(1)))


def vllm_max_num_batched_tokens(gpu: Gpu, entry_point: VllmEntryPoint = "server") -> int:
    """vLLM 0.33's default ``--max-num-batched-tokens`` on ``gpu``."""
    if gpu.memory_gib >= 160:
        return 16384
    if gpu.memory_gib >= 70 and not gpu.is_a100:
        return 8192 if entry_point == "server" else 16384
    return 2048 if entry_point == "server" else 8192


def sglang_chunked_prefill_size(gpu: Gpu) -> int:
    """SGLang 0.5.23's default ``--chunked-prefill-size`` on ``gpu``."""
    mib = gpu.memory_gib * 1024
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 160 * 1024:
        return 8192
    return 16384
