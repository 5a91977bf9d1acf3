"""The text a router matches for each request, as sgl-model-gateway 0.3.2 extracts it
(``GenerationRequest::extract_text_for_routing`` in src/protocols): a completion's prompt; a
chat's message texts joined by spaces (user text parts joined by spaces; an assistant's content
and reasoning); ``/generate`` input ids as decimal numbers joined by spaces. Hash-id traces have
no text: their synthetic token ids stand in for it, one symbol per token."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from analyzer.records import Record
from analyzer.workload import TokenizedLog


def _content(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: the text ones, joined by spaces
        return " ".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return None


def chat_text(messages: list[dict[str, Any]]) -> str:
    texts = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            main = _content(message.get("content")) or ""
            reasoning = message.get("reasoning_content") or ""
            if main or reasoning:
                texts.append(f"{main} {reasoning}".strip())
        else:
            text = _content(message.get("content"))
            if text is not None:
                texts.append(text)
    return " ".join(texts)


def routing_text(record: Record) -> str | None:
    """The router's text for a chat or a completion (None: a request given as token ids)."""
    if record.messages is not None:
        return chat_text(record.messages)
    return record.prompt


def routing_symbols(
    records: list[Record], log: TokenizedLog, hash_trace: bool
) -> list[np.ndarray] | None:
    """Each request's routing text as code points (requests' order); None for hash traces. A
    request given as token ids routes on its ids as decimal numbers, taken from the workload
    (the reader drops a record's ids once they are in it)."""
    if hash_trace:
        return None
    by_line = {(r.file, r.line): r for r in records}
    requests, workload = log.requests, log.workload
    out = []
    for i, (file, line) in enumerate(zip(requests["file"], requests["line"], strict=True)):
        record = by_line.get((file, int(line)))
        text = routing_text(record) if record is not None else None
        if text is not None:
            out.append(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64))
        else:
            start, stop = workload.prompt_offsets[i], workload.prompt_offsets[i + 1]
            out.append(decimal_symbols(workload.prompt_tokens[start:stop]))
    return out


@njit(cache=True)
def _digits(value: int) -> int:
    digits = 1
    while value >= 10**digits and digits < 10:
        digits += 1
    return digits


@njit(cache=True)
def decimal_symbols(ids: np.ndarray) -> np.ndarray:
    """The code points of ``" ".join(str(i) for i in ids)`` (ids >= 0)."""
    n = max(0, len(ids) - 1)  # the spaces
    for value in ids:
        n += _digits(value)
    out = np.empty(n, np.int64)
    at = 0
    for k, value in enumerate(ids):
        if k:
            out[at] = 32  # " "
            at += 1
        digits = _digits(value)
        for d in range(digits - 1, -1, -1):
            out[at + d] = 48 + value % 10
            value //= 10
        at += digits
    return out
