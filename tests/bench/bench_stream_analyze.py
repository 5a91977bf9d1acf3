"""``prefixcheck analyze`` on a synthetic 1B-token log, streamed (prints, never asserts): peak
resident memory, wall and CPU time of the whole command.

    .venv/bin/python tests/bench/bench_stream_analyze.py [--tokens 1e9] [-- ANALYZE FLAGS...]

The log is a hash-id trace (Mooncake format, 512 tokens per id) of chat traffic: conversations
that open with one of 40 system prompts of 2-16 blocks and grow by a user turn and an answer each
turn, so most prompt tokens are shared, as in production. It is written to a temporary folder
(about 15 MB for 1B tokens) and analyzed with a 2M-token cache. The peak is printed beside its
target (under 2 GB).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 512
TARGET_GB = 2.0  # the performance issue's bound on a streamed 1B-token log's peak memory


def write_trace(path: Path, tokens: float, seed: int = 0) -> tuple[int, int]:
    """A chat-like hash-id trace of about ``tokens`` prompt tokens: (requests, tokens)."""
    rng = random.Random(seed)
    systems = [list(range(s * 100, s * 100 + rng.randrange(2, 17))) for s in range(40)]
    next_id = 10_000
    open_chats: list[list[int]] = []
    total = requests = 0
    timestamp = 0
    with path.open("w") as out:
        while total < tokens:
            if open_chats and rng.random() < 0.8:
                blocks = open_chats.pop(rng.randrange(len(open_chats)))
            else:
                blocks = list(rng.choice(systems))
            turn = rng.randrange(1, 4)  # the new user turn (and the last answer), in blocks
            blocks = blocks + list(range(next_id, next_id + turn))
            next_id += turn
            length = len(blocks) * BLOCK - rng.randrange(BLOCK)
            timestamp += rng.randrange(1, 200)
            line = {
                "timestamp": timestamp,
                "input_length": length,
                "output_length": rng.randrange(50, 600),
                "hash_ids": blocks,
            }
            out.write(json.dumps(line) + "\n")
            total += length
            requests += 1
            if len(blocks) < 120:
                open_chats.append(blocks)
            if len(open_chats) > 2000:
                open_chats.pop(0)
    return requests, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="more analyze flags, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        requests, tokens = write_trace(trace, args.tokens)
        size = trace.stat().st_size / 1e6
        print(f"trace: {requests:,} requests, {tokens:,} prompt tokens, {size:.1f} MB")
        command = [
            sys.executable,
            "-c",
            "from cli.entry import main; main()",
            "analyze",
            str(trace),
            "--capacity-tokens",
            "2000000",
            "--quiet",
            "--json",
            str(Path(folder) / "report.json"),
            *[flag for flag in args.flags if flag != "--"],
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True, cwd=ROOT)
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        report = json.loads((Path(folder) / "report.json").read_text())
    rates = {name: f"{e['hit_rate']:.1%}" for name, e in report["engines"].items()}
    scope = report["diagnosis_scope"]
    peak_gb = usage.ru_maxrss / 1e6
    met = "met" if peak_gb < TARGET_GB else "MISSED"
    print(
        f"analyze: wall {wall:.1f} s, cpu {usage.ru_utime + usage.ru_stime:.1f} s, "
        f"peak RSS {peak_gb:.2f} GB (target < {TARGET_GB:g} GB at 1B tokens: {met}), "
        f"{tokens / wall / 1e6:.1f}M prompt tokens/s"
    )
    print(
        f"hit rates {rates}, ceiling {report['ceiling']['hit_rate']:.1%}; diagnosis on "
        f"{scope['prompt_tokens']:,} tokens ({'whole log' if scope['whole_log'] else 'sample'})"
    )


if __name__ == "__main__":
    main()
