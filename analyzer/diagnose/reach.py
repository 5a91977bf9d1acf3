"""Which requests a change to some requests can reach, in an unbounded sequential replay: what
lets a fix be replayed on those requests alone, the others keeping the hits they had.

In that replay (``cache_models.prefix_trie``) a request's hit at granularity ``g`` is ``g *
floor(min(L - 1, D) / g)``, with ``D`` the longest ``min(LCP, kept)`` over earlier sequences of
its namespace (and server). Two sequences whose first ``g`` tokens differ share under ``g``
tokens, which floor away: they never change each other's hits. A sequence of under ``g``
cacheable tokens is kept under ``g`` and its own prompt is shorter: it neither gets nor gives a
hit. So the requests fall in groups by (server, namespace, first ``g`` tokens), with every
short sequence a group of its own, and a group where no request changed replays as before.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models.workload import Workload


def reached_rows(
    base: Workload, changed: Workload, granularity: int, servers: np.ndarray | None
) -> np.ndarray:
    """The rows (request indices, ascending) whose hits ``changed`` may give otherwise than
    ``base`` (the same requests, some of them edited) at ``granularity`` and coarser."""
    edited = np.flatnonzero(edited_rows(base, changed))
    return rows_reached(base, edited, changed.select(edited), granularity, servers)


def rows_reached(
    base: Workload,
    rows: np.ndarray,
    changed: Workload,
    granularity: int,
    servers: np.ndarray | None,
) -> np.ndarray:
    """``reached_rows`` when only ``base``'s requests ``rows`` (ascending) changed, to
    ``changed`` (those requests alone, in that order): one pass over the base's first tokens,
    none over the rest of the log."""
    if not len(rows):
        return np.zeros(0, np.int64)
    server_ids = _server_ids(servers, base.n_requests)
    before = _base_keys(base, granularity, servers, server_ids)
    after = before.copy()
    after[rows] = _group_keys(changed, granularity, server_ids[rows], rows)
    # the groups an edited request leaves and joins; an unedited request keeps its group
    touched = np.union1d(before[rows], after[rows])
    return np.flatnonzero(np.isin(after, touched))


def _base_keys(
    base: Workload, granularity: int, servers: np.ndarray | None, server_ids: np.ndarray
) -> np.ndarray:
    """``base``'s group keys; on one server, made once per base and granularity (kept on it, as
    a cached property is: the fixes measured on one log share them; read only)."""
    if servers is not None:
        return _group_keys(base, granularity, server_ids, np.arange(base.n_requests))
    kept = base.__dict__.setdefault("_group_keys", {})
    if granularity not in kept:
        kept[granularity] = _group_keys(base, granularity, server_ids, np.arange(base.n_requests))
    return kept[granularity]


def edited_rows(base: Workload, changed: Workload) -> np.ndarray:
    """Per request, whether its tokens or what the trie reads of it differ."""
    edited = tokens_differ(
        base.prompt_tokens, base.prompt_offsets, changed.prompt_tokens, changed.prompt_offsets
    )
    edited |= tokens_differ(
        base.output_tokens, base.output_offsets, changed.output_tokens, changed.output_offsets
    )
    edited |= base.namespace != changed.namespace
    edited |= base.stop_finish != changed.stop_finish
    edited |= base.sglang_stop_finish != changed.sglang_stop_finish
    return edited


def _server_ids(servers: np.ndarray | None, n: int) -> np.ndarray:
    if servers is None:
        return np.zeros(n, np.int64)
    return np.unique(np.asarray(servers), return_inverse=True)[1].reshape(-1).astype(np.int64)


def _group_keys(
    workload: Workload, granularity: int, server_ids: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Per request, a hash of its group: (server, namespace, its first ``granularity`` tokens),
    or its row in the log (``rows``) for a short sequence. Requests whose groups collide are
    only replayed together, which is exact all the same (a group may hold requests that never
    share a block)."""
    return _hashes(
        workload.prompt_tokens,
        workload.prompt_offsets,
        workload.output_tokens,
        workload.output_offsets,
        workload.namespace.astype(np.int64),
        server_ids,
        rows.astype(np.int64),
        granularity,
    )


@njit(cache=True)
def tokens_differ(a_tokens, a_offsets, b_tokens, b_offsets):
    """Per request of two workloads of as many requests, whether their token runs differ."""
    n = len(a_offsets) - 1
    differ = np.zeros(n, np.bool_)
    for r in range(n):
        a0, a1, b0, b1 = a_offsets[r], a_offsets[r + 1], b_offsets[r], b_offsets[r + 1]
        if a1 - a0 != b1 - b0:
            differ[r] = True
            continue
        for i in range(a1 - a0):
            if a_tokens[a0 + i] != b_tokens[b0 + i]:
                differ[r] = True
                break
    return differ


_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(cache=True)
def _mix(state, value):
    return (state ^ np.uint64(np.int64(value))) * _FNV_PRIME


@njit(cache=True)
def _hashes(
    prompt_tokens, prompt_offsets, output_tokens, output_offsets, namespace, servers, rows, g
):
    """Each request's group hash: server, namespace and the first ``g`` tokens of prompt then
    answer; a request with fewer known tokens (an unknown, negative, token ends what the trie
    stores) hashes its row (``rows``) instead, under a mark of its own."""
    n = len(prompt_offsets) - 1
    keys = np.empty(n, np.uint64)
    for r in range(n):
        state = _mix(_mix(_FNV_OFFSET, servers[r]), namespace[r])
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        o0, o1 = output_offsets[r], output_offsets[r + 1]
        short = False
        for j in range(g):
            if p0 + j < p1:
                token = prompt_tokens[p0 + j]
            elif o0 + j - (p1 - p0) < o1:
                token = output_tokens[o0 + j - (p1 - p0)]
            else:
                token = -1
            if token < 0:
                short = True
                break
            state = _mix(state, token)
        keys[r] = _mix(_mix(_FNV_OFFSET, -1), rows[r]) if short else state
    return keys
