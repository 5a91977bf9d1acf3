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
so ``D`` is read off the nodes the prompt passes, with memory per node, not per token. A trie of
tokens keeps it per kind of what is kept instead (vLLM's ``L' + n' - 1``, SGLang's ``L' + k``,
unfloored) and floors each view's hit after the walk: ``floor_g`` is monotone, so flooring every
``cached(s)`` first or the match last gives the same hit, and the walk costs the same for any
number of views.

A log can be fed chunk by chunk (``PrefixTrie.feed``): the trie, its views and the request count
carry over, so the hits and the final nodes are those of one pass over the whole log.

A run-length workload (``cache_models.runs``: a hash-id trace's runs of synthetic tokens) is fed
the same way (``_trie_runs``): the trie stores run ids with their weights, and its hits and nodes
are those of its token expansion, node for node (lengths and depths in tokens; ``TrieNodes``
expands a node's runs back to tokens). A trie is fed tokens or runs, not both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from cache_models._trie_kernel import (
    N_COLUMNS,
    N_KINDS,
    N_NODES,
    N_REQUESTS,
    N_STORE,
    SGLANG_KEPT,
    VLLM_KEPT,
    feed_tokens,
    new_child_map,
)
from cache_models._trie_runs import feed_runs
from cache_models.result import ReplayResult
from cache_models.runs import RunWorkload, expand_entries
from cache_models.workload import Workload, offsets_of


@dataclass(frozen=True)
class TrieNodes:
    """The trie's nodes as columns; node 0 is a sentinel, namespace roots are its children.

    A trie fed runs stores run ids (``store``) with their tokens (``store_weights``) and each
    run's first token (``first_tokens``, ``cache_models.runs``); ``span`` counts the store
    entries on each edge. ``expanded`` is the trie of the expansion, node for node."""

    parent: np.ndarray  # int64
    start: np.ndarray  # int64, offset of the node's tokens (or runs) in ``store``
    length: np.ndarray  # int64, tokens on the edge into the node
    depth: np.ndarray  # int64, prefix length at the node's end
    count: np.ndarray  # int64, prompts that pass through the whole node
    first_request: np.ndarray  # int64, first request whose prompt passed through it (-1: none)
    namespace: np.ndarray  # int64, namespace of the node's root
    store: np.ndarray  # int32, the distinct tokens (or runs)
    span: np.ndarray | None = None  # int64, runs on the edge (None: fed tokens, ``length``)
    store_weights: np.ndarray | None = None  # int32, tokens of each run in ``store``
    first_tokens: np.ndarray | None = None  # int64, the first token of each run id

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    @property
    def of_runs(self) -> bool:
        """Whether the trie was fed runs (its store holds run ids)."""
        return self.span is not None

    def tokens(self, node: int) -> np.ndarray:
        """The token sequence from the root to the end of ``node``."""
        span = self.length if self.span is None else self.span
        edges = []
        while self.parent[node] > 0:
            edges.append(slice(self.start[node], self.start[node] + span[node]))
            node = int(self.parent[node])
        if not edges:
            return np.zeros(0, np.int32)
        store = np.concatenate([self.store[edge] for edge in edges[::-1]])
        if self.span is None:
            return store
        assert self.store_weights is not None and self.first_tokens is not None
        weights = np.concatenate([self.store_weights[edge] for edge in edges[::-1]])
        return expand_entries(store, weights, self.first_tokens)[0]

    @property
    def expanded(self) -> TrieNodes:
        """The trie as fed tokens: itself, or a trie fed runs with its store expanded (the token
        trie of the expansion, node for node; memory per distinct token, made once). What walks
        the store against a workload's tokens reads (``trie_walk``, ``block_stream``)."""
        return self if self.span is None else self._expanded_runs

    def with_namespace(self, namespace: np.ndarray) -> TrieNodes:
        """This trie with other namespace ids on its nodes. A trie of runs shares its expansion
        with the copy (the store's tokens, made once for both: both are walked)."""
        renamed = replace(self, namespace=namespace)
        if self.span is not None:
            renamed.__dict__["_expanded_runs"] = replace(self.expanded, namespace=namespace)
        return renamed

    @cached_property
    def _expanded_runs(self) -> TrieNodes:
        assert self.store_weights is not None and self.first_tokens is not None
        store, _ = expand_entries(self.store, self.store_weights, self.first_tokens)
        return TrieNodes(
            parent=self.parent,
            start=offsets_of(self.store_weights.astype(np.int64))[self.start],
            length=self.length,
            depth=self.depth,
            count=self.count,
            first_request=self.first_request,
            namespace=self.namespace,
            store=store,
        )


@dataclass(frozen=True)
class View:
    """An engine's unbounded cache at one granularity: ``engine`` "vllm" (block size) or
    "sglang" (page size), or "ideal" (granularity 1, everything an engine can cache)."""

    engine: str
    granularity: int = 1

    def __post_init__(self) -> None:
        if self.engine not in ("vllm", "sglang", "ideal") or self.granularity < 1:
            raise ValueError(f"bad view {self}")


@dataclass(frozen=True)
class SplitCount:
    """Count the node splits of SGLang's unbounded radix tree at page size 1 (``_trie_kernel.
    _sglang_splits``), with prefill chunks of ``chunk`` tokens (0: none)."""

    chunk: int = 0


@dataclass(frozen=True)
class TrieFeed:
    """A token feed's per-request results, one array per view: ``hits`` (the match, limited to
    L - 1), ``reach`` (the longest ``min(LCP, kept)`` over the whole kept sequence, not only the
    prompt, before flooring to the view's granularity: what vLLM finds cached of its blocks,
    and SGLang's ``D``), and SGLang's node ``splits`` (None unless counted)."""

    hits: list[np.ndarray]
    reach: list[np.ndarray]
    splits: np.ndarray | None


class PrefixTrie:
    """The ideal prefix cache, and per ``View`` an engine's unbounded one: replays a workload, or
    a log chunk by chunk (``feed``), and keeps the trie for later questions."""

    engine = "ideal"

    def __init__(
        self, views: Sequence[View] = (View("ideal"),), splits: SplitCount | None = None
    ) -> None:
        self.splits = splits
        self._start(views)

    def _start(self, views: Sequence[View]) -> None:
        self.views = list(views)
        self._granularity = np.array([v.granularity for v in self.views], np.int64)
        self._vllm = np.array([v.engine == "vllm" for v in self.views], np.bool_)
        self._children = new_child_map(1 << 12)
        self._columns = np.zeros((1024, N_COLUMNS), np.int64)
        # per node: the most a sequence through it keeps (tokens of one request: int32), per
        # kind of what an engine keeps (tokens; ``_trie_kernel.N_KINDS``) or per view (runs)
        self._best = np.zeros((1024, len(self.views)), np.int32)
        self._store = np.zeros(1 << 16, np.int32)
        self._store_weights = np.zeros(0, np.int32)  # a trie fed runs: tokens per store entry
        self._first_tokens: np.ndarray | None = None  # a trie fed runs: its runs' first tokens
        self._sizes = np.zeros(4, np.int64)  # nodes, store, requests, child-map keys
        self._sizes[N_NODES] = 1  # node 0: the sentinel above the namespace roots
        self._nodes: TrieNodes | None = None
        # per store entry, whether SGLang's tree has a node end there (``splits``; empty: off)
        self._boundaries = np.zeros(0 if self.splits is None else len(self._store), np.uint8)

    @property
    def n_requests(self) -> int:
        """Requests fed so far."""
        return int(self._sizes[N_REQUESTS])

    def feed(self, chunk: Workload | RunWorkload) -> list[np.ndarray]:
        """Per view, the hits of the chunk's requests, as if the whole log so far were replayed
        at once. The trie grows geometrically: a feed costs its own content, amortised. Chunks
        of runs come from one run table (``cache_models.hash_runs``)."""
        runs = isinstance(chunk, RunWorkload)
        if self.n_requests and runs != (self._first_tokens is not None):
            raise ValueError("a trie is fed tokens or runs, not both")
        if runs:
            if self.splits is not None:
                raise ValueError("a trie counts SGLang's splits over tokens only")
            return self._feed_runs(chunk)
        return self.feed_tokens(chunk).hits

    def feed_tokens(self, chunk: Workload, stop_finish: np.ndarray | None = None) -> TrieFeed:
        """``feed`` of tokens, with each request's reach and (``splits``) SGLang's node splits.
        ``stop_finish``: which requests keep their last output in the SGLang and ideal views
        (default ``Workload.sglang_stop_finish``: the overlap scheduler's)."""
        if self._first_tokens is not None:
            raise ValueError("a trie is fed tokens or runs, not both")
        if self.n_requests == 0:
            self._best = np.zeros((len(self._best), N_KINDS), np.int32)
        # a request adds at most five nodes (a namespace root, two splits, two leaves): room
        # for them all, zeroed lazily by numpy, so the kernel never copies the nodes to grow
        rows = int(self._sizes[N_NODES]) + 5 * chunk.n_requests
        self._columns = _with_room(self._columns, rows, zeroed=True)
        self._best = _with_room(self._best, rows, zeroed=True)
        tokens = int(chunk.prompt_offsets[-1] + chunk.output_offsets[-1])
        self._store = _with_room(self._store, int(self._sizes[N_STORE]) + tokens)
        if self.splits is not None:
            self._boundaries = _with_room(self._boundaries, len(self._store), zeroed=True)
        matched, reach, splits, *state = feed_tokens(
            self._columns,
            self._best,
            self._store,
            self._children,
            self._sizes,
            *chunk.kernel_inputs()[:5],
            chunk.sglang_stop_finish if stop_finish is None else stop_finish,
            self._boundaries,
            chunk.hit_limits if self.splits is not None else np.zeros(0, np.int64),
            0 if self.splits is None else self.splits.chunk,
        )
        self._columns, self._best, self._store, self._children, self._boundaries = state
        self._nodes = None
        limit = chunk.prompt_lengths - 1
        kinds = [VLLM_KEPT if view.engine == "vllm" else SGLANG_KEPT for view in self.views]
        hits = [
            np.minimum(limit, matched[kind]) // view.granularity * view.granularity
            for view, kind in zip(self.views, kinds, strict=True)
        ]
        splits_found = None if self.splits is None else splits
        return TrieFeed(hits, [reach[kind] for kind in kinds], splits_found)

    def _feed_runs(self, chunk: RunWorkload) -> list[np.ndarray]:
        runs = chunk.runs
        needed = int(self._sizes[N_STORE]) + int(runs.prompt_offsets[-1] + runs.output_offsets[-1])
        self._store = _with_room(self._store, needed)
        self._store_weights = _with_room(self._store_weights, needed)
        prompt_weights, output_weights = chunk.kernel_weights()
        prompt_ids, prompt_offsets, output_ids, output_offsets, namespace, _ = runs.kernel_inputs()
        hits, columns, best, store, weights, children = feed_runs(
            self._columns,
            self._best,
            self._store,
            self._store_weights,
            self._children,
            self._sizes,
            prompt_ids,
            prompt_weights,
            prompt_offsets,
            output_ids,
            output_weights,
            output_offsets,
            namespace,
            _sglang_stop_finish(chunk),
            self._granularity,
            self._vllm,
        )
        self._columns, self._best, self._store = columns, best, store
        self._store_weights, self._children = weights, children
        self._first_tokens = np.asarray(chunk.first_tokens, np.int64)
        self._nodes = None
        return list(hits)

    @property
    def nodes(self) -> TrieNodes:
        """The trie of everything fed so far (later feeds leave it as it is: the node columns are
        copied; the store is a view, as feeds only append to it or move it to a larger buffer)."""
        if self._nodes is None:
            n, columns = int(self._sizes[N_NODES]), self._columns
            nodes = TrieNodes(
                *(columns[:n, c].copy() for c in range(N_COLUMNS)),
                store=self._store[: self._sizes[N_STORE]],
            )
            if self._first_tokens is not None:  # fed runs: the kernel's lengths count runs
                length = nodes.depth - nodes.depth[nodes.parent]
                length[0] = 0
                nodes = replace(
                    nodes,
                    length=length,
                    span=nodes.length,
                    store_weights=self._store_weights[: self._sizes[N_STORE]],
                    first_tokens=self._first_tokens,
                )
            self._nodes = nodes
        return self._nodes

    def replay(self, workload: Workload | RunWorkload) -> ReplayResult:
        """Start over: the ideal hits of ``workload``."""
        (hits,) = self.replay_views(workload, [View("ideal")])
        return ReplayResult(engine=self.engine, hit_tokens=hits)

    def replay_views(
        self, workload: Workload | RunWorkload, views: Sequence[View]
    ) -> list[np.ndarray]:
        """Start over: per view, the per-request hits of that engine's unbounded, sequential
        replay of ``workload``."""
        self._start(views)
        return self.feed(workload)


def unbounded_hits(workload: Workload | RunWorkload, views: list[View]) -> list[np.ndarray]:
    """Per view, the hits of an unbounded, sequential replay (exactly the engine models')."""
    return PrefixTrie(views).feed(workload)


def _sglang_stop_finish(workload: RunWorkload) -> np.ndarray:
    """``Workload.sglang_stop_finish`` of the expansion (answer lengths in tokens)."""
    runs = workload.runs
    stops = np.ascontiguousarray(runs.stop_finish, np.bool_)
    if runs.max_new_tokens is None:
        return stops
    given = runs.max_new_tokens_given
    return stops & ~((given >= 0) & (workload.output_lengths >= given))


def _with_room(store: np.ndarray, needed: int, zeroed: bool = False) -> np.ndarray:
    """``store`` with room for ``needed`` tokens (or rows), grown here rather than in the
    kernel: numpy asks for huge pages (numba's runtime does not), and room it never writes stays
    unmapped, so the bound (every token of the chunk) costs no memory the store does not use."""
    if needed <= len(store):
        return store
    shape = (max(needed, 2 * len(store)), *store.shape[1:])
    bigger = np.zeros(shape, store.dtype) if zeroed else np.empty(shape, store.dtype)
    bigger[: len(store)] = store
    return bigger
