"""OpenAI chat-completions request logs: ``messages`` (+ ``tools``), optionally with the response.

Accepted shapes, one request a line:
``{"model": ..., "messages": [...], "tools": [...], "cache_salt": ...}`` (the request body), or
``{"request": {...body...}, "response": {...chat.completion...}}``; an answer is read from
``response.choices[0].message.content`` (a message with ``tool_calls`` is kept whole: its tokens
are what the template renders for the turn) or a top-level ``response`` / ``completion`` /
``output`` string, and the server's cached prompt tokens from
``response.usage.prompt_tokens_details.cached_tokens``.

The body's ``cache_salt`` (vLLM) separates cache namespaces; ``user`` or ``prompt_cache_key``
name the tenant; ``chat_template_kwargs`` and ``add_generation_prompt`` reach the template as
vLLM passes them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from analyzer.errors import BadLine
from analyzer.loaders.fields import (
    cache_fields,
    cached_tokens,
    count,
    optional_number,
    optional_str,
)
from analyzer.records import Message, Record

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class Completion(NamedTuple):
    """What a logged response says: the answer and the server's counts, each where logged."""

    answer: str | None = None
    finish_reason: str | None = None
    output_length: int | None = None
    created: float | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    prompt_tokens: int | None = None  # usage.prompt_tokens
    message: Message | None = None  # an answer that calls tools: the assistant message


def matches(obj: dict[str, Any]) -> bool:
    body = obj.get("request") if isinstance(obj.get("request"), dict) else obj
    return isinstance(body.get("messages"), list)


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    body = obj["request"] if isinstance(obj.get("request"), dict) else obj
    record = request_record(body, file, line)
    completion = response_fields(obj)
    arrival = optional_number(obj, "timestamp")
    record.output_text = completion.answer
    record.output_message = completion.message
    record.output_length = completion.output_length
    record.finish_reason = completion.finish_reason or optional_str(obj, "finish_reason")
    record.server_cached_tokens = completion.cached_tokens
    record.server_prompt_tokens = completion.prompt_tokens
    record.arrival_s = arrival if arrival is not None else completion.created
    return record


def request_record(body: dict[str, Any], file: str, line: int) -> Record:
    """The request part of a chat-completions body (messages, tools, salt, tenant, kwargs)."""
    messages = check_messages(body.get("messages"))
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise BadLine("field 'tools' must be a list of objects")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadLine("field 'chat_template_kwargs' must be an object")
    add_generation_prompt = body.get("add_generation_prompt", True)
    return Record(
        file=file,
        line=line,
        messages=messages,
        tools=tools or None,
        cache_salt=optional_str(body, "cache_salt") or None,
        model=optional_str(body, "model"),
        tenant=optional_str(body, "user") or optional_str(body, "prompt_cache_key") or None,
        chat_template_kwargs=kwargs or None,
        add_generation_prompt=add_generation_prompt is not False,
        **cache_fields(body),
    )


def check_messages(value: Any) -> list[Message]:
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


def response_fields(obj: dict[str, Any]) -> Completion:
    """The logged response of a request line: a ``response`` object, or the answer text alone."""
    response = obj.get("response")
    for key in ("completion", "output"):
        if isinstance(obj.get(key), str):
            return Completion(answer=obj[key])
    if isinstance(response, str):
        return Completion(answer=response)
    if not isinstance(response, dict):
        return Completion()
    return completion_fields(response)


def completion_fields(response: dict[str, Any]) -> Completion:
    """The fields of a ``chat.completion`` (or ``text_completion``) object."""
    choices = response.get("choices")
    answer = finish_reason = tool_message = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        tool_message = tool_call_message(message)
        if tool_message is None and isinstance(message.get("content"), str):
            answer = message["content"]
        elif isinstance(choices[0].get("text"), str):  # a completions response
            answer = choices[0]["text"]
        if isinstance(choices[0].get("finish_reason"), str):
            finish_reason = choices[0]["finish_reason"]
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    created = response.get("created")
    return Completion(
        answer,
        finish_reason,
        count(usage.get("completion_tokens")),
        float(created) if isinstance(created, int) else None,
        cached_tokens(usage),
        count(usage.get("prompt_tokens")),
        tool_message,
    )


def tool_call_message(message: Any) -> Message | None:
    """An assistant answer that calls tools, as the next turn's history holds it; else None."""
    if not isinstance(message, dict) or not isinstance(message.get("tool_calls"), list):
        return None
    if not message["tool_calls"]:
        return None
    content = message.get("content")
    return {
        "role": "assistant",
        "content": content if isinstance(content, str | list) else None,
        "tool_calls": message["tool_calls"],
        **{k: message[k] for k in ("reasoning_content", "reasoning") if message.get(k) is not None},
    }
