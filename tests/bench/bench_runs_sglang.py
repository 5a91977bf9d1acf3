"""SGLang's sequential replay of a hash-id trace per run vs per token (prints, never asserts).

    .venv/bin/python tests/bench/bench_runs_sglang.py [--trace PATH] [--capacity TOKENS]

The Mooncake conversation trace (../shared/data/traces/, skipped without it) as a ``HashTrace``
(512-token ids; prompt L = input_length, N = max(1, output_length), the ids spell L tokens, stop
finishes), replayed at page size 1 (unbounded unless ``--capacity``) as runs (``run_table`` +
``run_workload``) and as the tokens they stand for (``expand``). Each form runs in a fresh process
after a warm-up (numba's on-disk cache), so its CPU seconds and peak RSS are its own; the hits
must be identical. Target: the run form well under 0.1 CPU-s (table, workload and replay).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench_paths import MOONCAKE  # beside this script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from analyzer.loaders import LoadResult, iter_records  # noqa: E402
from analyzer.workload import hash_trace_of  # noqa: E402
from cache_models.config import SglangConfig  # noqa: E402
from cache_models.hash_runs import HashTrace, run_table, run_workload  # noqa: E402
from cache_models.runs import expand  # noqa: E402
from cache_models.sglang_radix import SglangRadixCache  # noqa: E402

TARGET_CPU_S = 0.1


def read_trace(path: Path) -> HashTrace:
    """The trace as a ``HashTrace``, read by prefixcheck's own loader (as ``analyze`` reads it)."""
    return hash_trace_of(list(iter_records([path], "auto", LoadResult())))


def one_form(path: Path, form: str, capacity: int | None) -> dict[str, float]:
    """Read, build and replay in this process; CPU seconds per stage, peak RSS, hits."""
    trace = read_trace(path)
    cache = SglangRadixCache(SglangConfig(capacity_tokens=capacity))
    small = trace.select(slice(0, 20))  # warm-up: numba's cache, the builder's first calls
    cache.replay(run_workload(small, run_table(small))[0])
    cache.replay(expand(run_workload(small, run_table(small))[0])[0])
    stages: dict[str, float] = {}
    clock = time.process_time()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.process_time()
        stages[name] = now - clock
        clock = now

    runs, _ = run_workload(trace, run_table(trace))
    lap("build")
    if form == "tokens":
        workload, _ = expand(runs)
        lap("expand")
        del runs
    else:
        workload = runs
    result = cache.replay(workload)
    lap("replay")
    entries = len(runs.runs.prompt_tokens) if form == "runs" else int(workload.prompt_offsets[-1])
    return {
        **stages,
        "entries": entries,
        "hits": int(result.hit_tokens.sum()),
        "prompt_tokens": int(result.metrics["sglang:prompt_tokens_total"]),
        "evicted": int(result.counters["evicted_tokens"].sum()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=MOONCAKE)
    ap.add_argument("--capacity", type=int, default=None)
    ap.add_argument("--form", choices=("runs", "tokens"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.trace.exists():
        print(f"skipped: {args.trace} is absent")
        return
    if args.form:
        print(json.dumps(one_form(args.trace, args.form, args.capacity)))
        return
    figures = {}
    for form in ("runs", "tokens"):
        command = [sys.executable, __file__, "--trace", str(args.trace), "--form", form]
        if args.capacity is not None:
            command += ["--capacity", str(args.capacity)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        figures[form] = json.loads(done.stdout.splitlines()[-1])
    capacity = args.capacity or "unbounded"
    print(f"{args.trace.name}: SGLang sequential, page 1, capacity {capacity}")
    for form, f in figures.items():
        cpu = sum(f.get(stage, 0.0) for stage in ("build", "expand", "replay"))
        stages = ", ".join(f"{s} {f[s]:.3f}" for s in ("build", "expand", "replay") if s in f)
        print(
            f"  {form:6s}: {cpu:6.3f} CPU-s ({stages}); {f['entries']:,} prompt entries; "
            f"peak RSS {f['peak_rss_mb']:.0f} MB; hit {f['hits'] / f['prompt_tokens']:.4f} "
            f"of {f['prompt_tokens']:,} prompt tokens; {f['evicted']:,} evicted"
        )
    runs_cpu = sum(figures["runs"].get(s, 0.0) for s in ("build", "replay"))
    same = all(figures["runs"][k] == figures["tokens"][k] for k in ("hits", "evicted"))
    print(f"  run form {runs_cpu:.3f} CPU-s (target < {TARGET_CPU_S}); hits identical: {same}")


if __name__ == "__main__":
    main()
