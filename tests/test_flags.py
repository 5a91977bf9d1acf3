"""Flags are parsed and checked where they enter: a bad value fails before any log is read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--what-if", "pad"], "unknown --what-if 'pad'"),
        (["--what-if", "block-size=0"], "--what-if block-size=0: not a valid value"),
        (["--what-if", "move-dynamic+move-dynamic"], "move-dynamic given twice"),
        (["--what-if", "capacity=8"], "at least one block"),
        (["--engine", "vlm"], "'vlm' is not one of"),
        (["--eviction-policy", "random"], "'random' is not one of"),
        (["--max-loss", "aligment=5%"], "no cause 'aligment'; did you mean alignment?"),
        (["--max-loss", "alignment"], "expected KIND=TOKENS"),
        (["--json", "/nonexistent-folder/r.json"], "--json /nonexistent-folder/r.json: no folder"),
        (["--per-request", "."], "--per-request .: is a folder"),
        (["--capacity-tokens", "8"], "at least one block"),
        (["--model-preset", "llama-9"], "llama-9"),
    ],
)
def test_bad_flags_fail_before_reading(flags: list[str], reason: str, tmp_path: Path) -> None:
    missing = tmp_path / "never-read.jsonl"  # reading it would fail with another error
    started = time.perf_counter()
    result = runner.invoke(app, ["analyze", str(missing), "--quiet", *flags])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 2, result.output
    assert reason in " ".join(result.output.split()), result.output
    assert "never-read" not in result.output
    assert elapsed < 5  # a generous bound for a loaded CI machine; about 10 ms here


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_output_fails_before_the_run(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = runner.invoke(
            app, ["analyze", str(EXAMPLE), "--quiet", "--markdown", str(locked / "r.md")]
        )
    finally:
        locked.chmod(0o700)
    assert result.exit_code == 2
    assert "cannot write" in result.output


@pytest.mark.parametrize("command", ["measure", "export-trace"])
def test_other_commands_check_their_outputs(command: str, tmp_path: Path) -> None:
    flag = "--json" if command == "measure" else "--output"
    result = runner.invoke(app, [command, str(tmp_path / "x.jsonl"), flag, str(tmp_path)])
    assert result.exit_code == 2
    assert "is a folder" in result.output
