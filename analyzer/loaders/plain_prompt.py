"""Plain prompts: ``{"prompt": "...", "output": "..."}`` (``completion``, ``response`` read too)."""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import cache_fields, optional_number, optional_str, required_str
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return isinstance(obj.get("prompt"), str)


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    prompt = required_str(obj, "prompt")
    if not prompt:
        raise BadLine("empty prompt")
    answer = None
    for key in ("output", "completion", "response"):
        answer = answer if answer is not None else optional_str(obj, key)
    return Record(
        file=file,
        line=line,
        prompt=prompt,
        output_text=answer,
        finish_reason=optional_str(obj, "finish_reason"),
        cache_salt=optional_str(obj, "cache_salt") or None,
        model=optional_str(obj, "model"),
        arrival_s=optional_number(obj, "timestamp"),
        **cache_fields(obj),
    )
