"""Whole pre-tokenized lines read from their bytes in compiled code: the first step of the
tokens loader's batch reader, for the lines most logs hold (no Python object per line until the
Record). A line is taken only in its plainest form: one JSON object whose keys are among
``FIELDS``, each at most once, spelt without escapes; the id lists plain (``id_lists``); every
other value ``null`` or a string of printable ASCII without escapes; a prompt of 1 to
``max_tokens`` ids and an answer of at most ``max_tokens``. Anything else (a timestamp, an
escape, a duplicate key, another field) is reported as not taken, for the caller's next reader."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from analyzer.loaders.id_lists import plain_list, skip_space

FIELDS = ("prompt_token_ids", "output_token_ids", "finish_reason", "cache_salt", "lora", "model")
STRING_FIELDS = FIELDS[2:]
_NAMES = np.frombuffer("".join(FIELDS).encode(), np.uint8)
_NAME_BOUNDS = np.cumsum([0, *(len(name) for name in FIELDS)]).astype(np.int64)
ROW = 2 * len(FIELDS)  # per line: the start and end of each field (ids, or a string's bytes)


def parse_lines(
    lines: Sequence[bytes], max_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, rows, taken)``: when ``taken[i]``, line ``i``'s field ``k`` spans
    ``rows[i, 2k] : rows[i, 2k + 1]``, in ``ids`` for the two id lists, in the line's bytes for
    the strings (-1, -1: absent or null)."""
    bounds = np.zeros(len(lines) + 1, np.int64)
    np.cumsum([len(raw) for raw in lines], out=bounds[1:])
    buffer = np.frombuffer(b"".join(lines), np.uint8)
    return _parse(buffer, bounds, _NAMES, _NAME_BOUNDS, max_tokens)


@njit(cache=True, nogil=True)
def _parse(buffer, bounds, names, name_bounds, max_tokens):
    n = len(bounds) - 1
    ids = np.empty(len(buffer) // 2 + 1, np.int32)  # a list of k ids takes at least 2k bytes
    rows = np.full((n, ROW), -1, np.int64)
    taken = np.zeros(n, np.bool_)
    size = 0
    for i in range(n):
        grown = _line(buffer, bounds[i], bounds[i + 1], ids, size, rows[i], names, name_bounds)
        prompt, output = rows[i, 1] - rows[i, 0], rows[i, 3] - rows[i, 2]
        if grown >= 0 and 0 < prompt <= max_tokens and output <= max_tokens:
            taken[i] = True
            size = grown
    return ids[:size], rows, taken  # a view (of twice the room): the workload copies what it keeps


@njit(cache=True, nogil=True)
def split_lists(ids, rows):
    """``parse_lines``' ids of taken lines (``rows``) as the prompts' ids and the answers',
    each flat with its offsets (an absent answer is empty)."""
    n = len(rows)
    prompt_offsets = np.zeros(n + 1, np.int64)
    answer_offsets = np.zeros(n + 1, np.int64)
    for i in range(n):
        prompt_offsets[i + 1] = prompt_offsets[i] + rows[i, 1] - rows[i, 0]
        answer_offsets[i + 1] = answer_offsets[i] + max(rows[i, 3] - rows[i, 2], 0)
    prompts = np.empty(prompt_offsets[n], np.int32)
    answers = np.empty(answer_offsets[n], np.int32)
    for i in range(n):
        at = prompt_offsets[i]
        for j in range(rows[i, 0], rows[i, 1]):
            prompts[at] = ids[j]
            at += 1
        at = answer_offsets[i]
        for j in range(rows[i, 2], rows[i, 3]):
            answers[at] = ids[j]
            at += 1
    return prompts, prompt_offsets, answers, answer_offsets


@njit(cache=True)
def _line(buffer, start, end, ids, size, row, names, name_bounds):
    """One line's fields into ``row`` (ids appended at ``ids[size:]``): the new size, or -1."""
    at = skip_space(buffer, start, end)
    if at >= end or buffer[at] != 123:  # {
        return -1
    at = skip_space(buffer, at + 1, end)
    seen = 0
    while True:
        key_end = _string_end(buffer, at, end)
        if key_end < 0:
            return -1
        field = _field(buffer, at + 1, key_end, names, name_bounds)
        if field < 0 or seen & (1 << field):
            return -1
        seen |= 1 << field
        at = skip_space(buffer, key_end + 1, end)
        if at >= end or buffer[at] != 58:  # :
            return -1
        at = skip_space(buffer, at + 1, end)
        if _is_null(buffer, at, end) and field != 0:
            at += 4
        elif field <= 1:
            first = size
            at, size = plain_list(buffer, at, end, ids, size)
            if at < 0:
                return -1
            row[2 * field], row[2 * field + 1] = first, size
        else:
            value_end = _string_end(buffer, at, end)
            if value_end < 0:
                return -1
            row[2 * field], row[2 * field + 1] = at + 1 - start, value_end - start
            at = value_end + 1
        at = skip_space(buffer, at, end)
        if at < end and buffer[at] == 44:  # ,
            at = skip_space(buffer, at + 1, end)
            continue
        if at < end and buffer[at] == 125:  # }
            return size if seen & 1 and skip_space(buffer, at + 1, end) == end else -1
        return -1


@njit(cache=True)
def _string_end(buffer, at, end):
    """The closing quote of the plain string that opens at ``buffer[at]`` (printable ASCII, no
    escape), or -1."""
    if at >= end or buffer[at] != 34:  # "
        return -1
    at += 1
    while at < end:
        byte = buffer[at]
        if byte == 34:
            return at
        if byte == 92 or byte < 32 or byte > 126:  # an escape, a control or non-ASCII byte
            return -1
        at += 1
    return -1


@njit(cache=True)
def _field(buffer, start, end, names, name_bounds):
    """The index in FIELDS of the key ``buffer[start:end]``, or -1."""
    for k in range(len(name_bounds) - 1):
        lo, hi = name_bounds[k], name_bounds[k + 1]
        if hi - lo == end - start:
            same = True
            for j in range(hi - lo):
                if buffer[start + j] != names[lo + j]:
                    same = False
                    break
            if same:
                return k
    return -1


@njit(cache=True)
def _is_null(buffer, at, end):
    return (
        at + 4 <= end
        and buffer[at] == 110
        and buffer[at + 1] == 117
        and buffer[at + 2] == 108
        and buffer[at + 3] == 108
    )
