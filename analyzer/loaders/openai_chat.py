"""OpenAI chat-completions request logs: ``messages`` (+ ``tools``), optionally with the response.

Accepted shapes, one request a line:
``{"model": ..., "messages": [...], "tools": [...], "cache_salt": ...}`` (the request body), or
``{"request": {...body...}, "response": {...chat.completion...}}``; an answer is read from
``response.choices[0].message.content`` or a top-level ``response`` / ``completion`` / ``output``
string.
"""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import optional_number, optional_str
from analyzer.records import Message, Record

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def matches(obj: dict[str, Any]) -> bool:
    body = obj.get("request") if isinstance(obj.get("request"), dict) else obj
    return isinstance(body.get("messages"), list)


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    body = obj["request"] if isinstance(obj.get("request"), dict) else obj
    messages = _messages(body.get("messages"))
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise BadLine("field 'tools' must be a list of objects")
    answer, finish_reason, output_length, created = _response(obj)
    arrival = optional_number(obj, "timestamp")
    return Record(
        file=file,
        line=line,
        messages=messages,
        tools=tools or None,
        output_text=answer,
        output_length=output_length,
        finish_reason=finish_reason or optional_str(obj, "finish_reason"),
        cache_salt=optional_str(body, "cache_salt") or None,
        model=optional_str(body, "model"),
        arrival_s=arrival if arrival is not None else created,
    )


def _messages(value: Any) -> list[Message]:
    if not isinstance(value, list):
        raise BadLine("field 'messages' must be a list")
    if not value:
        raise BadLine("empty 'messages'")
    for position, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadLine(f"messages[{position}] must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise BadLine(
                f"messages[{position}] has unknown role {role!r} (expected one of {sorted(ROLES)})"
            )
        content = message.get("content")
        if content is None and not message.get("tool_calls"):
            raise BadLine(f"messages[{position}] has no content")
        if content is not None and not isinstance(content, str | list):
            raise BadLine(f"messages[{position}].content must be a string or a list of parts")
    return value


def _response(obj: dict[str, Any]) -> tuple[str | None, str | None, int | None, float | None]:
    """The answer text, finish reason, output token count and creation time, where logged."""
    response = obj.get("response")
    for key in ("completion", "output"):
        if isinstance(obj.get(key), str):
            return obj[key], None, None, None
    if isinstance(response, str):
        return response, None, None, None
    if not isinstance(response, dict):
        return None, None, None, None
    choices = response.get("choices")
    answer = finish_reason = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            answer = message["content"]
        if isinstance(choices[0].get("finish_reason"), str):
            finish_reason = choices[0]["finish_reason"]
    usage = response.get("usage")
    output_length = None
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        output_length = usage["completion_tokens"]
    created = response.get("created")
    return (
        answer,
        finish_reason,
        output_length,
        float(created) if isinstance(created, int) else None,
    )
