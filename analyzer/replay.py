"""Replay a workload through both engines' cache models and the ideal cache."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from analyzer.progress import NoProgress, Progress
from cache_models.config import SglangConfig, TimeModel, VllmConfig
from cache_models.prefix_trie import PrefixTrie, TrieNodes
from cache_models.result import ReplayResult
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload

T = TypeVar("T")


@dataclass(frozen=True)
class ReplaySettings:
    """The engine flags a run replays with (one set shared by the CLI and the report)."""

    block_size: int = 16
    page_size: int = 1
    capacity_tokens: int | None = None
    eviction_policy: str = "lru"
    chunked_prefill_size: int = 0
    # Requests in flight at once; 1 = sequential (each request finishes before the next).
    max_in_flight: int = 1
    # Replay in arrival time with this service-time model (needs timestamps); None = by order.
    time_model: TimeModel | None = None

    def vllm(self) -> VllmConfig:
        return VllmConfig(
            block_size=self.block_size,
            capacity_tokens=self.capacity_tokens,
            max_in_flight=self.max_in_flight,
            time_model=self.time_model,
        )

    def sglang(self, page_size: int | None = None) -> SglangConfig:
        return SglangConfig(
            page_size=self.page_size if page_size is None else page_size,
            capacity_tokens=self.capacity_tokens,
            eviction_policy=self.eviction_policy,  # type: ignore[arg-type]
            chunked_prefill_size=self.chunked_prefill_size,
            max_in_flight=self.max_in_flight,
            time_model=self.time_model,
        )

    @property
    def streamable(self) -> bool:
        """Sequential replays can go chunk by chunk (nothing is in flight between chunks)."""
        return self.max_in_flight == 1 and self.time_model is None

    @property
    def mode(self) -> str:
        """The replay mode in words, for the report."""
        if self.time_model is not None:
            return (
                f"arrival time (up to {self.max_in_flight} in flight; prefill "
                f"{self.time_model.prefill_tokens_per_s:g} tokens/s, decode "
                f"{self.time_model.decode_tokens_per_s:g} tokens/s per request)"
            )
        if self.max_in_flight > 1:
            return f"concurrent (up to {self.max_in_flight} in flight, lock-step)"
        return "sequential"


@dataclass(frozen=True)
class Replays:
    """Per-request results, all in the workload's order."""

    vllm: ReplayResult
    sglang: ReplayResult
    sglang_page1: ReplayResult  # the same run when page_size is 1
    ideal: ReplayResult
    trie: TrieNodes


def replay_all(
    workload: Workload, settings: ReplaySettings, progress: Progress | None = None
) -> Replays:
    progress = progress or NoProgress()
    trie = PrefixTrie()
    jobs: dict[str, Callable[[], ReplayResult]] = {
        "vllm": lambda: VllmPrefixCache(settings.vllm()).replay(workload),
        "sglang": lambda: SglangRadixCache(settings.sglang()).replay(workload),
        "ideal": lambda: trie.replay(workload),
    }
    if settings.page_size != 1:
        jobs["sglang_page1"] = lambda: SglangRadixCache(settings.sglang(page_size=1)).replay(
            workload
        )
    progress.stage("replaying the caches", len(jobs))
    results = in_parallel(jobs, lambda: progress.advance(1))
    return Replays(
        vllm=results["vllm"],
        sglang=results["sglang"],
        sglang_page1=results.get("sglang_page1", results["sglang"]),
        ideal=results["ideal"],
        trie=trie.nodes,
    )


def in_parallel(
    jobs: dict[str, Callable[[], T]], done: Callable[[], None] | None = None
) -> dict[str, T]:
    """Run independent replays at once, in threads: the cache models' kernels release the GIL,
    so they use every core without copying the workload into other processes."""
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        results = {}
        for name, future in futures.items():
            results[name] = future.result()
            if done is not None:
                done()
    return results


def arrival_order(workload: Workload) -> np.ndarray | None:
    """The replay order when the log is not in arrival order (stable by timestamp), else None."""
    arrival = workload.arrival_s
    if arrival is None or bool(np.all(np.diff(arrival) >= 0)):
        return None
    return np.argsort(arrival, kind="stable")


def in_input_order(replays: Replays, order: np.ndarray) -> Replays:
    """Per-request results of a replay in ``order``, put back in input order."""

    def unpermute(result: ReplayResult) -> ReplayResult:
        def back(values: np.ndarray) -> np.ndarray:
            restored = np.empty_like(values)
            restored[order] = values
            return restored

        counters = {name: back(values) for name, values in result.counters.items()}
        return replace(result, hit_tokens=back(result.hit_tokens), counters=counters)

    first = replays.trie.first_request
    trie = replace(replays.trie, first_request=np.where(first >= 0, order[first], first))
    return Replays(
        vllm=unpermute(replays.vllm),
        sglang=unpermute(replays.sglang),
        sglang_page1=unpermute(replays.sglang_page1),
        ideal=unpermute(replays.ideal),
        trie=trie,
    )


def hit_rate(hit_tokens: np.ndarray, prompt_lengths: np.ndarray) -> float:
    total = int(prompt_lengths.sum())
    return int(hit_tokens.sum()) / total if total else 0.0


def mean_request_hit_rate(hit_tokens: np.ndarray, prompt_lengths: np.ndarray) -> float:
    return float(np.mean(hit_tokens / prompt_lengths)) if len(prompt_lengths) else 0.0
