"""JSON lists of token ids read straight from their bytes into one int32 array: the fast path of
pre-tokenized logs (no Python int per token). Only the plain form is taken (``[``, decimal
integers in 0..2^31-1, commas, JSON whitespace, ``]``); any other list (a negative id, a float,
a string, nesting, an id too large) is reported as not taken, for the caller to read that line
the ordinary way, with its ordinary error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from numba import njit

T = TypeVar("T")

_MAX_ID = (1 << 31) - 1
_MAX_DIGITS = 10  # 2^31 - 1 has 10 digits


def decoded_lines(lines: Sequence[tuple[int, Any]], decode: Callable[[bytes], T]) -> list[T | None]:
    """Each line's typed decode (a batch reader's first step), None where the line is not bytes
    or ``decode`` refuses it: the ordinary reader then decides, and says why."""
    decoded: list[T | None] = []
    for _, raw in lines:
        try:
            decoded.append(decode(raw) if isinstance(raw, bytes) else None)
        except Exception:  # any refusal
            decoded.append(None)
    return decoded


def parse_id_lists(lists: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids of each JSON list, laid out flat: ``(ids, offsets, taken)``; list ``i``'s ids are
    ``ids[offsets[i]:offsets[i + 1]]`` when ``taken[i]`` (else empty: not a plain id list)."""
    bounds = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(raw) for raw in lists], out=bounds[1:])
    buffer = np.frombuffer(b"".join(lists), np.uint8)
    return _parse(buffer, bounds)


def parse_list_pairs(
    decoded: Sequence[T | None], lists_of: Callable[[T], tuple[bytes, bytes | None]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int | None] | None]]:
    """``parse_id_lists`` of each decoded line's lists: a first one and, where ``lists_of``
    gives one, a second (a prompt's ids, then its answer's). Also, per line, the indices of its
    lists in the result (None for a line not decoded)."""
    lists: list[bytes] = []
    where: list[tuple[int, int | None] | None] = []
    for item in decoded:
        if item is None:
            where.append(None)
            continue
        first, second = lists_of(item)
        lists.append(first)
        if second is None:
            where.append((len(lists) - 1, None))
        else:
            lists.append(second)
            where.append((len(lists) - 2, len(lists) - 1))
    return (*parse_id_lists(lists), where)


@njit(cache=True, nogil=True)
def _parse(buffer: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(bounds) - 1
    ids = np.empty(len(buffer) // 2 + 1, np.int32)  # a list of k ids takes at least 2k bytes
    offsets = np.zeros(n + 1, np.int64)
    taken = np.zeros(n, np.bool_)
    size = 0
    for i in range(n):
        start = size
        ok = _one(buffer, bounds[i], bounds[i + 1], ids, size)
        if ok >= 0:
            size = ok
            taken[i] = True
        else:
            size = start
        offsets[i + 1] = size
    return ids[:size].copy(), offsets, taken


@njit(cache=True, inline="always")
def _space(byte: int) -> bool:
    return byte == 32 or byte == 9 or byte == 10 or byte == 13


@njit(cache=True)
def skip_space(buffer: np.ndarray, at: int, end: int) -> int:
    while at < end and _space(buffer[at]):
        at += 1
    return at


@njit(cache=True)
def _one(buffer: np.ndarray, at: int, end: int, ids: np.ndarray, size: int) -> int:
    """Append one list's ids at ``ids[size:]``; the new size, or -1 when it is not plain."""
    at, size = plain_list(buffer, skip_space(buffer, at, end), end, ids, size)
    if at < 0 or skip_space(buffer, at, end) != end:
        return -1
    return size


@njit(cache=True)
def plain_list(buffer: np.ndarray, at: int, end: int, ids: np.ndarray, size: int) -> tuple:
    """The plain id list that starts at ``buffer[at]`` appended at ``ids[size:]``: the position
    just past its ``]`` and the new size, or ``(-1, size)`` when it is not plain."""
    if at >= end or buffer[at] != 91:  # [
        return -1, size
    at = skip_space(buffer, at + 1, end)
    if at < end and buffer[at] == 93:  # ]: an empty list
        return at + 1, size
    while True:
        value, digits = 0, 0
        while at < end and 48 <= buffer[at] <= 57 and digits <= _MAX_DIGITS:
            value = value * 10 + (buffer[at] - 48)
            digits += 1
            at += 1
        if digits == 0 or digits > _MAX_DIGITS or value > _MAX_ID:
            return -1, size
        if digits > 1 and buffer[at - digits] == 48:  # a leading zero: not JSON
            return -1, size
        ids[size] = value
        size += 1
        at = skip_space(buffer, at, end)
        if at >= end:
            return -1, size
        if buffer[at] == 93:  # ]
            return at + 1, size
        if buffer[at] != 44:  # ,
            return -1, size
        at = skip_space(buffer, at + 1, end)
