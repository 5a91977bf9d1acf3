"""The JSON report validates against its published schema, whatever the log and the flags."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from analyzer.report import report_schema
from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
runner = CliRunner()
VALIDATOR = jsonschema.Draft202012Validator(report_schema())


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(report_schema())


@pytest.mark.parametrize(
    "args",
    [
        [str(ROOT / "examples" / "chat_logs.jsonl")],
        [str(ROOT / "examples" / "chat_logs.jsonl"), "--capacity-tokens", "4000", "--redact"],
        [str(ROOT / "examples" / "chat_logs.jsonl"), "--what-if", "block-size=32"],
        [str(FIXTURES / "vllm_server.log")],
        [str(FIXTURES / "openai_chat.jsonl")],
        [str(FIXTURES / "sglang_server.log")],
        [str(FIXTURES / "mooncake_trace.jsonl"), "--concurrency", "4"],
        [str(FIXTURES / "litellm_payloads.jsonl"), "--page-size", "16"],
    ],
)
def test_reports_validate(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["analyze", *args, "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in VALIDATOR.iter_errors(report)]
    assert errors == []


def test_schema_rejects_a_broken_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    runner.invoke(
        app, ["analyze", str(FIXTURES / "openai_chat.jsonl"), "--json", str(out), "--quiet"]
    )
    report = json.loads(out.read_text())
    del report["engines"]["vllm"]["hit_rate"]
    report["recommendations"] = [{"kind": "magic", "summary": "x", "details": {}, "measured": {}}]
    assert len(list(VALIDATOR.iter_errors(report))) == 2


def test_schema_command_prints_it() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert json.loads(result.output)["title"] == "prefixcheck analyze report"
