"""Settings from prefixcheck.toml / [tool.prefixcheck], overridden by flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "t.jsonl"
    log.write_text(
        "".join(json.dumps({"prompt_token_ids": list(range(40))}) + "\n" for _ in range(2))
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_pyproject_settings_apply(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.prefixcheck]\nblock-size = 32\nfail-under = 0.45\nengine = "vllm"\n'
    )
    result = runner.invoke(app, ["analyze", "t.jsonl", "--json", "r.json", "--quiet"])
    assert result.exit_code == 1  # vLLM at block 32 hits 32 of 80: below the configured gate
    report = json.loads((project / "r.json").read_text())
    assert report["engines"]["vllm"]["config"]["block_size"] == 32


def test_flags_override_settings(project: Path) -> None:
    (project / "prefixcheck.toml").write_text("fail-under = 0.45\n[analyze]\nblock_size = 32\n")
    result = runner.invoke(app, ["analyze", "t.jsonl", "--fail-under", "0.3", "--quiet"])
    assert result.exit_code == 0


def test_unknown_setting_is_an_error(project: Path) -> None:
    (project / "prefixcheck.toml").write_text("blok-size = 32\n")
    result = runner.invoke(app, ["analyze", "t.jsonl", "--quiet"])
    assert result.exit_code == 2
    assert "unknown setting 'blok-size'" in result.output


def test_explicit_config_path(project: Path) -> None:
    (project / "ci.toml").write_text("fail-under = 0.9\n")
    result = runner.invoke(app, ["--config", "ci.toml", "analyze", "t.jsonl", "--quiet"])
    assert result.exit_code == 1


def test_block_size_setting_leaves_export_trace_hash_ids_alone(project: Path) -> None:
    """``block-size`` is vLLM's block (analyze, measure); export-trace's tokens per hash id is
    ``--hash-id-tokens``, so a shared setting cannot change the trace."""
    (project / "prefixcheck.toml").write_text("block-size = 4\n")
    result = runner.invoke(app, ["export-trace", "t.jsonl", "-o", "trace.jsonl"])
    assert result.exit_code == 0, result.output
    first = json.loads((project / "trace.jsonl").read_text().splitlines()[0])
    assert len(first["hash_ids"]) == 1  # 40 tokens in one 512-token hash id, not ten of 4
    old = runner.invoke(app, ["export-trace", "t.jsonl", "-o", "x.jsonl", "--block-size", "16"])
    assert old.exit_code == 2
    assert "--hash-id-tokens" in old.output
