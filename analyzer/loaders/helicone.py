"""Helicone request exports: ``npx @helicone/export`` (``examples/export/typescript/index.ts`` of
Helicone's repository) writes the rows of ``POST /v1/request/query-clickhouse`` as JSON, JSONL or
CSV: ``{"request_id", "request_created_at", "request_user_id", "request_model", "model",
"prompt_tokens", "completion_tokens", "prompt_cache_read_tokens", ..., "request_body",
"response_body"}``. The bodies come only with ``--include-body`` (from each row's signed body:
the chat-completions request and the ``chat.completion``); its CSV has no ``response_body`` and
holds ``request_body`` as JSON text. Its JSON form ends with a comma before ``]`` (read as an
array all the same).
"""

from __future__ import annotations

import json
from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import count, dict_field, optional_int, optional_str, parse_time
from analyzer.loaders.openai_chat import completion_fields, request_record
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return "request_body" in obj and ("request_created_at" in obj or "response_body" in obj)


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    if isinstance(obj.get("request_body"), str):
        obj = {**obj, "request_body": _csv_json(obj["request_body"])}
    body = dict_field(obj, "request_body")
    if not body:
        raise BadLine("no request body (export with `npx @helicone/export --include-body`)")
    if not isinstance(body.get("messages"), list):
        raise BadLine("request_body has no 'messages' (only chat requests are read)")
    record = request_record(body, file, line)
    completion = completion_fields(dict_field(obj, "response_body"))
    record.output_text, record.finish_reason = completion.answer, completion.finish_reason
    record.output_message = completion.message
    record.output_length = completion.output_length or optional_int(obj, "completion_tokens")
    cached, prompt = completion.cached_tokens, completion.prompt_tokens
    record.server_cached_tokens = (
        cached if cached is not None else optional_int(obj, "prompt_cache_read_tokens")
    )
    record.server_prompt_tokens = prompt if prompt is not None else count(obj.get("prompt_tokens"))
    record.model = record.model or optional_str(obj, "request_model") or optional_str(obj, "model")
    record.tenant = record.tenant or optional_str(obj, "request_user_id") or None
    record.request_id = optional_str(obj, "request_id")
    record.arrival_s = parse_time(obj.get("request_created_at"), "request_created_at")
    return record


def _csv_json(text: str) -> Any:
    """A body from the export's CSV: ``convertToCSVRow`` doubles the quotes of the JSON text and
    then once more as CSV quoting, so after CSV parsing every quote is still doubled."""
    for candidate in (text, text.replace('""', '"')):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise BadLine("request_body is not JSON")
