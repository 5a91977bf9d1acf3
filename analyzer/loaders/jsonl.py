"""Reading JSON Lines: each line becomes a parsed object or a reasoned skip."""

from __future__ import annotations

import json
from typing import Any

from analyzer.errors import Skip


def json_object(raw: bytes, file: str, line: int) -> dict[str, Any] | Skip:
    """The JSON object on one line, or a Skip saying why it is not one."""
    if not raw.strip():
        return Skip(file, line, "blank line")
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        return Skip(file, line, "not UTF-8 text")
    except json.JSONDecodeError as exc:
        return Skip(file, line, f"malformed JSON ({exc.msg})")
    if not isinstance(obj, dict):
        return Skip(file, line, f"expected a JSON object, got {type(obj).__name__}")
    return obj
