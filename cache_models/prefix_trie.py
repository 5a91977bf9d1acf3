"""A compressed token trie of everything a workload computes: the ideal (unbounded, token-exact)
prefix cache, and the structure that shared-prefix discovery reads.

Each request first matches its prompt, limited to L-1 tokens (both engines always recompute the
last prompt token), then inserts its prompt and the outputs an engine can cache (all of them after
a stop finish, all but the last after a length finish). That hit is the ceiling: no engine, at any
capacity or block size, serves more. Requests whose prompts pass through a node are counted, and
every prompt end is a node boundary, so a node is a prefix shared by exactly ``count`` prompts.
Each distinct token is stored once; unknown (negative) tokens are never stored, as nothing after
them can match.

The same pass also gives, exactly, what vLLM and SGLang serve with unbounded capacity in a
sequential replay, at any block or page size (``unbounded_hits``). Without eviction an engine's
hit is ``g * floor(min(L - 1, D) / g)`` for granularity ``g``, where ``D`` is the longest
``min(LCP(prompt, s), cached(s))`` over earlier sequences ``s`` of the namespace, and ``cached(s)``
what the engine keeps of ``s``: vLLM ``floor((L' + n' - 1) / B) * B`` tokens (all outputs but the
last), SGLang ``floor((L' + k) / P) * P`` with ``k`` the outputs it inserts (all on a stop, all but
the last on a length finish). Each node keeps, per view, the most any sequence through it keeps,
so ``D`` is read off the nodes the prompt passes, with memory per node, not per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.typed import Dict

from cache_models.result import ReplayResult
from cache_models.workload import Workload

_NO_CHILD = -1


@dataclass(frozen=True)
class TrieNodes:
    """The trie's nodes as columns; node 0 is a sentinel, namespace roots are its children."""

    parent: np.ndarray  # int64
    start: np.ndarray  # int64, offset of the node's tokens in ``store``
    length: np.ndarray  # int64, tokens on the edge into the node
    depth: np.ndarray  # int64, prefix length at the node's end
    count: np.ndarray  # int64, prompts that pass through the whole node
    first_request: np.ndarray  # int64, first request whose prompt passed through it (-1: none)
    namespace: np.ndarray  # int64, namespace of the node's root
    store: np.ndarray  # int32, the distinct tokens

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    def tokens(self, node: int) -> np.ndarray:
        """The token sequence from the root to the end of ``node``."""
        parts = []
        while self.parent[node] > 0:
            parts.append(self.store[self.start[node] : self.start[node] + self.length[node]])
            node = int(self.parent[node])
        return np.concatenate(parts[::-1]) if parts else np.zeros(0, np.int32)


@dataclass(frozen=True)
class View:
    """An engine's unbounded cache at one granularity: ``engine`` "vllm" (block size) or
    "sglang" (page size), or "ideal" (granularity 1, everything an engine can cache)."""

    engine: str
    granularity: int = 1

    def __post_init__(self) -> None:
        if self.engine not in ("vllm", "sglang", "ideal") or self.granularity < 1:
            raise ValueError(f"bad view {self}")


class PrefixTrie:
    """The ideal prefix cache: replays a workload and keeps the trie for later questions."""

    engine = "ideal"

    def __init__(self) -> None:
        self.nodes: TrieNodes | None = None

    def replay(self, workload: Workload) -> ReplayResult:
        (hits,) = self.replay_views(workload, [View("ideal")])
        return ReplayResult(engine=self.engine, hit_tokens=hits)

    def replay_views(self, workload: Workload, views: list[View]) -> list[np.ndarray]:
        """Per view, the per-request hits of that engine's unbounded, sequential replay."""
        hits, columns = _build(
            workload.prompt_tokens,
            workload.prompt_offsets,
            workload.output_tokens,
            workload.output_offsets,
            workload.namespace.astype(np.int64),
            workload.stop_finish,
            np.array([v.granularity for v in views], np.int64),
            np.array([v.engine == "vllm" for v in views], np.bool_),
        )
        self.nodes = TrieNodes(*columns)
        return list(hits)


def unbounded_hits(workload: Workload, views: list[View]) -> list[np.ndarray]:
    """Per view, the hits of an unbounded, sequential replay (exactly the engine models')."""
    return PrefixTrie().replay_views(workload, views)


@njit(cache=True)
def _key(node: int, token: int) -> int:
    return (node << 32) | (token & 0xFFFFFFFF)


@njit(cache=True)
def _child(children, node: int, token: int) -> int:
    key = _key(node, token)
    return children[key] if key in children else _NO_CHILD  # noqa: SIM401 (numba: .get is Optional)


@njit(cache=True)
def _grow(array: np.ndarray, needed: int) -> np.ndarray:
    if needed <= len(array):
        return array
    bigger = np.empty(max(needed, 2 * len(array)), array.dtype)
    bigger[: len(array)] = array
    return bigger


@njit(cache=True)
def _grow_rows(array: np.ndarray, needed: int) -> np.ndarray:
    if needed <= len(array):
        return array
    bigger = np.zeros((max(needed, 2 * len(array)), array.shape[1]), array.dtype)
    bigger[: len(array)] = array
    return bigger


@njit(cache=True)
def _build(
    prompt_tokens,
    prompt_offsets,
    output_tokens,
    output_offsets,
    namespace,
    stop_finish,
    view_granularity,
    view_vllm,
):
    n_requests = len(prompt_offsets) - 1
    n_views = len(view_granularity)
    hits = np.zeros((n_views, n_requests), np.int64)
    reach = np.zeros(n_views, np.int64)  # per view: the longest min(LCP, kept) so far
    kept = np.zeros(n_views, np.int64)  # per view: what the engine keeps of this request
    children = Dict.empty(key_type=types.int64, value_type=types.int64)
    cap = 1024
    parent = np.zeros(cap, np.int64)
    start = np.zeros(cap, np.int64)
    length = np.zeros(cap, np.int64)
    depth = np.zeros(cap, np.int64)
    count = np.zeros(cap, np.int64)
    first = np.full(cap, -1, np.int64)
    space = np.zeros(cap, np.int64)
    best = np.zeros((cap, n_views), np.int64)  # per node and view: the most kept through it
    store = np.zeros(1 << 16, np.int32)
    n_nodes = 1  # node 0: the sentinel above the namespace roots
    n_store = 0
    seq = np.zeros(1024, np.int32)

    for r in range(n_requests):
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        o0, o1 = output_offsets[r], output_offsets[r + 1]
        prompt_len = p1 - p0
        n_out = (o1 - o0) if stop_finish[r] else (o1 - o0 - 1)
        seq = _grow(seq, prompt_len + n_out)
        seq[:prompt_len] = prompt_tokens[p0:p1]
        seq[prompt_len : prompt_len + n_out] = output_tokens[o0 : o0 + n_out]
        seq_len = prompt_len + n_out
        for i in range(seq_len):  # nothing after an unknown token can ever match
            if seq[i] < 0:
                seq_len = i
                break
        for v in range(n_views):
            g = view_granularity[v]
            n_kept = (o1 - o0 - 1) if view_vllm[v] else n_out
            kept[v] = min((prompt_len + n_kept) // g * g, seq_len)

        root = _child(children, 0, namespace[r])
        if root == _NO_CHILD:
            root = n_nodes
            n_nodes += 1
            if n_nodes > len(parent):
                parent = _grow(parent, n_nodes)
                start = _grow(start, n_nodes)
                length = _grow(length, n_nodes)
                depth = _grow(depth, n_nodes)
                count = _grow(count, n_nodes)
                first = _grow(first, n_nodes)
                space = _grow(space, n_nodes)
                best = _grow_rows(best, n_nodes)
            parent[root], start[root], length[root], depth[root] = 0, 0, 0, 0
            count[root], first[root], space[root] = 0, -1, namespace[r]
            children[_key(0, namespace[r])] = root

        # 1. match, limited to prompt_len - 1 tokens; per view, the best min(LCP, kept) on the way
        limit = min(prompt_len - 1, seq_len)
        reach[:] = 0
        node, pos = root, 0
        while pos < limit:
            child = _child(children, node, seq[pos])
            if child == _NO_CHILD:
                break
            m = 0
            while m < length[child] and pos + m < limit and store[start[child] + m] == seq[pos + m]:
                m += 1
            pos += m
            for v in range(n_views):
                reach[v] = max(reach[v], min(pos, best[child, v]))
            if m < length[child]:
                break
            node = child
        for v in range(n_views):
            g = view_granularity[v]
            hits[v, r] = min(prompt_len - 1, reach[v]) // g * g

        # 2. insert prompt + cacheable outputs, splitting at divergences and at the prompt end
        node, pos = root, 0
        while pos < seq_len:
            child = _child(children, node, seq[pos])
            if child == _NO_CHILD:
                # new leaf(s): [pos, prompt_len) counted, then the output tail
                cut = prompt_len if pos < prompt_len else seq_len
                while pos < seq_len:
                    end = min(cut, seq_len)
                    n_nodes += 1
                    if n_nodes > len(parent):
                        parent = _grow(parent, n_nodes)
                        start = _grow(start, n_nodes)
                        length = _grow(length, n_nodes)
                        depth = _grow(depth, n_nodes)
                        count = _grow(count, n_nodes)
                        first = _grow(first, n_nodes)
                        space = _grow(space, n_nodes)
                        best = _grow_rows(best, n_nodes)
                    leaf = n_nodes - 1
                    store = _grow(store, n_store + end - pos)
                    store[n_store : n_store + end - pos] = seq[pos:end]
                    parent[leaf], start[leaf], length[leaf] = node, n_store, end - pos
                    depth[leaf] = depth[node] + end - pos
                    counted = pos < prompt_len
                    count[leaf] = 1 if counted else 0
                    first[leaf] = r if counted else -1
                    space[leaf] = namespace[r]
                    best[leaf, :] = kept
                    children[_key(node, seq[pos])] = leaf
                    n_store += end - pos
                    node, pos, cut = leaf, end, seq_len
                break
            span = length[child]
            m = 0
            while m < span and pos + m < seq_len and store[start[child] + m] == seq[pos + m]:
                m += 1
            cut = min(m, prompt_len - pos) if pos < prompt_len else m
            if cut < span:
                if pos + cut == seq_len and pos + cut != prompt_len:
                    # the sequence ends inside an output node: nothing to add but what it keeps
                    for v in range(n_views):
                        best[child, v] = max(best[child, v], kept[v])
                    break
                # split child at cut: mid takes the first cut tokens
                n_nodes += 1
                if n_nodes > len(parent):
                    parent = _grow(parent, n_nodes)
                    start = _grow(start, n_nodes)
                    length = _grow(length, n_nodes)
                    depth = _grow(depth, n_nodes)
                    count = _grow(count, n_nodes)
                    first = _grow(first, n_nodes)
                    space = _grow(space, n_nodes)
                    best = _grow_rows(best, n_nodes)
                mid = n_nodes - 1
                parent[mid], start[mid], length[mid] = node, start[child], cut
                depth[mid] = depth[node] + cut
                count[mid], first[mid], space[mid] = count[child], first[child], space[child]
                best[mid, :] = best[child, :]
                children[_key(node, seq[pos])] = mid
                parent[child] = mid
                start[child] += cut
                length[child] -= cut
                children[_key(mid, store[start[child]])] = child
                child = mid
            if pos < prompt_len:
                count[child] += 1
                if first[child] < 0:
                    first[child] = r
            for v in range(n_views):
                best[child, v] = max(best[child, v], kept[v])
            pos += cut
            node = child

    columns = (
        parent[:n_nodes].copy(),
        start[:n_nodes].copy(),
        length[:n_nodes].copy(),
        depth[:n_nodes].copy(),
        count[:n_nodes].copy(),
        first[:n_nodes].copy(),
        space[:n_nodes].copy(),
        store[:n_store].copy(),
    )
    return hits, columns
