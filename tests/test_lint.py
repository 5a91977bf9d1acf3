"""``prefixcheck lint``: token lengths, alignment and dynamic placeholders of prompt templates."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from typer.testing import CliRunner

from analyzer.chat import chat_renderer
from analyzer.lint import lint_template
from analyzer.tokenizer import load_tokenizer
from cli.main import app

runner = CliRunner()
TOKENIZER = load_tokenizer(None)
RENDERER = chat_renderer(None, TOKENIZER.special)
STATIC = (
    "You are the support assistant for Acme Cloud. Answer questions about deployments, billing, "
    "DNS and TLS certificates. Be concise and friendly."
)


def lint(path: Path, **kwargs):
    return lint_template(path, TOKENIZER, RENDERER, 16, **kwargs)


def test_static_system_prompt_shares_up_to_the_user_turn(tmp_path: Path) -> None:
    path = tmp_path / "support.txt"
    path.write_text(STATIC)
    result = lint(path)
    rendered = RENDERER.render(
        [{"role": "system", "content": STATIC}, {"role": "user", "content": "x"}]
    )
    head = rendered[: rendered.index("x<|im_end|>")]
    expected = len(TOKENIZER.encode_batch([head], add_special_tokens=False)[0])
    assert result.shared_prefix_tokens == expected
    assert result.first_placeholder is None
    assert [f.rule for f in result.findings] == (["PC002"] if expected % 16 else [])


def test_placeholder_at_the_head_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dated.j2"
    path.write_text("Today is {{ date }}.\n" + STATIC)
    result = lint(path)
    (finding,) = result.findings
    assert finding.rule == "PC001" and finding.severity == "error" and finding.line == 1
    assert result.first_placeholder == "{{ date }}"
    assert result.static_tokens_after_placeholder >= 16
    moved = tmp_path / "moved.j2"
    moved.write_text(STATIC + "\nToday is {{ date }}.")
    assert lint(moved).static_tokens_after_placeholder < 16
    assert lint(moved).shared_prefix_tokens > result.shared_prefix_tokens


def test_json_message_list(tmp_path: Path) -> None:
    path = tmp_path / "sql.json"
    messages = [
        {"role": "system", "content": "Write SQL."},
        {"role": "user", "content": "{question}"},
    ]
    path.write_text(json.dumps(messages))
    result = lint(path)
    assert result.first_placeholder == "{question}"
    assert result.static_tokens_after_placeholder == 0


def test_cli_exit_codes_and_junit(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "good.txt").write_text(STATIC)
    junit = tmp_path / "lint.xml"
    ok = runner.invoke(app, ["lint", str(tmp_path / "prompts"), "--junit", str(junit)])
    assert ok.exit_code == 0, ok.output
    assert ET.parse(junit).getroot().get("failures") == "0"
    (tmp_path / "prompts" / "dated.j2").write_text("Now: {{ now }}. " + STATIC)
    bad = runner.invoke(app, ["lint", str(tmp_path / "prompts"), "--junit", str(junit)])
    assert bad.exit_code == 1
    assert "PC001 error" in bad.output
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_cli_missing_path_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["lint", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such file or folder" in result.output


def test_a_bad_file_does_not_stop_the_others_and_a_summary_ends(tmp_path: Path) -> None:
    static = "Be polite, answer in the user's language, and cite the handbook. " * 4
    (tmp_path / "a_dynamic.txt").write_text(f"Today is {{date}}. {static}\n")
    (tmp_path / "b_broken.json").write_text('[{"role": "system"')
    (tmp_path / "c_binary.md").write_bytes(b"\xff\xfe not text")
    (tmp_path / "d_static.txt").write_text(static)
    out = tmp_path / "lint.json"
    result = runner.invoke(app, ["lint", str(tmp_path), "--json", str(out)])
    assert result.exit_code == 2  # unreadable files are bad input; every file was still linted
    rules = {
        Path(t["path"]).name: [f["rule"] for f in t["findings"]]
        for t in json.loads(out.read_text())["templates"]
    }
    assert rules["a_dynamic.txt"] == ["PC001"]
    assert rules["b_broken.json"] == rules["c_binary.md"] == ["PC000"]
    assert "d_static.txt" in rules
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("4 templates: 3 errors (PC000 ×2, PC001 ×1)"), last
