"""LiteLLM's StandardLoggingPayload (one logged call a line, as its loggers write it):
``{"id", "call_type", "status", "startTime", "model", "messages", "response", "metadata":
{"user_api_key_team_id", ...}, "end_user", "model_parameters", ...}``."""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import count, dict_field, optional_str, parse_time
from analyzer.loaders.openai_chat import check_messages, completion_fields
from analyzer.records import Record


def matches(obj: dict[str, Any]) -> bool:
    return "call_type" in obj and "messages" in obj and ("startTime" in obj or "status" in obj)


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    if obj.get("status") == "failure":
        error = optional_str(obj, "error_str") or "no error text"
        raise BadLine(f"failed call, not served ({error[:80]})")
    messages = obj.get("messages")
    record = Record(file=file, line=line)
    if isinstance(messages, str):
        if not messages:
            raise BadLine("empty prompt")
        record.prompt = messages
    else:
        record.messages = check_messages(messages)
        tools = dict_field(obj, "model_parameters").get("tools")
        record.tools = tools if isinstance(tools, list) and tools else None
    response = obj.get("response")
    if isinstance(response, dict):
        completion = completion_fields(response)
        record.output_text, record.finish_reason = completion.answer, completion.finish_reason
        record.output_message = completion.message
        record.output_length = completion.output_length
        record.server_cached_tokens = completion.cached_tokens
        record.server_prompt_tokens = completion.prompt_tokens
    if record.server_prompt_tokens is None:
        record.server_prompt_tokens = count(obj.get("prompt_tokens"))
    metadata = dict_field(obj, "metadata")
    record.model = optional_str(obj, "model")
    record.tenant = (
        optional_str(metadata, "user_api_key_team_id")
        or optional_str(obj, "end_user")
        or optional_str(metadata, "user_api_key_user_id")
        or None
    )
    record.request_id = optional_str(obj, "id") or optional_str(obj, "request_id")
    # startTime: epoch seconds in the payload, a datetime string where a logger stringifies it
    record.arrival_s = parse_time(obj.get("startTime"), "startTime")
    return record
