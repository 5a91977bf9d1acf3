"""Reading JSON Lines: each line becomes a parsed object or a reasoned skip."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from analyzer.errors import Skip
from analyzer.loaders.guard import MAX_JSON_DEPTH, too_deep

# msgspec's decoder: 2-3x the standard library's on log lines (token-id lists above all); any
# line it refuses (NaN, lone surrogates, UTF-16, deep nesting, huge integers) is read again by
# the standard library, so every line reads exactly as before and fails with the same reason.
_fast_decode = msgspec.json.Decoder().decode
_FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def json_object(raw: bytes, file: str, line: int) -> dict[str, Any] | Skip:
    """The JSON object on one line, or a Skip saying why it is not one."""
    if not raw.strip():
        return Skip(file, line, "blank line")
    deep = f"JSON nested too deeply (over {MAX_JSON_DEPTH} levels)"
    try:
        obj = _fast_decode(raw)
        if isinstance(obj, dict):
            return obj
    except _FAST_ERRORS:
        pass
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        return Skip(file, line, "not UTF-8 text")
    except json.JSONDecodeError as exc:
        return Skip(file, line, f"malformed JSON ({exc.msg})")
    except ValueError as exc:  # an integer of over 4,300 digits, above all
        if "integer string conversion" in str(exc):
            return Skip(file, line, "malformed JSON (an integer of over 4,300 digits)")
        return Skip(file, line, f"malformed JSON ({str(exc)[:120]})")
    except RecursionError:
        return Skip(file, line, deep)
    if not isinstance(obj, dict):
        return Skip(file, line, f"expected a JSON object, got {type(obj).__name__}")
    # Only a line with that many brackets can nest that deep: the walk is for those alone.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and too_deep(obj):
        return Skip(file, line, deep)
    return obj


def bounded_json(text: str | bytes) -> Any:
    """JSON that nests at most MAX_JSON_DEPTH levels; a ValueError says why not (Python's own
    parser raises RecursionError on deep input, which no caller expects)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    if isinstance(value, dict | list) and too_deep(value):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value
