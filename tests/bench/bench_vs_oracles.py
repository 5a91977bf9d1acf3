"""The same workload through prefixcheck's cache models and through the engines' own code
(prints, never asserts): wall time of each, the ratio, and whether every request's hit agrees.

    .venv/bin/python tests/bench/bench_vs_oracles.py [--requests 2000] \\
        [--oracles ../shared/oracles] [--vllm-python PATH] [--sglang-python PATH] \\
        [--tokens-log LOG --tokens-requests 3000]

With ``--tokens-log`` (a pre-tokenized ``--format tokens`` log, e.g. bench_vs_dynamo's), also
end to end: ``prefixcheck analyze`` with the full diagnosis on the whole log (prompt tokens per
CPU-second of the process, best of 2) beside the oracles' replay of its first
``--tokens-requests`` requests unbounded (prompt tokens per CPU-second, start-up excluded), the
ratio beside its target (500x), and whether analyze's per-request hits on those requests equal
the oracles'.

The workload is the bundled chat-log generator's traffic at ``--requests`` requests, tokenized
with the default tokenizer (prompts with their answers). The oracles (vLLM 0.33.0's KVCacheManager,
SGLang 0.5.23's UnifiedRadixCache) run in their own interpreters (see shared/oracles/README.md);
their start-up (about 8 s each) is measured apart from the replay. Our models are timed warm (after
a first replay that compiles the kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from generate_chat_logs import generate  # noqa: E402

from analyzer.ingest import IngestOptions, ingest  # noqa: E402
from analyzer.progress import NoProgress  # noqa: E402
from cache_models.config import SglangConfig, VllmConfig  # noqa: E402
from cache_models.sglang_radix import SglangRadixCache  # noqa: E402
from cache_models.vllm_apc import VllmPrefixCache  # noqa: E402
from cache_models.workload import Workload  # noqa: E402

BLOCKS = 4097  # vLLM num_gpu_blocks (one is the null block): 65,536 usable tokens at block 16


def workload_of(n_requests: int) -> Workload:
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "chat.jsonl"
        log.write_text("".join(json.dumps(line) + "\n" for line in generate(n_requests, seed=7)))
        return ingest([log], IngestOptions(cache_dir=None), NoProgress()).tokenized.workload


def oracle_lines(workload: Workload) -> str:
    """The oracles' input: one JSON line per request."""
    return "".join(
        json.dumps({"prompt": workload.prompt(i).tolist(), "output": workload.output(i).tolist()})
        + "\n"
        for i in range(workload.n_requests)
    )


def run_oracle(python: str, script: Path, args: list[str], stdin: str) -> tuple[list[int], float]:
    start = time.perf_counter()
    done = subprocess.run(
        [python, str(script), *args], input=stdin, capture_output=True, text=True, check=True
    )
    elapsed = time.perf_counter() - start
    return [json.loads(line)["hit"] for line in done.stdout.splitlines()], elapsed


def startup(python: str, script: Path, args: list[str]) -> float:
    """The oracle's time to import and build its engine, on an empty input."""
    return run_oracle(python, script, args, "")[1]


def cpu_run(command: list[str], stdin: str = "") -> tuple[float, str]:
    """CPU seconds (user + sys, with children) and stdout of one process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as given:
        given.write(stdin.encode())
        given.seek(0)
        process = subprocess.Popen(command, stdin=given, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        if os.waitstatus_to_exitcode(status) not in (0, 1):
            raise RuntimeError(f"{command[:4]} exited {status}")
        out.seek(0)
        return usage.ru_utime + usage.ru_stime, out.read().decode()


def end_to_end(args: argparse.Namespace) -> None:
    """analyze on a whole pre-tokenized log beside the oracles on its head, same requests."""
    log: Path = args.tokens_log
    with log.open() as lines:
        head_lines = [line for _, line in zip(range(args.tokens_requests), lines, strict=False)]
    records = [json.loads(line) for line in head_lines]
    prompt_tokens = sum(len(r["prompt_token_ids"]) for r in records)
    total = sum(len(r["prompt_token_ids"]) + len(r.get("output_token_ids") or [1]) for r in records)
    stdin = "".join(
        json.dumps({"prompt": r["prompt_token_ids"], "output": r.get("output_token_ids") or []})
        + "\n"
        for r in records
    )
    analyze = [sys.executable, "-c", "from cli.entry import main; main()", "analyze"]
    with tempfile.TemporaryDirectory() as folder:
        head = Path(folder) / "head.jsonl"
        head.write_text("".join(head_lines))
        per_request = Path(folder) / "hits.jsonl"
        cpu_run([*analyze, str(head), "--format", "tokens", "--quiet", "--per-request",
                 str(per_request)])  # fmt: skip
        ours = [json.loads(line) for line in per_request.read_text().splitlines()]
        report = Path(folder) / "report.json"
        whole = [*analyze, str(log), "--format", "tokens", "--quiet", "--json", str(report)]
        cpu_run(whole)  # warm-up: kernels from their cache
        cpu_s = min(cpu_run(whole)[0] for _ in range(2))
        log_tokens = json.loads(report.read_text())["prompt_tokens"]
    our_rate = log_tokens / cpu_s
    print(
        f"\nEnd to end: analyze --format tokens (full diagnosis) on {log.name}, "
        f"{log_tokens:,} prompt tokens: {cpu_s:.2f} cpu-s, {our_rate / 1e6:.1f}M tok/cpu-s"
    )
    print(f"oracles on its first {len(records):,} requests ({prompt_tokens:,} prompt tokens)")
    blocks = total // 16 + len(records) + 2
    oracles = [
        ("vLLM", args.vllm_python, "vllm", ["--block-size", "16", "--num-blocks", str(blocks)]),
        ("SGLang", args.sglang_python, "sglang",
         ["--page-size", "1", "--capacity-tokens", str(total + 1024),
          "--output-insert", "all_but_last"]),
    ]  # fmt: skip
    for name, python, folder_name, oracle_args in oracles:
        script = str(args.oracles / folder_name / "oracle.py")
        oracle_cpu, out = cpu_run([python, script, *oracle_args], stdin)
        start_cpu = min(cpu_run([python, script, *oracle_args], "")[0] for _ in range(2))
        rate = prompt_tokens / max(oracle_cpu - start_cpu, 1e-9)
        hits = [json.loads(line)["hit"] for line in out.splitlines()]
        agree = hits == [row[f"{name.lower()}_hit"] for row in ours]
        ratio = our_rate / rate
        print(
            f"  {name:7} oracle {rate / 1e3:8.1f}k tok/cpu-s (start-up {start_cpu:.1f} cpu-s "
            f"excluded); ratio {ratio:6.0f}x, target >= 500x: {'met' if ratio >= 500 else 'MISSED'}"
            f"; hits identical: {'yes' if agree else 'NO'}"
        )


def timed(replay, workload: Workload) -> tuple[np.ndarray, float]:
    replay(workload)  # compile
    start = time.perf_counter()
    hits = replay(workload).hit_tokens
    return hits, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--oracles", type=Path, default=ROOT.parent / "shared" / "oracles")
    parser.add_argument("--vllm-python", default="/work/oracle_envs/vllm/bin/python")
    parser.add_argument("--sglang-python", default="/work/oracle_envs/sglang/bin/python")
    parser.add_argument("--tokens-log", type=Path, default=None)
    parser.add_argument("--tokens-requests", type=int, default=3000)
    args = parser.parse_args()
    if args.requests:  # --requests 0: the end-to-end figure alone
        models(args)
    if args.tokens_log is not None:
        end_to_end(args)


def models(args: argparse.Namespace) -> None:
    """The cache models beside the oracles on the chat generator's traffic, warm."""
    workload = workload_of(args.requests)
    tokens = int(workload.prompt_offsets[-1])
    # Stop-finish answers, as SGLang's oracle inserts with --output-insert all.
    workload = Workload.from_arrays(
        [workload.prompt(i) for i in range(workload.n_requests)],
        [workload.output(i) for i in range(workload.n_requests)],
    )
    print(f"workload: {workload.n_requests} requests, {tokens:,} prompt tokens")
    stdin = oracle_lines(workload)
    vllm_args = ["--block-size", "16", "--num-blocks", str(BLOCKS)]
    sglang_args = ["--page-size", "1", "--capacity-tokens", str((BLOCKS - 1) * 16)]
    sglang_args += ["--output-insert", "all"]
    engines = [
        (
            "vLLM",
            args.vllm_python,
            args.oracles / "vllm" / "oracle.py",
            vllm_args,
            lambda w: VllmPrefixCache(
                VllmConfig(block_size=16, capacity_tokens=(BLOCKS - 1) * 16)
            ).replay(w),
        ),
        (
            "SGLang",
            args.sglang_python,
            args.oracles / "sglang" / "oracle.py",
            sglang_args,
            lambda w: SglangRadixCache(SglangConfig(capacity_tokens=(BLOCKS - 1) * 16)).replay(w),
        ),
    ]
    print(f"{'engine':8} {'oracle s':>9} {'start-up s':>11} {'ours s':>8} {'ratio':>9} agree")
    for name, python, script, oracle_args, ours in engines:
        oracle_hits, oracle_s = run_oracle(python, script, oracle_args, stdin)
        start_s = startup(python, script, oracle_args)
        our_hits, our_s = timed(ours, workload)
        replay_s = max(oracle_s - start_s, 1e-9)
        agree = our_hits.tolist() == oracle_hits
        print(
            f"{name:8} {oracle_s:9.1f} {start_s:11.1f} {our_s:8.4f} "
            f"{replay_s / our_s:8.0f}x {'yes' if agree else 'NO'}"
        )


if __name__ == "__main__":
    main()
