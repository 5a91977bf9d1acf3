"""The HTML report holds what the terminal shows (verdict, prefill estimate, the server's own
counts, gates, skipped lines, why each fix works), each cause in a colour of its own, and no cell
cut short. The page is looked at with tests/screenshot_html.py (headless Chromium)."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from cli.render_html import CAUSE_COLORS

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def page(tmp_path: Path, log: Path, *flags: str) -> str:
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["analyze", str(log), "--html", str(out), "--quiet", *flags])
    assert result.exit_code in (0, 1), result.output
    return unescape(re.sub(r"<[^>]+>", " ", out.read_text()))


def test_the_page_holds_what_the_terminal_shows(tmp_path: Path) -> None:
    # LiteLLM payloads: a skipped failed call and the server's cached-token counts
    text = " ".join(page(tmp_path, ROOT / "tests/fixtures/litellm_payloads.jsonl").split())
    for heading in ("Verdict", "Prefix-cache hits", "Skipped lines", "Replay vs the server's"):
        assert heading in text, heading
    assert "Prefill estimate (llama-3.1-8b shape)" in text
    example = ROOT / "examples" / "chat_logs.jsonl"
    flags = ["--capacity-tokens", "3000", "--fail-under", "0.9", "--what-if", "no-salt"]
    text = " ".join(page(tmp_path, example, *flags).split())
    assert "FAIL vLLM" in text and "why: " in text  # the gates, and why each fix works
    assert "Belady bound, vLLM" in text and "Belady bound, SGLang" in text
    assert "no-salt" in text


def test_each_cause_has_its_own_colour_and_no_cell_is_cut(tmp_path: Path) -> None:
    assert len(set(CAUSE_COLORS.values())) == len(CAUSE_COLORS)
    out = tmp_path / "report.html"
    example = ROOT / "examples" / "chat_logs.jsonl"
    flags = ["--capacity-tokens", "3000", "--what-if", "move-dynamic+no-salt+block-size=32"]
    runner.invoke(app, ["analyze", str(example), "--html", str(out), "--quiet", *flags])
    html = out.read_text()
    start = html.index("Recomputed prompt tokens by cause")
    stacked = html[start : html.index("<h2", start)]
    fills = re.findall(r'fill="(#\w+)"><title>([^:<]+):', stacked)
    by_name = {name: fill for fill, name in fills}
    assert len(set(by_name.values())) == len(by_name) >= 8, by_name
    legend = re.findall(r'width="12" height="12" fill="(#\w+)"', stacked)
    assert sorted(legend) == sorted(by_name.values())  # the legend draws the same colours
    assert "text-overflow" not in html and "overflow: hidden" not in html
    assert "move-dynamic+no-salt+block-size=32" in html
