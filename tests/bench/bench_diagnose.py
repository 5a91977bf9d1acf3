"""Diagnosis time on a large pre-tokenized workload (prints, never asserts).

    .venv/bin/python tests/bench/bench_diagnose.py [--requests 3000] [--capacity 200000]

The workload is ``bench_vllm_replay``'s chat traffic (long system prompts, growing conversations,
a salted tenant) with a varying value planted after the head of a quarter of the prompts. Prints
the time of each diagnosis stage after a warm-up run (JIT compilation excluded), and the
capacity curve's measured error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import analyzer.diagnose as diagnose_module
from analyzer.diagnose import DiagnoseInput, diagnose
from analyzer.replay import ReplaySettings, replay_all
from cache_models.workload import Workload
from tests.bench.bench_vllm_replay import chat_workload

STAGES = ("_salt_free", "find_dynamic_content", "capacity_curves", "size_sweep", "recommend")


def with_values(workload: Workload, seed: int = 1) -> Workload:
    """A 6-token varying value after the first 12 tokens of every fourth prompt."""
    rng = np.random.default_rng(seed)
    prompts = [workload.prompt(i) for i in range(workload.n_requests)]
    for i in range(0, len(prompts), 4):
        if len(prompts[i]) > 60:
            value = rng.integers(0, 150_000, 6, dtype=np.int32)
            prompts[i] = np.concatenate([prompts[i][:12], value, prompts[i][12:]])
    outputs = [workload.output(i) for i in range(workload.n_requests)]
    return Workload.from_arrays(prompts, outputs, workload.namespace, arrival_s=workload.arrival_s)


def timed(name: str, function: Callable[..., Any], times: dict[str, float]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = function(*args, **kwargs)
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
        return result

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--capacity", type=int, default=200_000)
    args = parser.parse_args()
    workload = with_values(chat_workload(args.requests))
    settings = ReplaySettings(capacity_tokens=args.capacity)
    print(f"{workload.n_requests:,} requests, {int(workload.prompt_offsets[-1]):,} prompt tokens")
    replays = replay_all(workload, settings)
    inputs = DiagnoseInput(
        workload,
        replays,
        settings,
        np.zeros(workload.n_requests, np.int32),
        None,
        None,
        False,
        check_curves=True,
    )
    diagnose(inputs)  # warm-up: compiles or loads every kernel
    times: dict[str, float] = {}
    for name in STAGES:
        setattr(diagnose_module, name, timed(name, getattr(diagnose_module, name), times))
    start = time.perf_counter()
    result = diagnose(inputs)
    total = time.perf_counter() - start
    for name in STAGES:
        print(f"  {name:22s} {times[name]:7.2f} s")
    print(f"  {'diagnose (all)':22s} {total:7.2f} s")
    prompt = int(workload.prompt_offsets[-1])
    for engine, curve in result.diagnosis.capacity_curves.items():
        print(
            f"{engine}: curve granularity {curve.granularity}, max error vs replays "
            f"{curve.max_abs_error(prompt):.2%} at {[c.capacity_tokens for c in curve.checks]}"
        )
    for site in result.diagnosis.dynamic_content:
        print(f"dynamic value at token {site.position}: {site.requests:,} requests")


if __name__ == "__main__":
    main()
