"""Anthropic Messages requests: ``{"model", "system", "messages": [...content blocks...],
"tools", "max_tokens", "metadata": {"user_id"}}``, optionally as ``{"request": ..., "response":
{"type": "message", "content": [...], "stop_reason", "usage": {...}}}``.

They are converted to chat-completions messages the way vLLM's Anthropic endpoint does before it
applies the chat template: the system blocks' text joined into one system message, text and
image blocks as content parts, ``tool_use`` blocks as tool calls, ``tool_result`` blocks as tool
messages. ``cache_control`` marks are ignored: vLLM and SGLang cache every prefix regardless.
The server's cached count is ``usage.cache_read_input_tokens``; ``max_tokens`` is the output limit
(vLLM's endpoint passes it on as the chat request's ``max_tokens``).
"""

from __future__ import annotations

import json
from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import (
    count,
    dict_field,
    optional_number,
    optional_str,
    output_limit,
)
from analyzer.loaders.openai_chat import check_messages
from analyzer.records import Message, Record

BLOCK_TYPES = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "document"})
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}


def accepts(obj: dict[str, Any]) -> bool:
    return isinstance(_body(obj).get("messages"), list)


def matches(obj: dict[str, Any]) -> bool:
    body = _body(obj)
    if not isinstance(body.get("messages"), list):
        return False
    response = obj.get("response")
    return (
        body.get("system") is not None
        or "anthropic_version" in body
        or str(body.get("model") or "").startswith("claude")
        or (isinstance(response, dict) and response.get("type") == "message")
        or any(_has_anthropic_blocks(m) for m in body["messages"] if isinstance(m, dict))
    )


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["request"] if isinstance(obj.get("request"), dict) else obj


def _has_anthropic_blocks(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and (block.get("type") in BLOCK_TYPES or "source" in block)
        for block in content
    )


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    body = _body(obj)
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    response = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    usage = dict_field(response, "usage")
    cached = usage.get("cache_read_input_tokens")
    # input_tokens counts only what was neither read from nor written to the cache.
    parts = [
        count(usage.get(key))
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    ]
    prompt_tokens = sum(p or 0 for p in parts) if parts[0] is not None else None
    output_length = usage.get("output_tokens")
    stop_reason = response.get("stop_reason")
    return Record(
        file=file,
        line=line,
        messages=check_messages(messages),
        tools=_tools(body.get("tools")),
        model=optional_str(body, "model"),
        tenant=optional_str(dict_field(body, "metadata"), "user_id") or None,
        output_text=_answer(response.get("content")),
        output_length=output_length if isinstance(output_length, int) else None,
        finish_reason=STOP_REASONS.get(stop_reason, stop_reason)
        if isinstance(stop_reason, str)
        else None,
        server_cached_tokens=cached if isinstance(cached, int) else None,
        server_prompt_tokens=prompt_tokens,
        arrival_s=optional_number(obj, "timestamp"),
        max_new_tokens=output_limit(body, {}),  # the request's required max_tokens
    )


def _system(system: Any) -> list[Message]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if isinstance(system, list):
        text = "".join(
            block["text"]
            for block in system
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
        return [{"role": "system", "content": text}] if text else []
    raise BadLine("field 'system' must be a string or a list of text blocks")


def _messages(value: Any) -> list[Message]:
    if not isinstance(value, list):
        raise BadLine("field 'messages' must be a list")
    converted: list[Message] = []
    for position, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadLine(f"messages[{position}] must be a user or assistant message")
        content = message.get("content")
        if isinstance(content, str):
            converted.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            converted.extend(_blocks(message["role"], content, position))
        else:
            raise BadLine(f"messages[{position}].content must be a string or a list of blocks")
    return converted


def _blocks(role: str, blocks: list[Any], position: int) -> list[Message]:
    """One Anthropic message's blocks as chat-completions messages."""
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    tool_results: list[Message] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            function = {"name": block.get("name"), "arguments": arguments}
            tool_calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result":
            tool_results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _result_text(block.get("content")),
                }
            )
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadLine(f"messages[{position}] has a {kind!r} block (not read)")
    converted: list[Message] = list(tool_results)
    if parts or tool_calls:
        message: Message = {"role": role, "content": parts or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        converted.append(message)
    return converted


def _image_url(block: dict[str, Any]) -> str:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "url":
        return str(source.get("url"))
    return f"data:{source.get('media_type')};base64,{source.get('data')}"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return ""


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadLine("field 'tools' must be a list of objects")
    return [
        {
            "type": "function",
            "function": {
                "name": tool.get("name"),
                "description": tool.get("description", ""),
                "parameters": tool.get("input_schema", {}),
            },
        }
        for tool in tools
    ] or None


def _answer(content: Any) -> str | None:
    if not isinstance(content, list):
        return None
    texts = [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return "".join(texts) if texts else None
