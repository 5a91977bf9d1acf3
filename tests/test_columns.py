"""Plain lines read as columns give what their Records give: pre-tokenized lines (TokenLines,
``build_lines_workload``) the same chunks, workloads, request rows, namespaces and unknown
answer ids as ``build_workload``; Mooncake lines (HashLines) the same runs, rows and chunks as
``build_run_workload`` of their Records; both the same Records when those are read."""

from __future__ import annotations

import json
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path

import numpy as np
import pytest

from analyzer import ingest
from analyzer.ingest import ChunkedIngest, IngestOptions
from analyzer.progress import NoProgress
from analyzer.records import RecordList, TokenLines, any_messages


def _lines(rng: np.random.Generator, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        fields: dict = {"prompt_token_ids": rng.integers(0, 50, int(rng.integers(1, 30))).tolist()}
        answer = rng.integers(5)
        if answer == 1:
            fields["output_token_ids"] = rng.integers(0, 50, int(rng.integers(1, 9))).tolist()
        elif answer == 2:
            fields["output_token_ids"] = []
        elif answer == 3:
            fields["output_token_ids"] = None
        for key, values in (
            ("finish_reason", ["stop", "length", "", None, "abort"]),
            ("cache_salt", ["", "t1", "t2", None]),
            ("lora", ["", "a", None]),
            ("model", ["m1", "m2", "", None]),
        ):
            if rng.random() < 0.6:
                fields[key] = values[int(rng.integers(len(values)))]
        items = list(fields.items())
        rng.shuffle(items)  # any key order: the answer's ids may come first
        out.append(json.dumps(dict(items), separators=(",", ":")).encode())
    return out


def _chunks(
    path: Path, columns: bool, options: IngestOptions | None = None
) -> tuple[list, ChunkedIngest]:
    reader = ChunkedIngest([path], options or IngestOptions(format="tokens"), NoProgress())
    if not columns:
        reader.items = lambda columns=True: ChunkedIngest.items(reader, columns=False)  # type: ignore[method-assign]
    return list(reader.chunks(chunk_records=700)), reader


def _record_dicts(records) -> list[dict]:
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value.tolist() if isinstance(value, np.ndarray) else value

    return [plain(asdict(r)) for r in records]


@pytest.mark.parametrize("seed", [0, 1])
def test_columns_match_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path = tmp_path / "t.jsonl"
    lines = _lines(rng, 3000)
    lines[1700] = b'{"prompt_token_ids": [1], "timestamp": 1700000000}'  # one batch of Records
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(ingest, "CHUNK_TOKENS", 5000)  # chunks cut by tokens inside a batch too
    fast, fast_reader = _chunks(path, True)
    slow, slow_reader = _chunks(path, False)
    assert [c.tokenized.workload.n_requests for c in fast] == [
        c.tokenized.workload.n_requests for c in slow
    ]
    assert any(isinstance(c.records, RecordList) for c in fast)
    assert any(not isinstance(c.records, RecordList) for c in fast)  # the batch of Records
    for a, b in zip(fast, slow, strict=True):
        wa, wb = a.tokenized.workload, b.tokenized.workload
        for name in ("prompt_tokens", "prompt_offsets", "output_tokens", "output_offsets"):
            np.testing.assert_array_equal(getattr(wa, name), getattr(wb, name), err_msg=name)
        np.testing.assert_array_equal(wa.namespace, wb.namespace)
        np.testing.assert_array_equal(wa.stop_finish, wb.stop_finish)
        assert wa.arrival_s is None or b.tokenized.requests["arrival_s"].null_count() == 0
        assert a.tokenized.requests.equals(b.tokenized.requests)
        assert a.tokenized.requests.schema == b.tokenized.requests.schema
        assert a.tokenized.namespace_labels == b.tokenized.namespace_labels
        assert a.tokenized.assumed_stop_finish == b.tokenized.assumed_stop_finish
        assert a.tokenized.token_cache == b.tokenized.token_cache
        assert _record_dicts(a.records) == _record_dicts(b.records)
    assert fast_reader.state == slow_reader.state  # namespaces, models, the next unknown id
    whole_fast, whole_slow = fast_reader.finished(fast), slow_reader.finished(slow)
    assert _record_dicts(whole_fast.loaded.records) == _record_dicts(whole_slow.loaded.records)
    assert whole_fast.tokenized.requests.equals(whole_slow.tokenized.requests)
    assert fast_reader.loaded.lines_read == slow_reader.loaded.lines_read == 3000
    assert not any_messages(whole_fast.loaded.records)


def test_record_list_reads_like_a_list(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(_lines(np.random.default_rng(3), 2500)) + b"\n")
    reader = ChunkedIngest([path], IngestOptions(format="tokens"), NoProgress())
    items = list(reader.items())
    assert [len(i) for i in items] == [2000, 500]
    assert all(isinstance(i, TokenLines) for i in items)
    whole = [r for i in items for r in i.records(with_ids=False)]
    records = RecordList(
        [items[0].slice(0, 1024), whole[1024:1030], items[0].slice(1030, 2000), items[1]]
    )
    assert len(records) == 2500
    assert _record_dicts(records) == _record_dicts(whole)
    assert [records[k].line for k in (0, 1023, 1024, 1029, 1030, 2499, -1)] == [
        1, 1024, 1025, 1030, 1031, 2500, 2500,
    ]  # fmt: skip
    assert _record_dicts(records[1020:1034]) == _record_dicts(whole[1020:1034])
    with pytest.raises(IndexError):
        records[2500]


def _same(a: object, b: object) -> None:
    """Equal dataclasses, array by array."""
    assert type(a) is type(b)
    if is_dataclass(a):
        for f in fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype  # type: ignore[union-attr]
        np.testing.assert_array_equal(a, b)  # type: ignore[arg-type]
    else:
        assert a == b


def _trace_lines(rng: np.random.Generator, n: int, block: int, timed: float) -> list[bytes]:
    out = []
    for i in range(n):
        length = int(rng.integers(1, 6 * block))
        blocks = -(-length // block)
        line: dict = {"input_length": length, "hash_ids": rng.integers(0, 40, blocks).tolist()}
        if rng.random() < 0.8:
            line["output_length"] = int(rng.integers(1, 3 * block))
            if rng.random() < 0.3:
                more = -(-(length + line["output_length"]) // block) - blocks
                line["output_hash_ids"] = rng.integers(0, 40, more).tolist()
        if rng.random() < timed:
            line["timestamp"] = 1000 * i + int(rng.integers(1000))
        out.append(json.dumps(line).encode())
    return out


@pytest.mark.parametrize(
    ("runs", "timed"), [(8192, 0.9), (8192, 1.0), (8192, 0.0), (None, 0.9)]
)  # replayed as runs (some, every, no line with a time); expanded into tokens
def test_hash_lines_match_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: int | None, timed: float
) -> None:
    path = tmp_path / "t.jsonl"
    lines = _trace_lines(np.random.default_rng(5), 2600, 16, timed)
    lines[1500] = b'{"input_length": 3, "hash_ids": [1], "extra": 1}'  # one batch of Records
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(ingest, "CHUNK_TOKENS", 9000)
    options = IngestOptions(format="hash-trace", hash_block_size=16, hash_runs=runs)
    fast, fast_reader = _chunks(path, True, options)
    slow, slow_reader = _chunks(path, False, options)
    assert len(fast) == len(slow) > 4
    assert any(isinstance(c.records, RecordList) for c in fast) == (runs is not None)
    for a, b in zip(fast, slow, strict=True):
        wa, wb = a.tokenized.workload, b.tokenized.workload
        _same(wa, wb)  # every column of the runs (or tokens)
        assert a.tokenized.requests.equals(b.tokenized.requests)
        assert a.tokenized.requests.schema == b.tokenized.requests.schema
        assert a.tokenized.namespace_labels == b.tokenized.namespace_labels
        assert a.tokenized.assumed_stop_finish == b.tokenized.assumed_stop_finish
        assert _record_dicts(a.records) == _record_dicts(b.records)
    assert fast_reader.state == slow_reader.state
    whole = fast_reader.finished(fast).loaded.records
    assert _record_dicts(whole) == _record_dicts(slow_reader.finished(slow).loaded.records)
