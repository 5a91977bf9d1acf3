"""vLLM APC replay speed on a large pre-tokenized workload (prints, never asserts).

    .venv/bin/python tests/bench/bench_vllm_replay.py [--requests 40000] [--reference 500]

The workload mimics chat traffic: long system prompts, conversations whose next prompt holds the
previous prompt and answer, fresh requests, a salted tenant. JIT compilation is excluded (a
warm-up replay first). Prints prompt tokens per second (per wall and per CPU second) for each
replay mode, and for the reference on the first ``--reference`` requests.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cache_models.config import TimeModel, VllmConfig
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload

VOCAB = 150_000
MAX_CONVERSATION = 32_000


def chat_workload(n_requests: int, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)

    def text(lo: int, hi: int) -> np.ndarray:
        return rng.integers(0, VOCAB, int(rng.integers(lo, hi)), dtype=np.int32)

    systems = [text(500, 4000) for _ in range(16)]
    chats: list[np.ndarray] = []
    prompts, outputs = [], []
    for _ in range(n_requests):
        k = int(rng.integers(len(chats))) if chats and rng.random() < 0.6 else -1
        if k >= 0:
            prompt = np.concatenate([chats[k], text(20, 400)])
        else:
            prompt = np.concatenate([systems[int(rng.integers(len(systems)))], text(20, 800)])
        output = text(10, 500)
        prompts.append(prompt)
        outputs.append(output)
        history = np.concatenate([prompt, output])
        if k >= 0 and len(history) > MAX_CONVERSATION:
            chats.pop(k)
        elif k >= 0:
            chats[k] = history
        elif len(chats) < 300:
            chats.append(history)
    namespace = (rng.random(n_requests) < 0.1).astype(np.int32)
    arrival = np.cumsum(rng.exponential(0.05, n_requests))
    return Workload.from_arrays(prompts, outputs, namespace, arrival_s=arrival)


def timed(cache: VllmPrefixCache, workload: Workload) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (the machine may be shared) and hit rate of one replay."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = cache.replay(workload)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, result.total_hit_tokens / workload.prompt_lengths.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--reference", type=int, default=500)
    args = parser.parse_args()
    start = time.perf_counter()
    workload = chat_workload(args.requests)
    prompt_tokens = int(workload.prompt_lengths.sum())
    print(
        f"workload: {workload.n_requests} requests, {prompt_tokens / 1e6:.1f}M prompt tokens, "
        f"{int(workload.output_lengths.sum()) / 1e6:.1f}M output tokens "
        f"(built in {time.perf_counter() - start:.1f} s)"
    )
    modes = {
        "sequential, unbounded": VllmConfig(block_size=16),
        "sequential, 1M-token cache": VllmConfig(block_size=16, capacity_tokens=1 << 20),
        "lock-step 64 in flight, 1M-token cache": VllmConfig(
            block_size=16, capacity_tokens=1 << 20, max_in_flight=64
        ),
        "arrival time 256 in flight, 1M-token cache": VllmConfig(
            block_size=16, capacity_tokens=1 << 20, max_in_flight=256, time_model=TimeModel()
        ),
    }
    small = workload.select(np.arange(min(50, workload.n_requests)))
    for name, config in modes.items():
        cache = VllmPrefixCache(config)
        start = time.perf_counter()
        cache.replay(small)  # compiles the kernel (or loads it from numba's cache)
        compile_s = time.perf_counter() - start
        wall, cpu, hit_rate = timed(cache, workload)
        print(
            f"{name:44s} {prompt_tokens / wall / 1e6:6.1f}M prompt tokens/s "
            f"(per CPU second {prompt_tokens / cpu / 1e6:.1f}M; {wall:.2f} s, "
            f"hit rate {hit_rate:.3f}, warm-up {compile_s:.1f} s)"
        )
    subset = workload.select(np.arange(min(args.reference, workload.n_requests)))
    subset = replace(subset, arrival_s=None)
    wall, _, _ = timed(VllmPrefixCache(modes["sequential, unbounded"], "reference"), subset)
    print(
        f"{'reference, sequential, unbounded':44s} "
        f"{subset.prompt_lengths.sum() / wall / 1e6:6.1f}M prompt tokens/s "
        f"({subset.n_requests} requests, {wall:.2f} s)"
    )


if __name__ == "__main__":
    main()
