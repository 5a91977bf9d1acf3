"""End-to-end runs of ``prefixcheck analyze`` through typer's runner."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
runner = CliRunner()


def run(*args: str | Path) -> object:
    return runner.invoke(app, ["analyze", *map(str, args)])


def write_tokens(path: Path, requests: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def test_example_log_end_to_end(tmp_path: Path) -> None:
    report_path, table_path = tmp_path / "report.json", tmp_path / "requests.parquet"
    result = run(EXAMPLE, "--json", report_path, "--per-request", table_path)
    assert result.exit_code == 0, result.output
    for text in ("vLLM (block 16)", "SGLang (page 1, lru)", "ceiling", "Top shared prefixes"):
        assert text in result.output
    # The runner's console is 80 wide: snippets are listed below the table, readable, not squeezed.
    assert "You are the support assistant" in result.output
    report = json.loads(report_path.read_text())
    assert report["schema_version"] == 1
    assert report["requests"] == 600
    assert report["skipped"]["count"] == 0
    assert "qwen2.5" in report["tokenizer"]
    vllm, sglang = report["engines"]["vllm"], report["engines"]["sglang"]
    assert 0 < vllm["hit_tokens"] <= sglang["hit_tokens"] <= report["ceiling"]["hit_tokens"]
    assert vllm["hit_rate"] == pytest.approx(vllm["hit_tokens"] / report["prompt_tokens"])
    assert vllm["metrics"]["vllm:prefix_cache_hits"] == vllm["hit_tokens"]
    assert sglang["metrics"]["sglang:cached_tokens_total"] == sglang["hit_tokens"]
    assert report["alignment_loss"]["tokens"] == sglang["hit_tokens"] - vllm["hit_tokens"]
    assert isinstance(report["recommendations"], list)
    prefixes = report["shared_prefixes"]
    assert prefixes and all(p["remainder"] == p["tokens"] % 16 for p in prefixes)
    assert any("You are the support assistant" in (p["snippet"] or "") for p in prefixes)
    table = pl.read_parquet(table_path)
    assert table.height == 600
    assert table["vllm_hit"].sum() == vllm["hit_tokens"]
    assert table["line"].to_list() == list(range(1, 601))


def test_hand_derived_hits(tmp_path: Path) -> None:
    shared = list(range(1, 18))
    x32 = list(range(100, 132))
    cases = write_tokens(
        tmp_path / "cases.jsonl",
        [
            {"prompt_token_ids": shared + [500, 501], "output_token_ids": [9]},
            {"prompt_token_ids": shared + [600, 601], "output_token_ids": [9]},
            {"prompt_token_ids": x32, "output_token_ids": [9]},
            {"prompt_token_ids": x32, "output_token_ids": [9]},
        ],
    )
    out = tmp_path / "out.jsonl"
    result = run(cases, "--format", "tokens", "--per-request", out)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["prompt_tokens"], r["vllm_hit"], r["sglang_hit"]) for r in rows] == [
        (19, 0, 0),
        (19, 16, 17),
        (32, 0, 0),
        (32, 16, 31),
    ]


def test_bad_lines_are_counted_and_the_run_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "mixed.jsonl"
    log.write_text(
        json.dumps({"prompt_token_ids": [1, 2, 3]})
        + "\n{broken\n"
        + json.dumps({"prompt_token_ids": []})
        + "\n"
        + json.dumps({"prompt_token_ids": [1, 2, 3, 4]})
        + "\n"
    )
    report_path = tmp_path / "r.json"
    result = run(log, "--json", report_path)
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["requests"] == 2
    assert report["skipped"]["count"] == 2
    assert (
        report["skipped"]["examples"][0]
        == f"{log}:2: malformed JSON (Expecting property name enclosed in double quotes)"
    )
    assert "Skipped lines" in result.output


def test_strict_exits_2_at_the_first_bad_line(tmp_path: Path) -> None:
    log = write_tokens(tmp_path / "t.jsonl", [{"prompt_token_ids": [1]}, {"prompt_token_ids": "x"}])
    result = run(log, "--strict")
    assert result.exit_code == 2
    assert f"{log}:2: field 'prompt_token_ids' must be a list" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p / "missing.jsonl", "cannot read"),
        (lambda p: write_tokens(p / "x.jsonl", [{"what": 1}]), "unknown log format"),
    ],
)
def test_unusable_input_exits_2(tmp_path: Path, setup, message: str) -> None:
    result = run(setup(tmp_path))
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_unknown_format_flag_exits_2(tmp_path: Path) -> None:
    result = run(write_tokens(tmp_path / "t.jsonl", [{"prompt_token_ids": [1]}]), "--format", "xml")
    assert result.exit_code == 2
    assert "unknown --format 'xml'" in result.output


def test_fail_under_gate(tmp_path: Path) -> None:
    log = write_tokens(
        tmp_path / "t.jsonl", [{"prompt_token_ids": list(range(40))} for _ in range(2)]
    )
    assert run(log, "--fail-under", "0.3", "--quiet").exit_code == 0
    failed = run(log, "--fail-under", "0.5", "--quiet")
    assert failed.exit_code == 1
    assert "gate failed: vLLM (block 16) token hit rate 40.00% < 50.00%" in failed.output
    assert "gate failed: SGLang (page 1, lru) token hit rate 48.75% < 50.00%" in failed.output


def test_redact_hides_snippets(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    result = run(EXAMPLE, "--redact", "--json", report_path, "--quiet")
    assert result.exit_code == 0
    prefixes = json.loads(report_path.read_text())["shared_prefixes"]
    assert prefixes and all(p["snippet"] is None for p in prefixes)


def test_replay_modes_are_named_in_the_report(tmp_path: Path) -> None:
    shared = list(range(1, 21))
    log = write_tokens(
        tmp_path / "timed.jsonl",
        [
            {"timestamp": 0.0, "prompt_token_ids": shared + [30], "output_token_ids": [5] * 40},
            {"timestamp": 0.001, "prompt_token_ids": shared + [31], "output_token_ids": [5]},
        ],
    )
    modes = {}
    for flags in ([], ["--concurrency", "2"], ["--replay-in-time"]):
        report_path, table = tmp_path / "r.json", tmp_path / "t.jsonl"
        result = run(log, *flags, "--json", report_path, "--per-request", table, "--quiet")
        assert result.exit_code == 0, result.output
        report = json.loads(report_path.read_text())
        modes[" ".join(flags)] = report["replay_mode"]
        # The second request's 20 shared tokens, lost to being in flight with the first.
        assert report["losses"]["sglang"]["concurrency"]["tokens"] == (20 if flags else 0)
        assert report["losses"]["vllm"]["concurrency"]["tokens"] == 0
        rows = [json.loads(line) for line in table.read_text().splitlines()]
        # vLLM caches the first request's blocks when it is scheduled, so the second hits them
        # in every mode. SGLang inserts the prompt at the end of its prefill: with both in
        # flight (one batch; or the second arriving 1 ms in, mid-prefill), the second misses.
        assert [r["vllm_hit"] for r in rows] == [0, 16]
        assert [r["sglang_hit"] for r in rows] == ([0, 20] if not flags else [0, 0])
    assumed = (
        "defaults for H100 (79.1 GiB): vLLM --max-num-batched-tokens 8192 (server), "
        "SGLang --chunked-prefill-size 8192"
    )
    assert modes[""] == f"sequential; {assumed}"
    assert modes["--concurrency 2"] == (
        f"concurrent (up to 2 in flight, lock-step, 8192 tokens per step); {assumed}"
    )
    assert modes["--replay-in-time"].startswith("arrival time (up to 256 in flight")


def test_replay_in_time_needs_timestamps(tmp_path: Path) -> None:
    log = write_tokens(tmp_path / "t.jsonl", [{"prompt_token_ids": [1, 2, 3]}])
    result = run(log, "--replay-in-time")
    assert result.exit_code == 2
    assert "--replay-in-time needs an arrival time" in result.output
