"""Typed field access for log parsers: a wrong type is a BadLine naming the field."""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine


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


def int_list(obj: dict[str, Any], key: str, *, required: bool) -> list[int] | None:
    """A list of non-negative integers (token ids, hash ids)."""
    if key not in obj or obj[key] is None:
        if required:
            raise BadLine(f"missing field {key!r}")
        return None
    value = obj[key]
    if not isinstance(value, list):
        raise BadLine(f"field {key!r} must be a list of integers, got {type(value).__name__}")
    for position, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int):
            raise BadLine(f"field {key!r}[{position}] must be an integer, got {item!r}")
        if not 0 <= item < 2**31:
            raise BadLine(f"field {key!r}[{position}] = {item} is outside 0..2^31-1")
    return value
