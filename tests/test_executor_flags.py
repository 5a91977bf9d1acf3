"""--executor and --ray-address as they enter: checked before anything is read (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chat_logs.jsonl"


def test_ray_without_the_extra_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("analyzer.executors.importlib.util.find_spec", lambda name: None)
    result = CliRunner().invoke(app, ["analyze", str(EXAMPLE), "--executor", "ray"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == ["prefixcheck: error: --executor ray needs Ray: pip install 'prefixcheck[ray]'"]


def test_a_ray_address_needs_the_ray_executor() -> None:
    result = CliRunner().invoke(app, ["analyze", str(EXAMPLE), "--ray-address", "auto"])
    assert result.exit_code == 2
    assert "--ray-address needs --executor ray" in result.output


def test_an_unknown_executor_is_refused() -> None:
    result = CliRunner().invoke(app, ["analyze", str(EXAMPLE), "--executor", "spark"])
    assert result.exit_code == 2
