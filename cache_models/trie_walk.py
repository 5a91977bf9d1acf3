"""Walking requests down a built prefix trie: the child map, and which marked nodes a request's
prompt passes through (whole)."""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models.prefix_trie import TrieNodes
from cache_models.workload import Workload


def nodes_on_paths(
    trie: TrieNodes, workload: Workload, marked: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every (request, node) where ``marked[node]`` and the request's prompt holds the node's
    whole path (``trie`` built from ``workload``), ordered by request then depth."""
    trie = trie.expanded
    return _marked_on_paths(
        child_map(trie),
        trie.start,
        trie.length,
        trie.store,
        marked,
        _below_marked(trie.parent, marked),
        workload.prompt_tokens,
        workload.prompt_offsets,
        workload.namespace.astype(np.int64),
    )


def _below_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Per node, whether a marked node lies below it (a walk looking for marked nodes goes no
    further where this is false)."""
    below = np.zeros(len(parent), np.bool_)
    nodes = np.flatnonzero(marked)
    while len(nodes):
        nodes = np.unique(parent[nodes])
        nodes = nodes[(nodes > 0) & ~below[nodes]]
        below[nodes] = True
    return below


# A child map: an open-addressing table (linear probing, at most half full) of child keys and
# their nodes, looked up inline; numba's typed Dict, which every lookup calls into (twice: ``in``,
# then ``[]``), took six times as long to read and fourteen to build. A slot holds its key and
# node side by side (one cache line read a lookup, as good as always).
ChildMap = tuple[np.ndarray, int]  # int64 (key, node) per slot (key -1: empty), hash shift
_EMPTY = -1
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: multiplicative hashing


def child_map(trie: TrieNodes) -> ChildMap:
    """The child map, keyed as the trie keys it: (parent, first token); roots by namespace.
    Made once per trie (kept on it, as a cached property is; read only)."""
    trie = trie.expanded
    children = trie.__dict__.get("_child_map")
    if children is None:
        bits = max(1, int(2 * trie.n_nodes - 1).bit_length())  # >= 2 slots per entry
        slots = _children(trie.parent, trie.start, trie.length, trie.namespace, trie.store, bits)
        children = (slots, 64 - bits)
        trie.__dict__["_child_map"] = children
    return children


@njit(cache=True, inline="always")
def child_key(node: int, token: int) -> int:
    return (node << 32) | (token & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def _slot(key, shift):
    return np.int64((np.uint64(key) * _FIBONACCI) >> np.uint64(shift))


@njit(cache=True, inline="always")
def child_of(children, node: int, token: int) -> int:
    """The child of ``node`` whose edge starts with ``token`` (-1: none)."""
    slots, shift = children
    key = child_key(node, token)
    slot = _slot(key, shift)
    while True:
        found = slots[slot, 0]
        if found == key:
            return slots[slot, 1]
        if found == _EMPTY:
            return -1
        slot = (slot + 1) & (len(slots) - 1)


@njit(cache=True)
def _children(parent, start, length, namespace, store, bits):
    slots = np.full((1 << bits, 2), _EMPTY, np.int64)  # keys are >= 0: nodes and 32-bit tokens
    shift = 64 - bits
    for node in range(1, len(parent)):
        if parent[node] == 0:
            key = child_key(0, namespace[node])
        elif length[node] > 0:
            key = child_key(parent[node], store[start[node]])
        else:
            continue
        slot = _slot(key, shift)
        while slots[slot, 0] != _EMPTY and slots[slot, 0] != key:
            slot = (slot + 1) & (len(slots) - 1)
        slots[slot, 0] = key
        slots[slot, 1] = node
    return slots


@njit(cache=True)
def _marked_on_paths(
    children, start, length, store, marked, below, prompt_tokens, prompt_offsets, namespace
):
    """The walk of ``nodes_on_paths``: each prompt from its root while a marked node lies below
    (a child with none is not compared, nor looked for under the last marked node)."""
    requests = np.empty(64, np.int64)
    nodes = np.empty(64, np.int64)
    found = 0
    for r in range(len(prompt_offsets) - 1):
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        node = child_of(children, 0, namespace[r])
        pos = 0
        while node >= 0 and (marked[node] or below[node]):
            if marked[node]:
                if found == len(requests):
                    requests = np.concatenate((requests, np.empty(found, np.int64)))
                    nodes = np.concatenate((nodes, np.empty(found, np.int64)))
                requests[found], nodes[found] = r, node
                found += 1
            if pos >= p1 - p0 or not below[node]:
                break
            node = child_of(children, node, prompt_tokens[p0 + pos])
            if node < 0 or not (marked[node] or below[node]) or pos + length[node] > p1 - p0:
                break
            m = 0
            while m < length[node] and store[start[node] + m] == prompt_tokens[p0 + pos + m]:
                m += 1
            if m < length[node]:
                break
            pos += length[node]
    return requests[:found].copy(), nodes[:found].copy()
