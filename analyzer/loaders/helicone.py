"""Helicone request exports (``npx @helicone/export``, JSON or JSONL): ``{"request_id",
"request_created_at", "request_body": {...chat-completions body...}, "response_body":
{...chat.completion...}, "request_user_id", "request_model", "prompt_cache_read_tokens",
...}``."""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import count, dict_field, optional_int, optional_str, parse_time
from analyzer.loaders.openai_chat import completion_fields, request_record
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return "request_body" in obj and ("request_created_at" in obj or "response_body" in obj)


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    body = dict_field(obj, "request_body")
    if not isinstance(body.get("messages"), list):
        raise BadLine("request_body has no 'messages' (only chat requests are read)")
    record = request_record(body, file, line)
    completion = completion_fields(dict_field(obj, "response_body"))
    record.output_text, record.finish_reason = completion.answer, completion.finish_reason
    record.output_length = completion.output_length or optional_int(obj, "completion_tokens")
    cached, prompt = completion.cached_tokens, completion.prompt_tokens
    record.server_cached_tokens = (
        cached if cached is not None else optional_int(obj, "prompt_cache_read_tokens")
    )
    record.server_prompt_tokens = prompt if prompt is not None else count(obj.get("prompt_tokens"))
    record.model = record.model or optional_str(obj, "request_model")
    record.tenant = record.tenant or optional_str(obj, "request_user_id") or None
    record.request_id = optional_str(obj, "request_id")
    record.arrival_s = parse_time(obj.get("request_created_at"), "request_created_at")
    return record
