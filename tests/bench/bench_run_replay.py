"""The Mooncake hash-id trace replayed as runs (``cache_models.hash_runs``) beside its token
expansion (``cache_models.runs.expand``): CPU seconds (best of ``--repeats``) and peak RSS of each,
and their hits, which must be identical (prints, never asserts).

    .venv/bin/python tests/bench/bench_run_replay.py [--repeats 3] [--trace PATH]

Each (form, replay) runs in a fresh process, so its peak RSS is its own: the trace read with
msgspec (ids = hash_ids, L = input_length, n = max(1, output_length), known = L, 512-token
blocks, namespace 0, stop finishes), the run table and run workload built (the token form then
expands it), a warm-up replay (numba kernels come from their on-disk cache), then the timed
replays. Replays: vLLM sequential unbounded at 16- and 512-token blocks, the prefix trie (ideal).
Target: the run form's vLLM replay under 0.2 CPU-s at 512-token blocks (Dynamo: 1.1 CPU-s).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TRACES = next(
    (up / "shared" / "data" / "traces" for up in ROOT.parents if (up / "shared").is_dir()),
    ROOT.parent / "shared" / "data" / "traces",
)
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"
REPLAYS = ("vllm16", "vllm512", "trie")
TARGET_S = 0.2  # the run form's vLLM replay at 512-token blocks


def read_trace(path: Path):
    """The trace as a ``HashTrace`` (the bench's own reader; ingest has the product's)."""
    import msgspec

    from cache_models.hash_runs import HashTrace
    from cache_models.workload import offsets_of

    class Row(msgspec.Struct):
        input_length: int
        output_length: int
        hash_ids: list[int]

    decoder = msgspec.json.Decoder(Row)
    rows = [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]
    n = len(rows)
    prompt = np.array([row.input_length for row in rows], np.int64)
    return HashTrace(
        ids=np.array([h for row in rows for h in row.hash_ids], np.int64),
        id_offsets=offsets_of(np.array([len(row.hash_ids) for row in rows], np.int64)),
        block_size=512,
        prompt_lengths=prompt,
        output_lengths=np.maximum(1, np.array([row.output_length for row in rows], np.int64)),
        known_lengths=prompt,
        namespace=np.zeros(n, np.int32),
        stop_finish=np.ones(n, bool),
    )


def child(path: Path, form: str, replay: str, repeats: int) -> None:
    from cache_models.config import VllmConfig
    from cache_models.hash_runs import run_table, run_workload
    from cache_models.prefix_trie import PrefixTrie
    from cache_models.runs import expand
    from cache_models.vllm_apc import VllmPrefixCache

    trace = read_trace(path)
    start = time.process_time()
    workload, _ = run_workload(trace, run_table(trace))
    build_s = time.process_time() - start
    if form == "tokens":
        start = time.process_time()
        workload, _ = expand(workload)
        build_s += time.process_time() - start
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
    digest = int(np.asarray(hits, np.int64) @ np.arange(1, len(hits) + 1, dtype=np.int64))
    print(json.dumps({"cpu_s": best, "build_s": build_s, "peak_mb": peak_mb,
                      "hits": int(hits.sum()), "digest": digest}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", type=Path, default=MOONCAKE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("FORM", "REPLAY"))
    args = parser.parse_args()
    if args.child:
        child(args.trace, *args.child, args.repeats)
        return
    if not args.trace.is_file():
        print(f"skipped: no trace at {args.trace}")
        return
    print(f"{args.trace.name}: replay CPU-s (best of {args.repeats}), build CPU-s, peak RSS")
    for replay in REPLAYS:
        measured = {}
        for form in ("runs", "tokens"):
            command = [sys.executable, __file__, "--trace", str(args.trace)]
            command += ["--repeats", str(args.repeats), "--child", form, replay]
            out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
            measured[form] = m = json.loads(out.stdout.strip().splitlines()[-1])
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
