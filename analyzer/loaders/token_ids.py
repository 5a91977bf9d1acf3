"""Pre-tokenized requests: ``{"prompt_token_ids": [...], "output_token_ids": [...],
"cache_salt": "...", "finish_reason": "stop"}`` (all but ``prompt_token_ids`` optional).

Plain lines (those fields alone, ids as plain JSON lists) are read in batches: one typed decode
per line that leaves the id lists as bytes, then every list of the batch parsed into one int32
array in compiled code (``id_lists``). Any other line, or one the fast path does not take
whole, is read by ``parse``, the ordinary way, with its ordinary error."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from analyzer.errors import BadLine
from analyzer.loaders.fields import cache_fields, int_list, optional_number, optional_str
from analyzer.loaders.guard import MAX_REQUEST_TOKENS, MAX_TIME_S, MIN_TIME_S
from analyzer.loaders.id_lists import decoded_lines, parse_list_pairs
from analyzer.loaders.token_lines import parse_lines, split_lists
from analyzer.records import Record, TokenLines


def matches(obj: dict[str, Any]) -> bool:
    return "prompt_token_ids" in obj


def parse(obj: dict[str, Any], file: str, line: int) -> Record:
    prompt = int_list(obj, "prompt_token_ids", required=True)
    if prompt is None or not len(prompt):
        raise BadLine("empty prompt_token_ids")
    output = int_list(obj, "output_token_ids", required=False)
    return Record(
        file=file,
        line=line,
        prompt_token_ids=prompt,
        output_token_ids=output if output is not None and len(output) else None,
        finish_reason=optional_str(obj, "finish_reason"),
        cache_salt=optional_str(obj, "cache_salt") or None,
        lora=optional_str(obj, "lora") or None,
        model=optional_str(obj, "model"),
        arrival_s=optional_number(obj, "timestamp"),
        **cache_fields(obj),
    )


_NULL = msgspec.Raw(b"null")


class _PlainLine(msgspec.Struct, forbid_unknown_fields=True):
    """A line with no field but these (any other, or another type: read by ``parse``)."""

    prompt_token_ids: msgspec.Raw
    output_token_ids: msgspec.Raw = _NULL
    finish_reason: str | None = None
    cache_salt: str | None = None
    lora: str | None = None
    model: str | None = None
    timestamp: int | float | None = None


_decode_plain = msgspec.json.Decoder(_PlainLine).decode


def plain_lines(file: str, lines: Sequence[tuple[int, Any]]) -> TokenLines | list[Record | None]:
    """The lines as TokenLines when the compiled reader (``token_lines``) takes every one, the
    common case; else ``plain_records``' list."""
    raws = [raw if isinstance(raw, bytes) else b"" for _, raw in lines]
    ids, rows, taken = parse_lines(raws, MAX_REQUEST_TOKENS)
    if taken.all():
        return _columns(file, lines, raws, ids, rows)
    return _records(file, lines, raws, ids, rows, taken)


def plain_records(file: str, lines: Sequence[tuple[int, Any]]) -> list[Record | None]:
    """The Record of each plain line, exactly as ``parse`` reads it; None for every other line
    (not bytes, not one JSON object of these fields, a list that is not plain ids, a prompt
    without tokens or too long, a time out of range): those are for ``parse``. The plainest
    lines are read whole in compiled code (``token_lines``), the others by a typed decode."""
    read = plain_lines(file, lines)
    return list(read.records()) if isinstance(read, TokenLines) else read


def _columns(
    file: str, lines: Sequence[tuple[int, Any]], raws: list[bytes], ids: Any, rows: Any
) -> TokenLines:
    """Lines the compiled reader took, as columns: ``rows`` holds each field's span."""
    prompts, prompt_offsets, answers, answer_offsets = split_lists(ids, rows)
    return TokenLines(
        file=file,
        lines=np.array([number for number, _ in lines], np.int64),
        prompt_ids=prompts,
        prompt_offsets=prompt_offsets,
        output_ids=answers,
        output_offsets=answer_offsets,
        finish_reason=_strings(raws, rows, 2, empty=""),
        cache_salt=_strings(raws, rows, 3, empty=None),
        lora=_strings(raws, rows, 4, empty=None),
        model=_strings(raws, rows, 5, empty=""),
    )


def _strings(raws: list[bytes], rows: Any, field: int, empty: str | None) -> list[str | None]:
    """Each line's string ``FIELDS[field]`` (None where absent or null; ``empty`` for ``""``)."""
    starts = rows[:, 2 * field]
    if (starts < 0).all():
        return [None] * len(raws)
    starts, ends = starts.tolist(), rows[:, 2 * field + 1].tolist()
    seen: dict[bytes, str | None] = {b"": empty}  # a log repeats its few values
    out: list[str | None] = []
    for raw, start, end in zip(raws, starts, ends, strict=True):
        if start < 0:
            out.append(None)
            continue
        key = raw[start:end]
        if key not in seen:
            seen[key] = key.decode()
        out.append(seen[key])
    return out


def _records(
    file: str,
    lines: Sequence[tuple[int, Any]],
    raws: list[bytes],
    ids: Any,
    rows: Any,
    taken: Any,
) -> list[Record | None]:
    records: list[Record | None] = [None] * len(lines)
    rest: list[int] = []
    for i, (row, take) in enumerate(zip(rows.tolist(), taken.tolist(), strict=True)):
        if not take:
            rest.append(i)
            continue
        raw = raws[i]
        p0, p1, o0, o1, f0, f1, s0, s1, l0, l1, m0, m1 = row
        records[i] = Record(
            file=file,
            line=lines[i][0],
            prompt_token_ids=ids[p0:p1],
            output_token_ids=ids[o0:o1] if o1 > o0 else None,
            finish_reason=None if f0 < 0 else raw[f0:f1].decode(),
            cache_salt=raw[s0:s1].decode() or None if s0 >= 0 else None,
            lora=raw[l0:l1].decode() or None if l0 >= 0 else None,
            model=None if m0 < 0 else raw[m0:m1].decode(),
        )
    if rest:
        for i, record in zip(rest, _decoded_records(file, [lines[i] for i in rest]), strict=True):
            records[i] = record
    return records


def _decoded_records(file: str, lines: Sequence[tuple[int, Any]]) -> list[Record | None]:
    """``plain_records`` of the lines the compiled reader did not take, by a typed decode."""
    decoded = decoded_lines(lines, _decode_plain)
    ids, offsets, taken, where = parse_list_pairs(
        decoded,
        lambda item: (
            item.prompt_token_ids,
            None if item.output_token_ids == _NULL else item.output_token_ids,
        ),
    )
    records: list[Record | None] = []
    for (number, _), item, lists in zip(lines, decoded, where, strict=True):
        if item is None or lists is None:
            records.append(None)
            continue
        records.append(_record(file, number, item, ids, offsets, taken, *lists))
    return records


def _record(
    file: str,
    line: int,
    item: _PlainLine,
    ids: Any,
    offsets: Any,
    taken: Any,
    prompt: int,
    output: int | None,
) -> Record | None:
    prompt_len = offsets[prompt + 1] - offsets[prompt]
    if not taken[prompt] or not 0 < prompt_len <= MAX_REQUEST_TOKENS:
        return None
    output_ids = None
    if output is not None:
        output_len = offsets[output + 1] - offsets[output]
        if not taken[output] or output_len > MAX_REQUEST_TOKENS:
            return None
        if output_len:
            output_ids = ids[offsets[output] : offsets[output + 1]]
    arrival = item.timestamp
    if arrival is not None:
        if isinstance(arrival, int) and not -(2**62) < arrival < 2**62:
            return None  # far outside any time, and float() of it may overflow
        arrival = float(arrival)
        if not (math.isfinite(arrival) and MIN_TIME_S <= arrival <= MAX_TIME_S):
            return None
    return Record(
        file=file,
        line=line,
        prompt_token_ids=ids[offsets[prompt] : offsets[prompt + 1]],
        output_token_ids=output_ids,
        finish_reason=item.finish_reason,
        cache_salt=item.cache_salt or None,
        lora=item.lora or None,
        model=item.model,
        arrival_s=arrival,
    )
