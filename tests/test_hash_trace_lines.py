"""The batched reader of hash-id trace lines (Mooncake, Bailian) gives every line the Record or
the skip that the ordinary line-by-line reader (``hash_trace.parse`` and the guard) gives it."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

import analyzer.loaders as loaders
from analyzer.ingest import IngestOptions
from analyzer.loaders import hash_trace, load_logs
from analyzer.pipeline import AnalyzeOptions, analyze

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HASH_FORMATS = ("hash-trace", "bailian-trace")


def _ordinary(patch: pytest.MonkeyPatch) -> None:
    """Every hash-trace line through ``parse``: the formats without their batch readers."""
    for name in HASH_FORMATS:
        patch.setitem(loaders.FORMATS, name, replace(loaders.FORMATS[name], batch=None))


def _read(
    path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool, fmt: str, block: int | None
) -> tuple[list, list, int]:
    with monkeypatch.context() as patch:
        if not fast:
            _ordinary(patch)
        loaded = load_logs([path], fmt, hash_block_size=block)
    records = []
    for record in loaded.records:
        fields = asdict(record)
        blocks = fields.pop("hash_blocks")
        assert record.hash_blocks is not None and record.hash_blocks.ids.dtype == np.int64
        blocks["ids"] = blocks["ids"].tolist()
        records.append((fields, blocks))
    return records, [(skip.line, skip.reason) for skip in loaded.skips], loaded.skips.count


def _random_lines(rng: np.random.Generator, n: int, block: int, bailian: bool) -> list[bytes]:
    """Valid lines: int, float, null and absent timestamps, some with ``output_hash_ids``,
    fields in any order and JSON whitespace."""
    lines = []
    for i in range(n):
        input_length = int(rng.integers(1, 6 * block))
        blocks = -(-input_length // block)
        obj: dict = {"input_length": input_length, "output_length": int(rng.integers(0, 3 * block))}
        obj["hash_ids"] = rng.integers(0, 2**31, blocks).tolist()
        if obj["output_length"] and rng.random() < 0.4:
            more = -(-(input_length + obj["output_length"]) // block) - blocks
            obj["output_hash_ids"] = rng.integers(0, 2**31, more).tolist()
        elif rng.random() < 0.1:
            obj["output_length"] = None
        when = rng.random()
        if when < 0.3:
            obj["timestamp"] = int(rng.integers(0, 10**10))
        elif when < 0.6:
            obj["timestamp"] = float(rng.random() * 1e9)
        elif when < 0.7:
            obj["timestamp"] = None
        if bailian:
            obj["chat_id"] = int(i) if rng.random() < 0.7 else f"c{i}"
            obj.update(parent_chat_id=i - 1, type="text", turn=int(rng.integers(1, 5)))
        items = list(obj.items())
        rng.shuffle(items)
        lines.append(json.dumps(dict(items), indent=None if rng.random() < 0.8 else 1).encode())
    return [line.replace(b"\n", b" ") for line in lines]


@pytest.mark.parametrize(
    ("fmt", "block", "bailian"),
    [
        ("auto", None, False),
        ("hash-trace", 64, False),
        ("auto", None, True),
        ("bailian-trace", 8, True),
        ("hash-trace", None, True),  # Bailian lines read as Mooncake's blocks: ids, seconds
    ],
)
def test_random_valid_lines_read_as_parse_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, block: int | None, bailian: bool
) -> None:
    size = block or (16 if bailian and fmt != "hash-trace" else 512)
    lines = _random_lines(np.random.default_rng(len(fmt) + size), 1500, size, bailian)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast = _read(path, monkeypatch, True, fmt, block)
    ordinary = _read(path, monkeypatch, False, fmt, block)
    assert fast == ordinary
    assert len(fast[0]) == 1500 and not fast[2]
    taken = hash_trace.plain_records(
        "t", list(enumerate(lines, 1)), size, bailian=fmt == "bailian-trace"
    )
    assert all(record is not None for record in taken)  # the fast path took every line
    ids = {record.request_id for record in taken}
    assert all(isinstance(i, str) for i in ids) and len(ids) == 1500 if bailian else ids == {None}


BAD = [
    b'{"input_length": 1100, "hash_ids": [1, 2]}',  # too few blocks for 512
    b'{"input_length": 1000, "hash_ids": [1, 2, 3]}',
    b'{"input_length": 0, "hash_ids": [1]}',
    b'{"input_length": -5, "hash_ids": [1]}',
    b'{"input_length": 16777217, "hash_ids": [1]}',
    b'{"input_length": 100, "hash_ids": []}',
    b'{"input_length": 100, "hash_ids": null}',
    b'{"input_length": 100}',
    b'{"hash_ids": [1]}',
    b'{"input_length": null, "hash_ids": [1]}',
    b'{"input_length": "100", "hash_ids": [1]}',
    b'{"input_length": 100.0, "hash_ids": [1]}',
    b'{"input_length": true, "hash_ids": [1]}',
    b'{"input_length": 100, "hash_ids": [-1]}',
    b'{"input_length": 100, "hash_ids": [2147483648]}',
    b'{"input_length": 100, "hash_ids": [9223372036854775808]}',
    b'{"input_length": 100, "hash_ids": [1.5]}',
    b'{"input_length": 100, "hash_ids": ["1"]}',
    b'{"input_length": 100, "hash_ids": [true]}',
    b'{"input_length": 100, "hash_ids": [[1]]}',
    b'{"input_length": 100, "hash_ids": [01]}',
    b'{"input_length": 100, "hash_ids": "1 2"}',
    b'{"input_length": 100, "hash_ids": {"a": 1}}',
    b'{"input_length": 100, "output_length": -1, "hash_ids": [1]}',
    b'{"input_length": 100, "output_length": "9", "hash_ids": [1]}',
    b'{"input_length": 100, "output_length": 16777217, "hash_ids": [1]}',
    b'{"input_length": 100, "output_length": 1.5, "hash_ids": [1]}',
    b'{"input_length": 100, "output_length": 900, "hash_ids": [1], "output_hash_ids": [2]}',
    b'{"input_length": 100, "output_length": 900, "hash_ids": [1], "output_hash_ids": [2, 3]}',
    b'{"input_length": 100, "output_length": 0, "hash_ids": [1], "output_hash_ids": []}',
    b'{"input_length": 100, "hash_ids": [1], "output_hash_ids": [2]}',
    b'{"input_length": 100, "output_length": 9, "hash_ids": [1], "output_hash_ids": null}',
    b'{"input_length": 100, "output_length": 900, "hash_ids": [1], "output_hash_ids": [-2]}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": "5"}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": true}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": 1e400}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": 1e300}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": -1e17}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": 99999999999999999999999}',
    b'{"input_length": 100, "hash_ids": [1], "timestamp": ' + b"9" * 400 + b"}",
    b'{"input_length": 100, "hash_ids": [1], "timestamp": [1]}',
    b'{"input_length": 100, "hash_ids": [1], "extra": 1}',  # other fields: ordinary
    b'{"input_length": 100, "hash_ids": [1], "prompt_token_ids": [1]}',
    b'{"input_length": 100, "hash_ids": [1], "chat_id": null}',
    b'{"input_length": 100, "hash_ids": [1], "chat_id": 1.5}',
    b'{"input_length": 100, "hash_ids": [1], "chat_id": [1, 2]}',
    b'{"input_length": 100, "hash_ids": [1], "chat_id": {"a": [[1]]}}',
    b'{"input_length": 100, "hash_ids": [1], "chat_id": 1, "turn": {"x": 1}}',
    b'{"input_length": 100, "hash_ids": [1], "chat_id": 1, "type": ' + b"[" * 200 + b"]" * 200,
    b'{"input_length": 100, "hash_ids": [1], "chat_id": 1, "parent_chat_id": ' + b"9" * 30 + b"}",
    b'{"input_length": 100, "hash_ids": [1], "hash_ids": [1, 2]}',  # duplicate: the last wins
    b'{"input_length": 100, "input_length": 600, "hash_ids": [1, 2]}',
    b'{"input_length": 100, "hash_ids": [1]',
    b'{"input_length": 100, "hash_ids": [1,]}',
    b"[1, 2]",
    b"",
    b"not json",
    b'{"input_length": 100, "hash_ids": [1], "chat_id": 7}',  # valid: Bailian in a Mooncake file
    b'{"input_length": 100, "hash_ids": [1]}',  # valid: Mooncake in a Bailian file is mixed
]


@pytest.mark.parametrize("fmt", ["hash-trace", "bailian-trace"])
@pytest.mark.parametrize("repeat", [1, 40])  # one batch, and lines across batches
def test_bad_lines_get_the_skip_parse_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, repeat: int
) -> None:
    bailian = fmt == "bailian-trace"
    lines = [line.replace(b"{", b'{"chat_id": 3, ', 1) for line in BAD] if bailian else BAD
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines * repeat) + b"\n")
    fast = _read(path, monkeypatch, True, fmt, 512)
    ordinary = _read(path, monkeypatch, False, fmt, 512)
    assert fast == ordinary
    records, skips, skipped = fast
    reasons = {reason for _, reason in skips}
    assert len(records) + skipped == len(lines) * repeat
    for expected in ("expected 3 blocks", "input_length must be positive", "must be an integer"):
        assert any(expected in reason for reason in reasons), expected
    assert any("outside 0..2^31-1" in reason for reason in reasons)
    assert any("between the years 1 and 9999" in reason for reason in reasons)
    # The fast path took the valid plain lines, and no line that parse or the guard refuses (a
    # line it leaves may still be valid: one with other fields, for parse to read).
    taken = hash_trace.plain_records("t", list(enumerate(lines, 1)), 512, bailian=bailian)
    kept = {record.line for record in taken if record is not None}
    valid = {fields["line"] for fields, _ in records if fields["line"] <= len(lines)}
    plain = [BAD.index(line) + 1 for line in BAD if b"600" in line or b'chat_id": 7' in line]
    assert kept < valid and {*plain, len(BAD)} <= kept


def test_mixed_lines_in_a_bailian_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(BAD[-1] + b"\n" + BAD[-2] + b"\n")
    fast = _read(path, monkeypatch, True, "bailian-trace", 512)
    ordinary = _read(path, monkeypatch, False, "bailian-trace", 512)
    assert fast == ordinary
    assert [line for line, _ in fast[1]] == [1] and "mixed formats" in fast[1][0][1]
    assert fast[0][0][0]["request_id"] == "7"


@pytest.mark.parametrize("fixture", ["mooncake_trace.jsonl", "bailian_trace.jsonl"])
def test_analyze_reports_are_unchanged(fixture: str, monkeypatch: pytest.MonkeyPatch) -> None:
    options = AnalyzeOptions(ingest=IngestOptions())
    fast = analyze([FIXTURES / fixture], options).report.to_dict()
    _ordinary(monkeypatch)
    assert fast == analyze([FIXTURES / fixture], options).report.to_dict()
    assert fast["requests"] == 2
