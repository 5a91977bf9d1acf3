"""Langfuse observations: the batch export of the observations table (JSON, JSONL or CSV; rows
as ``worker/src/features/database-read-stream/observation-stream.ts`` writes them through
``convertObservation``: ``id, traceId, type, startTime, model, modelParameters, input, output,
usageDetails, inputUsage, ..., traceName, userId``) and the public API's
``GET /api/public/observations`` items (the same camelCase fields, with ``usage``; a saved
``{"data": [...], "meta": {...}}`` response is read item by item).

``input`` is what the SDK logged: the messages list, ``{"messages": [...], "tools": [...]}`` (the
OpenAI integration with tools), or the prompt string of a completion; ``output`` the assistant
message (an answer that calls tools counts as one), or its text. ``usageDetails`` keeps the
server's counts; the OpenAI integration splits cached prompt tokens off ``input`` into
``input_cached_tokens``. Observations other than generations (spans, events, agents, tools) are
reasoned skips.
"""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import count, dict_field, optional_str, parse_time
from analyzer.loaders.openai_chat import request_record, tool_call_message
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return "traceId" in obj and "startTime" in obj and "input" in obj


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    kind = obj.get("type")
    if kind not in (None, "GENERATION"):
        article = "an" if str(kind)[:1] in "AEIOU" else "a"
        raise BadLine(f"{article} {kind} observation, not a generation")
    value = obj.get("input")
    if isinstance(value, list):
        value = {"messages": value}
    if isinstance(value, str) and value:  # a completion's prompt
        record = Record(file=file, line=line, prompt=value)
    elif isinstance(value, dict) and isinstance(value.get("messages"), list):
        record = request_record(value, file, line)
    else:
        raise BadLine("field 'input' holds no chat messages and no prompt")
    output = obj.get("output")
    record.output_message = tool_call_message(output)
    if isinstance(output, dict):
        output = output.get("content")
    if record.output_message is None:
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
