"""The engine settings that change hits, as flags: checked where they enter (exit 2 naming the
flag), GPU-dependent defaults named in the report, and each reaching the replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache_models.defaults import (
    parse_gpu,
    sglang_chunked_prefill_size,
    vllm_max_num_batched_tokens,
)
from tests.test_cli import run, write_tokens


@pytest.mark.parametrize(
    ("gpu", "server", "llm", "sglang"),
    [
        ("H100", 8192, 16384, 8192),
        ("H200", 8192, 16384, 8192),
        ("A100", 2048, 8192, 8192),  # vLLM keeps A100s on the small tier (PR #17885)
        ("A100-40GB", 2048, 8192, 4096),
        ("B200", 16384, 16384, 16384),
        ("L4", 2048, 8192, 4096),
        ("T4", 2048, 8192, 2048),
        ("80GB", 8192, 16384, 8192),
        ("24", 2048, 8192, 4096),
    ],
)
def test_gpu_defaults(gpu: str, server: int, llm: int, sglang: int) -> None:
    spec = parse_gpu(gpu)
    assert vllm_max_num_batched_tokens(spec, "server") == server
    assert vllm_max_num_batched_tokens(spec, "llm") == llm
    assert sglang_chunked_prefill_size(spec) == sglang


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu", "potato"], "--gpu potato: not a GPU name"),
        (["--eviction-policy", "tlru"], "tlru needs --radix-eviction-policy-config"),
        (
            [
                "--eviction-policy",
                "tlru",
                "--radix-eviction-policy-config",
                '{"threshold": 5, "next_prompt_estimate": 5}',
            ],
            "tlru needs threshold > next_prompt_estimate",
        ),
        (
            ["--eviction-policy", "slru", "--radix-eviction-policy-config", '{"threshold": 5}'],
            "slru takes no 'threshold'",
        ),
        (["--radix-eviction-policy-config", "{nope"], "not JSON"),
        (
            ["--concurrency", "64", "--max-num-batched-tokens", "32"],
            "--max-num-batched-tokens 32 is below --concurrency 64",
        ),
        (["--eviction-policy", "random"], "random"),
    ],
)
def test_bad_engine_flags_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    log = write_tokens(tmp_path / "t.jsonl", [{"prompt_token_ids": [1, 2, 3]}])
    result = run(log, *flags)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def replay(tmp_path: Path, requests: list[dict], *flags: str) -> tuple[dict, list[dict]]:
    log = write_tokens(tmp_path / "t.jsonl", requests)
    report_path, table = tmp_path / "r.json", tmp_path / "t.jsonl.out.jsonl"
    result = run(log, *flags, "--json", report_path, "--per-request", table, "--quiet")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    return json.loads(report_path.read_text()), rows


def test_overlap_off_caches_one_output_less(tmp_path: Path) -> None:
    first = {"prompt_token_ids": list(range(1, 31)), "output_token_ids": list(range(40, 50))}
    follow_up = {"prompt_token_ids": first["prompt_token_ids"] + first["output_token_ids"] + [7]}
    requests = [{**first, "finish_reason": "stop"}, follow_up]
    _, default = replay(tmp_path, requests)
    _, off = replay(tmp_path, requests, "--disable-overlap-schedule")
    assert [r["sglang_hit"] for r in default] == [0, 40]  # all 10 outputs cached after a stop
    assert [r["sglang_hit"] for r in off] == [0, 39]  # all but the last


def test_gpu_and_budget_reach_the_report(tmp_path: Path) -> None:
    requests = [{"prompt_token_ids": [1, 2, 3]}]
    report, _ = replay(tmp_path, requests, "--gpu", "A100-40GB", "--concurrency", "4")
    assert report["replay_mode"] == (
        "concurrent (up to 4 in flight, lock-step, 2048 tokens per step); defaults for "
        "A100-40GB (39.4 GiB): vLLM --max-num-batched-tokens 2048 (server), SGLang "
        "--chunked-prefill-size 4096"
    )
    report, _ = replay(
        tmp_path, requests, "--max-num-batched-tokens", "512", "--chunked-prefill-size", "0"
    )
    assert report["replay_mode"] == "sequential"
    config = report["engines"]["vllm"]["config"]
    assert config["max_num_batched_tokens"] == 512


def test_prefill_chunks_change_hits_with_requests_in_flight(tmp_path: Path) -> None:
    """Two 3000-token prompts sharing 2000 tokens, in flight together. Without a threshold the
    first is scheduled up to the budget before the second is admitted, which hits the whole
    share; with --long-prefill-token-threshold 512 the second is admitted in the first step
    beside the first's 512-token chunk, and hits only that chunk."""
    shared = list(range(1, 2001))
    requests = [
        {"prompt_token_ids": shared + [5000 + i for i in range(1000)], "output_token_ids": [1]},
        {"prompt_token_ids": shared + [7000 + i for i in range(1000)], "output_token_ids": [1]},
    ]
    flags = ("--concurrency", "2", "--max-num-batched-tokens", "2048")
    _, whole = replay(tmp_path, requests, *flags)
    _, chunked = replay(tmp_path, requests, *flags, "--long-prefill-token-threshold", "512")
    assert [r["vllm_hit"] for r in whole] == [0, 2000]
    assert [r["vllm_hit"] for r in chunked] == [0, 512]
