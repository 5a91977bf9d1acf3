"""CI gates and their outputs: each gate both ways with its exit code, JUnit XML that parses,
Markdown, GitHub step summaries and annotations, and byte-identical JSON across runs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.errors import PrefixcheckError
from analyzer.gates import LossLimit, evaluate_gates
from cli.main import app

runner = CliRunner()
# Two identical 40-token prompts: vLLM hits 32 of 80 tokens (40%), SGLang 39 (48.75%);
# alignment loss 7 tokens.
REQUESTS = [{"prompt_token_ids": list(range(40))}] * 2


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    return path


def analyze(*args: str | Path) -> object:
    return runner.invoke(app, ["analyze", *map(str, args), "--quiet"])


@pytest.mark.parametrize(
    ("flags", "exit_code"),
    [
        (["--fail-under", "0.45", "--engine", "sglang"], 0),
        (["--fail-under", "0.45", "--engine", "vllm"], 1),
        (["--fail-under", "0.45"], 1),
        (["--max-loss", "alignment=7"], 0),
        (["--max-loss", "alignment=6"], 1),
        (["--max-loss", "alignment=9%"], 0),
        (["--max-loss", "alignment=8%"], 1),
    ],
)
def test_gates_pass_and_fail(log: Path, flags: list[str], exit_code: int) -> None:
    result = analyze(log, *flags)
    assert result.exit_code == exit_code, result.output
    assert ("gate failed" in result.output) == (exit_code == 1)


def test_bad_gate_flags_exit_2(log: Path) -> None:
    assert analyze(log, "--max-loss", "alignment").exit_code == 2
    assert analyze(log, "--fail-under", "0.5", "--engine", "tgi").exit_code == 2


def test_junit_has_one_case_per_gate(log: Path, tmp_path: Path) -> None:
    junit = tmp_path / "gates.xml"
    result = analyze(log, "--fail-under", "0.45", "--max-loss", "alignment=10", "--junit", junit)
    assert result.exit_code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == 4  # 2 gates x 2 engines
    failed = [case.get("name") for case in cases if case.find("failure") is not None]
    assert failed == ["vllm: hit rate >= 45.00%"]
    assert suite.get("tests") == "4" and suite.get("failures") == "1"


def test_markdown_summary(log: Path, tmp_path: Path) -> None:
    path = tmp_path / "summary.md"
    assert analyze(log, "--markdown", path, "--fail-under", "0.3").exit_code == 0
    text = path.read_text()
    assert "| vLLM (block 16) | 32 | 40.00% |" in text
    assert "| vllm: hit rate >= 30.00% | ✅" in text


def test_github_actions_summary_and_annotations(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = analyze(log, "--fail-under", "0.45")
    assert result.exit_code == 1
    assert "::error title=prefixcheck gate::vLLM (block 16) token hit rate 40.00%25 < 45.00%25" in (
        result.output
    )
    assert "## prefixcheck" in summary.read_text()


def test_no_github_output_outside_actions(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    assert "::" not in analyze(log, "--fail-under", "0.45").output


def test_json_is_byte_identical_across_runs(log: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert analyze(log, "--json", first).exit_code == 0
    assert analyze(log, "--json", second).exit_code == 0
    assert first.read_bytes() == second.read_bytes()


def test_loss_limit_parsing() -> None:
    assert LossLimit.parse("alignment=12") == LossLimit("alignment", 12.0, False)
    assert LossLimit.parse("eviction = 2.5%") == LossLimit("eviction", 0.025, True)
    with pytest.raises(PrefixcheckError):
        LossLimit.parse("alignment=120%")
    # the cause spelled as a flag is the cause; a misspelt one is named with the right name
    assert LossLimit.parse("dynamic-content=5%") == LossLimit("dynamic_content", 0.05, True)
    with pytest.raises(PrefixcheckError, match=r"did you mean dynamic_content\?"):
        LossLimit.parse("dynamic_contnet=5%")
    with pytest.raises(PrefixcheckError, match=r"no cause 'magic'.*causes: never_seen"):
        LossLimit.parse("magic=5")


def test_unknown_loss_kind_is_an_error() -> None:
    report = {
        "prompt_tokens": 10,
        "engines": {"vllm": {"label": "v", "hit_rate": 0.5}},
        "losses": {"vllm": {"alignment": {"tokens": 1}}},
    }
    with pytest.raises(PrefixcheckError, match="no cause 'typo'"):
        LossLimit.parse("typo=1")
    # a cause the report does not hold (an older report, say) is named when the gate runs
    with pytest.raises(PrefixcheckError, match="unknown loss 'eviction'"):
        evaluate_gates(report, max_losses=[LossLimit.parse("eviction=1")], engine="vllm")
