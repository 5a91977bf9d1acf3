"""The command line behaves as an engineer's other tools do: --version, -h, help that fits 80
columns without cutting a flag name."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

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


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "chat_logs.jsonl"


def analyze(*flags: str) -> tuple[int, str, dict | None]:
    result = runner.invoke(app, ["analyze", str(EXAMPLE), "--json", "-", *flags])
    try:
        return result.exit_code, result.stderr, json.loads(result.stdout)
    except ValueError:
        return result.exit_code, result.output, None


def test_json_dash_is_standard_output_alone(tmp_path: Path) -> None:
    code, _, report = analyze("--diagnose-tokens", "2000")
    assert code == 0 and report is not None and report["requests"] == 600
    assert not (Path.cwd() / "-").exists()
    result = runner.invoke(app, ["analyze", str(EXAMPLE), "--json", "-", "--markdown", "-"])
    assert result.exit_code == 2 and "both write to standard output" in result.output


def test_a_repeated_single_valued_flag_is_an_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    result = runner.invoke(
        app, ["analyze", str(EXAMPLE), "--per-request", str(a), f"--per-request={b}"]
    )
    assert result.exit_code == 2
    assert "'--per-request': given 2 times" in " ".join(result.output.split())
    assert not a.exists() and not b.exists()
    # repeatable ones stay repeatable
    twice = ["--what-if", "no-salt", "--what-if", "block-size=32", "--quiet"]
    assert runner.invoke(app, ["analyze", str(EXAMPLE), *twice]).exit_code == 0


@pytest.mark.parametrize(
    ("rate", "code"), [("0.7", 0), ("70", 0), ("70%", 0), ("0.9", 1), ("90", 1)]
)
def test_fail_under_takes_a_rate_or_a_percentage(rate: str, code: int) -> None:
    result = runner.invoke(app, ["analyze", str(EXAMPLE), "--quiet", "--fail-under", rate])
    assert result.exit_code == code, result.output  # the example: vLLM 77.6%, SGLang 81.1%


def test_the_engines_own_flag_names() -> None:
    """--radix-eviction-policy (SGLang), --max-num-seqs (vLLM), --max-total-tokens (SGLang) and
    --kv-cache-memory-bytes (vLLM, in tokens of the model shape) are the flags they name."""
    pairs = [
        (
            ["--radix-eviction-policy", "lfu", "--capacity-tokens", "3000"],
            ["--eviction-policy", "lfu", "--capacity-tokens", "3000"],
        ),
        (["--max-num-seqs", "4"], ["--concurrency", "4"]),
        (["--max-total-tokens", "3000"], ["--capacity-tokens", "3000"]),
    ]
    for alias, flags in pairs:
        _, _, with_alias = analyze("--diagnose-tokens", "2000", *alias)
        _, _, with_flag = analyze("--diagnose-tokens", "2000", *flags)
        assert with_alias and with_flag
        assert with_alias["engines"] == with_flag["engines"], alias
    code, _, by_bytes = analyze("--diagnose-tokens", "2000", "--kv-cache-memory-bytes", "1GiB")
    per_token = by_bytes["prefill_estimate"]["kv_bytes_per_token"]
    assert by_bytes["engines"]["vllm"]["config"]["capacity_tokens"] == 2**30 // per_token
    code, message, _ = analyze("--kv-cache-memory-bytes", "1GiB", "--capacity-tokens", "9")
    assert code == 2 and "give one" in message
