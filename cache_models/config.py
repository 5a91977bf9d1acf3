"""Engine configurations: the server flags that change which prompt tokens hit the cache."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

SglangEvictionPolicy = Literal["lru", "lfu", "slru", "priority", "tlru", "fifo", "mru", "filo"]
SGLANG_EVICTION_POLICIES: tuple[str, ...] = typing.get_args(SglangEvictionPolicy)
# What SGLang 0.5.23's server accepts for --radix-eviction-policy (arg_groups/choices.py
# RADIX_EVICTION_POLICY_CHOICES). fifo, mru and filo exist in mem_cache/evict_policy.py but the
# server refuses them: the model keeps them for what-if comparisons only.
SGLANG_SERVER_EVICTION_POLICIES: tuple[str, ...] = ("lru", "lfu", "slru", "priority", "tlru")


def blocks_in(capacity_tokens: int | None, size: int) -> int | None:
    """Whole blocks (vLLM) or pages (SGLang) of ``size`` tokens in a capacity (None: unbounded).
    The one place a capacity in tokens becomes blocks or pages."""
    return None if capacity_tokens is None else capacity_tokens // size


@dataclass(frozen=True)
class TimeModel:
    """Service times for a replay in arrival time: a request holds its KV from admission to finish.

    Prefill of the uncached prompt tokens takes ``uncached / prefill_tokens_per_s`` seconds, then
    each output token one decode step of ``1 / decode_tokens_per_s`` seconds.
    """

    prefill_tokens_per_s: float = 8000.0
    decode_tokens_per_s: float = 40.0

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("TimeModel rates must be positive")


@dataclass(frozen=True)
class VllmConfig:
    """vLLM v1 automatic prefix caching (one full-attention KV-cache group)."""

    block_size: int = 16
    # Usable KV capacity in tokens; usable blocks = capacity_tokens // block_size (the engine's
    # num_gpu_blocks is one more: block 0 is the reserved null block). None = unbounded.
    capacity_tokens: int | None = None
    # Requests in flight at once (max_num_seqs); 1 = strictly sequential replay.
    max_in_flight: int = 1
    # Replay in arrival time (needs Workload.arrival_s); None = by order only.
    time_model: TimeModel | None = None
    # --max-num-batched-tokens: the tokens Scheduler.schedule may schedule per step (chunked
    # prefill, vLLM's default). None = no budget: every admitted prompt is prefilled in the step
    # that admits it. vLLM's own default depends on the GPU and entry point (cli's --gpu).
    max_num_batched_tokens: int | None = None
    # --long-prefill-token-threshold (vLLM default 0 = off): at most this many prompt tokens of one
    # request per step, while more than one request is running or waiting.
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < max(
            1, self.max_in_flight
        ):
            raise ValueError(
                "max_num_batched_tokens must be >= max_in_flight (vLLM: max_num_batched_tokens "
                ">= max_num_seqs)"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.capacity_tokens is not None and self.capacity_tokens < self.block_size:
            raise ValueError("capacity_tokens must hold at least one block")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")

    @property
    def usable_blocks(self) -> int | None:
        """Blocks the cache holds (None: unbounded)."""
        return blocks_in(self.capacity_tokens, self.block_size)


@dataclass(frozen=True)
class SglangConfig:
    """SGLang RadixAttention prefix cache (UnifiedRadixCache, full attention)."""

    page_size: int = 1
    # KV pool size in token slots (max_total_num_tokens). None = unbounded.
    capacity_tokens: int | None = None
    eviction_policy: SglangEvictionPolicy = "lru"
    # --radix-eviction-policy-config {"protected_threshold": P} (SLRUStrategy, default 2): slru
    # protects nodes hit at least this often.
    slru_protected_threshold: int = 2
    # --radix-eviction-policy-config {"threshold": T, "next_prompt_estimate": Q} (TLRUStrategy;
    # tokens; the server needs T > Q >= 0 under tlru): a node is "tail-safe", evicted before any
    # other, when the tokens above it cover its branch's longest history + Q - T.
    tlru_threshold: int = 0
    tlru_next_prompt_estimate: int = 0
    # --chunked-prefill-size; 0 = no chunking (chunk boundaries become tree node boundaries).
    # SGLang's default depends on GPU memory (cli's --gpu picks it).
    chunked_prefill_size: int = 0
    # False = --disable-overlap-schedule: a stop finish then caches all outputs but the last,
    # like a max_new_tokens finish (no decode step still in flight when it stops).
    overlap_schedule: bool = True
    # SGLANG_ENABLE_WAITING_PREFIX_REFRESH (on by default in SGLang): with fcfs + lru, every 32nd
    # scheduling pass touches the waiting requests' whole prompts.
    waiting_prefix_refresh: bool = True
    max_in_flight: int = 1
    time_model: TimeModel | None = None

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.capacity_tokens is not None and self.capacity_tokens < self.page_size:
            raise ValueError("capacity_tokens must hold at least one page")
        if self.eviction_policy not in SGLANG_EVICTION_POLICIES:
            raise ValueError(f"unknown SGLang eviction policy {self.eviction_policy!r}")
        if self.slru_protected_threshold < 0:
            raise ValueError("slru_protected_threshold must be >= 0")
        if self.eviction_policy == "tlru" and not (
            self.tlru_threshold > self.tlru_next_prompt_estimate >= 0
        ):
            raise ValueError(
                "tlru needs threshold > next_prompt_estimate >= 0 (SGLang refuses other values: "
                "no token would ever be tail-safe)"
            )
        if self.chunked_prefill_size < 0:
            raise ValueError("chunked_prefill_size must be >= 0")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")

    @property
    def usable_pages(self) -> int | None:
        """Whole pages the KV pool holds (None: unbounded)."""
        return blocks_in(self.capacity_tokens, self.page_size)
