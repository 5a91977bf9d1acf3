"""Conversation datasets, expanded into one request per assistant turn (the turn's prompt is
every message before it, its answer the turn itself):

- ShareGPT: ``{"id", "conversations": [{"from": "human" | "gpt" | "system", "value": "..."}]}``;
- LMSYS-Chat-1M: ``{"conversation_id", "model", "conversation": [{"role", "content"}], "turn",
  "language", ...}``.
"""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import optional_str
from analyzer.records import Message, Record

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def matches_sharegpt(obj: dict[str, Any]) -> bool:
    turns = obj.get("conversations")
    return (
        isinstance(turns, list)
        and bool(turns)
        and isinstance(turns[0], dict)
        and ("from" in turns[0])
    )


def matches_lmsys(obj: dict[str, Any]) -> bool:
    turns = obj.get("conversation")
    return (
        isinstance(turns, list)
        and bool(turns)
        and isinstance(turns[0], dict)
        and ("role" in turns[0])
    )


def parse_sharegpt(obj: dict[str, Any], file: str, line: int) -> list[Record]:
    turns = obj.get("conversations")
    if not isinstance(turns, list):
        raise BadLine("field 'conversations' must be a list")
    # a top-level "system" (FastChat's and LLaMA-Factory's ShareGPT datasets) opens the chat
    system = optional_str(obj, "system")
    messages = [{"role": "system", "content": system}] if system else []
    for position, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("from") not in SHAREGPT_ROLES:
            speaker = turn.get("from") if isinstance(turn, dict) else turn
            raise BadLine(f"conversations[{position}] has unknown speaker {speaker!r}")
        if not isinstance(turn.get("value"), str):
            raise BadLine(f"conversations[{position}].value must be a string")
        messages.append({"role": SHAREGPT_ROLES[turn["from"]], "content": turn["value"]})
    return expand(messages, file, line, conversation=optional_str(obj, "id"), model=None)


def parse_lmsys(obj: dict[str, Any], file: str, line: int) -> list[Record]:
    turns = obj.get("conversation")
    if not isinstance(turns, list):
        raise BadLine("field 'conversation' must be a list")
    messages = []
    for position, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ("system", "user", "assistant"):
            raise BadLine(f"conversation[{position}] has no user/assistant/system role")
        if not isinstance(turn.get("content"), str):
            raise BadLine(f"conversation[{position}].content must be a string")
        messages.append({"role": turn["role"], "content": turn["content"]})
    return expand(
        messages,
        file,
        line,
        conversation=optional_str(obj, "conversation_id"),
        model=optional_str(obj, "model"),
    )


def expand(
    messages: list[Message], file: str, line: int, conversation: str | None, model: str | None
) -> list[Record]:
    """One request per assistant turn that follows at least one message."""
    records = [
        Record(
            file=file,
            line=line,
            messages=messages[:position],
            output_text=message["content"],
            finish_reason="stop",
            model=model,
            request_id=f"{conversation}#{turn}" if conversation else None,
        )
        for turn, (position, message) in enumerate(
            (p, m) for p, m in enumerate(messages) if m["role"] == "assistant" and p > 0
        )
    ]
    if not records:
        raise BadLine("no assistant turn after a user message")
    return records
