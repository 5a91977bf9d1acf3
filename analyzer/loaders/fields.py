"""Typed field access for log parsers: a wrong type is a BadLine naming the field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np

from analyzer.errors import BadLine

# Epoch times above this are milliseconds (1e11 s is the year 5138).
MILLISECONDS_FROM = 1e11


def optional_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadLine(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def required_str(obj: dict[str, Any], key: str) -> str:
    if key not in obj:
        raise BadLine(f"missing field {key!r}")
    value = optional_str(obj, key)
    if value is None:
        raise BadLine(f"field {key!r} is null")
    return value


def optional_int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadLine(f"field {key!r} must be an integer, got {type(value).__name__}")
    return value


def optional_number(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadLine(f"field {key!r} must be a number, got {type(value).__name__}")
    return float(value)


def int_list(obj: dict[str, Any], key: str, *, required: bool) -> np.ndarray | None:
    """A list of integers in 0..2^31-1 (token ids, hash ids), as an int32 array.

    Checked in bulk: the element types in one C-level pass, the range on the array; only a bad
    list is walked element by element, for the error naming the first bad position."""
    if key not in obj or obj[key] is None:
        if required:
            raise BadLine(f"missing field {key!r}")
        return None
    value = obj[key]
    if not isinstance(value, list):
        raise BadLine(f"field {key!r} must be a list of integers, got {type(value).__name__}")
    if not value:
        return np.zeros(0, np.int32)
    if set(map(type, value)) == {int}:  # bool is a type of its own here, as are int subclasses
        try:
            ids = np.array(value, dtype=np.int64)
        except OverflowError:
            ids = None
        if ids is not None and ids.min() >= 0 and ids.max() < 2**31:
            return ids.astype(np.int32)
    _raise_first_bad(value, key)
    raise AssertionError("unreachable: a bad element was found")


def _raise_first_bad(value: list[Any], key: str) -> None:
    for position, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int):
            raise BadLine(f"field {key!r}[{position}] must be an integer, got {item!r}")
        if not 0 <= item < 2**31:
            raise BadLine(f"field {key!r}[{position}] = {item} is outside 0..2^31-1")


def dotted(obj: Any, path: str) -> Any:
    """The value at a dotted path (``request.body.messages``, ``choices.0.text``), or None."""
    for part in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


def parse_time(value: Any, key: str) -> float | None:
    """Seconds since the epoch from a number (seconds, or milliseconds when it is that large) or
    an ISO 8601 string."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadLine(f"field {key!r} must be a time, got a boolean")
    if isinstance(value, int | float):
        return float(value) / 1000.0 if value > MILLISECONDS_FROM else float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise BadLine(f"field {key!r} is not a time: {value[:40]!r}") from None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    raise BadLine(f"field {key!r} must be a time, got {type(value).__name__}")


def dict_field(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """A nested object, or an empty one when absent."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadLine(f"field {key!r} must be an object, got {type(value).__name__}")
    return value


def count(value: Any) -> int | None:
    """A logged token count: a non-negative integer, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def cached_tokens(usage: Any) -> int | None:
    """The server's cached prompt tokens from an OpenAI-style ``usage`` object."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    return count(details.get("cached_tokens")) if isinstance(details, dict) else None


def cache_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The request fields that change which prompt tokens the engines read from their caches,
    as ``Record`` keyword arguments: SGLang's ``extra_key`` (a namespace) and ``priority``
    (``--radix-eviction-policy priority``), ``logprob_start_len`` when ``return_logprob`` is set
    (SGLang matches at most that many tokens: ``Req._compute_max_prefix_len``), and vLLM's
    ``prompt_logprobs`` (``SamplingParams.skip_reading_prefix_cache``: no lookup at all), and
    the output limit (``output_limit``: SGLang's admission reserves it). Read at the top level
    or under ``sampling_params`` (SGLang's ``/generate``)."""
    sampling = dict_field(obj, "sampling_params")
    fields: dict[str, Any] = {}
    extra_key = optional_str(obj, "extra_key")
    if extra_key:
        fields["extra_key"] = extra_key
    priority = optional_int(obj, "priority")
    if priority is not None:
        if not -(2**63) <= priority < 2**63:
            raise BadLine(f"field 'priority' = {priority} is outside the signed 64-bit range")
        fields["priority"] = priority
    prompt_logprobs = obj.get("prompt_logprobs", sampling.get("prompt_logprobs"))
    if prompt_logprobs is not None:
        if isinstance(prompt_logprobs, bool) or not isinstance(prompt_logprobs, int):
            raise BadLine("field 'prompt_logprobs' must be an integer")
        fields["prompt_logprobs"] = True
    return_logprob = obj.get("return_logprob") or False
    if not isinstance(return_logprob, bool):
        raise BadLine("field 'return_logprob' must be a boolean")
    start = optional_int(obj, "logprob_start_len")
    if return_logprob and start is not None and start >= 0:
        fields["logprob_start_len"] = start
    limit = output_limit(obj, sampling)
    if limit is not None:
        fields["max_new_tokens"] = limit
    return fields


# The request's output limit, first found wins: OpenAI's max_completion_tokens supersedes its
# deprecated max_tokens (vLLM ``ChatCompletionRequest.to_sampling_params``); SGLang's
# ``/generate`` puts max_new_tokens under sampling_params.
LIMIT_FIELDS = ("max_completion_tokens", "max_tokens", "max_new_tokens")


def output_limit(obj: dict[str, Any], sampling: dict[str, Any]) -> int | None:
    """The request's ``max_new_tokens`` (what SGLang's ``PrefillAdder`` reserves per request),
    from ``max_completion_tokens`` / ``max_tokens`` / ``max_new_tokens`` at the top level or
    under ``sampling_params``; None when the log gives none."""
    for where in (obj, sampling):
        for key in LIMIT_FIELDS:
            value = optional_int(where, key)
            if value is not None:
                if value < 0:
                    raise BadLine(f"field {key!r} = {value} must be non-negative")
                return value
    return None
