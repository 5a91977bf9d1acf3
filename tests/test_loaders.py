"""Loaders: format detection, field mapping, and a reasoned skip for every bad line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from analyzer.errors import PrefixcheckError, Skip, StrictModeError
from analyzer.loaders import detect_format, hash_trace, load_logs
from analyzer.loaders.hash_trace import expand_hash_ids
from analyzer.loaders.jsonl import json_object


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def test_openai_request_with_response(tmp_path: Path) -> None:
    log = write_lines(
        tmp_path / "chat.jsonl",
        [
            {
                "timestamp": 12.5,
                "request": {
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "cache_salt": "tenant",
                },
                "response": {
                    "created": 10,
                    "choices": [{"message": {"content": "hello"}, "finish_reason": "length"}],
                    "usage": {"completion_tokens": 3},
                },
            }
        ],
    )
    loaded = load_logs([log])
    assert loaded.formats == {str(log): "openai"}
    (record,) = loaded.records
    assert record.messages == [{"role": "user", "content": "hi"}]
    assert record.tools == [{"type": "function", "function": {"name": "f"}}]
    assert (record.output_text, record.finish_reason, record.output_length) == (
        "hello",
        "length",
        3,
    )
    assert (record.cache_salt, record.model, record.arrival_s) == ("tenant", "m", 12.5)
    assert (record.file, record.line) == (str(log), 1)


def test_plain_request_body_is_openai(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "a.jsonl", [{"messages": [{"role": "user", "content": "x"}]}])
    assert detect_format(log).name == "openai"


def test_prompt_format(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "p.jsonl", [{"prompt": "Once upon", "completion": " a time"}])
    (record,) = load_logs([log]).records
    assert (record.prompt, record.output_text) == ("Once upon", " a time")


def test_tokens_format(tmp_path: Path) -> None:
    log = write_lines(
        tmp_path / "t.jsonl",
        [
            {
                "prompt_token_ids": [1, 2, 3],
                "output_token_ids": [4],
                "cache_salt": "s",
                "finish_reason": "stop",
            }
        ],
    )
    loaded = load_logs([log])
    assert loaded.formats[str(log)] == "tokens"
    (record,) = loaded.records
    assert record.prompt_token_ids.dtype == np.int32  # type: ignore[union-attr]
    assert list(record.prompt_token_ids) == [1, 2, 3]
    assert list(record.output_token_ids) == [4]
    assert (record.cache_salt, record.finish_reason) == ("s", "stop")


def test_hash_trace_expansion() -> None:
    tokens = expand_hash_ids([7, 9, 11], input_length=10, block_size=4)
    assert len(tokens) == 10 and tokens.dtype == np.int32 and (tokens >= 0).all()
    same_prefix = expand_hash_ids([7, 9, 12], input_length=12, block_size=4)
    assert np.array_equal(same_prefix[:8], tokens[:8])
    # Different ids differ at every position of their block, not only the first.
    assert (same_prefix[8:10] != tokens[8:10]).all()
    assert len(set(expand_hash_ids(list(range(1000)), 4000, 4)[::4].tolist())) == 1000


def test_hash_trace_format(tmp_path: Path) -> None:
    log = write_lines(
        tmp_path / "trace.jsonl",
        [{"timestamp": 1500, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}],
    )
    loaded = load_logs([log])
    assert loaded.formats[str(log)] == "hash-trace"
    (record,) = loaded.records
    assert record.prompt_token_ids is None  # read as ids: expanded when tokenized
    prompt, answer = hash_trace.expanded(record.hash_blocks)
    assert len(prompt) == 600 and answer is None
    assert (record.output_length, record.arrival_s) == (20, 1.5)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ("", "blank line"),
        ({"prompt_token_ids": []}, "empty prompt_token_ids"),
        ({"prompt_token_ids": [1, "x"]}, "field 'prompt_token_ids'[1] must be an integer"),
        ({"prompt_token_ids": [1, 2, True]}, "field 'prompt_token_ids'[2] must be an integer"),
        ({"prompt_token_ids": [1, 2.0]}, "field 'prompt_token_ids'[1] must be an integer"),
        ({"prompt_token_ids": [1, [2]]}, "field 'prompt_token_ids'[1] must be an integer"),
        ({"prompt_token_ids": [3, -1]}, "field 'prompt_token_ids'[1] = -1 is outside 0..2^31-1"),
        ({"prompt_token_ids": [2**31, 0]}, "field 'prompt_token_ids'[0] = 2147483648 is outside"),
        ({"prompt_token_ids": [0, 2**70]}, "field 'prompt_token_ids'[1] = 1180591620717411303424"),
        ({"prompt_token_ids": [1], "output_token_ids": [0, False]}, "field 'output_token_ids'[1]"),
        ({"prompt_token_ids": [1], "cache_salt": 5}, "field 'cache_salt' must be a string"),
        ({"output_token_ids": [1]}, "missing field 'prompt_token_ids'"),
    ],
)
def test_bad_token_lines_are_skipped_with_reason(tmp_path: Path, line: object, reason: str) -> None:
    log = write_lines(tmp_path / "t.jsonl", [{"prompt_token_ids": [1, 2]}, line])
    loaded = load_logs([log], "tokens")
    assert len(loaded.records) == 1
    (skip,) = loaded.skips
    assert (skip.file, skip.line) == (str(log), 2)
    assert skip.reason.startswith(reason)
    assert loaded.lines_read == 2


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"messages": []}, "empty 'messages'"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0] has unknown role"),
        ({"messages": [{"role": "user"}]}, "messages[0] has no content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content must be"),
        ({"messages": "hi"}, "field 'messages' must be a list"),
    ],
)
def test_bad_chat_lines_are_skipped_with_reason(tmp_path: Path, line: object, reason: str) -> None:
    log = write_lines(tmp_path / "c.jsonl", [line])
    (skip,) = load_logs([log], "openai").skips
    assert skip.reason.startswith(reason)


def test_empty_prompt_is_skipped(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "p.jsonl", [{"prompt": ""}, {"prompt": "ok"}])
    loaded = load_logs([log])
    assert [s.reason for s in loaded.skips] == ["empty prompt"]
    assert len(loaded.records) == 1


def test_hash_trace_block_count_mismatch(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "h.jsonl", [{"input_length": 2000, "hash_ids": [1, 2]}])
    (skip,) = load_logs([log], "hash-trace").skips
    assert "expected 4 blocks of 512 tokens" in skip.reason


def test_strict_stops_at_first_bad_line(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "t.jsonl", [{"prompt_token_ids": [1]}, "{oops"])
    with pytest.raises(StrictModeError, match=r"t\.jsonl:2: malformed JSON"):
        load_logs([log], strict=True)


def test_detection_skips_leading_garbage(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "t.jsonl", ["garbage", {"prompt_token_ids": [1]}])
    assert detect_format(log).name == "tokens"


def test_unknown_format_is_an_error(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(PrefixcheckError, match="unknown log format"):
        load_logs([log])


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PrefixcheckError, match="cannot read"):
        load_logs([tmp_path / "missing.jsonl"])


def test_several_files_keep_order(tmp_path: Path) -> None:
    first = write_lines(tmp_path / "1.jsonl", [{"prompt_token_ids": [1]}])
    second = write_lines(tmp_path / "2.jsonl", [{"prompt": "x"}])
    loaded = load_logs([first, second])
    assert [r.file for r in loaded.records] == [str(first), str(second)]
    assert loaded.formats == {str(first): "tokens", str(second): "prompt"}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt_token_ids": [1, 2, 3], "x": -0, "y": 1.5e308, "z": "\\u00e9"}',
        b'{"a": "\\ud800", "b": 123456789012345678901234567890}',  # msgspec refuses the surrogate
        b'{"a": 1, "a": 2}',
        '{"a": "é"}'.encode("utf-16"),  # the standard library detects UTF-16
    ],
)
def test_json_lines_read_as_the_standard_library_does(raw: bytes) -> None:
    assert json_object(raw, "f", 1) == json.loads(raw)


def test_json_lines_the_fast_decoder_refuses_keep_their_reading() -> None:
    nan = json_object(b'{"timestamp": NaN, "prompt": "x"}', "f", 1)
    assert isinstance(nan, dict) and math.isnan(nan["timestamp"])
    assert json_object(b"[1, 2]", "f", 3) == Skip("f", 3, "expected a JSON object, got list")
    bad = json_object(b'{"a": 1} x', "f", 2)
    assert isinstance(bad, Skip) and bad.reason.startswith("malformed JSON (Extra data")
