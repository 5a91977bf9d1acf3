"""End to end: logs of every kind through ``analyze`` and ``export-trace`` (per-model analysis,
the server's own counts next to the replay, the token cache, Ctrl-C)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
runner = CliRunner()
SYSTEM = "You are the billing assistant of Acme Cloud. " * 12


def invoke(*args: str | Path) -> object:
    return runner.invoke(app, [*map(str, args)])


def chat_log(path: Path, users: list[str], salts: list[str | None] | None = None) -> Path:
    rows = []
    for i, user in enumerate(users):
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        }
        if salts and salts[i]:
            body["cache_salt"] = salts[i]
        rows.append(body)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_several_models_each_on_their_own_caches(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    result = invoke(
        "analyze", FIXTURES / "lmsys_chat.jsonl", FIXTURES / "sharegpt.json", "--json", report_path
    )
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    models = report["models"]
    assert set(models) == {"vicuna-13b", "llama-2-13b-chat", "(no model)"}
    assert sum(m["requests"] for m in models.values()) == report["requests"] == 6
    for engine in ("vllm", "sglang"):
        total = sum(m["engines"][engine]["hit_tokens"] for m in models.values())
        assert total == report["engines"][engine]["hit_tokens"]
    assert models["llama-2-13b-chat"]["engines"]["sglang"]["hit_tokens"] > 0
    assert "Per model (each on its own caches)" in result.output


def test_server_counts_next_to_the_replay(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    table = tmp_path / "requests.jsonl"
    result = invoke(
        "analyze", FIXTURES / "openai_chat.jsonl", "--json", report_path, "--per-request", table
    )
    assert result.exit_code == 0, result.output
    comparison = json.loads(report_path.read_text())["server_comparison"]
    assert (comparison["requests"], comparison["server_cached_tokens"]) == (2, 224)
    vllm = comparison["engines"]["vllm"]
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    assert [r["server_cached_tokens"] for r in rows] == [0, 224, None]
    assert vllm["hit_tokens"] == sum(r["vllm_hit"] for r in rows[:2])
    assert 0.0 <= vllm["exact"] <= vllm["within_block"] <= 1.0
    assert "Replay vs the server's cached tokens (2 requests)" in result.output
    # The log's usage.prompt_tokens (233, 236) are not our counts: it was tokenized otherwise.
    counts = comparison["prompt_counts"]
    assert (counts["requests"], counts["server_prompt_tokens"]) == (2, 233 + 236)
    assert counts["our_prompt_tokens"] == sum(r["prompt_tokens"] for r in rows[:2])
    assert counts["equal"] == 0.0
    assert comparison["server_hit_rate"] == pytest.approx(224 / (233 + 236))
    assert [r["server_prompt_tokens"] for r in rows] == [233, 236, None]
    notes = json.loads(report_path.read_text())["notes"]
    assert any("prompt-token counts differ from ours on 100% of the 2" in n for n in notes)


def test_server_counts_match_a_log_tokenized_as_the_server_did(tmp_path: Path) -> None:
    """SGLang's own log: its prompt_tokens equal ours, its cached_tokens equal our SGLang replay."""
    report_path = tmp_path / "r.json"
    result = invoke("analyze", FIXTURES / "sglang_server.log", "--json", report_path)
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    comparison = report["server_comparison"]
    assert comparison["prompt_counts"] == {
        "requests": 2,
        "server_prompt_tokens": 52,
        "our_prompt_tokens": 52,
        "equal": 1.0,
    }
    assert comparison["server_cached_tokens"] == comparison["engines"]["sglang"]["hit_tokens"] == 17
    assert comparison["engines"]["sglang"]["exact"] == 1.0
    assert comparison["engines"]["vllm"]["hit_tokens"] == 16  # one whole block of the 17
    assert not any("prompt-token counts differ" in n for n in report["notes"])
    assert "server 52, ours 52, equal on 100% of requests" in " ".join(result.output.split())


def test_second_run_reads_the_token_cache(tmp_path: Path) -> None:
    log = chat_log(tmp_path / "c.jsonl", ["a", "b", "c"])
    first, second, uncached = (tmp_path / f"{name}.json" for name in ("1", "2", "3"))
    assert invoke("analyze", log, "--json", first, "--quiet").exit_code == 0
    warm = invoke("analyze", log, "--json", second)
    assert warm.exit_code == 0
    assert invoke("analyze", log, "--json", uncached, "--quiet", "--no-cache").exit_code == 0
    assert "Token cache: 3 distinct texts read from disk, 0 tokenized." in warm.output
    # the README's promise: the same input gives byte-identical JSON, cold cache or warm
    assert first.read_bytes() == second.read_bytes() == uncached.read_bytes()
    assert list((Path(os.environ["PREFIXCHECK_CACHE_DIR"]) / "tokens").iterdir())


def test_export_trace_chains_block_ids_like_vllm(tmp_path: Path) -> None:
    log = chat_log(
        tmp_path / "c.jsonl",
        ["first question", "second question", "first question"],
        [None, None, "t"],
    )
    trace = tmp_path / "trace.jsonl"
    result = invoke("export-trace", log, "--hash-id-tokens", "16", "-o", trace)
    assert result.exit_code == 0, result.output
    assert "wrote 3 requests" in result.output
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    for line in lines:
        assert set(line) == {"timestamp", "input_length", "output_length", "hash_ids"}
        assert len(line["hash_ids"]) == math.ceil(line["input_length"] / 16)
    first, second, salted = (line["hash_ids"] for line in lines)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared > 3 and first[:shared] == second[:shared]
    assert not set(salted) & set(first)  # a cache salt changes every block's hash
    assert first[0] == 0 and max(max(ids) for ids in (first, second, salted)) < 3 * len(first)


def test_exported_trace_replays_to_the_same_vllm_hits(tmp_path: Path) -> None:
    """The bundled multi-turn log: its answers travel as ``output_hash_ids``, so the trace gives
    the log's vLLM hits exactly; without them (what tools that read only the Mooncake keys see)
    later turns miss the answers they repeat."""
    log = ROOT / "examples" / "chat_logs.jsonl"
    trace = tmp_path / "trace.jsonl"
    assert invoke("export-trace", log, "--hash-id-tokens", "16", "-o", trace).exit_code == 0
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    with_answers = [line for line in lines if "output_hash_ids" in line]
    assert len(with_answers) > len(lines) / 2
    for line in with_answers:
        blocks = math.ceil((line["input_length"] + line["output_length"]) / 16)
        assert len(line["hash_ids"]) + len(line["output_hash_ids"]) == blocks
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        "".join(
            json.dumps({k: v for k, v in line.items() if k != "output_hash_ids"}) + "\n"
            for line in lines
        )
    )
    reports = {name: tmp_path / f"{name}.json" for name in ("log", "trace", "plain")}
    assert invoke("analyze", log, "--json", reports["log"], "--quiet").exit_code == 0
    for name, path in (("trace", trace), ("plain", plain)):
        result = invoke(
            "analyze", path, "--hash-block-size", "16", "--json", reports[name], "--quiet"
        )
        assert result.exit_code == 0, result.output
    hits = {
        name: json.loads(path.read_text())["engines"]["vllm"]["hit_tokens"]
        for name, path in reports.items()
    }
    assert hits["log"] == hits["trace"] > hits["plain"] > 0


def test_bad_output_hash_ids_are_reasoned_skips(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    good = {"input_length": 20, "output_length": 10, "hash_ids": [1, 2], "output_hash_ids": []}
    trace.write_text(
        json.dumps(good)
        + "\n"
        + json.dumps({**good, "output_hash_ids": [3, 4]})
        + "\n"
        + json.dumps({**good, "output_length": 0})
        + "\n"
    )
    report = tmp_path / "r.json"
    result = invoke("analyze", trace, "--hash-block-size", "16", "--json", report, "--quiet")
    assert result.exit_code == 0, result.output
    skipped = json.loads(report.read_text())["skipped"]
    assert skipped["count"] == 2
    assert "2 output_hash_ids for input_length 20 and output_length 10" in skipped["examples"][0]
    assert "output_hash_ids need a positive output_length" in skipped["examples"][1]


def test_format_flags_and_errors(tmp_path: Path) -> None:
    result = invoke("analyze", FIXTURES / "vllm_server.log", "--format", "openai", "--strict")
    assert result.exit_code == 2
    assert "vllm_server.log:1: malformed JSON" in result.output
    result = invoke("analyze", FIXTURES / "openai_chat.jsonl", "--chat-template-kwargs", "[1]")
    assert result.exit_code == 2 and "must be a JSON object" in result.output
    result = invoke("analyze", FIXTURES / "openai_chat.jsonl", "--chat-template", "nope")
    assert result.exit_code == 2 and "unknown --chat-template 'nope'" in result.output
    custom = tmp_path / "custom.jsonl"
    custom.write_text(json.dumps({"q": {"text": "hello there"}, "t": 5}) + "\n")
    report = tmp_path / "r.json"
    result = invoke(
        "analyze", custom, "--prompt-field", "q.text", "--time-field", "t", "--json", report
    )
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["inputs"] == {str(custom): "mapped"}


def test_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "big.jsonl"
    with log.open("w") as out:
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "generate_chat_logs.py"),
                "--requests",
                "20000",
            ],
            stdout=out,
            check=True,
        )
    ready = "import cli.main\nprint('ready', flush=True)\nimport cli.entry\ncli.entry.main()"
    process = subprocess.Popen(
        [sys.executable, "-c", ready, "analyze", str(log), "--no-cache"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    time.sleep(1.5)  # reading and tokenizing 20k requests takes several seconds more
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert stderr.decode().strip().endswith("prefixcheck: interrupted")
    assert "Traceback" not in stderr.decode()


@pytest.mark.parametrize("name", ["langfuse_batch_export.jsonl", "helicone_export.json"])
def test_exported_tool_call_answers_are_hit_by_the_next_turn(name: str, tmp_path: Path) -> None:
    """The first turn's answer calls a tool (content null): the second turn's prompt holds it
    as the template renders it, so it hits the first prompt and that answer, token for token.
    Without the answer it would hit the first prompt only."""
    table = tmp_path / "requests.csv"
    args = ("analyze", FIXTURES / name, "--block-size", "1", "--per-request", table, "--quiet")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    first, second = (line.split(",") for line in table.read_text().splitlines()[1:3])
    header = table.read_text().splitlines()[0].split(",")
    names = ("prompt_tokens", "output_tokens", "vllm_hit", "ceiling_hit")
    column = {name: header.index(name) for name in names}
    answered = int(first[column["prompt_tokens"]]) + int(first[column["output_tokens"]])
    assert int(second[column["ceiling_hit"]]) == answered
    # vLLM never computes the KV of the answer's last token (decode stops on it).
    assert int(second[column["vllm_hit"]]) == answered - 1
