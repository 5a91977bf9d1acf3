"""Langfuse observation exports (API ``/api/public/observations`` or the UI's JSON/JSONL export):
``{"id", "traceId", "type": "GENERATION", "startTime", "model", "modelParameters", "input",
"output", "usageDetails": {"input", "output", "input_cached_tokens"}, "userId", "metadata"}``.

``input`` is what the SDK logged: the messages list, or ``{"messages": [...], "tools": [...]}``;
``output`` the assistant message (or its text). Observations other than generations (spans,
events) are reasoned skips.
"""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import count, dict_field, optional_str, parse_time
from analyzer.loaders.openai_chat import request_record
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return "traceId" in obj and "startTime" in obj and "input" in obj


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    kind = obj.get("type")
    if kind not in (None, "GENERATION"):
        raise BadLine(f"a {kind} observation, not a generation")
    value = obj.get("input")
    if isinstance(value, list):
        value = {"messages": value}
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        raise BadLine("field 'input' holds no chat messages")
    record = request_record(value, file, line)
    output = obj.get("output")
    if isinstance(output, dict):
        output = output.get("content")
    record.output_text = output if isinstance(output, str) else None
    usage = dict_field(obj, "usageDetails") or dict_field(obj, "usage")
    output_tokens = usage.get("output")
    record.output_length = output_tokens if isinstance(output_tokens, int) else None
    cached = usage.get("input_cached_tokens")
    record.server_cached_tokens = cached if isinstance(cached, int) else None
    record.server_prompt_tokens = _prompt_tokens(usage)
    record.finish_reason = optional_str(dict_field(obj, "metadata"), "finish_reason")
    record.model = optional_str(obj, "model") or record.model
    record.tenant = optional_str(obj, "userId") or record.tenant
    record.request_id = optional_str(obj, "id")
    record.arrival_s = parse_time(obj.get("startTime"), "startTime")
    return record


def _prompt_tokens(usage: dict[str, Any]) -> int | None:
    """The total less the output counts: right whether ``input`` includes the cached tokens (as
    logged by the SDK) or excludes them (as Langfuse's OpenAI integration splits them off)."""
    total = count(usage.get("total"))
    outputs = [count(v) for k, v in usage.items() if k == "output" or k.startswith("output_")]
    if total is None or not outputs or None in outputs:
        return None
    prompt = total - sum(o or 0 for o in outputs)
    return prompt if prompt >= 0 else None
