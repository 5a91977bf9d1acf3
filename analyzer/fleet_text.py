"""The text a router matches for each request, as sgl-model-gateway 0.3.2 extracts it
(``GenerationRequest::extract_text_for_routing`` in src/protocols): a completion's prompt; a
chat's message texts joined by spaces (user text parts joined by spaces; an assistant's content
and reasoning); ``/generate`` input ids as decimal numbers joined by spaces. Hash-id traces have
no text: their synthetic token ids stand in for it, one symbol per token."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analyzer.records import Record


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
    """The router's text for one request (None: no text, use its token ids)."""
    if record.messages is not None:
        return chat_text(record.messages)
    if record.prompt is not None:
        return record.prompt
    if record.prompt_token_ids is not None:
        return " ".join(str(int(t)) for t in record.prompt_token_ids)
    return None


def routing_symbols(
    records: list[Record], requests: pl.DataFrame, hash_trace: bool
) -> list[np.ndarray] | None:
    """Each request's routing text as code points (requests' order); None for hash traces."""
    if hash_trace:
        return None
    by_line = {(r.file, r.line): r for r in records}
    out = []
    for file, line in zip(requests["file"], requests["line"], strict=True):
        record = by_line.get((file, int(line)))
        text = routing_text(record) if record is not None else None
        out.append(
            np.frombuffer((text or "").encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        )
    return out
