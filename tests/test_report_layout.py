"""The example report as a user reads it in an 80-column terminal: the verdict first, nothing cut,
every column's unit or meaning said, padding advised only where the replay gains."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
FLAGS = ["--capacity-tokens", "20000", "--what-if", "move-dynamic+no-salt"]


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict]:
    out = tmp_path_factory.mktemp("layout") / "report.json"
    result = CliRunner().invoke(
        app,
        ["analyze", str(EXAMPLE), *FLAGS, "--json", str(out)],
        env={"COLUMNS": "80", "LINES": "50"},
        terminal_width=80,
    )
    assert result.exit_code == 0, result.output
    return result.output.splitlines(), json.loads(out.read_text())


def test_no_line_is_cut_at_80_columns(shown: tuple[list[str], dict]) -> None:
    lines, _ = shown
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    cut = [line for line in lines if line.rstrip(" │").endswith("…")]
    assert not cut, cut  # rich's ellipsis ends a cut cell; snippets' own "…" sit mid-line


def test_verdict_comes_first(shown: tuple[list[str], dict]) -> None:
    lines, report = shown
    text = "\n".join(lines)
    verdict = text.index("Verdict")
    assert verdict < text.index("Prefix-cache hits") < text.index("Top shared prefixes")
    head = text[verdict : text.index("Prefix-cache hits")]
    assert f"vLLM {report['engines']['vllm']['hit_rate']:.1%}" in head
    assert "cause dynamic content" in head  # the biggest avoidable cause of the example
    best = report["recommendations"][0]["summary"]
    assert " ".join(best.split()[:6]) in " ".join(head.replace("│", " ").split())


def test_units_and_meanings_are_said(shown: tuple[list[str], dict]) -> None:
    lines, report = shown
    text = " ".join(" ".join(lines).split())
    header = next(i for i, line in enumerate(lines) if re.match(r"^\s+capacity\s+KV on", line))
    assert "(tokens)" in lines[header + 1] and "llama-3.1-8b" in lines[header + 1]
    assert "% 16: tokens past the prefix's last full 16-token block" in text
    assert "pad: tokens that would align it" in text
    for engine, hits in report["upper_bounds"]["belady"].items():
        label = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
        assert re.search(rf"Belady bound, {label}\s+{hits['hit_tokens']:,}", text)
    assert not re.search(r"LRU [\d.]+%, Belady bound", text)  # a table row, not a paragraph
    # one row per template: the example's four templates, each listed once
    templates = {p["template"] for p in report["shared_prefixes"]}
    rows = [line for line in lines if re.match(r"^\s+\d+\s+\d[\d,]*\s+\d+\s+[\d,]+\s+[\d,]+", line)]
    assert len(rows) == len(templates)


def test_padding_shown_only_where_the_replay_gains(shown: tuple[list[str], dict]) -> None:
    lines, report = shown
    leads: dict[int, dict] = {}
    for prefix in report["shared_prefixes"]:
        leads.setdefault(prefix["template"], prefix)
    table = lines[next(i for i, line in enumerate(lines) if "Top shared prefixes" in line) :]
    for number, prefix in enumerate(leads.values(), 1):
        [row] = [
            line for line in table if re.match(rf"^\s+{number}\s+{prefix['tokens']:,}\s", line)
        ]
        pad = row.split()[5]
        gains = (prefix["padding_saves"] or 0) > 0
        assert pad == (f"+{prefix['padding']}" if gains else "-" if prefix["padding"] else "0")
    assert any((p["padding_saves"] or 0) <= 0 < p["padding"] for p in leads.values())


def test_the_verdicts_cause_is_over_the_diagnosed_sample(shown: tuple[list[str], dict]) -> None:
    """Streamed, the shares are over the diagnosed requests, and the verdict says so."""
    from analyzer.verdict import Verdict

    _, report = shown
    sampled = {**report, "diagnosis_scope": {**report["diagnosis_scope"], "whole_log": False}}
    tokens, share, cause = max(
        (entry["tokens"], entry["share"], cause)
        for causes in report["losses"].values()
        for cause, entry in causes.items()
        if cause not in ("never_seen", "last_token")
    )
    head = f"{cause.replace('_', ' ')}: {tokens:,} tokens, {share:.1%} of prompt tokens"
    assert Verdict.of(report).biggest_cause.startswith(f"{head} recomputed")
    assert Verdict.of(sampled).biggest_cause.startswith(f"{head} of the diagnosed sample")
