"""``--executor ray`` on a synthetic chat log of about 50M prompt tokens (prints, never asserts):
tokens per second per worker for 1 and 2 workers, ingest and replay timed separately.

Ingest: read, render and tokenize on the workers ("tasks s": until every shard is read), then the
chunks cut on the driver from the shards' request tables. Replay: vLLM + SGLang caches in one
actor per model; past the first chunk each actor fetches its model's keyed token tables itself.

    .venv/bin/python tests/bench/bench_ray.py [--tokens 5e7] [--files 8] [--workers 1 2]

The log is the bundled example's conversations copied until the token count is reached, each
copy's last user turn made distinct (so that the tokenizer does the work, not its dedup), half
the copies sent to a second model (two pools: two replay actors). No token cache. Each worker
count runs in a fresh process with ``ray.init(num_cpus=N)``. Targets: ingest tokens/s per worker
near the local tokenizer's single-core rate (bench_tokenize.py), and replay near
bench_streaming_replay.py's rate; the 2-worker ingest row per worker near the 1-worker row.
Replay actors reserve no CPU (Ray's default for actors), so both rows replay with the same two
actors: the replay column is per actor (each feeds its pool's vLLM and SGLang caches). The
ceiling's prefix trie (one actor reading every pool's tables) is timed after the replay.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"


def write_log(folder: Path, tokens: float, files: int) -> list[Path]:
    """Copies of the example's requests (about 193 prompt tokens each) in ``files`` files."""
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    per_row = 115_900 / len(rows)  # the example's prompt tokens per request
    copies = max(1, int(tokens / per_row / len(rows)))
    handles = [(folder / f"log-{i:02d}.jsonl").open("w") for i in range(files)]
    n = 0
    for copy in range(copies):
        for row in rows:
            request = json.loads(json.dumps(row))
            body = request.get("request", request)
            body["model"] = ["model-a", "model-b"][copy % 2]
            last = body["messages"][-1]
            last["content"] = f"{last['content']} (case {copy}-{n})"
            handles[n * files // (copies * len(rows))].write(json.dumps(request) + "\n")
            n += 1
    for handle in handles:
        handle.close()
    return sorted(folder.glob("log-*.jsonl"))


def one_run(workers: int, paths: list[str]) -> dict:
    """Ingest and replay on a fresh local cluster of ``workers`` CPUs."""
    import ray

    from analyzer.executors import ExecutorOptions
    from analyzer.executors.ray_executor import RayExecutor
    from analyzer.ingest import IngestOptions
    from analyzer.pipeline import AnalyzeOptions
    from analyzer.pool import CachePool, model_labels
    from analyzer.progress import NoProgress

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    options = AnalyzeOptions(ingest=IngestOptions(cache_dir=None), sample_tokens=1)
    executor = RayExecutor.connect(ExecutorOptions("ray"))
    reader = executor.reader([Path(p) for p in paths], options.ingest, NoProgress(), 1)
    began = time.perf_counter()
    chunks = [chunk.tokenized for chunk in reader.chunks()]
    ingest_s = time.perf_counter() - began
    tokens = sum(int(c.workload.prompt_offsets[-1]) for c in chunks)
    pool = CachePool(options.settings, options.settings.engines, None, executor.caches())
    began = time.perf_counter()
    for chunk in chunks:
        pool.feed(chunk.workload, model_labels(chunk.requests["model"]))
    replay_s = time.perf_counter() - began
    trie = executor.trie()  # the ceiling: one actor over every pool's requests
    began = time.perf_counter()
    for chunk in chunks:
        trie.feed(chunk.workload)
    ceiling_s = time.perf_counter() - began
    executor.close()
    ray.shutdown()
    return {
        "workers": workers,
        "tokens": tokens,
        "ingest_s": ingest_s,
        "tasks_s": reader.tasks_seconds,
        "replay_s": replay_s,
        "ceiling_s": ceiling_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=5e7)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(one_run(args.run, args.paths)))
        return
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        paths = write_log(Path(folder), args.tokens, args.files)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"log: {len(paths)} files, {size / 1e6:,.0f} MB, written in "
            f"{time.perf_counter() - began:.0f} s"
        )
        header = f"{'workers':>7} {'tokens':>12} {'ingest s':>9} {'(tasks s)':>9} "
        print(
            header + f"{'ingest tok/s/worker':>20} {'replay s':>9} {'replay tok/s/actor':>20}"
            f" {'ceiling s':>9} {'ceiling tok/s':>14}"
        )
        for workers in args.workers:
            out = subprocess.run(
                [sys.executable, __file__, "--run", str(workers), *map(str, paths)],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            ingest = r["tokens"] / r["ingest_s"] / workers
            replay = r["tokens"] / r["replay_s"] / 2  # two pools: two actors
            print(
                f"{workers:>7} {r['tokens']:>12,} {r['ingest_s']:>9.1f} {r['tasks_s']:>9.1f} "
                f"{ingest:>20,.0f} "
                f"{r['replay_s']:>9.1f} {replay:>20,.0f} "
                f"{r['ceiling_s']:>9.1f} {r['tokens'] / r['ceiling_s']:>14,.0f}"
            )


if __name__ == "__main__":
    main()
