"""Sequential SGLang replay speed on a large pre-tokenized workload (prints, never asserts).

    .venv/bin/python tests/bench/bench_sglang_replay.py [--requests 20000]

The workload mimics chat traffic: a few long system prompts, conversations whose next prompt holds
the previous prompt and answer, fresh requests. JIT compilation is excluded (a warm-up replay).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cache_models.config import SglangConfig
from cache_models.sglang_radix import SglangRadixCache
from cache_models.workload import Workload

VOCAB = 150_000
MAX_CONVERSATION = 16_000


def chat_workload(n_requests: int, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)

    def text(lo: int, hi: int) -> np.ndarray:
        return rng.integers(0, VOCAB, int(rng.integers(lo, hi)), dtype=np.int32)

    systems = [text(300, 3000) for _ in range(16)]
    open_chats: list[np.ndarray] = []
    prompts, outputs = [], []
    for _ in range(n_requests):
        if open_chats and rng.random() < 0.6:
            k = int(rng.integers(len(open_chats)))
            prompt = np.concatenate([open_chats[k], text(20, 400)])
        else:
            k = -1
            prompt = np.concatenate([systems[int(rng.integers(len(systems)))], text(20, 800)])
        output = text(10, 500)
        prompts.append(prompt)
        outputs.append(output)
        history = np.concatenate([prompt, output])
        if k >= 0:
            open_chats[k] = history
        elif len(open_chats) < 200:
            open_chats.append(history)
        if len(history) > MAX_CONVERSATION and k >= 0:
            open_chats.pop(k)
    namespace = (rng.random(n_requests) < 0.1).astype(np.int32)
    stop = rng.random(n_requests) < 0.7
    return Workload.from_arrays(prompts, outputs, namespace, stop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    args = ap.parse_args()
    workload = chat_workload(args.requests)
    warm = workload.select(np.arange(200))
    prompt_tokens = int(workload.prompt_lengths.sum())
    print(f"{workload.n_requests} requests, {prompt_tokens / 1e6:.1f}M prompt tokens")
    for page_size in (1, 16):
        for capacity in (None, 2_000_000, 200_000):
            for policy in ("lru", "lfu"):
                config = SglangConfig(
                    page_size=page_size, capacity_tokens=capacity, eviction_policy=policy
                )
                cache = SglangRadixCache(config)
                cache.replay(warm)
                start, cpu = time.perf_counter(), time.process_time()
                result = cache.replay(workload)
                seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                hit_rate = result.hit_tokens.sum() / prompt_tokens
                print(
                    f"page {page_size:2d} capacity {capacity or 'unbounded':>9} {policy}: "
                    f"{prompt_tokens / seconds / 1e6:6.1f}M prompt tokens/s "
                    f"({seconds:.2f} s, {cpu:.2f} s of CPU, hit rate {hit_rate:.3f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
