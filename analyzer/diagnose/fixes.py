"""Workload transforms: a fix applied to the log's token arrays, giving a new Workload to replay.

Edits work on flat arrays (numba), never on per-request Python objects. Inserted tokens use ids
outside every vocabulary, so they match only themselves: what matters for the cache is how many
there are and where, not which text a user would put there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
from numba import njit

from analyzer.diagnose.reach import tokens_differ
from cache_models.workload import Workload

# Padding inserted by a pad-prefix fix (a user pads with text of the same token count).
PAD_TOKEN = 2**31 - 2
# A dynamic value made constant (the counterfactual of the loss attribution).
DYNAMIC_TOKEN = 2**31 - 3


@dataclass(frozen=True)
class Edits:
    """Per edit: in ``request``'s prompt, drop ``delete`` tokens at ``position`` (original
    coordinates) and put ``insert`` copies of ``token`` there. Sorted by request, then position;
    the edits of one request do not overlap."""

    request: np.ndarray  # int64
    position: np.ndarray  # int64
    delete: np.ndarray  # int64
    insert: np.ndarray  # int64
    token: np.ndarray  # int32

    @classmethod
    def of(
        cls,
        request: np.ndarray,
        position: np.ndarray,
        delete: np.ndarray | int,
        insert: np.ndarray | int,
        token: int,
    ) -> Edits:
        """Edits from unsorted columns; scalars apply to every edit."""
        n = len(request)
        columns = [
            np.broadcast_to(np.asarray(c, np.int64), n) for c in (request, position, delete, insert)
        ]
        order = np.lexsort((columns[1], columns[0]))
        return cls(*(c[order].copy() for c in columns), np.full(n, token, np.int32))

    def __len__(self) -> int:
        return len(self.request)


@dataclass(frozen=True)
class EditedLog:
    """``base`` with ``edits`` applied, built only as far as it is read: the requests a replay
    of the reached ones needs (``select``), or the whole log (``workload``, made once)."""

    base: Workload
    edits: Edits

    @cached_property
    def workload(self) -> Workload:
        return apply_edits(self.base, self.edits)

    @property
    def n_requests(self) -> int:
        return self.base.n_requests

    @property
    def prompt_token_count(self) -> int:
        return self.base.prompt_token_count + int((self.edits.insert - self.edits.delete).sum())

    @cached_property
    def changed(self) -> tuple[np.ndarray, Workload]:
        """The requests (ascending) whose prompts the edits change, and those requests edited (a
        request with edits that leave its tokens as they were is not one)."""
        rows = np.unique(self.edits.request)
        before = self.base.select(rows)
        after = self._edited(before, rows)
        differ = tokens_differ(
            before.prompt_tokens, before.prompt_offsets, after.prompt_tokens, after.prompt_offsets
        )
        if differ.all():
            return rows, after
        return rows[differ], after.select(np.flatnonzero(differ))

    def select(self, rows: np.ndarray) -> Workload:
        """The edited log's requests at ``rows`` (ascending, distinct), as
        ``workload.select(rows)`` gives them, edited without building the rest."""
        rows = np.asarray(rows, np.int64)
        return self._edited(self.base.select(rows), rows)

    def _edited(self, selected: Workload, rows: np.ndarray) -> Workload:
        """``selected`` (the base's ``rows``, ascending) with the edits of those rows."""
        edits = self.edits
        at = np.minimum(np.searchsorted(rows, edits.request), max(len(rows) - 1, 0))
        mine = (rows[at] == edits.request) if len(rows) else np.zeros(len(edits), np.bool_)
        columns = (edits.position, edits.delete, edits.insert, edits.token)
        return apply_edits(selected, Edits(at[mine], *(column[mine] for column in columns)))


def apply_edits(workload: Workload, edits: Edits) -> Workload:
    """The workload with every edit applied to the prompts (outputs and metadata unchanged)."""
    if not len(edits):
        return workload
    change = np.zeros(workload.n_requests, np.int64)
    np.add.at(change, edits.request, edits.insert - edits.delete)
    offsets = np.zeros(workload.n_requests + 1, np.int64)
    np.cumsum(workload.prompt_lengths + change, out=offsets[1:])
    first_edit = np.searchsorted(edits.request, np.arange(workload.n_requests + 1))
    tokens = _edit(
        workload.prompt_tokens,
        workload.prompt_offsets,
        offsets,
        first_edit,
        edits.position,
        edits.delete,
        edits.insert,
        edits.token,
    )
    return replace(workload, prompt_tokens=tokens, prompt_offsets=offsets)


def original_hits(hits: np.ndarray, edits: Edits, prompt_lengths: np.ndarray) -> np.ndarray:
    """Hits of an edited replay in the original prompts' coordinates: an edit's tokens count as hit
    when all of them were (then so are the tokens it replaced), else the hit stops before it."""
    first_edit = np.searchsorted(edits.request, np.arange(len(hits) + 1))
    mapped = _map_back(
        hits.astype(np.int64), first_edit, edits.position, edits.delete, edits.insert
    )
    return np.minimum(mapped, prompt_lengths - 1)


def rotate(
    workload: Workload, request: np.ndarray, start: np.ndarray, split: np.ndarray, end: np.ndarray
) -> Workload:
    """Within each listed request's prompt, put tokens [split, end) before [start, split)."""
    tokens = workload.prompt_tokens.copy()
    _rotate(tokens, workload.prompt_offsets, request, start, split, end)
    return replace(workload, prompt_tokens=tokens)


def with_namespace(workload: Workload, namespace: np.ndarray) -> Workload:
    return replace(workload, namespace=namespace.astype(np.int32))


@njit(cache=True)
def _edit(tokens, offsets, new_offsets, first_edit, position, delete, insert, token):
    out = np.empty(new_offsets[-1], np.int32)
    for r in range(len(offsets) - 1):
        src, dst = offsets[r], new_offsets[r]
        cursor = 0  # in the original prompt
        for e in range(first_edit[r], first_edit[r + 1]):
            n = position[e] - cursor
            out[dst : dst + n] = tokens[src + cursor : src + position[e]]
            dst += n
            out[dst : dst + insert[e]] = token[e]
            dst += insert[e]
            cursor = position[e] + delete[e]
        n = offsets[r + 1] - offsets[r] - cursor
        out[dst : dst + n] = tokens[src + cursor : offsets[r + 1]]
    return out


@njit(cache=True)
def _map_back(hits, first_edit, position, delete, insert):
    out = hits.copy()
    for r in range(len(hits)):
        shift = 0  # edited minus original coordinates, before the current edit
        for e in range(first_edit[r], first_edit[r + 1]):
            at = position[e] + shift
            if hits[r] < at + insert[e]:
                out[r] = min(hits[r], at) - shift
                break
            shift += insert[e] - delete[e]
        else:
            out[r] = hits[r] - shift
    return out


@njit(cache=True)
def _rotate(tokens, offsets, request, start, split, end):
    for i in range(len(request)):
        base = offsets[request[i]]
        segment = tokens[base + start[i] : base + end[i]].copy()
        head = split[i] - start[i]
        tail = end[i] - split[i]
        tokens[base + start[i] : base + start[i] + tail] = segment[head:]
        tokens[base + start[i] + tail : base + end[i]] = segment[:head]
