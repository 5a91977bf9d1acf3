"""Fleet replays on the Mooncake conversation trace (prints, never asserts): one instance and
2/4/8 replicas under round-robin, consistent hash on the first block, SGLang's cache_aware and
Dynamo's KV router, unbounded and at a per-replica capacity, each with its run time.

    .venv/bin/python tests/bench/bench_fleet.py [TRACE] [--capacity 1000000] [--replicas 2 4 8]

What ``analyze --replicas N --router R --replay-in-time [--capacity-tokens C]`` computes: routing
in arrival time (the service-time model's defaults, up to 256 in flight per replica), each replica
replaying its share in arrival time through its own vLLM (block 16) and SGLang (page 1) caches,
one instance holding N x C beside them. Run time = routing + the replicas' replays (the single
instance is timed apart).
The trace is expected at ../shared/data/traces/ beside the project (never copied into it).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from analyzer.fleet import FleetOptions, place  # noqa: E402
from analyzer.ingest import ChunkedIngest, IngestOptions  # noqa: E402
from analyzer.progress import NoProgress  # noqa: E402
from analyzer.replay import ReplaySettings  # noqa: E402
from cache_models.config import TimeModel  # noqa: E402
from cache_models.sglang_radix import SglangRadixCache  # noqa: E402
from cache_models.vllm_apc import VllmPrefixCache  # noqa: E402
from cache_models.workload import Workload  # noqa: E402

MOONCAKE = Path("/work/shared/data/traces/mooncake_conversation_trace.jsonl")
if not MOONCAKE.exists():  # a checkout beside shared/
    MOONCAKE = ROOT.parent / "shared" / "data" / "traces" / MOONCAKE.name
ROUTERS = (
    ("round-robin", None),
    ("hash", "first-block"),
    ("sglang-cache-aware", None),
    ("dynamo-kv", None),
)


def load(path: Path) -> Workload:
    reader = ChunkedIngest([path], IngestOptions(), NoProgress())
    return reader.finished(list(reader.chunks(1 << 20))).tokenized.workload


def engines(workload: Workload, settings: ReplaySettings) -> tuple[int, int]:
    vllm = VllmPrefixCache(settings.vllm()).replay(workload).total_hit_tokens
    sglang = SglangRadixCache(settings.sglang()).replay(workload).total_hit_tokens
    return vllm, sglang


def keys(workload: Workload, field: str | None) -> list[str | None]:
    if field != "first-block":
        return [None] * workload.n_requests
    return [workload.prompt(i)[:16].tobytes().hex() for i in range(workload.n_requests)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=MOONCAKE)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    if not args.trace.exists():
        sys.exit(f"no trace at {args.trace}")
    workload = load(args.trace)
    total = int(workload.prompt_lengths.sum())
    print(f"{args.trace.name}: {workload.n_requests:,} requests, {total:,} prompt tokens")
    base = ReplaySettings(max_in_flight=256, time_model=TimeModel())
    for capacity in (None, args.capacity):
        label = "unbounded" if capacity is None else f"{capacity:,} tokens per replica"
        print(f"\n== {label} (vLLM hit rate / SGLang hit rate, run time)")
        settings = replace(base, capacity_tokens=capacity)
        start = time.perf_counter()
        v, s = engines(workload, settings)
        print(
            f"  one instance            {v / total:6.1%} / {s / total:6.1%}  "
            f"{time.perf_counter() - start:6.1f} s"
        )
        for n in args.replicas:
            if capacity is not None:  # unbounded: N times nothing is the instance above
                whole = replace(settings, capacity_tokens=capacity * n)
                start = time.perf_counter()
                v, s = engines(workload, whole)
                print(
                    f"  one instance x{n} capacity {v / total:6.1%} / {s / total:6.1%}  "
                    f"{time.perf_counter() - start:6.1f} s"
                )
            for router, field in ROUTERS:
                start = time.perf_counter()
                placement = place(
                    workload,
                    keys(workload, field),
                    settings,
                    FleetOptions(n, router, session_field=field),
                )
                routed = time.perf_counter() - start
                hits = np.zeros(2, np.int64)
                for r in range(n):
                    rows = np.flatnonzero(placement.replica == r)
                    if len(rows):
                        hits += engines(workload.select(rows), settings)
                counts = np.bincount(placement.replica, minlength=n)
                name = router + (f" ({field})" if field else "")
                print(
                    f"  {n} x {name:26} {hits[0] / total:6.1%} / {hits[1] / total:6.1%}  "
                    f"{time.perf_counter() - start:6.1f} s (routing {routed:5.1f} s)  "
                    f"requests max/mean {counts.max() / counts.mean():4.2f}"
                )
                sys.stdout.flush()


if __name__ == "__main__":
    main()
