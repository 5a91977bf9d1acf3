"""The Mooncake hash-id trace replayed as runs (``cache_models.hash_runs``) beside its token
expansion (``cache_models.runs.expand``): CPU seconds (best of ``--repeats``) and peak RSS of each,
and their hits, which must be identical (prints, never asserts).

    .venv/bin/python tests/bench/bench_run_replay.py [--repeats 3] [--trace PATH]

Each (form, replay) runs in a fresh process, so its peak RSS is its own: the trace read with
msgspec (ids = hash_ids, L = input_length, n = max(1, output_length), known = L, 512-token
blocks, namespace 0, stop finishes), the run table and run workload built, a warm-up replay
(numba kernels come from their on-disk cache), then the timed replays. The token form is
expanded once, in a process of its own (its CPU-s printed; ``expand`` peaks at several GB), and
saved; its replays load it, so their peak RSS is the token workload's and the replay's.
Replays: vLLM sequential unbounded at 16- and 512-token blocks, the prefix trie (ideal).
Target: the run form's vLLM replay under 0.2 CPU-s at 512-token blocks (Dynamo: 1.1 CPU-s).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from bench_paths import MOONCAKE  # beside this script

if TYPE_CHECKING:
    from cache_models.hash_runs import HashTrace

ROOT = Path(__file__).resolve().parents[2]
REPLAYS = ("vllm16", "vllm512", "trie")
TARGET_S = 0.2  # the run form's vLLM replay at 512-token blocks


def read_trace(path: Path) -> HashTrace:
    """The trace as a ``HashTrace``, read by prefixcheck's own loader (as ``analyze`` reads it)."""
    from analyzer.loaders import LoadResult, iter_records
    from analyzer.workload import hash_trace_of

    return hash_trace_of(list(iter_records([path], "auto", LoadResult())))


TOKEN_COLUMNS = ("prompt_tokens", "prompt_offsets", "output_tokens", "output_offsets")


def expand_to(path: Path, saved: Path) -> None:
    """Expand the trace's run workload and save the token workload's columns to ``saved``."""
    from cache_models.hash_runs import run_table, run_workload
    from cache_models.runs import expand

    trace = read_trace(path)
    start = time.process_time()
    workload, _ = expand(run_workload(trace, run_table(trace))[0])
    expand_s = time.process_time() - start
    columns = {name: getattr(workload, name) for name in TOKEN_COLUMNS}
    np.savez(saved, **columns, stop_finish=workload.stop_finish)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"expand_s": expand_s, "peak_mb": peak_mb}))


def child(path: Path, form: str, replay: str, repeats: int, saved: Path) -> None:
    from cache_models.config import VllmConfig
    from cache_models.hash_runs import run_table, run_workload
    from cache_models.prefix_trie import PrefixTrie
    from cache_models.vllm_apc import VllmPrefixCache
    from cache_models.workload import Workload

    start = time.process_time()
    if form == "tokens":
        columns = np.load(saved)
        n = len(columns["stop_finish"])
        workload = Workload(
            **{name: columns[name] for name in TOKEN_COLUMNS},
            namespace=np.zeros(n, np.int32),
            stop_finish=columns["stop_finish"],
        )
    else:
        trace = read_trace(path)
        start = time.process_time()
        workload, _ = run_workload(trace, run_table(trace))
    build_s = time.process_time() - start
    if replay == "trie":
        run = lambda: PrefixTrie().replay(workload).hit_tokens  # noqa: E731
    else:
        model = VllmPrefixCache(VllmConfig(block_size=int(replay.removeprefix("vllm"))))
        run = lambda: model.replay(workload).hit_tokens  # noqa: E731
    hits = run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        hits = run()
        best = min(best, time.process_time() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    digest = hashlib.sha256(np.asarray(hits, np.int64).tobytes()).hexdigest()
    print(json.dumps({"cpu_s": best, "build_s": build_s, "peak_mb": peak_mb,
                      "hits": int(hits.sum()), "digest": digest}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", type=Path, default=MOONCAKE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("FORM", "REPLAY"))
    parser.add_argument("--expand-to", type=Path)
    parser.add_argument("--saved", type=Path)
    args = parser.parse_args()
    if args.expand_to:
        expand_to(args.trace, args.expand_to)
        return
    if args.child:
        child(args.trace, *args.child, args.repeats, args.saved)
        return
    if not args.trace.is_file():
        print(f"skipped: no trace at {args.trace}")
        return
    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "tokens.npz"
        expanded = run_child(args, ["--expand-to", str(saved)])
        print(
            f"{args.trace.name}: expand {expanded['expand_s']:.2f} CPU-s, peak "
            f"{expanded['peak_mb']:.0f} MB; replay CPU-s (best of {args.repeats}), load/build "
            "CPU-s, peak RSS"
        )
        for replay in REPLAYS:
            compare(args, replay, saved)


def run_child(args: argparse.Namespace, extra: list[str]) -> dict:
    command = [sys.executable, __file__, "--trace", str(args.trace), "--repeats"]
    out = subprocess.run(
        [*command, str(args.repeats), *extra], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace, replay: str, saved: Path) -> None:
    """One replay in both forms, and whether their per-request hits agree."""
    measured = {}
    for form in ("runs", "tokens"):
        measured[form] = m = run_child(args, ["--saved", str(saved), "--child", form, replay])
        print(
            f"  {replay:8} {form:6}  replay {m['cpu_s']:6.3f} CPU-s  build {m['build_s']:6.3f}"
            f"  peak {m['peak_mb']:7.0f} MB  hits {m['hits']:,}"
        )
    same = measured["runs"]["digest"] == measured["tokens"]["digest"]
    line = f"  {replay:8} per-request hits identical: {same}"
    if replay == "vllm512":
        line += f"; runs {measured['runs']['cpu_s']:.3f} CPU-s vs target < {TARGET_S}"
    print(line)


if __name__ == "__main__":
    main()
