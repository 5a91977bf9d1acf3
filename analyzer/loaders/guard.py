"""The reader's guard: what every parsed line must satisfy before it becomes a request, whatever
its format, and how an unexpected error on one line becomes that line's reasoned skip.

The bounds are far beyond any real request, so that no line, however hostile, can make the run
allocate without limit: a claimed output length or prompt length over MAX_REQUEST_TOKENS, JSON
nested deeper than MAX_JSON_DEPTH, a count or time that no server logs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from analyzer.errors import BadLine
from analyzer.loaders.joins import Answer
from analyzer.records import Record

# Tokens in one prompt or one answer: 16M, over ten times the longest context of any model.
MAX_REQUEST_TOKENS = 1 << 24
MAX_JSON_DEPTH = 100  # nested objects and lists in one line (real logs nest under 20)
MAX_COUNT = 1 << 53  # logged token counts (cached, prompt): above this no count is real
# Arrival times: seconds since the epoch, years 1 to 9999 (what a datetime can hold).
MIN_TIME_S, MAX_TIME_S = -62_135_596_800.0, 253_402_300_799.0
REASON_CHARS = 300  # an unexpected error's message in a skip reason, at most


def unexpected(exc: BaseException) -> str:
    """The skip reason for an error no parser anticipated (a bug, or an input no one foresaw)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, MemoryError):
        return "too large to read (out of memory)"
    message = str(exc).replace("\n", " ")
    if len(message) > REASON_CHARS:
        message = message[:REASON_CHARS] + "..."
    return f"unreadable line ({type(exc).__name__}: {message})"


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether objects and lists nest deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def checked(parsed: Record | list[Record] | Answer) -> Record | list[Record] | Answer:
    """The parsed line, once every request (or answer) in it is within bounds and typed."""
    for item in parsed if isinstance(parsed, list) else [parsed]:
        if isinstance(item, Answer):
            _check_answer(item)
        else:
            _check_record(item)
    return parsed


def _check_record(record: Record) -> None:
    for name in ("model", "cache_salt", "lora", "tenant", "finish_reason", "request_id"):
        value = getattr(record, name)
        if value is not None and not isinstance(value, str):
            raise BadLine(f"{name} must be a string, got {type(value).__name__}")
    messages = record.messages
    if messages is not None and not (
        isinstance(messages, list) and all(isinstance(message, dict) for message in messages)
    ):
        raise BadLine("messages must be a list of objects")
    if record.tools is not None and not isinstance(record.tools, list):
        raise BadLine(f"tools must be a list, got {type(record.tools).__name__}")
    if record.chat_template_kwargs is not None and not isinstance(
        record.chat_template_kwargs, dict
    ):
        raise BadLine("chat_template_kwargs must be an object")
    _check_text("prompt", record.prompt)
    _check_text("answer text", record.output_text)
    _check_ids("prompt_token_ids", record.prompt_token_ids)
    _check_ids("output_token_ids", record.output_token_ids)
    _check_length("output length", record.output_length)
    for name in ("server_cached_tokens", "server_prompt_tokens"):
        _check_count(name, getattr(record, name))
    if record.arrival_s is not None:
        when = record.arrival_s
        if (
            isinstance(when, bool)
            or not isinstance(when, int | float)
            or not math.isfinite(when)
            or not MIN_TIME_S <= when <= MAX_TIME_S
        ):
            raise BadLine(f"arrival time {_shown(when)} is not a time between the years 1 and 9999")


def _check_answer(answer: Answer) -> None:
    _check_text("answer text", answer.output_text)
    _check_ids("output_token_ids", answer.output_token_ids)
    _check_length("output length", answer.output_length)
    for name in ("server_cached_tokens", "server_prompt_tokens"):
        _check_count(name, getattr(answer, name))
    if answer.finish_reason is not None and not isinstance(answer.finish_reason, str):
        raise BadLine("finish_reason must be a string")


def _check_text(name: str, text: Any) -> None:
    if text is None:
        return
    if not isinstance(text, str):
        raise BadLine(f"{name} must be a string, got {type(text).__name__}")
    check_unicode(name, text)


def check_unicode(name: str, text: str) -> None:
    """Text a tokenizer can take: no lone surrogates (JSON's ``"\\ud800"`` decodes to one)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadLine(
                f"{name} is not valid Unicode (a lone surrogate at character {exc.start})"
            ) from None


def _check_ids(name: str, ids: Any) -> None:
    if ids is None:
        return
    if len(ids) > MAX_REQUEST_TOKENS:
        raise BadLine(f"{name} has {len(ids):,} tokens, over the maximum {MAX_REQUEST_TOKENS:,}")
    if isinstance(ids, np.ndarray) and ids.dtype == np.int32:
        return
    try:
        array = np.asarray(ids, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        raise BadLine(f"{name} must be a list of token ids (integers)") from None
    if array.ndim != 1 or (array.size and not (array.min() >= 0 and array.max() < 2**31)):
        raise BadLine(f"{name} must be a flat list of token ids in 0..2^31-1")


def _check_length(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadLine(f"{name} must be a non-negative integer, got {_shown(value)}")
    if value > MAX_REQUEST_TOKENS:
        raise BadLine(
            f"claimed {name} of {_shown(value)} tokens is beyond any model (at most "
            f"{MAX_REQUEST_TOKENS:,}; not allocated)"
        )


def _check_count(name: str, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT
    ):
        raise BadLine(f"{name} must be a token count, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A value for a message, short (a 4,000-digit integer cannot even be printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    text = f"{value!r}" if isinstance(value, int | float) else type(value).__name__
    return text[:40]
