"""``prefixcheck compare``: reports where a template grew by one token across a block boundary."""

from __future__ import annotations

import json
import random
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def write_log(path: Path, system_tokens: int, requests: int = 50) -> Path:
    rng = random.Random(0)
    system = list(range(1000, 1000 + system_tokens))
    # Each question starts with its own token, so the system prompt is the only shared prefix.
    lines = [
        {"prompt_token_ids": system + [5000 + i] + [rng.randrange(6000, 9000) for _ in range(20)]}
        for i in range(requests)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def report(tmp_path: Path, name: str, system_tokens: int, *flags: str, requests: int = 50) -> Path:
    out = tmp_path / f"{name}.json"
    log = write_log(tmp_path / f"{name}.jsonl", system_tokens, requests)
    result = runner.invoke(app, ["analyze", str(log), "--json", str(out), "--quiet", *flags])
    assert result.exit_code == 0, result.output
    return out


def test_template_grown_across_a_block_boundary(tmp_path: Path) -> None:
    base = report(tmp_path, "base", 48)  # three full blocks: every later request hits 48
    head = report(tmp_path, "head", 49)  # one token more: still 48 hit, one more recomputed
    diff_path = tmp_path / "diff.json"
    result = runner.invoke(
        app, ["compare", str(base), str(head), "--max-drop", "0.05", "--json", str(diff_path)]
    )
    assert result.exit_code == 0, result.output
    diff = json.loads(diff_path.read_text())
    (template,) = diff["templates"]
    assert (template["status"], template["base_tokens"], template["head_tokens"]) == (
        "changed",
        48,
        49,
    )
    assert (template["base_remainder"], template["head_remainder"]) == (0, 1)
    vllm = diff["engines"]["vllm"]
    assert vllm["base_hit_rate"] > vllm["head_hit_rate"]
    assert "Templates that changed" in result.output

    failed = runner.invoke(app, ["compare", str(base), str(head), "--max-drop", "0.001"])
    assert failed.exit_code == 1
    assert "over --max-drop 0.10%" in failed.output


def test_compare_rejects_a_non_report(tmp_path: Path) -> None:
    bogus = tmp_path / "x.json"
    bogus.write_text('{"hello": 1}')
    result = runner.invoke(app, ["compare", str(bogus), str(bogus)])
    assert result.exit_code == 2
    assert "not a prefixcheck report" in result.output


def test_engines_named_with_both_configurations(tmp_path: Path) -> None:
    """Two block sizes: the row names both; an unchanged rate shows +0.00%, not -0.00%."""
    log = write_log(tmp_path / "log.jsonl", 40)
    paths = []
    for block in (16, 32):
        out = tmp_path / f"b{block}.json"
        args = ["analyze", str(log), "--block-size", str(block), "--json", str(out), "--quiet"]
        assert runner.invoke(app, args).exit_code == 0
        paths.append(str(out))
    result = runner.invoke(app, ["compare", *paths, "--markdown", str(tmp_path / "c.md")])
    assert result.exit_code == 0, result.output
    assert "vLLM (block 16 → block 32)" in result.output
    sglang = next(line for line in result.output.splitlines() if "SGLang (page 1, lru)" in line)
    assert sglang.split()[-1] == "+0.00%"
    assert "-0.00%" not in (tmp_path / "c.md").read_text()


def test_losses_of_diagnoses_over_different_requests_are_not_compared(tmp_path: Path) -> None:
    """A streamed log's leading sample beside the whole log: the losses count different requests,
    so compare says so and shows none, while the hit rates (both over the whole log) still
    compare."""
    whole = report(tmp_path, "whole", 48, requests=2500)  # more than one chunk of requests
    sampled = report(tmp_path, "sampled", 48, "--diagnose-tokens", "1", requests=2500)
    assert json.loads(sampled.read_text())["diagnosis_scope"]["whole_log"] is False
    diff_path = tmp_path / "diff.json"
    result = runner.invoke(app, ["compare", str(whole), str(sampled), "--json", str(diff_path)])
    assert result.exit_code == 0, result.output
    diff = json.loads(diff_path.read_text())
    (warning,) = diff["warnings"]
    assert "cover different requests" in warning and "losses by cause are not compared" in warning
    assert diff["losses"] == {}
    assert diff["engines"]["vllm"]["base_hit_rate"] == diff["engines"]["vllm"]["head_hit_rate"]
    same = runner.invoke(app, ["compare", str(whole), str(whole), "--json", str(diff_path)])
    assert same.exit_code == 0 and json.loads(diff_path.read_text())["warnings"] == []
