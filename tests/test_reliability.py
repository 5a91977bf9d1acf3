"""Hostile inputs, one class at a time: every one is a counted skip naming file, line and reason,
or an error that says why the run stopped (exit 2); none is a traceback, an unbounded allocation
or a hang; a bug is exit 70 with one line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

import analyzer.errors as errors
import analyzer.loaders.sources as sources
from analyzer.errors import PrefixcheckError, StrictModeError
from analyzer.ingest import IngestOptions, ingest
from analyzer.loaders import load_logs
from analyzer.progress import NoProgress
from analyzer.tokenizer import load_tokenizer
from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


def lines(path: Path, *items: object) -> Path:
    path.write_bytes(
        b"".join(
            (item if isinstance(item, bytes) else json.dumps(item).encode()) + b"\n"
            for item in items
        )
    )
    return path


def accounted(loaded, n_lines: int) -> None:  # type: ignore[no-untyped-def]
    """Every line read is a request or a counted skip, never both, never neither."""
    assert loaded.lines_read == n_lines
    request_lines = {r.line for r in loaded.records}
    skip_lines = {s.line for s in loaded.skips}
    assert not request_lines & skip_lines
    assert request_lines | skip_lines == set(range(1, n_lines + 1))


HOSTILE_LINES = {
    "deep nesting": b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "deep but parseable": b'{"messages": [' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"]}",
    "5,000-digit count": b'{"messages": [], "usage": {"prompt_tokens": ' + b"9" * 5000 + b"}}",
    "400-digit time": b'{"messages": [{"role":"user","content":"x"}], "created": 1'
    + b"0" * 400
    + b"}",
    "role of the wrong type": {"messages": [{"role": 5, "content": "x"}]},
    "role a list": {"messages": [{"role": ["user"], "content": "x"}]},
    "content a number": {"messages": [{"role": "user", "content": 12}]},
    "tool result of images": {
        "messages": [{"role": "tool", "content": [{"type": "image", "image": 3}]}]
    },
    "messages a string": {"messages": "hello"},
    "messages of scalars": {"messages": [1, 2]},
    "lone surrogate": b'{"messages": [{"role": "user", "content": "a \\ud800 b"}]}',
    "claimed output 5e8": {**CHAT, "usage": {"completion_tokens": 500_000_000}},
    "claimed output 3e9": {**CHAT, "usage": {"completion_tokens": 3_000_000_000}},
    "cached count negative huge": {**CHAT, "usage": {"prompt_tokens": 2**70}},
    "NaN": b'{"messages": [{"role":"user","content":"x"}], "created": NaN}',
    "not an object": b"[1, 2, 3]",
    "not UTF-8": b'{"messages": "\xff\xfe"}',
}


@pytest.mark.parametrize("name", HOSTILE_LINES)
def test_each_hostile_line_is_a_counted_skip_or_a_request(tmp_path: Path, name: str) -> None:
    log = lines(tmp_path / "log.jsonl", CHAT, HOSTILE_LINES[name], CHAT)
    ingested = ingest([log], IngestOptions(), NoProgress())  # read, render, tokenize
    skips = ingested.loaded.skips + ingested.tokenized.skips
    assert ingested.tokenized.workload.n_requests + len(skips) == 3
    assert all(f"{skip}".startswith(f"{log}:2: ") for skip in skips)
    if skips:
        with pytest.raises(StrictModeError, match=r"log\.jsonl:2: "):
            ingest([log], IngestOptions(strict=True), NoProgress())


def test_all_hostile_lines_through_the_command(tmp_path: Path) -> None:
    log = lines(
        tmp_path / "log.jsonl", *[item for v in HOSTILE_LINES.values() for item in (CHAT, v)]
    )
    result = runner.invoke(app, ["analyze", str(log), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["requests"] + report["skipped"]["count"] == 2 * len(HOSTILE_LINES)
    strict = runner.invoke(app, ["analyze", str(log), "--strict", "--quiet"])
    assert strict.exit_code == 2 and "log.jsonl:2:" in strict.output.replace("\n", "")
    assert "Traceback" not in result.output + strict.output


def test_claimed_output_lengths_are_bounded_not_allocated(tmp_path: Path) -> None:
    log = lines(
        tmp_path / "t.jsonl",
        {"timestamp": 1, "input_length": 3, "output_length": 3_000_000_000, "hash_ids": [1]},
        {"timestamp": 2, "input_length": 3, "output_length": 5, "hash_ids": [1]},
        {"timestamp": 3, "input_length": 10**12, "hash_ids": [1]},
    )
    loaded = load_logs([log], "hash-trace")
    accounted(loaded, 3)
    assert [s.line for s in loaded.skips] == [1, 3]
    assert "beyond any model" in loaded.skips[0].reason


def test_nan_time_with_replay_in_time(tmp_path: Path) -> None:
    log = lines(
        tmp_path / "p.jsonl",
        b'{"prompt": "a b c", "timestamp": NaN}',
        {"prompt": "a b c", "timestamp": 1.0},
        {"prompt": "a b c d", "timestamp": 1e300},
    )
    loaded = load_logs([log], "prompt", fields=None)
    accounted(loaded, 3)
    result = runner.invoke(app, ["analyze", str(log), "--replay-in-time", "--quiet"])
    assert result.exit_code == 0, result.output


def test_bom_on_a_one_line_file(tmp_path: Path) -> None:
    log = tmp_path / "bom.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + json.dumps(CHAT).encode() + b"\n")
    assert len(load_logs([log]).records) == 1
    array = tmp_path / "bom.json"
    array.write_bytes(b"\xef\xbb\xbf" + json.dumps([CHAT, CHAT]).encode())
    assert len(load_logs([array]).records) == 2


def test_truncated_compressed_files_are_errors(tmp_path: Path) -> None:
    data = b"".join(json.dumps({"prompt": f"hello {i}"}).encode() + b"\n" for i in range(5000))
    whole = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "t.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(data)[:3000])
    two_frames = whole + zstandard.ZstdCompressor().compress(data)
    (tmp_path / "two.jsonl.zst").write_bytes(two_frames)
    for name in ("t.jsonl.zst", "t.jsonl.gz"):
        with pytest.raises(PrefixcheckError, match=name.replace(".", r"\.")):
            load_logs([tmp_path / name])
    assert len(load_logs([tmp_path / "two.jsonl.zst"]).records) == 10_000


def test_long_lines_are_skipped_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1000)
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    log = lines(tmp_path / "l.jsonl", CHAT, big, CHAT)
    loaded = load_logs([log])
    accounted(loaded, 3)
    assert "over the maximum" in loaded.skips[0].reason and loaded.skips[0].line == 2


def test_skips_are_counted_with_a_bounded_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "SKIPS_KEPT", 10)
    log = tmp_path / "n.jsonl"
    log.write_bytes(json.dumps(CHAT).encode() + b"\n" + b"\n" * 5000 + b"{oops\n" * 100)
    loaded = load_logs([log])
    assert loaded.lines_read == 5101 and len(loaded.records) == 1
    assert len(loaded.skips) == 5100 and len(loaded.skips.kept) == 10
    assert loaded.skips.reasons == {"blank line": 5000, "malformed JSON": 100}


def test_named_pipe_is_opened_once(tmp_path: Path) -> None:
    pipe = tmp_path / "logs.json"
    os.mkfifo(pipe)

    def write() -> None:
        with pipe.open("wb") as handle:
            handle.write(json.dumps([CHAT, CHAT]).encode())

    writer = threading.Thread(target=write)
    writer.start()
    loaded = load_logs([pipe])
    writer.join(timeout=10)
    assert len(loaded.records) == 2 and not writer.is_alive()


def test_devices_are_refused() -> None:
    with pytest.raises(PrefixcheckError, match="not a regular file or a named pipe"):
        load_logs(["/dev/zero"])


def test_unreadable_subfolder_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines(tmp_path / "a.jsonl", CHAT)
    (tmp_path / "locked").mkdir()
    lines(tmp_path / "locked" / "b.jsonl", CHAT)
    real = os.scandir

    def scandir(path: object = ".") -> object:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PrefixcheckError, match=r"locked: cannot read this folder"):
        load_logs([tmp_path])


def test_broken_pyproject_without_our_table_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project\nname = broken")
    assert runner.invoke(app, ["schema"]).exit_code == 0
    (tmp_path / "pyproject.toml").write_text("[tool.prefixcheck]\nblock-size = = 3")
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 2 and "invalid TOML" in result.output


@pytest.fixture(scope="module")
def good_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    good = tmp_path_factory.mktemp("good") / "good.json"
    log = lines(good.parent / "c.jsonl", CHAT, CHAT)
    assert runner.invoke(app, ["analyze", str(log), "--json", str(good), "--quiet"]).exit_code == 0
    return good


@pytest.mark.parametrize(
    "report",
    [
        {"schema_version": 1},
        {"schema_version": 1, "engines": []},
        {"schema_version": 1, "engines": {"vllm": {"hit_rate": "x"}}},
        {
            "schema_version": 1,
            "engines": {e: {"hit_rate": 0.5, "label": e} for e in ("vllm", "sglang")},
            "shared_prefixes": [{"fingerprint": 3}],
        },
        {
            "schema_version": 1,
            "engines": {e: {"hit_rate": 0.5, "label": e} for e in ("vllm", "sglang")},
            "losses": {"vllm": {"eviction": "many"}},
        },
    ],
)
def test_compare_reports_of_the_wrong_shape(
    tmp_path: Path, good_report: Path, report: dict
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    result = runner.invoke(app, ["compare", str(good_report), str(bad)])
    assert result.exit_code == 2 and "not a prefixcheck report" in result.output, result.output


def test_deep_json_in_lint_and_kwargs(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "m.json").write_text(deep)
    result = runner.invoke(app, ["lint", str(tmp_path / "m.json")])
    assert result.exit_code == 2 and "nested deeper" in result.output
    log = lines(tmp_path / "c.jsonl", CHAT)
    result = runner.invoke(app, ["analyze", str(log), "--chat-template-kwargs", deep])
    assert result.exit_code == 2 and "nested deeper" in result.output


@pytest.mark.parametrize("spec", ["models/qwen2.5", "./qwen/tokenizer.json", "a/b/c", "x.json"])
def test_a_missing_local_path_never_goes_to_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()

    def no_hub(repo_id: str, fast: bool) -> None:
        raise AssertionError(f"hub asked for {repo_id}")

    monkeypatch.setattr("analyzer.tokenizer._from_hub", no_hub)
    with pytest.raises(PrefixcheckError, match="no such tokenizer file or folder"):
        load_tokenizer(spec)


def test_strict_stops_at_a_bad_line(tmp_path: Path) -> None:
    log = lines(tmp_path / "s.jsonl", CHAT, HOSTILE_LINES["deep nesting"])
    with pytest.raises(StrictModeError, match=r"s\.jsonl:2: JSON nested too deeply"):
        load_logs([log], strict=True)


def test_a_bug_is_exit_70_with_one_line(tmp_path: Path) -> None:
    log = lines(tmp_path / "c.jsonl", CHAT)
    code = (
        "import sys, analyzer.pipeline as p\n"
        "def boom(*a, **k): raise ZeroDivisionError('planted')\n"
        "p.diagnose_log = boom\n"
        "from cli.entry import main\n"
        f"sys.argv = ['prefixcheck', 'analyze', {str(log)!r}, '--quiet']\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 70, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("prefixcheck: internal error: ZeroDivisionError: planted")
    assert "please report it" in line
