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

A log can be fed chunk by chunk (``PrefixTrie.feed``): the trie, its views and the request count
carry over, so the hits and the final nodes are those of one pass over the whole log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.typed import Dict

from cache_models.result import ReplayResult
from cache_models.workload import Workload

_NO_CHILD = -1
# Columns of the kernel's node matrix, in TrieNodes' order; entries of its sizes.
PARENT, START, LENGTH, DEPTH, COUNT, FIRST, SPACE = range(7)
N_COLUMNS = 7
N_NODES, N_STORE, N_REQUESTS = range(3)


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


@njit(cache=True)
def _empty_children():
    """The child map, made in compiled code: ``Dict.empty`` called from Python compiles its
    constructor anew in every process (~0.3 s), this is loaded from numba's cache."""
    return Dict.empty(key_type=types.int64, value_type=types.int64)


class PrefixTrie:
    """The ideal prefix cache, and per ``View`` an engine's unbounded one: replays a workload, or
    a log chunk by chunk (``feed``), and keeps the trie for later questions."""

    engine = "ideal"

    def __init__(self, views: Sequence[View] = (View("ideal"),)) -> None:
        self._start(views)

    def _start(self, views: Sequence[View]) -> None:
        self.views = list(views)
        self._granularity = np.array([v.granularity for v in self.views], np.int64)
        self._vllm = np.array([v.engine == "vllm" for v in self.views], np.bool_)
        self._children = _empty_children()
        self._columns = np.zeros((1024, N_COLUMNS), np.int64)
        self._best = np.zeros((1024, len(self.views)), np.int64)
        self._store = np.zeros(1 << 16, np.int32)
        self._sizes = np.zeros(3, np.int64)
        self._sizes[N_NODES] = 1  # node 0: the sentinel above the namespace roots
        self._nodes: TrieNodes | None = None

    @property
    def n_requests(self) -> int:
        """Requests fed so far."""
        return int(self._sizes[N_REQUESTS])

    def feed(self, chunk: Workload) -> list[np.ndarray]:
        """Per view, the hits of the chunk's requests, as if the whole log so far were replayed
        at once. The trie grows geometrically: a feed costs its own content, amortised."""
        self._store = _with_room(
            self._store,
            int(self._sizes[N_STORE]) + int(chunk.prompt_offsets[-1] + chunk.output_offsets[-1]),
        )
        hits, self._columns, self._best, self._store = _feed(
            self._columns,
            self._best,
            self._store,
            self._children,
            self._sizes,
            *chunk.kernel_inputs()[:5],
            chunk.sglang_stop_finish,  # SGLang's views; vLLM's keep N - 1 outputs regardless
            self._granularity,
            self._vllm,
        )
        self._nodes = None
        return list(hits)

    @property
    def nodes(self) -> TrieNodes:
        """The trie of everything fed so far (later feeds leave it as it is: the node columns are
        copied; the store is a view, as feeds only append to it or move it to a larger buffer)."""
        if self._nodes is None:
            n, columns = int(self._sizes[N_NODES]), self._columns
            self._nodes = TrieNodes(
                *(columns[:n, c].copy() for c in range(N_COLUMNS)),
                store=self._store[: self._sizes[N_STORE]],
            )
        return self._nodes

    def replay(self, workload: Workload) -> ReplayResult:
        """Start over: the ideal hits of ``workload``."""
        (hits,) = self.replay_views(workload, [View("ideal")])
        return ReplayResult(engine=self.engine, hit_tokens=hits)

    def replay_views(self, workload: Workload, views: Sequence[View]) -> list[np.ndarray]:
        """Start over: per view, the per-request hits of that engine's unbounded, sequential
        replay of ``workload``."""
        self._start(views)
        return self.feed(workload)


def unbounded_hits(workload: Workload, views: list[View]) -> list[np.ndarray]:
    """Per view, the hits of an unbounded, sequential replay (exactly the engine models')."""
    return PrefixTrie(views).feed(workload)


def _with_room(store: np.ndarray, needed: int) -> np.ndarray:
    """``store`` with room for ``needed`` tokens, grown here rather than in the kernel: numpy
    asks for huge pages (numba's runtime does not), and room it never writes stays unmapped, so
    the bound (every token of the chunk) costs no memory the store does not use."""
    if needed <= len(store):
        return store
    bigger = np.empty(max(needed, 2 * len(store)), store.dtype)
    bigger[: len(store)] = store
    return bigger


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
def _add_node(columns, best, sizes, parent, start, length, depth, count, first, space):
    """Append a node (the arrays grow geometrically); returns its id and the arrays."""
    node = sizes[N_NODES]
    sizes[N_NODES] = node + 1
    columns = _grow_rows(columns, node + 1)
    best = _grow_rows(best, node + 1)
    columns[node, PARENT], columns[node, START], columns[node, LENGTH] = parent, start, length
    columns[node, DEPTH], columns[node, COUNT], columns[node, FIRST] = depth, count, first
    columns[node, SPACE] = space
    return node, columns, best


@njit(cache=True, nogil=True)
def _feed(
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
    view_granularity,
    view_vllm,
):
    """Match then insert each request (see the module docstring); ``best[node, view]`` is the most
    any sequence through the node keeps in that view."""
    n_requests = len(prompt_offsets) - 1
    n_views = len(view_granularity)
    hits = np.zeros((n_views, n_requests), np.int64)
    reach = np.zeros(n_views, np.int64)  # per view: the longest min(LCP, kept) so far
    kept = np.zeros(n_views, np.int64)  # per view: what the engine keeps of this request
    seq = np.zeros(1024, np.int32)

    for r in range(n_requests):
        request = sizes[N_REQUESTS] + r  # counted over the whole stream
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
            root, columns, best = _add_node(columns, best, sizes, 0, 0, 0, 0, 0, -1, namespace[r])
            children[_key(0, namespace[r])] = root

        # 1. match, limited to prompt_len - 1 tokens; per view, the best min(LCP, kept) on the way
        limit = min(prompt_len - 1, seq_len)
        reach[:] = 0
        node, pos = root, 0
        while pos < limit:
            child = _child(children, node, seq[pos])
            if child == _NO_CHILD:
                break
            edge, span = columns[child, START], columns[child, LENGTH]
            m = 0
            while m < span and pos + m < limit and store[edge + m] == seq[pos + m]:
                m += 1
            pos += m
            for v in range(n_views):
                reach[v] = max(reach[v], min(pos, best[child, v]))
            if m < span:
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
                    n_store = sizes[N_STORE]
                    store = _grow(store, n_store + end - pos)
                    store[n_store : n_store + end - pos] = seq[pos:end]
                    sizes[N_STORE] = n_store + end - pos
                    counted = pos < prompt_len
                    leaf, columns, best = _add_node(
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
                    children[_key(node, seq[pos])] = leaf
                    node, pos, cut = leaf, end, seq_len
                break
            span = columns[child, LENGTH]
            m = 0
            while (
                m < span and pos + m < seq_len and store[columns[child, START] + m] == seq[pos + m]
            ):
                m += 1
            cut = min(m, prompt_len - pos) if pos < prompt_len else m
            if cut < span:
                if pos + cut == seq_len and pos + cut != prompt_len:
                    # the sequence ends inside an output node: nothing to add but what it keeps
                    for v in range(n_views):
                        best[child, v] = max(best[child, v], kept[v])
                    break
                # split child at cut: mid takes the first cut tokens
                mid, columns, best = _add_node(
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
                children[_key(node, seq[pos])] = mid
                columns[child, PARENT] = mid
                columns[child, START] += cut
                columns[child, LENGTH] -= cut
                children[_key(mid, store[columns[child, START]])] = child
                child = mid
            if pos < prompt_len:
                columns[child, COUNT] += 1
                if columns[child, FIRST] < 0:
                    columns[child, FIRST] = request
            for v in range(n_views):
                best[child, v] = max(best[child, v], kept[v])
            pos += cut
            node = child
    sizes[N_REQUESTS] += n_requests
    return hits, columns, best, store
