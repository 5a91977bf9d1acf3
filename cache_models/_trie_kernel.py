"""The prefix trie's kernels (``prefix_trie``): the node arrays, the child map, and the pass
that matches then inserts each request of a token workload (``feed_tokens``; the run-length
one is ``_trie_runs``).

The child map is an open-addressing table of (parent, first token) keys in one int64 array, not a
numba typed dict: every dict operation is a call into the runtime that counts a reference to the
dict, and a lookup took two (``in``, then ``[]``). A trie only adds children (a split re-points
a key), so the table has no tombstones; it doubles at half full, inside the pass."""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models import engine_rules as rules

NO_CHILD = -1
# Columns of the kernel's node matrix, in TrieNodes' order; entries of its sizes.
PARENT, START, LENGTH, DEPTH, COUNT, FIRST, SPACE = range(7)
N_COLUMNS = 7
N_NODES, N_STORE, N_REQUESTS, N_KEYS = range(4)  # N_KEYS: the child map's keys in use
# What an engine keeps of a request, the two columns of a token trie's ``best``: vLLM its first
# L + N - 1 tokens; SGLang (and the ceiling) L + the outputs it inserts (``stop_finish``).
VLLM_KEPT, SGLANG_KEPT = 0, 1
N_KINDS = 2
# Columns of the child map; a slot whose key is EMPTY_KEY is free (keys are never negative).
KEY, CHILD = 0, 1
EMPTY_KEY = -1
_FIBONACCI = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: spreads the keys' low bits


@njit(cache=True)
def new_child_map(slots: int) -> np.ndarray:
    """An empty child map of ``slots`` (a power of two) slots."""
    return np.full((slots, 2), EMPTY_KEY, np.int64)


@njit(cache=True, inline="always")
def child_key(node: int, token: int) -> int:
    return (node << 32) | (token & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def _first_slot(key: int, mask: int) -> int:
    h = np.int64(key) * np.int64(_FIBONACCI)
    return (h ^ (h >> np.int64(32))) & mask


@njit(cache=True, inline="always")
def find_child(children: np.ndarray, node: int, token: int) -> int:
    key = child_key(node, token)
    mask = len(children) - 1
    s = _first_slot(key, mask)
    while True:
        found = children[s, KEY]
        if found == key:
            return children[s, CHILD]
        if found == EMPTY_KEY:
            return NO_CHILD
        s = (s + 1) & mask


@njit(cache=True)
def set_child(
    children: np.ndarray, sizes: np.ndarray, node: int, token: int, child: int
) -> np.ndarray:
    """Map (``node``, ``token``) to ``child``, a new key or a re-pointed one; returns the map
    (a new, doubled one once it would be over half full)."""
    if 2 * (sizes[N_KEYS] + 1) > len(children):
        bigger = new_child_map(2 * len(children))
        mask = len(bigger) - 1
        for old in range(len(children)):
            key = children[old, KEY]
            if key != EMPTY_KEY:
                s = _first_slot(key, mask)
                while bigger[s, KEY] != EMPTY_KEY:
                    s = (s + 1) & mask
                bigger[s, KEY], bigger[s, CHILD] = key, children[old, CHILD]
        children = bigger
    key = child_key(node, token)
    mask = len(children) - 1
    s = _first_slot(key, mask)
    while children[s, KEY] != key and children[s, KEY] != EMPTY_KEY:
        s = (s + 1) & mask
    if children[s, KEY] == EMPTY_KEY:
        sizes[N_KEYS] += 1
    children[s, KEY], children[s, CHILD] = key, child
    return children


@njit(cache=True)
def grow(array: np.ndarray, needed: int) -> np.ndarray:
    """``array`` with room for ``needed`` (callers test the size first: a call counts a
    reference to each array it is passed and returns, atomically, once per request or node)."""
    if needed <= len(array):
        return array
    bigger = np.empty(max(needed, 2 * len(array)), array.dtype)
    bigger[: len(array)] = array
    return bigger


@njit(cache=True)
def grow_zeros(array: np.ndarray, needed: int) -> np.ndarray:
    """``grow``, the new room zeroed."""
    if needed <= len(array):
        return array
    bigger = np.zeros(max(needed, 2 * len(array)), array.dtype)
    bigger[: len(array)] = array
    return bigger


@njit(cache=True)
def grow_rows(array: np.ndarray, needed: int) -> np.ndarray:
    if needed <= len(array):
        return array
    bigger = np.zeros((max(needed, 2 * len(array)), array.shape[1]), array.dtype)
    bigger[: len(array)] = array
    return bigger


@njit(cache=True, inline="always")
def add_node(columns, best, sizes, parent, start, length, depth, count, first, space):
    """Append a node (the arrays grow geometrically); returns its id and the arrays. Inlined, as
    a call would count a reference to each array it is passed and returns."""
    node = sizes[N_NODES]
    sizes[N_NODES] = node + 1
    if node + 1 > len(columns):
        columns = grow_rows(columns, node + 1)
        best = grow_rows(best, node + 1)
    columns[node, PARENT], columns[node, START], columns[node, LENGTH] = parent, start, length
    columns[node, DEPTH], columns[node, COUNT], columns[node, FIRST] = depth, count, first
    columns[node, SPACE] = space
    return node, columns, best


@njit(cache=True, nogil=True)
def feed_tokens(
    columns,
    best,
    store,
    children,
    sizes,
    prompt_tokens,
    prompt_offsets,
    output_tokens,
    output_offsets,
    namespace,
    stop_finish,
    boundaries,
    hit_limit,
    chunk,
):
    """Match then insert each request (see the module docstring); ``best[node, kind]`` is the
    most any sequence through the node keeps (``VLLM_KEPT``, ``SGLANG_KEPT``). Per kind, each
    request's ``matched`` is its longest ``min(LCP, kept)`` over its prompt's first L - 1 tokens
    (every view's hit floors it: ``prefix_trie``), and ``reach`` the same over its whole
    sequence. With ``boundaries`` (one byte per store entry; empty: off) it also counts
    SGLang's node splits per request (``_sglang_splits``)."""
    n_requests = len(prompt_offsets) - 1
    matched_out = np.zeros((N_KINDS, n_requests), np.int64)
    reach_out = np.zeros((N_KINDS, n_requests), np.int64)
    splits = np.zeros(n_requests, np.int64)
    splitting = len(boundaries) > 0
    segments = np.zeros((64, 3), np.int64)  # the request's path: (depth, store start, length)
    cuts = np.zeros(8, np.int64)
    reach = np.zeros(N_KINDS, np.int64)  # per kind: the longest min(LCP, kept) so far
    kept = np.zeros(N_KINDS, np.int64)  # per kind: what the engine keeps of this request
    seq = np.zeros(1024, np.int32)
    path = np.zeros(64, np.int64)  # the nodes the match passed through whole

    for r in range(n_requests):
        request = sizes[N_REQUESTS] + r  # counted over the whole stream
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        o0, o1 = output_offsets[r], output_offsets[r + 1]
        prompt_len = p1 - p0
        n_out = (o1 - o0) if stop_finish[r] else (o1 - o0 - 1)
        if prompt_len + n_out > len(seq):
            seq = grow(seq, prompt_len + n_out)
        seq[:prompt_len] = prompt_tokens[p0:p1]
        seq[prompt_len : prompt_len + n_out] = output_tokens[o0 : o0 + n_out]
        seq_len = prompt_len + n_out
        for i in range(seq_len):  # nothing after an unknown token can ever match
            if seq[i] < 0:
                seq_len = i
                break
        kept[VLLM_KEPT] = min(prompt_len + o1 - o0 - 1, seq_len)
        kept[SGLANG_KEPT] = min(prompt_len + n_out, seq_len)

        root = find_child(children, 0, namespace[r])
        if root == NO_CHILD:
            root, columns, best = add_node(columns, best, sizes, 0, 0, 0, 0, 0, -1, namespace[r])
            children = set_child(children, sizes, 0, namespace[r], root)

        # 1. match, limited to prompt_len - 1 tokens; per kind, the best min(LCP, kept) on the way
        limit = min(prompt_len - 1, seq_len)
        reach[:] = 0
        node, pos, n_path = root, 0, 0
        while pos < limit:
            child = find_child(children, node, seq[pos])
            if child == NO_CHILD:
                break
            edge, span = columns[child, START], columns[child, LENGTH]
            m = 0
            while m < span and pos + m < limit and store[edge + m] == seq[pos + m]:
                m += 1
            pos += m
            for v in range(N_KINDS):
                reach[v] = max(reach[v], min(pos, best[child, v]))
            if m < span:
                break
            if n_path + 1 > len(path):
                path = grow(path, n_path + 1)
            path[n_path] = child
            n_path += 1
            node = child
        for v in range(N_KINDS):
            matched_out[v, r] = reach[v]

        # 2. insert prompt + cacheable outputs, splitting at divergences and at the prompt end;
        # the nodes the match passed through whole lie inside the prompt: counted as they are
        node, pos, n_segments = root, 0, 0
        for k in range(n_path):
            child = path[k]
            if splitting:
                segments, n_segments = _segment(
                    segments, n_segments, pos, columns[child, START], columns[child, LENGTH]
                )
            columns[child, COUNT] += 1
            if columns[child, FIRST] < 0:
                columns[child, FIRST] = request
            for v in range(N_KINDS):
                best[child, v] = max(best[child, v], kept[v])
            pos += columns[child, LENGTH]
            node = child
        while pos < seq_len:
            child = find_child(children, node, seq[pos])
            if child == NO_CHILD:
                # new leaf(s): [pos, prompt_len) counted, then the output tail
                cut = prompt_len if pos < prompt_len else seq_len
                while pos < seq_len:
                    end = min(cut, seq_len)
                    n_store = sizes[N_STORE]
                    if n_store + end - pos > len(store):
                        store = grow(store, n_store + end - pos)
                    if splitting and len(boundaries) < len(store):
                        boundaries = grow_zeros(boundaries, len(store))
                    store[n_store : n_store + end - pos] = seq[pos:end]
                    if splitting:
                        segments, n_segments = _segment(
                            segments, n_segments, pos, n_store, end - pos
                        )
                    sizes[N_STORE] = n_store + end - pos
                    counted = pos < prompt_len
                    leaf, columns, best = add_node(
                        columns,
                        best,
                        sizes,
                        node,
                        n_store,
                        end - pos,
                        columns[node, DEPTH] + end - pos,
                        1 if counted else 0,
                        request if counted else -1,
                        namespace[r],
                    )
                    best[leaf, :] = kept
                    children = set_child(children, sizes, node, seq[pos], leaf)
                    node, pos, cut = leaf, end, seq_len
                break
            span = columns[child, LENGTH]
            m = 0
            while (
                m < span and pos + m < seq_len and store[columns[child, START] + m] == seq[pos + m]
            ):
                m += 1
            for v in range(N_KINDS):  # before this request's own kept length is added
                reach[v] = max(reach[v], min(pos + m, best[child, v]))
            cut = min(m, prompt_len - pos) if pos < prompt_len else m
            if splitting:
                segments, n_segments = _segment(
                    segments, n_segments, pos, columns[child, START], cut
                )
            if cut < span:
                if pos + cut == seq_len and pos + cut != prompt_len:
                    # the sequence ends inside an output node: nothing to add but what it keeps
                    for v in range(N_KINDS):
                        best[child, v] = max(best[child, v], kept[v])
                    break
                # split child at cut: mid takes the first cut tokens
                mid, columns, best = add_node(
                    columns,
                    best,
                    sizes,
                    node,
                    columns[child, START],
                    cut,
                    columns[node, DEPTH] + cut,
                    columns[child, COUNT],
                    columns[child, FIRST],
                    columns[child, SPACE],
                )
                best[mid, :] = best[child, :]
                children = set_child(children, sizes, node, seq[pos], mid)
                columns[child, PARENT] = mid
                columns[child, START] += cut
                columns[child, LENGTH] -= cut
                children = set_child(children, sizes, mid, store[columns[child, START]], child)
                child = mid
            if pos < prompt_len:
                columns[child, COUNT] += 1
                if columns[child, FIRST] < 0:
                    columns[child, FIRST] = request
            for v in range(N_KINDS):
                best[child, v] = max(best[child, v], kept[v])
            pos += cut
            node = child
        for v in range(N_KINDS):
            reach_out[v, r] = reach[v]
        if splitting:
            limit = rules.sglang_match_limit(prompt_len, hit_limit[r])
            splits[r], cuts = _sglang_splits(
                boundaries,
                segments,
                n_segments,
                cuts,
                reach[SGLANG_KEPT],
                seq_len,
                prompt_len,
                prompt_len + n_out,
                limit,
                chunk,
            )
    sizes[N_REQUESTS] += n_requests
    return matched_out, reach_out, splits, columns, best, store, children, boundaries


@njit(cache=True, inline="always")
def _segment(segments, n_segments, depth, start, length):
    """Append a piece of the request's path: ``length`` tokens from ``depth``, stored from
    ``start``."""
    if n_segments + 1 > len(segments):
        segments = grow_rows(segments, n_segments + 1)
    segments[n_segments, 0], segments[n_segments, 1] = depth, start
    segments[n_segments, 2] = length
    return segments, n_segments + 1


@njit(cache=True, inline="always")
def _sglang_splits(
    boundaries, segments, n_segments, cuts, shared, seq_len, prompt_len, kept, limit, chunk
):
    """The node splits SGLang's radix tree makes for one request, unbounded at page size 1, and
    its node ends marked in ``boundaries`` (a byte per store entry: whether the prefix ending at
    that token ends a node). ``shared`` is ``D``, what the request's ``kept`` tokens share with
    the tree before it (``_sglang_unbounded``). Each of the request's walks ends at some ``e``
    (the match: ``limit``; each prefill chunk's checkpoint; the prompt's: L; the release:
    ``kept``; the refresh match, L, adds no end): it cuts the tree at ``min(D, e)``, a split
    unless a node already ends there, and an insert's new leaf ends at its ``e > D``."""
    matched = min(shared, limit)
    n_chunks = max(0, (prompt_len - matched - 1) // chunk) if chunk > 0 else 0
    n_ends = 3 + n_chunks
    if len(cuts) < 2 * n_ends:
        cuts = np.empty(2 * n_ends, np.int64)
    n_cuts = 0
    for k in range(n_ends):
        if k == 0:
            e = limit
        elif k == 1:
            e = prompt_len
        elif k == 2:
            e = kept
        else:
            e = matched + (k - 2) * chunk
        cuts[n_cuts] = min(shared, e)
        n_cuts += 1
        if e > shared and k > 0:  # an insert's leaf ends there (the match adds none)
            cuts[n_cuts] = e
            n_cuts += 1
    cuts[:n_cuts].sort()
    found, s, last = 0, 0, -1
    for k in range(n_cuts):
        p = cuts[k]
        if p == last or p <= 0 or p > seq_len:  # nothing lies past an unknown token
            continue
        last = p
        while segments[s, 0] + segments[s, 2] < p:  # the piece holding token p - 1
            s += 1
        at = segments[s, 1] + p - 1 - segments[s, 0]
        if p <= shared and boundaries[at] == 0:
            found += 1
        boundaries[at] = 1
    return found, cuts
