"""The diagnosis through the command line: JSON keys, per-request loss columns, --what-if (each one
a replay of the changed log or flags), the HTML report, and the terminal charts."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from analyzer.diagnose.losses import CATEGORIES
from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
runner = CliRunner()


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("example")
    paths = {name: folder / name for name in ("report.json", "requests.parquet", "report.html")}
    result = runner.invoke(
        app,
        [
            "analyze",
            str(EXAMPLE),
            "--capacity-tokens",
            "8000",
            "--what-if",
            "block-size=32",
            "--what-if",
            "capacity=1e6",
            "--what-if",
            "no-salt+page-size=16",
            "--json",
            str(paths["report.json"]),
            "--per-request",
            str(paths["requests.parquet"]),
            "--html",
            str(paths["report.html"]),
        ],
        env={"COLUMNS": "120"},
    )
    assert result.exit_code == 0, result.output
    return {
        "output": result.output,
        "report": json.loads(paths["report.json"].read_text()),
        "table": pl.read_parquet(paths["requests.parquet"]),
        "html": paths["report.html"].read_text(),
        "folder": folder,
    }


def test_json_keys_and_per_request_losses(example: dict) -> None:
    report, table = example["report"], example["table"]
    for key in ("losses", "loss_definitions", "dynamic_content", "capacity_curve"):
        assert report[key]
    assert set(report["upper_bounds"]) >= {"ceiling", "belady"}
    assert {p["size"] for p in report["block_size_sweep"]["vllm"]} == {1, 4, 8, 16, 32, 64, 128}
    for engine in ("vllm", "sglang"):
        assert list(report["losses"][engine]) == list(CATEGORIES)
        columns = sum(table[f"{engine}_lost_{name}"] for name in CATEGORIES)
        assert (columns == table["prompt_tokens"] - table[f"{engine}_hit"]).all()
        for name in CATEGORIES:
            assert table[f"{engine}_lost_{name}"].sum() == report["losses"][engine][name]["tokens"]
    kinds = {"pad_prefix", "move_dynamic_content", "reorder_parts", "block_size"}
    kinds |= {"capacity", "salt", "engine"}
    for item in report["recommendations"]:
        assert item["kind"] in kinds and item["summary"]
        assert max(g["recomputed_tokens_saved"] for g in item["measured"].values()) > 0


def test_what_if_is_a_replay(example: dict, tmp_path: Path) -> None:
    report = example["report"]
    by_name = {item["name"]: item for item in report["what_if"]}
    assert list(by_name) == ["block-size=32", "capacity=1e6", "no-salt+page-size=16"]
    assert list(by_name["block-size=32"]["measured"]) == ["vllm"]
    for name, flags in (
        ("block-size=32", ["--block-size", "32", "--capacity-tokens", "8000"]),
        ("capacity=1e6", ["--capacity-tokens", "1000000"]),
    ):
        out = tmp_path / f"{name}.json"
        result = runner.invoke(
            app, ["analyze", str(EXAMPLE), *flags, "--json", str(out), "--quiet"]
        )
        assert result.exit_code == 0, result.output
        replayed = json.loads(out.read_text())
        for engine, gain in by_name[name]["measured"].items():
            assert gain["hit_tokens_before"] == report["engines"][engine]["hit_tokens"]
            assert gain["hit_tokens_after"] == replayed["engines"][engine]["hit_tokens"]
    assert "What if (replayed)" in example["output"]


def test_bad_what_if_is_a_usage_error() -> None:
    result = runner.invoke(app, ["analyze", str(EXAMPLE), "--what-if", "pad", "--quiet"])
    assert result.exit_code == 2
    assert "unknown --what-if 'pad'" in result.output


def test_html_report_is_self_contained(example: dict) -> None:
    html = example["html"]
    assert html.startswith("<!DOCTYPE html>")
    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        ET.fromstring(svg)  # well-formed
    assert html.count("<svg") == 3
    assert re.findall(r"(?:src|href)\s*=|url\(|<link|<script|<img", html) == []
    assert "Recomputed prompt tokens by cause" in html
    assert "Token hit rate against KV capacity" in html


def test_terminal_shows_losses_and_charts(example: dict) -> None:
    output = example["output"]
    for title in (
        "Recomputed prompt tokens by cause",
        "Dynamic content before shared text",
        "Token hit rate against KV capacity",
        "Hit rate against block size",
    ):
        assert title in output
    assert "█" in output


def test_unsorted_log_is_diagnosed_in_arrival_order(example: dict) -> None:
    """The same requests, lines reversed: replayed by timestamp, so the same diagnosis, and the
    per-request losses follow the lines."""
    folder = example["folder"]
    lines = EXAMPLE.read_text().splitlines()
    reversed_log = folder / "reversed.jsonl"
    reversed_log.write_text("\n".join(reversed(lines)) + "\n")
    out, table_path = folder / "reversed.json", folder / "reversed.parquet"
    result = runner.invoke(
        app,
        [
            "analyze",
            str(reversed_log),
            "--capacity-tokens",
            "8000",
            "--json",
            str(out),
            "--per-request",
            str(table_path),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    report, original = json.loads(out.read_text()), example["report"]
    for key in ("losses", "dynamic_content", "upper_bounds", "block_size_sweep"):
        assert report[key] == original[key]
    assert [r["summary"] for r in report["recommendations"]] == [
        r["summary"] for r in original["recommendations"]
    ]
    table = pl.read_parquet(table_path)
    column = "vllm_lost_eviction"
    assert table[column].to_list() == example["table"][column].to_list()[::-1]


def test_curves_unchecked_by_default(example: dict) -> None:
    for curve in example["report"]["capacity_curve"].values():
        assert curve["points"] and curve["checks"] == [] and curve["max_abs_error"] is None
    assert "vs replays" not in example["output"]


def test_no_diagnosis_keeps_hit_rates(example: dict, tmp_path: Path) -> None:
    out = tmp_path / "bare.json"
    flags = ["analyze", str(EXAMPLE), "--capacity-tokens", "8000", "--json", str(out), "--quiet"]
    result = runner.invoke(app, [*flags, "--no-diagnosis"])
    assert result.exit_code == 0, result.output
    bare, full = json.loads(out.read_text()), example["report"]
    for engine in ("vllm", "sglang"):
        assert bare["engines"][engine] == full["engines"][engine]
    assert bare["ceiling"] == full["ceiling"]
    assert bare["shared_prefixes"] and bare["recommendations"] == []
    assert "losses" not in bare and "capacity_curve" not in bare
    refused = runner.invoke(app, [*flags, "--no-diagnosis", "--what-if", "block-size=32"])
    assert refused.exit_code == 2 and "need the diagnosis" in refused.output
    gated = runner.invoke(app, [*flags, "--no-diagnosis", "--max-loss", "eviction=5%"])
    assert gated.exit_code == 2 and "needs the diagnosis" in gated.output
    aligned = runner.invoke(app, [*flags, "--no-diagnosis", "--max-loss", "alignment=100%"])
    assert aligned.exit_code == 0, aligned.output


def test_replay_in_time_diagnoses_a_leading_sample(tmp_path: Path) -> None:
    out = tmp_path / "timed.json"
    per_request = tmp_path / "timed.parquet"
    args = ["analyze", str(EXAMPLE), "--replay-in-time", "--diagnose-tokens", "20000"]
    result = runner.invoke(
        app, [*args, "--json", str(out), "--per-request", str(per_request), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    report, table = json.loads(out.read_text()), pl.read_parquet(per_request)
    scope = report["diagnosis_scope"]
    assert not scope["whole_log"] and 0 < scope["prompt_tokens"] <= 20000
    assert scope["requests"] < report["requests"]
    diagnosed = table.head(scope["requests"])
    for engine in ("vllm", "sglang"):
        lost = sum(diagnosed[f"{engine}_lost_{name}"] for name in CATEGORIES)
        assert (lost == diagnosed["prompt_tokens"] - diagnosed[f"{engine}_hit"]).all()
        assert table[f"{engine}_lost_eviction"][scope["requests"] :].null_count() > 0
    assert any("replayed whole, in its replay mode" in note for note in report["notes"])
