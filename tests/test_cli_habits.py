"""The command line behaves as an engineer's other tools do: --version, -h, help that fits 80
columns without cutting a flag name."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
COMMANDS = ["analyze", "measure", "compare", "lint", "export-trace", "schema"]


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"prefixcheck {version('prefixcheck')}"


@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)])
def test_help_fits_80_columns_and_names_every_flag_whole(command: list[str]) -> None:
    short = runner.invoke(app, [*command, "-h"], env={"COLUMNS": "80"}, terminal_width=80)
    long = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert short.exit_code == long.exit_code == 0
    assert short.output == long.output
    lines = long.output.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "…" not in long.output
    group = typer.main.get_command(app)
    target = group.commands[command[0]] if command else group  # type: ignore[attr-defined]
    words = set(re.findall(r"--?[\w-]+", long.output))
    for param in target.params:
        if getattr(param, "param_type_name", None) != "option":
            continue
        for name in [*param.opts, *param.secondary_opts]:
            assert name in words, f"{name} cut or missing in {' '.join(command)} --help"
