"""Where the CPU goes when a hash-id trace is analyzed (prints, never asserts): each stage run
alone in this process, one after another, with its user and system CPU seconds and page faults
(system time is mostly the kernel zeroing fresh pages, so faults show which stage touches new
memory), beside the end-to-end targets of the performance issue.

    .venv/bin/python tests/bench/bench_trace_stages.py [TRACE] [--block-size 16]
        [--dynamo-cpu-s 2.7] [--tokens] [--chunked-prefill-size 8192]

TRACE defaults to the Mooncake conversation trace (../shared/data/traces/, never copied into the
project). Stages: importing the command line, reading the trace into chunks of runs of tokens
(as ``analyze`` does: ``cache_models.hash_runs``; ``--tokens``: expanded into tokens, 4M at a
time, as a replay that does not read runs takes it), then each engine's sequential replay and
the prefix trie over those chunks. The kernels are loaded (or compiled) on a small workload
first, and that cost is printed apart. ``analyze`` runs the replays in threads, so its wall time
is below the sum.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_paths import MOONCAKE  # beside this script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def usage() -> tuple[float, float, int]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime, own.ru_stime, own.ru_minflt


Rows = list[tuple[str, float, float, int]]


def stage(name: str, work: Callable[[], object], rows: Rows) -> object:
    user, system, faults = usage()
    result = work()
    after = usage()
    rows.append((name, after[0] - user, after[1] - system, after[2] - faults))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=MOONCAKE)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--dynamo-cpu-s", type=float, default=None, help="Dynamo's figure, printed beside ours"
    )
    parser.add_argument("--tokens", action="store_true", help="expand the trace into tokens")
    parser.add_argument(
        "--chunked-prefill-size", type=int, default=8192, help="SGLang's (analyze's default)"
    )
    args = parser.parse_args()
    if not args.trace.exists():
        print(f"skipped: {args.trace} not found")
        return
    rows: Rows = []
    start = time.perf_counter()
    stage("import the command line", lambda: __import__("cli.main"), rows)

    from analyzer.ingest import ChunkedIngest, IngestOptions
    from analyzer.pool import engine_cache
    from analyzer.progress import NoProgress
    from analyzer.settings import ReplaySettings
    from cache_models.prefix_trie import PrefixTrie
    from cache_models.workload import Workload

    settings = ReplaySettings(
        block_size=args.block_size, chunked_prefill_size=args.chunked_prefill_size
    )
    tiny = Workload.from_lists([[1, 2, 3] * 20, [1, 2, 3] * 21], [[7, 8], [9]])

    def load_kernels() -> None:
        for engine in settings.engines:
            engine_cache(engine, settings).feed(tiny)
        PrefixTrie().feed(tiny)

    stage("load the kernels (cached; first run compiles)", load_kernels, rows)
    reader = ChunkedIngest(
        [args.trace],
        IngestOptions(hash_runs=None if args.tokens else settings.chunked_prefill_size),
        NoProgress(),
    )
    read = "read + expand to token chunks" if args.tokens else "read into chunks of runs"
    chunks = stage(read, lambda: list(reader.chunks()), rows)
    assert isinstance(chunks, list)
    workloads = [chunk.tokenized.workload for chunk in chunks]
    hits: dict[str, int] = {}
    for engine in settings.engines:

        def replay(engine: str = engine) -> None:
            cache = engine_cache(engine, settings)
            hits[engine] = sum(int(cache.feed(w).hit_tokens.sum()) for w in workloads)

        stage(f"replay: {engine}", replay, rows)

    def trie() -> None:
        prefix_trie = PrefixTrie()
        hits["ceiling"] = sum(int(prefix_trie.feed(w)[0].sum()) for w in workloads)

    stage("replay: prefix trie (ceiling)", trie, rows)
    wall = time.perf_counter() - start
    tokens = sum(w.prompt_token_count for w in workloads)
    print(
        f"{args.trace.name}: {sum(w.n_requests for w in workloads):,} requests, {tokens:,} "
        f"prompt tokens, {len(workloads)} chunks, block {args.block_size}"
    )
    for name, user, system, faults in rows:
        print(f"  {name:48} user {user:5.2f} s  sys {system:5.2f} s  faults {faults:8,}")
    total = sum(user + system for _, user, system, _ in rows)
    peer = "" if args.dynamo_cpu_s is None else f"; Dynamo's whole run: {args.dynamo_cpu_s} cpu-s"
    print(f"  {'all stages':48} cpu {total:5.2f} s  wall {wall:5.2f} s{peer}")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
    print("  hit tokens: " + ", ".join(f"{name} {value:,}" for name, value in hits.items()))


if __name__ == "__main__":
    main()
