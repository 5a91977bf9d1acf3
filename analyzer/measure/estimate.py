"""The analytical prefill estimate: FLOPs and KV bytes from the model shape (no torch needed).

Prefilling ``new`` tokens on top of ``cached`` tokens already in the KV cache costs

- linear layers: ``2 · layer_params · layers`` FLOPs per new token (a multiply-add is 2 FLOPs);
- attention: ``4 · layers · heads · head_dim`` FLOPs per (query, key) pair (QKᵀ and PV), and the
  new token at position p attends to p + 1 keys, so ``new · cached + new · (new + 1) / 2`` pairs;
- the LM head on the last position only, as engines do: ``2 · hidden · vocab``.

A hit of ``h`` tokens saves the linear FLOPs of ``h`` tokens and the attention of their
``h · (h + 1) / 2`` pairs. The GPU-seconds are the FLOPs at an assumed effective throughput
(``ASSUMED_TFLOPS``); ``prefixcheck measure`` replaces that assumption by a measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from analyzer.measure.presets import ModelShape
from analyzer.shares import share

# Effective bf16 prefill throughput assumed for the seconds: an H100-class GPU at ~40% of peak.
ASSUMED_TFLOPS = 400.0
KV_DTYPE_BYTES = 2  # bf16 / fp16 KV cache


@dataclass(frozen=True)
class EngineEstimate:
    prefill_flops_saved: float
    prefill_flops_saved_share: float
    gpu_seconds_saved_at_assumed_tflops: float
    hit_kv_bytes: int  # KV bytes read from the cache instead of recomputed, summed over requests


@dataclass(frozen=True)
class PrefillEstimate:
    """What the log's prefills cost on a model shape, and what each engine's hits save."""

    model: str
    params: int
    linear_flops_per_token: int
    attention_flops_per_token_pair: int
    kv_bytes_per_token: int
    prefill_flops: float  # the whole log without any cache
    assumed_tflops: float
    engines: dict[str, EngineEstimate]
    distinct_tokens_kv_bytes: int  # KV of every distinct cached token (an unbounded cache)
    capacity_kv_bytes: int | None  # KV of --capacity-tokens on this shape

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def linear_flops_per_token(shape: ModelShape) -> int:
    return 2 * shape.n_layers * shape.layer_params


def attention_flops_per_pair(shape: ModelShape) -> int:
    return 4 * shape.n_layers * shape.n_heads * shape.head_dim


def prefill_flops(
    shape: ModelShape, new_tokens: np.ndarray, cached_tokens: np.ndarray
) -> np.ndarray:
    """FLOPs to prefill ``new_tokens`` on top of ``cached_tokens`` (elementwise, float64)."""
    new = np.asarray(new_tokens, np.float64)
    cached = np.asarray(cached_tokens, np.float64)
    pairs = new * cached + new * (new + 1) / 2
    head = 2.0 * shape.hidden_size * shape.vocab_size
    return linear_flops_per_token(shape) * new + attention_flops_per_pair(shape) * pairs + head


def prefill_estimate(
    shape: ModelShape,
    prompt_lengths: np.ndarray,
    hit_tokens: dict[str, np.ndarray],
    distinct_tokens: int,
    capacity_tokens: int | None,
) -> PrefillEstimate:
    """The estimate for a whole log: per request prompt lengths and each engine's hits."""
    zeros = np.zeros_like(prompt_lengths)
    full = prefill_flops(shape, prompt_lengths, zeros)
    total = float(full.sum())
    kv_bytes = shape.kv_bytes_per_token(KV_DTYPE_BYTES)
    engines = {}
    for engine, hits in hit_tokens.items():
        saved = float((full - prefill_flops(shape, prompt_lengths - hits, hits)).sum())
        engines[engine] = EngineEstimate(
            prefill_flops_saved=saved,
            prefill_flops_saved_share=share(saved, total),
            gpu_seconds_saved_at_assumed_tflops=saved / (ASSUMED_TFLOPS * 1e12),
            hit_kv_bytes=int(hits.sum()) * kv_bytes,
        )
    return PrefillEstimate(
        model=shape.name,
        params=shape.params,
        linear_flops_per_token=linear_flops_per_token(shape),
        attention_flops_per_token_pair=attention_flops_per_pair(shape),
        kv_bytes_per_token=kv_bytes,
        prefill_flops=total,
        assumed_tflops=ASSUMED_TFLOPS,
        engines=engines,
        distinct_tokens_kv_bytes=distinct_tokens * kv_bytes,
        capacity_kv_bytes=None if capacity_tokens is None else capacity_tokens * kv_bytes,
    )
