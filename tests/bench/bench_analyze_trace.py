"""``prefixcheck analyze`` end to end on a hash-id trace (prints, never asserts): wall time, CPU
time and peak resident memory of the whole command, as a user runs it.

    .venv/bin/python tests/bench/bench_analyze_trace.py [TRACE] [--block-size 16] [-- FLAGS...]

TRACE defaults to the Mooncake conversation trace (about 145M prompt tokens at 512 tokens per
hash id), expected at ../shared/data/traces/ beside the project (never copied into it). The first
run of a fresh checkout also compiles the numba kernels: the script runs the command twice and
reports both.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def run(command: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (GB) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=MOONCAKE)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="more analyze flags, after --")
    args = parser.parse_args()
    command = [
        sys.executable,
        "-c",
        "from cli.entry import main; main()",
        "analyze",
        str(args.trace),
        "--block-size",
        str(args.block_size),
        "--quiet",
        *[flag for flag in args.flags if flag != "--"],
    ]
    print(f"prefixcheck analyze {args.trace.name} --block-size {args.block_size}")
    for label in ("first run (compiles kernels)", "second run"):
        wall, cpu, rss = run(command)
        # ru_maxrss of children is the largest of any child so far, hence the running maximum.
        print(f"  {label:30} wall {wall:6.1f} s   cpu {cpu:6.1f} s   peak RSS {rss:5.2f} GB")


if __name__ == "__main__":
    main()
