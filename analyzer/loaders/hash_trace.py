"""Hash-id traces: Mooncake's ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}`` (512-token blocks) and Alibaba Bailian's ``{"chat_id", "parent_chat_id",
"timestamp": s, "input_length", "output_length", "type", "turn", "hash_ids"}`` (16-token blocks):
one id per block of ``block_size`` prompt tokens, the last block partial.

Each id is expanded into synthetic token ids so that equal ids give equal tokens and different ids
differ at every position of the block: token ``j`` of id ``h`` is ``(h * A + j * C) mod 2^31`` with
``A`` odd (``ID_FACTOR``; ``C`` is ``RUN_STEP``), one-to-one in ``h`` for each ``j``. The ids
chain (equal id, equal prefix), so this reproduces every match the trace implies and puts each
divergence at the start of the first differing block, which is all a trace can tell; no two
blocks look alike after their first token (which would read as a varying value followed by shared
text).

A line is read into its ids (``HashBlocks``), not its tokens: tokenizing expands them
(``expanded``), and a sequential replay takes the trace as runs of tokens without expanding them
(``cache_models.hash_runs``).

``output_hash_ids`` (written by ``prefixcheck export-trace`` where the log had the answer; other
tools ignore it) continue the chain over the answer's tokens: prompt and answer are the first
``input_length`` and the next ``output_length`` tokens of all the ids expanded, so a later turn
that repeats the answer hits it, as on the log.

Lines of these fields alone are read in batches (``plain_records``), as pre-tokenized lines are:
one typed decode per line that leaves the id lists as bytes, every list of the batch parsed in
compiled code (``id_lists``), the checks of ``parse`` and the reader's guard on the values. Any
line the batch does not take whole is read by ``parse``, with its ordinary error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import msgspec
import numpy as np

from analyzer.errors import BadLine
from analyzer.loaders.fields import int_list, optional_int, optional_number
from analyzer.loaders.guard import MAX_REQUEST_TOKENS, MAX_TIME_S, MIN_TIME_S
from analyzer.loaders.id_lists import decoded_lines, parse_list_pairs
from analyzer.records import HashBlocks, HashLines, Record
from cache_models.hash_runs import ID_FACTOR
from cache_models.runs import RUN_STEP

DEFAULT_BLOCK_SIZE = 512
BAILIAN_BLOCK_SIZE = 16


def matches(obj: dict[str, Any]) -> bool:
    return "hash_ids" in obj


def matches_bailian(obj: dict[str, Any]) -> bool:
    return "hash_ids" in obj and "chat_id" in obj


def expand_hash_ids(
    hash_ids: np.ndarray | list[int], input_length: int, block_size: int
) -> np.ndarray:
    """The first ``input_length`` synthetic tokens of a run of ids.

    In uint32 arithmetic (mod 2^32, whose low 31 bits are those mod 2^31), written once into
    the int32 result: no int64 intermediate of the whole block matrix."""
    ids = np.asarray(hash_ids, dtype=np.int64).astype(np.uint32)
    tokens = np.empty((len(ids), block_size), np.uint32)
    np.add(
        (ids * np.uint32(ID_FACTOR))[:, None],
        _offset_terms(block_size)[None, :],
        out=tokens,
    )
    tokens &= np.uint32(0x7FFFFFFF)
    return tokens.view(np.int32).ravel()[:input_length]


@lru_cache(maxsize=8)
def _offset_terms(block_size: int) -> np.ndarray:
    """``j * C mod 2^32`` for each offset j of a block (read-only: shared between calls)."""
    terms = (np.arange(block_size, dtype=np.uint64) * RUN_STEP).astype(np.uint32)
    terms.flags.writeable = False
    return terms


def parse(
    obj: dict[str, Any], file: str, line: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> Record:
    hash_ids = int_list(obj, "hash_ids", required=True)
    input_length = optional_int(obj, "input_length")
    if hash_ids is None or not len(hash_ids):
        raise BadLine("empty hash_ids")
    if input_length is None:
        raise BadLine("missing field 'input_length'")
    if input_length < 1:
        raise BadLine(f"input_length must be positive, got {input_length}")
    if input_length > MAX_REQUEST_TOKENS:  # expanded below: checked before it is allocated
        raise BadLine(f"input_length is over the maximum {MAX_REQUEST_TOKENS:,} tokens")
    expected_blocks = -(-input_length // block_size)
    if len(hash_ids) != expected_blocks:
        raise BadLine(
            f"{len(hash_ids)} hash_ids for input_length {input_length}: expected {expected_blocks} "
            f"blocks of {block_size} tokens (set --hash-block-size)"
        )
    output_length = optional_int(obj, "output_length")
    if output_length is not None and output_length < 0:
        raise BadLine(f"output_length must be >= 0, got {output_length}")
    timestamp = optional_number(obj, "timestamp")
    bailian = "chat_id" in obj
    more = _output_ids(obj, hash_ids, input_length, output_length, block_size)
    known = input_length if more is None else input_length + (output_length or 0)
    return Record(
        file=file,
        line=line,
        hash_blocks=HashBlocks(
            np.asarray(hash_ids if more is None else [*hash_ids, *more], np.int64),
            block_size,
            input_length,
            known,
        ),
        output_length=output_length,
        # Mooncake timestamps are milliseconds, Bailian's seconds.
        arrival_s=None if timestamp is None else timestamp if bailian else timestamp / 1000.0,
        request_id=str(obj["chat_id"]) if bailian else None,
    )


def expanded(blocks: HashBlocks) -> tuple[np.ndarray, np.ndarray | None]:
    """A request's prompt tokens, and its answer's (None when the line has no output ids)."""
    tokens = expand_hash_ids(blocks.ids, blocks.known_length, blocks.block_size)
    prompt = tokens[: blocks.prompt_length]
    answer = tokens[blocks.prompt_length :] if blocks.known_length > blocks.prompt_length else None
    return prompt, answer


def _output_ids(
    obj: dict[str, Any],
    hash_ids: list[int],
    input_length: int,
    output_length: int | None,
    block_size: int,
) -> list[int] | None:
    """The answer's ids from ``output_hash_ids`` (None when the line has none)."""
    if "output_hash_ids" not in obj:
        return None
    more = int_list(obj, "output_hash_ids", required=True)
    if not output_length:
        raise BadLine("output_hash_ids need a positive output_length")
    expected = -(-(input_length + output_length) // block_size) - len(hash_ids)
    if len(more) != expected:
        raise BadLine(
            f"{len(more)} output_hash_ids for input_length {input_length} and output_length "
            f"{output_length}: expected {expected} more blocks of {block_size} tokens"
        )
    return more


_ABSENT = msgspec.Raw(b"")  # no JSON value is empty: an absent field
_Scalar = int | float | str | bool | None


class _TraceLine(msgspec.Struct, forbid_unknown_fields=True):
    """A Mooncake or Bailian line of these fields alone, typed as ``parse`` takes them (any other
    field or type: read by ``parse``); ``parse`` ignores the Bailian fields but ``chat_id``."""

    hash_ids: msgspec.Raw
    input_length: int
    output_length: int | None = None
    output_hash_ids: msgspec.Raw = _ABSENT
    timestamp: int | float | None = None
    chat_id: int | str | msgspec.UnsetType = msgspec.UNSET
    parent_chat_id: _Scalar = None
    type: _Scalar = None
    turn: _Scalar = None


_decode_line = msgspec.json.Decoder(_TraceLine).decode


def plain_lines(
    file: str,
    lines: Sequence[tuple[int, Any]],
    block_size: int = DEFAULT_BLOCK_SIZE,
    bailian: bool = False,
) -> HashLines | list[Record | None]:
    """The lines as HashLines when every one is a plain line (``plain_records`` takes it) with
    no request id (a Bailian line's ``chat_id``: a Record, for the answers to join); else
    ``plain_records``' list."""
    read, ids = _read_lines(lines, block_size, bailian)
    if not read or not all(row is not None and row[-1] is None for row in read):
        return [None if row is None else _record(file, ids, block_size, *row) for row in read]
    rows: list[tuple] = read  # type: ignore[assignment]
    numbers, firsts, ends, prompts, knowns, outputs, arrivals, _ = zip(*rows, strict=True)
    offsets = np.array([*firsts, ends[-1]], np.int64)
    return HashLines(
        file=file,
        lines=np.array(numbers, np.int64),
        ids=ids[offsets[0] : offsets[-1]],  # the lines' lists, back to back
        id_offsets=offsets - offsets[0],
        block_size=block_size,
        prompt_length=np.array(prompts, np.int64),
        known_length=np.array(knowns, np.int64),
        output_length=np.array([-1 if n is None else n for n in outputs], np.int64),
        arrival_s=np.array([math.nan if a is None else a for a in arrivals], np.float64),
    )


def plain_records(
    file: str,
    lines: Sequence[tuple[int, Any]],
    block_size: int = DEFAULT_BLOCK_SIZE,
    bailian: bool = False,
) -> list[Record | None]:
    """The Record of each plain line, exactly as ``parse`` and the guard read it; None for every
    other line (not bytes, not one JSON object of ``_TraceLine``'s fields, an id list that is not
    plain ids in 0..2^31-1, any check of ``parse`` failed, a time out of range, no ``chat_id`` in
    a Bailian file): those are for ``parse``."""
    read = plain_lines(file, lines, block_size, bailian)
    return read.records() if isinstance(read, HashLines) else read


def _read_lines(
    lines: Sequence[tuple[int, Any]], block_size: int, bailian: bool
) -> tuple[list[tuple | None], np.ndarray]:
    """Each plain line's fields ``(number, first id, end, input_length, known_length,
    output_length, arrival_s, request_id)``, its ids ``ids[first:end]``; None for any other."""
    decoded = [
        None if bailian and item is not None and item.chat_id is msgspec.UNSET else item
        for item in decoded_lines(lines, _decode_line)
    ]  # a Mooncake line in a Bailian file goes to ``parse``: a mixed-format error
    ids, offset_array, taken_array, where = parse_list_pairs(
        decoded,
        lambda item: (item.hash_ids, item.output_hash_ids if len(item.output_hash_ids) else None),
    )
    offsets, taken = offset_array.tolist(), taken_array.tolist()  # Python ints: read per line
    read: list[tuple | None] = []
    for (number, _), item, lists in zip(lines, decoded, where, strict=True):
        if item is None or lists is None:
            read.append(None)
            continue
        prompt, answer = lists
        last = prompt if answer is None else answer
        first, end = offsets[prompt], offsets[last + 1]
        blocks = offsets[prompt + 1] - first
        ok = taken[prompt] and taken[last]
        read.append(_checked(number, item, first, end, blocks, block_size) if ok else None)
    return read, ids.astype(np.int64)


def _checked(
    number: int, item: _TraceLine, first: int, end: int, blocks: int, block_size: int
) -> tuple | None:
    """The fields of one decoded line whose id lists are plain (ids ``first`` to ``end``: the
    prompt's ``blocks``, then the answer's), or None where ``parse`` or the guard would refuse
    it."""
    input_length, output_length = item.input_length, item.output_length
    if not 0 < input_length <= MAX_REQUEST_TOKENS or blocks != -(-input_length // block_size):
        return None
    if output_length is not None and not 0 <= output_length <= MAX_REQUEST_TOKENS:
        return None
    known = input_length
    if end - first > blocks or len(item.output_hash_ids):
        if not output_length:
            return None
        known = input_length + output_length
        if end - first != -(-known // block_size):
            return None
    bailian = item.chat_id is not msgspec.UNSET
    arrival = _arrival(item.timestamp, bailian)
    if arrival is False:
        return None
    request_id = str(item.chat_id) if bailian else None
    return number, first, end, input_length, known, output_length, arrival, request_id


def _record(
    file: str,
    ids: np.ndarray,
    block_size: int,
    number: int,
    first: int,
    end: int,
    input_length: int,
    known: int,
    output_length: int | None,
    arrival: float | None,
    request_id: str | None,
) -> Record:
    return Record(
        file=file,
        line=number,
        hash_blocks=HashBlocks(ids[first:end], block_size, input_length, known),
        output_length=output_length,
        arrival_s=arrival,
        request_id=request_id,
    )


def _arrival(timestamp: float | None, bailian: bool) -> float | bool | None:
    """Seconds (Mooncake's milliseconds converted), or False where the guard refuses the time."""
    if timestamp is None:
        return None
    if isinstance(timestamp, int) and not -(2**62) < timestamp < 2**62:
        return False  # far outside any time, and float() of it may overflow
    arrival = float(timestamp) if bailian else float(timestamp) / 1000.0
    return arrival if math.isfinite(arrival) and MIN_TIME_S <= arrival <= MAX_TIME_S else False
