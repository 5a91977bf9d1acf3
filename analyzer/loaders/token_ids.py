"""Pre-tokenized requests: ``{"prompt_token_ids": [...], "output_token_ids": [...],
"cache_salt": "...", "finish_reason": "stop"}`` (all but ``prompt_token_ids`` optional)."""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import cache_fields, int_list, optional_number, optional_str
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return "prompt_token_ids" in obj


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    prompt = int_list(obj, "prompt_token_ids", required=True)
    if prompt is None or not len(prompt):
        raise BadLine("empty prompt_token_ids")
    output = int_list(obj, "output_token_ids", required=False)
    return Record(
        file=file,
        line=line,
        prompt_token_ids=prompt,
        output_token_ids=output if output is not None and len(output) else None,
        finish_reason=optional_str(obj, "finish_reason"),
        cache_salt=optional_str(obj, "cache_salt") or None,
        lora=optional_str(obj, "lora") or None,
        model=optional_str(obj, "model"),
        arrival_s=optional_number(obj, "timestamp"),
        **cache_fields(obj),
    )
