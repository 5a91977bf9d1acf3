"""A hash-id trace as runs of synthetic tokens (``RunWorkload``), without expanding a token.

Token ``j`` of id ``h`` is ``(h * ID_FACTOR + j * RUN_STEP) mod 2^31`` (``expand_hash_ids``, the
loader's expansion): a block is a progression, and two different ids differ at every offset. Two
requests' streams therefore diverge only where their ids differ (a block boundary) or where one
stream stops inside a block. The runs of an id ``h`` are cut at every offset where some request
that holds ``h`` has a point the replay acts at (``cut_points``): its prompt's end ``L``, ``L - 1``
(the lookup's limit), the answer's ends ``L + n - 1`` and ``L + n``, the end of the tokens its
ids spell, and, for SGLang's chunked prefill, where a prefill chunk can end (``run_table``'s
``chunk``). The cuts are the same for every request that holds ``h``, so equal runs get equal ids
(the run's index in ``RunTable``) and the contract of ``cache_models.runs`` holds.

The cuts depend on every request that holds an id, so the table is built from the whole trace
(its ids and lengths: a few bytes per block, not per token) before any replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from cache_models.runs import RUN_STEP, TOKEN_MASK, RunWorkload
from cache_models.workload import Workload, offsets_of

ID_FACTOR = 0x9E3779B1  # odd: h -> h * ID_FACTOR mod 2^31 is one-to-one


DENSE_FACTOR = 16  # values within 16 times their number: unique by a table, not a sort


@dataclass(frozen=True)
class HashTrace:
    """Requests of a hash-id trace as columns: each request's ids back to back (its prompt's,
    then any ``output_hash_ids``), ``block_size`` tokens per id."""

    ids: np.ndarray  # int64
    id_offsets: np.ndarray  # int64, n + 1
    block_size: int
    prompt_lengths: np.ndarray  # int64, >= 1
    output_lengths: np.ndarray  # int64, >= 1
    known_lengths: np.ndarray  # int64: tokens the ids spell (L, or L + n with output ids)
    namespace: np.ndarray  # int32
    stop_finish: np.ndarray  # bool
    arrival_s: np.ndarray | None = None

    @property
    def n_requests(self) -> int:
        return len(self.id_offsets) - 1

    def select(self, rows: slice) -> HashTrace:
        """The requests of ``rows`` (a step-1 slice), as a trace of their own."""
        start, stop, _ = rows.indices(self.n_requests)
        lo, hi = self.id_offsets[start], self.id_offsets[stop]
        return HashTrace(
            ids=self.ids[lo:hi],
            id_offsets=self.id_offsets[start : stop + 1] - lo,
            block_size=self.block_size,
            prompt_lengths=self.prompt_lengths[start:stop],
            output_lengths=self.output_lengths[start:stop],
            known_lengths=self.known_lengths[start:stop],
            namespace=self.namespace[start:stop],
            stop_finish=self.stop_finish[start:stop],
            arrival_s=None if self.arrival_s is None else self.arrival_s[start:stop],
        )


@dataclass(frozen=True)
class RunTable:
    """Every run of every id, sorted by (id, offset): run ``i`` is ``lengths[i]`` tokens of id
    ``ids[i]`` from offset ``offsets[i]``; ``first_tokens[i]`` is its first synthetic token."""

    ids: np.ndarray  # int64
    offsets: np.ndarray  # int64
    lengths: np.ndarray  # int64
    first_tokens: np.ndarray  # int64
    block_size: int
    id_values: np.ndarray  # int64: the distinct ids, sorted
    keys: np.ndarray  # int64: each run's ``code * (block_size + 1) + offset``, sorted (its
    # code: its id's index in id_values)
    distinct_tokens: int = 0  # at most the trace's distinct tokens: a block per id, and every
    # unknown token (the caches' sizing hint, ``RunWorkload.log_tokens_hint``)

    @property
    def n_runs(self) -> int:
        return len(self.ids)


def first_token(ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Token ``offsets`` of ids ``ids``, as ``expand_hash_ids`` makes it (int64)."""
    h = np.asarray(ids, np.int64).astype(np.uint32).astype(np.int64)
    return (h * ID_FACTOR + np.asarray(offsets, np.int64) * RUN_STEP) & TOKEN_MASK


def _occurrences(trace: HashTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each id occurrence's request, block index in it and tokens it covers in the stream."""
    counts = np.diff(trace.id_offsets)
    request = np.repeat(np.arange(trace.n_requests, dtype=np.int64), counts)
    block = np.arange(len(trace.ids), dtype=np.int64) - trace.id_offsets[:-1][request]
    covered = np.minimum(trace.block_size, trace.known_lengths[request] - block * trace.block_size)
    if len(covered) and covered.min() < 1:
        raise ValueError("a request has more ids than its known tokens fill")
    return request, block, covered


def cut_points(trace: HashTrace) -> np.ndarray:
    """Per request, the stream positions a replay acts at (int64, n x 4): ``L - 1``, ``L``,
    ``L + n - 1`` and ``L + n``."""
    prompt, answer = trace.prompt_lengths, trace.output_lengths
    return np.stack([prompt - 1, prompt, prompt + answer - 1, prompt + answer], axis=1)


def run_table(trace: HashTrace, chunk: int = 0) -> RunTable:
    """The runs of every id of ``trace``, cut where any request holding it needs a boundary.

    ``chunk`` > 0: SGLang's ``--chunked-prefill-size``, whose prefill chunks end at ``m + k *
    chunk`` for a request that matched ``m`` tokens (``engine_rules.chunk_end``), each end a node
    boundary. A match ends between two entries, so every entry start of a prompt may be ``m``:
    the table is cut there too, and again for the entries those cuts make, until no cut is new
    (the cuts of a block only take offsets ``(m + k * chunk) mod block_size``, so this ends)."""
    return trace_runs(trace, chunk)[0]


def trace_runs(
    trace: HashTrace, chunk: int = 0, next_unknown: int = -1
) -> tuple[RunTable, RunWorkload, int]:
    """``run_table(trace, chunk)``, and ``run_workload`` of the whole trace under it: the last
    round of the chunk cuts' fixpoint reads the trace as those runs already, so it is not
    read again."""
    ids, offsets = _own_cuts(trace)
    table = _table(ids, offsets, trace.block_size)
    runs = None
    while chunk > 0:
        runs = run_workload(trace, table, next_unknown)
        more_ids, more_offsets = _chunk_cuts(trace, runs[0], chunk)
        codes = _codes(table.id_values, more_ids)
        known = _among(codes * (trace.block_size + 1) + more_offsets, table.keys)
        if known.all():
            break
        ids = np.concatenate([table.ids, more_ids[~known]])
        offsets = np.concatenate([table.offsets, more_offsets[~known]])
        table = _table(ids, offsets, trace.block_size)
        runs = None
    unknown = trace.prompt_lengths + trace.output_lengths - trace.known_lengths
    distinct = len(table.id_values) * trace.block_size + int(np.maximum(unknown, 0).sum())
    table = replace(table, distinct_tokens=distinct)
    if runs is None:
        return table, *run_workload(trace, table, next_unknown)
    return table, replace(runs[0], log_tokens_hint=distinct), runs[1]


def _own_cuts(trace: HashTrace) -> tuple[np.ndarray, np.ndarray]:
    """(id, offset) of each block's start, each occurrence's end inside its block, and each
    request's ``cut_points`` inside its blocks."""
    size = trace.block_size
    request, block, covered = _occurrences(trace)
    points = cut_points(trace)
    starts = block * size
    inside = (points[request] > starts[:, None]) & (points[request] < (starts + covered)[:, None])
    cut_occ, cut_col = np.nonzero(inside)
    cut_offsets = points[request[cut_occ], cut_col] - starts[cut_occ]
    ends = covered < size
    ids = np.concatenate([trace.ids, trace.ids[cut_occ], trace.ids[ends]])
    offsets = np.concatenate([np.zeros(len(trace.ids), np.int64), cut_offsets, covered[ends]])
    return ids, offsets.astype(np.int64)


def _chunk_cuts(trace: HashTrace, runs: RunWorkload, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(id, offset) of every prefill chunk end ``m + k * chunk < L`` inside a block, for every
    entry start ``m`` of every prompt of ``runs`` (``trace`` as runs)."""
    weights = runs.prompt_weights.astype(np.int64)
    offsets = runs.runs.prompt_offsets
    request = np.repeat(np.arange(trace.n_requests), np.diff(offsets))
    positions = offsets_of(weights)
    starts = positions[:-1] - positions[offsets[:-1]][request]  # each entry's start in its prompt
    prompt = trace.prompt_lengths[request]
    per_start = np.maximum(0, (prompt - starts - 1) // chunk)  # k >= 1 with m + k * chunk < L
    owner = np.repeat(np.arange(len(starts)), per_start)
    first = offsets_of(per_start)
    k = 1 + np.arange(first[-1]) - first[:-1][owner]
    ends = starts[owner] + k * chunk
    size = trace.block_size
    inside = ends % size != 0
    ends, owner = ends[inside], owner[inside]
    ids = trace.ids[trace.id_offsets[request[owner]] + ends // size]
    return ids, (ends % size).astype(np.int64)


def _table(ids: np.ndarray, offsets: np.ndarray, size: int) -> RunTable:
    """The runs of the distinct (id, offset) cuts, sorted by id then offset."""
    id_values, codes = _unique(ids)
    assert codes is not None
    keys, _ = _unique(codes * (size + 1) + offsets, inverse=False)
    codes, offsets = keys // (size + 1), keys % (size + 1)
    ids = id_values[codes]
    same_next = np.append(codes[1:] == codes[:-1], False)
    ends_at = np.where(same_next, np.append(offsets[1:], 0), size)
    return RunTable(
        ids, offsets, ends_at - offsets, first_token(ids, offsets), size, id_values, keys
    )


def _unique(values: np.ndarray, inverse: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """``np.unique(values, return_inverse=inverse)`` of int64 values; by a table of presence
    when they lie in a range a few times their number (hash ids are counted from 0: no sort).
    The table takes at most 16 bytes per value without the inverse (a bool for each number of a
    range up to 16 times their count) and 36 with it (a bool and an int64 for each number of a
    range up to 4 times their count)."""
    values = np.asarray(values, np.int64)
    factor = DENSE_FACTOR // 4 if inverse else DENSE_FACTOR
    if len(values) and values.min() >= 0 and values.max() < factor * len(values) + 1024:
        present = np.zeros(int(values.max()) + 1, np.bool_)
        present[values] = True
        unique = np.flatnonzero(present).astype(np.int64)
        if not inverse:
            return unique, None
        return unique, (np.cumsum(present, dtype=np.int64) - 1)[values]
    if not inverse:
        return np.unique(values), None
    unique, codes = np.unique(values, return_inverse=True)
    return unique, codes.astype(np.int64).reshape(-1)


def _among(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.isin(values, keys)`` for sorted distinct int64 ``keys`` >= 0: by a table of presence
    when they lie in a range a few times their number (a cut's key: its id's code and offset),
    else by binary search; numpy's own hashes every value (0.14 CPU-s for the 1.5M ids of a
    16-token trace)."""
    values = np.asarray(values, np.int64)
    if not len(keys) or not len(values):
        return np.zeros(len(values), bool)
    if keys[-1] < DENSE_FACTOR * len(keys) + 1024:
        present = np.zeros(int(keys[-1]) + 2, np.bool_)  # the last: every value above
        present[keys] = True
        return present[np.clip(values, 0, len(present) - 1)] & (values >= 0)
    at = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return keys[at] == values


def _codes(id_values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each id's index in the sorted ``id_values``; an error for an id not among them."""
    ids = np.asarray(ids, np.int64)
    n = len(id_values)
    if n and id_values[0] >= 0 and id_values[-1] < DENSE_FACTOR // 4 * n + 1024:
        code_of = np.full(int(id_values[-1]) + 2, -1, np.int64)  # the last: every id above
        code_of[id_values] = np.arange(n)
        codes = code_of[np.clip(ids, 0, len(code_of) - 1)]
        if len(ids) and ((codes < 0) | (ids < 0)).any():
            raise ValueError("an id of the trace is not in the run table")
        return codes
    codes = np.searchsorted(id_values, ids)
    if len(codes) and (codes.max() >= n or (id_values[codes] != ids).any()):
        raise ValueError("an id of the trace is not in the run table")
    return codes


def run_workload(
    trace: HashTrace, table: RunTable, next_unknown: int = -1
) -> tuple[RunWorkload, int]:
    """``trace``'s requests as runs of ``table`` (built from a trace holding them all), and the
    next unknown id. Tokens past the ids (an answer of unknown text) are unknown entries, cut at
    ``L + n - 1``."""
    blocks_known = -(-trace.known_lengths // trace.block_size)
    if (np.diff(trace.id_offsets) > blocks_known).any():
        raise ValueError("a request has more ids than its known tokens fill")
    codes = _codes(table.id_values, trace.ids)
    scale = table.block_size + 1
    # An id's runs are consecutive rows of the table, the first at run_start[code].
    run_start = offsets_of(np.bincount(table.keys // scale, minlength=len(table.id_values)))
    args = (
        codes,
        np.asarray(trace.id_offsets, np.int64),
        table.block_size,
        np.asarray(trace.prompt_lengths, np.int64),
        np.asarray(trace.output_lengths, np.int64),
        np.asarray(trace.known_lengths, np.int64),
        run_start,
        np.asarray(table.lengths, np.int64),
        table.keys,
        next_unknown,
    )
    n = trace.n_requests
    counts = np.zeros((2, n), np.int64)  # prompt and answer entries of each request
    none32, none64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
    _entries(*args, counts, none32, none32, none64, none32, none32, none64)
    prompt_offsets, output_offsets = offsets_of(counts[0]), offsets_of(counts[1])
    prompt_ids = np.empty(int(prompt_offsets[-1]), np.int32)
    prompt_weights = np.empty(int(prompt_offsets[-1]), np.int32)
    output_ids = np.empty(int(output_offsets[-1]), np.int32)
    output_weights = np.empty(int(output_offsets[-1]), np.int32)
    after = _entries(
        *args,
        counts,
        prompt_ids,
        prompt_weights,
        prompt_offsets,
        output_ids,
        output_weights,
        output_offsets,
    )
    runs = Workload(
        prompt_tokens=prompt_ids,
        prompt_offsets=prompt_offsets,
        output_tokens=output_ids,
        output_offsets=output_offsets,
        namespace=np.asarray(trace.namespace, np.int32),
        stop_finish=np.asarray(trace.stop_finish, bool),
        arrival_s=trace.arrival_s,
    )
    workload = RunWorkload(
        runs, prompt_weights, output_weights, table.first_tokens, table.distinct_tokens
    )
    return workload, int(after)


@njit(cache=True)
def _entries(
    codes,
    id_offsets,
    size,
    prompt,
    answer,
    known,
    run_start,
    lengths,
    keys,
    next_unknown,
    counts,
    prompt_ids,
    prompt_weights,
    prompt_offsets,
    output_ids,
    output_weights,
    output_offsets,
):
    """Each request's entries in order: the runs of each id occurrence that start before what it
    covers of its block, then the unknown tail ``[known, L + n)`` cut at ``L + n - 1`` (ids from
    ``next_unknown`` down); an entry starting before ``L`` is the prompt's. Counts them into
    ``counts`` when the output arrays are empty, else writes them. Returns the next unknown id."""
    fill = len(prompt_offsets) > 0
    sides = (
        (prompt_ids, prompt_weights, prompt_offsets),
        (output_ids, output_weights, output_offsets),
    )
    scale = size + 1
    for r in range(len(prompt)):
        pos = 0
        counts[0, r] = counts[1, r] = 0
        for j in range(id_offsets[r], id_offsets[r + 1]):
            covered = min(size, known[r] - (j - id_offsets[r]) * size)
            code = codes[j]
            lo, hi = run_start[code], run_start[code + 1]
            if covered < size:  # the runs that start before the occurrence's end
                hi = lo + np.searchsorted(keys[lo:hi], code * scale + covered)
            for k in range(lo, hi):
                part = 0 if pos < prompt[r] else 1
                _put(fill, sides[part], part, r, counts, k, lengths[k])
                pos += lengths[k]
        end = prompt[r] + answer[r]
        tail = max(0, end - known[r])
        first = end - 1 - known[r] if end - 1 > known[r] else tail
        for weight in (first, tail - first):
            if weight > 0:
                part = 0 if pos < prompt[r] else 1
                _put(fill, sides[part], part, r, counts, next_unknown, weight)
                pos += weight
                next_unknown -= 1
    return next_unknown


@njit(cache=True, inline="always")
def _put(fill, side, part, r, counts, entry, weight):
    """The next entry of request r's prompt (``part`` 0) or answer (1): counted in ``counts``,
    and written to ``side`` (its ids, weights and offsets) when ``fill``."""
    if fill:
        ids, weights, offsets = side
        at = offsets[r] + counts[part, r]
        ids[at] = entry
        weights[at] = weight
    counts[part, r] += 1
