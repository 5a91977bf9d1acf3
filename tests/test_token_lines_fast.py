"""The batched reader of pre-tokenized lines gives every line the Record or the skip that the
ordinary line-by-line reader gives it."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from analyzer.loaders import FORMATS, load_logs, token_ids
from analyzer.loaders.id_lists import parse_id_lists
from analyzer.loaders.token_lines import parse_lines

LINES = [
    b'{"prompt_token_ids": [1, 2, 3], "output_token_ids": [4, 5], "finish_reason": "stop"}',
    b'{"prompt_token_ids":[0,2147483647],"model":"m","cache_salt":"","lora":"a"}',
    b'{"prompt_token_ids": [ 7 ,\t8 ], "output_token_ids": null, "timestamp": 1700000000.5}',
    b'{"prompt_token_ids": [9], "output_token_ids": [], "timestamp": 1700000000}',
    b'{"prompt_token_ids": [9], "prompt_token_ids": [10, 11]}',  # duplicate: the last wins
    b'{"prompt_token_ids": [1, 2], "priority": 3, "max_tokens": 9}',  # other fields: ordinary
    b'{"prompt_token_ids": []}',
    b'{"prompt_token_ids": [2147483648]}',
    b'{"prompt_token_ids": [1, -1]}',
    b'{"prompt_token_ids": [1, 2.0]}',
    b'{"prompt_token_ids": [1, 1e3]}',
    b'{"prompt_token_ids": [1, true]}',
    b'{"prompt_token_ids": [1, "2"]}',
    b'{"prompt_token_ids": [[1]]}',
    b'{"prompt_token_ids": [1], "output_token_ids": [3, -4]}',
    b'{"prompt_token_ids": [1], "output_token_ids": 5}',
    b'{"prompt_token_ids": "1 2"}',
    b'{"prompt_token_ids": null}',
    b'{"prompt_token_ids": [1], "finish_reason": 3}',
    b'{"prompt_token_ids": [1], "timestamp": true}',
    b'{"prompt_token_ids": [1], "timestamp": 1e400}',
    b'{"prompt_token_ids": [1], "timestamp": 99999999999999999999999}',
    b'{"prompt_token_ids": [1], "timestamp": ' + b"9" * 400 + b"}",
    b'{"prompt_token_ids": [1], "timestamp": -99999999999}',
    b'{"prompt_token_ids": [1], "model": "\\ud800"}',
    b'{"prompt_token_ids": [1, 00]}',
    b'{"prompt_token_ids": [1,]}',
    b"",
    b"not json",
    b"[1, 2]",
    b'{"output_token_ids": [1]}',
    b'{"prompt_token_ids": [123456789012]}',
]


def _read(path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool) -> tuple[list, list]:
    with monkeypatch.context() as patch:
        if not fast:  # every line through the ordinary reader
            patch.setitem(FORMATS, "tokens", replace(FORMATS["tokens"], batch=None))
        loaded = load_logs([path], "tokens")
    records = [
        {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in asdict(r).items()}
        for r in loaded.records
    ]
    return records, [(s.line, s.reason) for s in loaded.skips]


@pytest.mark.parametrize("repeat", [1, 700])  # one batch, and lines across batches
def test_fast_reader_matches_the_ordinary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeat: int
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(LINES * repeat) + b"\n")
    fast, ordinary = _read(path, monkeypatch, True), _read(path, monkeypatch, False)
    assert fast == ordinary
    records, skips = fast
    assert len(records) == 7 * repeat and records[4]["prompt_token_ids"] == [10, 11]
    assert records[0]["output_token_ids"] == [4, 5] and records[3]["output_token_ids"] is None
    assert {reason.split(" ")[0] for _, reason in skips} >= {"field", "empty", "malformed"}
    taken = token_ids.plain_records("t", list(enumerate(LINES, 1)))
    assert [record is not None for record in taken[:6]] == [True] * 5 + [False]
    assert all(record is None for record in taken[6:])


def test_id_lists_take_only_plain_lists() -> None:
    lists = [b"[1,2,3]", b" [ 0 , 2147483647 ] ", b"[]", b"[2147483648]", b"[-1]", b"[1.0]"]
    lists += [b"[01]", b"[1,]", b"[[1]]", b'["1"]', b"null", b"[1 2]", b"[3]x", b"[7\n,\t8]"]
    ids, offsets, taken = parse_id_lists(lists)
    assert taken.tolist() == [True, True, True] + [False] * 10 + [True]
    rows = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(lists))]
    assert rows[:3] == [[1, 2, 3], [0, 2**31 - 1], []] and rows[-1] == [7, 8]
    assert all(not row for row in rows[3:-1])


VARIANTS = [  # the compiled reader's edges: taken (True) or left to the typed decode
    (b'{"prompt_token_ids": [5, 6], "output_token_ids": null}', True),
    (b' { "model" : "m-1" , "prompt_token_ids" :[5], "output_token_ids":[7] } \r\n', True),
    (b'{"output_token_ids": [], "prompt_token_ids": [5], "lora": "", "finish_reason": ""}', True),
    (b'{"prompt_token_ids": [5], "finish_reason": null, "cache_salt": "s"}', True),
    (b'{"prompt_token_ids": [5], "finish_reason": "st\\"op"}', False),
    (b'{"prompt_token_ids": [5], "model": "\xc3\xa9"}', False),
    (b'{"prompt_token_ids": [5], "model": "a\tb"}', False),
    (b'{"prompt_token_ids": [5], "model": nul}', False),
    (b'{"prompt_token_ids": [5], "model": nullx}', False),
    (b'{"prompt_token_ids": [5], "mode\\u006c": "m"}', False),
    (b'{"prompt_token_ids": [5]} x', False),
    (b'{"prompt_token_ids": [5],}', False),
    (b'{"prompt_token_ids": [5] "model": "m"}', False),
    (b'{"prompt_token_ids": [5], "model": "m"', False),
    (b'{"prompt_token_ids": [5], "model": "m", "model": "n"}', False),
    (b'{"prompt_token_ids": [5], "output_token_ids": [1], "output_token_ids": null}', False),
    (b'{"prompt_token_ids": [5], "extra": {}}', False),
    (b"{}", False),
    (b'{"model": "m"}', False),
]


def test_compiled_reader_takes_only_the_plainest_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [line for line, _ in VARIANTS]
    _, _, taken = parse_lines(lines, 1 << 24)
    assert taken.tolist() == [plain for _, plain in VARIANTS]
    path = tmp_path / "v.jsonl"
    path.write_bytes(b"\n".join(line.rstrip(b"\r\n") for line in lines) + b"\n")
    fast, ordinary = _read(path, monkeypatch, True), _read(path, monkeypatch, False)
    assert fast == ordinary
    records, _ = fast
    assert records[1]["model"] == "m-1" and records[1]["output_token_ids"] == [7]
    assert records[2]["lora"] is None and records[2]["finish_reason"] == ""
    assert records[4]["finish_reason"] == 'st"op' and records[5]["model"] == "é"
    _, _, taken = parse_lines([b'{"prompt_token_ids": [1, 2, 3]}'], 2)  # over the maximum
    assert not taken[0]
