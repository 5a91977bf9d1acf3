"""Walking requests down a built prefix trie: the child map, and which marked nodes a request's
prompt passes through (whole)."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict

from cache_models.prefix_trie import TrieNodes
from cache_models.workload import Workload


def nodes_on_paths(
    trie: TrieNodes, workload: Workload, marked: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every (request, node) where ``marked[node]`` and the request's prompt holds the node's
    whole path (``trie`` built from ``workload``), ordered by request then depth."""
    trie = trie.expanded
    stop_depth = int(trie.depth[marked].max()) if marked.any() else 0
    return _marked_on_paths(
        child_map(trie),
        trie.start,
        trie.length,
        trie.store,
        marked,
        stop_depth,
        workload.prompt_tokens,
        workload.prompt_offsets,
        workload.namespace.astype(np.int64),
    )


def child_map(trie: TrieNodes) -> Dict:
    """The child map, keyed as the trie keys it: (parent, first token); roots by namespace.
    Made once per trie (kept on it, as a cached property is; read only)."""
    trie = trie.expanded
    children = trie.__dict__.get("_child_map")
    if children is None:
        children = _children(trie.parent, trie.start, trie.length, trie.namespace, trie.store)
        trie.__dict__["_child_map"] = children
    return children


@njit(cache=True, inline="always")
def child_key(node: int, token: int) -> int:
    return (node << 32) | (token & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def child_of(children, node: int, token: int) -> int:
    """The child of ``node`` whose edge starts with ``token`` (-1: none)."""
    key = child_key(node, token)
    return children[key] if key in children else -1  # noqa: SIM401 (numba: .get is Optional)


@njit(cache=True)
def _children(parent, start, length, namespace, store):
    children = Dict.empty(key_type=types.int64, value_type=types.int64)
    for node in range(1, len(parent)):
        if parent[node] == 0:
            children[child_key(0, namespace[node])] = node
        elif length[node] > 0:
            children[child_key(parent[node], store[start[node]])] = node
    return children


@njit(cache=True)
def _marked_on_paths(
    children, start, length, store, marked, stop_depth, prompt_tokens, prompt_offsets, namespace
):
    requests = np.empty(64, np.int64)
    nodes = np.empty(64, np.int64)
    found = 0
    for r in range(len(prompt_offsets) - 1):
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        node = child_of(children, 0, namespace[r])
        pos = 0
        while node >= 0:
            if marked[node]:
                if found == len(requests):
                    requests = np.concatenate((requests, np.empty(found, np.int64)))
                    nodes = np.concatenate((nodes, np.empty(found, np.int64)))
                requests[found], nodes[found] = r, node
                found += 1
            if pos >= min(p1 - p0, stop_depth):
                break
            node = child_of(children, node, prompt_tokens[p0 + pos])
            if node < 0 or pos + length[node] > p1 - p0:
                break
            m = 0
            while m < length[node] and store[start[node] + m] == prompt_tokens[p0 + pos + m]:
                m += 1
            if m < length[node]:
                break
            pos += length[node]
    return requests[:found].copy(), nodes[:found].copy()
