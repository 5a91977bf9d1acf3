"""``prefixcheck analyze`` end to end beside NVIDIA Dynamo's offline replay, on the workloads of
the performance issue (prints, never asserts): CPU seconds (user + sys, best of ``--repeats``),
wall seconds and peak RSS of each whole process, the hit rates of both, and each figure beside
its target.

    .venv/bin/python tests/bench/bench_vs_dynamo.py [--dynamo-python PATH] [--repeats 3]
        [--only mooncake,tokens,chat] [--workdir DIR]

Workloads:
- ``mooncake``: the Mooncake conversation trace (../shared/data/traces/, never copied into the
  project; skipped without it): analyze with the full diagnosis at 16-token blocks, and hit
  rates only (``--no-diagnosis``) at 512, beside Dynamo at the same block sizes (1 worker).
- ``tokens``: a pre-tokenized log (``--format tokens``, 150k requests, ~23M prompt tokens,
  generated here: shared system prompts, multi-turn conversations holding the previous answer),
  beside Dynamo on the same log exported as a 16-token hash trace (``prefixcheck export-trace``,
  its Mooncake keys only).
- ``chat``: a raw OpenAI chat log (the bundled generator's traffic, 50k requests), tokenized with
  the default tokenizer, without the token cache and with it (a second run reads it).

Dynamo (``ai-dynamo`` 1.6.1; ``pip install ai-dynamo`` fails offline) installs in a venv of its
own: ``pip install ai-dynamo-runtime==1.6.1``, then ``pip install --no-deps ai-dynamo==1.6.1``,
then ``msgspec pyzmq aiohttp pydantic prometheus_client redis tqdm uvloop zstandard``; pass its
interpreter with ``--dynamo-python`` (or ``DYNAMO_PYTHON``). Its side is skipped without it. It
runs ``dynamo.replay.run_trace_replay`` offline with the vLLM mocker backend, prefix caching on
and enough GPU blocks for nothing to be evicted; its hit rate is ``prefix_cache_reused_ratio``.

Each workload is also run with ``--no-diagnosis``: the difference is printed as the diagnosis's
share of the full run's CPU-s, beside its target (a third at most).

Every run is a fresh process (numba kernels come from their on-disk cache after the warm-up run,
which is not counted, and modules from their bytecode: ``PYTHONDONTWRITEBYTECODE`` is dropped);
the CPU time is the OS's accounting of that process and its children.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_paths import MOONCAKE  # beside this script

ROOT = Path(__file__).resolve().parents[2]
PREFIXCHECK = [sys.executable, "-c", "from cli.entry import main; main()"]
DYNAMO_SCRIPT = """
import json, sys
from dynamo.replay import run_trace_replay
trace = sys.argv[1]
block, trace_block, blocks = (int(arg) for arg in sys.argv[2:5])
engine = {"block_size": block, "num_gpu_blocks": blocks, "backend": "vllm",
          "enable_prefix_caching": True}
report = run_trace_replay(trace, extra_engine_args={"engine": engine},
                          trace_block_size=trace_block, num_workers=1,
                          router_mode="round_robin", replay_mode="offline")
summary = report.summary
print(json.dumps({"hit_rate": summary["prefix_cache_reused_ratio"],
                  "prompt_tokens": summary["total_input_tokens"]}))
"""


@dataclass(frozen=True)
class Measured:
    cpu_s: float  # best of the repeats
    wall_s: float  # of the best run
    peak_rss_gb: float  # largest of the repeats
    hit_rate: float
    prompt_tokens: int


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """CPU seconds (user + sys, the process and its children), wall seconds, peak RSS (GB) and
    stdout of one fresh process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, cwd=ROOT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read().decode()
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command[:6])}... exited {process.returncode}:\n{stderr}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1e6, stdout


def measure(command: list[str], read: callable, repeats: int, env: dict | None = None) -> Measured:
    environment = {**os.environ, **(env or {})}
    # an installed package's modules are imported from bytecode: with PYTHONDONTWRITEBYTECODE
    # set (as in some sandboxes) an editable checkout would compile every changed module on
    # every run, a tenth of a second of each figure
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    run_once(command, environment)  # warm-up: kernels compiled or loaded, bytecode written
    best = None
    peak = 0.0
    for _ in range(repeats):
        cpu, wall, rss, stdout = run_once(command, environment)
        peak = max(peak, rss)
        if best is None or cpu < best[0]:
            best = (cpu, wall, stdout)
    assert best is not None
    hit_rate, prompt_tokens = read(best[2])
    return Measured(best[0], best[1], peak, hit_rate, prompt_tokens)


def prefixcheck(
    path: Path, flags: list[str], repeats: int, workdir: Path, env: dict | None = None
) -> Measured:
    report = workdir / "report.json"
    command = [*PREFIXCHECK, "analyze", str(path), "--quiet", "--json", str(report), *flags]

    def read(_: str) -> tuple[float, int]:
        data = json.loads(report.read_text())
        return data["engines"]["vllm"]["hit_rate"], data["prompt_tokens"]

    return measure(command, read, repeats, env)


def dynamo(
    python: str, trace: Path, block: int, trace_block: int, blocks: int, repeats: int
) -> Measured:
    command = [python, "-c", DYNAMO_SCRIPT, str(trace), str(block), str(trace_block), str(blocks)]

    def read(stdout: str) -> tuple[float, int]:
        data = json.loads(stdout.strip().splitlines()[-1])
        return data["hit_rate"], data["prompt_tokens"]

    return measure(command, read, repeats, {"DYN_LOG": "warn"})


def row(label: str, m: Measured | None, target: str = "") -> None:
    if m is None:
        print(f"  {label:44} (not run)")
        return
    rate = m.prompt_tokens / m.cpu_s / 1e6
    print(
        f"  {label:44} cpu {m.cpu_s:6.2f} s  wall {m.wall_s:6.2f} s  RSS {m.peak_rss_gb:5.2f} GB  "
        f"vLLM hit {m.hit_rate:.4%}  {rate:6.1f}M tok/cpu-s  {target}"
    )


def verdict(ours: Measured, peer: Measured | None) -> str:
    """``ours`` beside the target: fewer CPU seconds than the peer."""
    if peer is None:
        return "target: fewer cpu-s than Dynamo (not run)"
    met = "met" if ours.cpu_s < peer.cpu_s else "MISSED"
    return f"target < {peer.cpu_s:.2f} cpu-s (Dynamo): {met}"


def throughput_verdict(ours: Measured, goal_m: float) -> str:
    rate = ours.prompt_tokens / ours.cpu_s / 1e6
    wall = ours.prompt_tokens / ours.wall_s / 1e6
    return (
        f"target >= {goal_m:g}M tok/cpu-s: {'met' if rate >= goal_m else 'MISSED'} "
        f"({wall:.1f}M tok/s of wall on this machine's 2 cores)"
    )


def diagnosis_share(full: Measured, bare: Measured) -> str:
    """The diagnosis's share of the full run's CPU-s (the run minus one with --no-diagnosis)."""
    share = max(0.0, full.cpu_s - bare.cpu_s) / full.cpu_s
    met = "met" if share <= 1 / 3 else "MISSED"
    return f"diagnosis {share:.0%} of the cpu-s (target <= 1/3: {met})"


def unbounded_blocks(path: Path, block: int, trace_block: int) -> int:
    """GPU blocks enough to hold every prompt and answer of a trace (nothing evicted)."""
    tokens = 0
    with path.open() as lines:
        for line in lines:
            record = json.loads(line)
            tokens += record["input_length"] + record["output_length"] + trace_block
    return tokens // block + 1024


def bench_mooncake(args: argparse.Namespace, workdir: Path) -> None:
    print(f"Mooncake conversation trace ({MOONCAKE.name})")
    if not MOONCAKE.exists():
        print(f"  skipped: {MOONCAKE} not found")
        return
    peer16 = peer512 = None
    if args.dynamo_python:
        peer16 = dynamo(
            args.dynamo_python, MOONCAKE, 16, 512, unbounded_blocks(MOONCAKE, 16, 512), args.repeats
        )
        peer512 = dynamo(
            args.dynamo_python,
            MOONCAKE,
            512,
            512,
            unbounded_blocks(MOONCAKE, 512, 512),
            args.repeats,
        )
    full = prefixcheck(MOONCAKE, ["--block-size", "16"], args.repeats, workdir)
    bare = prefixcheck(MOONCAKE, ["--block-size", "512", "--no-diagnosis"], args.repeats, workdir)
    bare16 = prefixcheck(MOONCAKE, ["--block-size", "16", "--no-diagnosis"], args.repeats, workdir)
    row("Dynamo offline replay, block 16, 1 worker", peer16)
    row("prefixcheck analyze, block 16 (full diagnosis)", full, verdict(full, peer16))
    row("prefixcheck analyze, block 16 --no-diagnosis", bare16)
    row("Dynamo offline replay, block 512, 1 worker", peer512)
    row("prefixcheck analyze, block 512 --no-diagnosis", bare, verdict(bare, peer512))


def tokens_log(path: Path, requests: int, seed: int = 0) -> None:
    """A pre-tokenized chat log: 24 system prompts of unaligned lengths, conversations whose next
    request holds the previous prompt and answer, fresh single-turn requests."""
    rng = np.random.default_rng(seed)
    vocab = 150_000
    systems = [rng.integers(0, vocab, int(rng.integers(40, 150))) for _ in range(24)]
    chats: list[np.ndarray] = []
    with path.open("w") as out:
        for _ in range(requests):
            if chats and rng.random() < 0.45:
                history = chats.pop(int(rng.integers(len(chats))))
                prompt = np.concatenate([history, rng.integers(0, vocab, int(rng.integers(5, 40)))])
            else:
                system = systems[int(rng.integers(len(systems)))]
                prompt = np.concatenate([system, rng.integers(0, vocab, int(rng.integers(10, 50)))])
            output = rng.integers(0, vocab, int(rng.integers(5, 30)))
            if len(prompt) < 250 and rng.random() < 0.7:
                chats.append(np.concatenate([prompt, output]))
            if len(chats) > 2000:
                chats.pop(0)
            out.write(
                f'{{"prompt_token_ids": [{",".join(map(str, prompt.tolist()))}], '
                f'"output_token_ids": [{",".join(map(str, output.tolist()))}], '
                '"finish_reason": "length"}\n'
            )


def bench_tokens(args: argparse.Namespace, workdir: Path) -> None:
    log = workdir / f"tokens-{args.token_requests}.jsonl"
    if not log.exists():
        tokens_log(log, args.token_requests)
    print(f"Pre-tokenized log ({log.name}, --format tokens)")
    ours = prefixcheck(log, ["--format", "tokens"], args.repeats, workdir)
    trace = workdir / f"tokens-{args.token_requests}.trace.jsonl"
    if not trace.exists():
        exported = workdir / "exported.jsonl"
        subprocess.run(
            [*PREFIXCHECK, "export-trace", str(log), "--format", "tokens", "--hash-id-tokens",
             "16", "-o", str(exported)],
            check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        with exported.open() as lines, trace.open("w") as out:
            for line in lines:  # the Mooncake keys only: what Dynamo reads
                record = json.loads(line)
                record.pop("output_hash_ids", None)
                out.write(json.dumps(record) + "\n")
        exported.unlink()
    # Without the answers' ids a later turn cannot hit the answer it repeats: the same trace
    # through prefixcheck is the like-for-like figure beside Dynamo's.
    on_trace = prefixcheck(
        trace, ["--hash-block-size", "16", "--no-diagnosis"], args.repeats, workdir
    )
    peer = None
    if args.dynamo_python:
        peer = dynamo(
            args.dynamo_python, trace, 16, 16, unbounded_blocks(trace, 16, 16), args.repeats
        )
    row("Dynamo, the log as a 16-token hash trace", peer)
    row("prefixcheck, that trace, --no-diagnosis", on_trace)
    bare = prefixcheck(log, ["--format", "tokens", "--no-diagnosis"], args.repeats, workdir)
    row("prefixcheck analyze --format tokens", ours, throughput_verdict(ours, 10))
    row("prefixcheck --format tokens --no-diagnosis", bare, diagnosis_share(ours, bare))
    if peer:
        print(
            f"  {'':44} CPU-s ratio Dynamo / prefixcheck on the log: {peer.cpu_s / ours.cpu_s:.2f}"
        )
    print(f"  {'':44} (the log's own hits count the answers the next turns repeat; a trace cannot)")


def bench_chat(args: argparse.Namespace, workdir: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    from generate_chat_logs import generate

    log = workdir / f"chat-{args.chat_requests}.jsonl"
    if not log.exists():
        with log.open("w") as out:
            for item in generate(args.chat_requests, 7):
                out.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"Raw OpenAI chat log ({log.name}, default tokenizer)")
    cold = prefixcheck(log, ["--no-cache"], args.repeats, workdir)
    cache = {"PREFIXCHECK_CACHE_DIR": str(workdir / "token-cache")}
    warm = prefixcheck(log, [], args.repeats, workdir, cache)  # the warm-up run fills the cache
    bare = prefixcheck(log, ["--no-diagnosis"], args.repeats, workdir, cache)
    row("prefixcheck analyze --no-cache", cold, throughput_verdict(cold, 2))
    row("prefixcheck analyze, token cache filled", warm, throughput_verdict(warm, 10))
    row("prefixcheck, cache filled, --no-diagnosis", bare, diagnosis_share(warm, bare))
    print(f"  {'':44} peer (UranusSeven's simulator) not installed here")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dynamo-python", default=os.environ.get("DYNAMO_PYTHON"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="mooncake,tokens,chat")
    parser.add_argument("--token-requests", type=int, default=150_000)
    parser.add_argument("--chat-requests", type=int, default=50_000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "pc-bench")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.dynamo_python:
        print("Dynamo: no --dynamo-python (or DYNAMO_PYTHON): its side is skipped")
    print(f"CPU seconds: user + sys of each whole process, best of {args.repeats} after a warm-up")
    benches = {"mooncake": bench_mooncake, "tokens": bench_tokens, "chat": bench_chat}
    for name in args.only.split(","):
        benches[name](args, args.workdir)


if __name__ == "__main__":
    main()
