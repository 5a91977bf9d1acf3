"""Compiled sequential replay of SGLang's radix cache: ``_sglang_reference`` on flat arrays.

Nodes are rows of one int64 matrix and one float64 matrix (no Python object per node); a node's
tokens are a span of one token arena. Children are found through an open-addressing map keyed by
(parent, namespace, first page). Evictable leaves sit in a persistent binary heap with lazy
deletion: every change to a node's key or evictability gives it a new version, and only the entry
carrying the current version counts. The replay stops before a request when node rows or arena room
run short; the caller (``sglang_radix._replay_fast``, the adapter) grows them and resumes, so
memory follows the live tree and the pool, not the log.

A call from one compiled function to another counts a reference to every array it is passed, an
atomic increment and decrement each, which had taken over half of the replay: the tree is six
arrays, the helpers called for every node or request (the child map, the lock walks, token
copies) take the arrays they use or are inlined, and an unbounded pool (``NO_EVICTION``, no heap)
makes no call for eviction, allocation or heap refreshes at all.

The server settings follow the reference exactly: each request's ``priority`` goes into every
insert (``UnifiedRadixCache`` inserts with ``req.priority or 0``, the prompt split with + 1);
``hit_limit`` caps the match (``Req._compute_max_prefix_len``: ``logprob_start_len`` under
``return_logprob``); ``overlap`` False (``--disable-overlap-schedule``) makes a stop finish insert
N-1 outputs; ``tlru`` keeps DEPTH and HISTORY per node (``_set_tlru_lens_and_raise_history``) and
``slru``/``tlru`` read their ``--radix-eviction-policy-config`` from ``Tree.ints``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from cache_models import engine_rules as rules

POLICY_CODES = {
    "lru": 0,
    "lfu": 1,
    "fifo": 2,
    "mru": 3,
    "filo": 4,
    "priority": 5,
    "slru": 6,
    "tlru": 7,
}
LRU, LFU, FIFO, MRU, FILO, BY_PRIORITY, SLRU, TLRU = range(8)
NO_EVICTION = -1  # an unbounded pool: no eviction heap at all
ANCESTOR_STAMP_STEP = 0.00001
ROOT = 0
EMPTY, TOMB = -1, -2
ROOT_PRIORITY = -(2**63 - 1)
INITIAL_ROWS = 1024
INITIAL_ARENA = 1 << 16  # tokens
COUNTERS = ("evicted_tokens", "inserted_tokens", "node_splits", "rejected")

# Columns of Tree.nodes. VERSION is the node's current heap version, -1 for an unused row.
PARENT, N_CHILDREN, KEY_START, KEY_LEN, NAMESPACE, LOCK_REF, HIT_COUNT, PRIORITY, VERSION = range(9)
DEPTH, HISTORY = 9, 10  # tlru: tokens from the root through the node; the branch's deepest depth
KEY_TOKENS = 11  # the tokens the key stands for (KEY_LEN for tokens, its runs' weights for runs)
N_NODE_COLUMNS = 12
# Columns of Tree.times (SGLang's logical clock).
LAST_ACCESS, CREATION = 0, 1
# Columns of Tree.table (the child map) and Tree.heap (node and version are exact as floats).
SLOT_NODE, SLOT_HASH = 0, 1
ENTRY_KEY, ENTRY_TIE, ENTRY_NODE, ENTRY_VERSION = 0, 1, 2, 3
# Slots of Tree.ints.
FREE_TOP, ARENA_TOP, EVICTABLE, PROTECTED, POOL_FREE, HEAP_SIZE, TABLE_FILL = range(7)
SPLITS, EVICTED, PASSES, LAST_VERSION, CLOCK = 7, 8, 9, 10, 11
SLRU_THRESHOLD, TLRU_TAIL, N_INTS = 12, 13, 14  # the policy's parameters
FREE_STACK = N_INTS  # Tree.ints[FREE_STACK + k]: the stack of unused rows, FREE_TOP of them

_FNV_OFFSET = -3750763034362895579  # 0xcbf29ce484222325 as int64
_FNV_PRIME = 1099511628211


class Tree(NamedTuple):
    """The radix tree, the pool's free count and the eviction heap, as arrays."""

    nodes: np.ndarray  # int64[rows, N_NODE_COLUMNS]
    times: np.ndarray  # float64[rows, 2]: last access, creation
    arena: np.ndarray  # int32 tokens
    table: np.ndarray  # int64[slots, 2]: node (or EMPTY / TOMB), hash
    heap: np.ndarray  # float64[entries, 4]: policy key, last access (the tie-break), node, version
    ints: np.ndarray  # int64 scalars (see the slot names above), then the stack of unused rows


def new_tree(n_rows: int, arena_tokens: int, pool_tokens: int) -> Tree:
    """An empty tree with room for ``n_rows`` nodes (the root included)."""
    n_rows = max(n_rows, 16)
    table_size = 1 << int(4 * n_rows - 1).bit_length()
    tree = Tree(
        nodes=np.zeros((n_rows, N_NODE_COLUMNS), np.int64),
        times=np.zeros((n_rows, 2), np.float64),
        arena=np.zeros(max(arena_tokens, 16), np.int32),
        table=np.full((table_size, 2), EMPTY, np.int64),
        heap=np.zeros((2 * n_rows + 2, 4), np.float64),
        ints=np.zeros(FREE_STACK + n_rows, np.int64),
    )
    tree.nodes[:, VERSION] = -1
    tree.nodes[ROOT, PARENT] = -1
    tree.nodes[ROOT, LOCK_REF] = 1
    tree.nodes[ROOT, PRIORITY] = ROOT_PRIORITY
    tree.nodes[ROOT, VERSION] = 0
    tree.ints[FREE_STACK:] = np.arange(n_rows - 1, -1, -1)
    tree.ints[FREE_TOP] = n_rows - 1  # the root is the last on the stack, taken
    tree.ints[POOL_FREE] = pool_tokens
    return tree


def grown(tree: Tree, n_rows: int, arena_tokens: int, page_size: int, policy: int) -> Tree:
    """A copy of ``tree`` with at least ``n_rows`` rows and a compacted arena of
    ``arena_tokens``; the child map and the heap are rebuilt."""
    old = len(tree.nodes)
    n_rows = max(n_rows, old)
    bigger = new_tree(n_rows, arena_tokens, 0)
    bigger.nodes[:old] = tree.nodes
    bigger.times[:old] = tree.times
    top = int(tree.ints[FREE_TOP])
    stack = bigger.ints[FREE_STACK:]
    stack[: n_rows - old] = np.arange(n_rows - 1, old - 1, -1)
    stack[n_rows - old : n_rows - old + top] = tree.ints[FREE_STACK : FREE_STACK + top]
    bigger.ints[:FREE_STACK] = tree.ints[:FREE_STACK]
    bigger.ints[FREE_TOP] = top + n_rows - old
    _compact_arena(bigger, tree.arena)
    _rehash(bigger.table, bigger.nodes, bigger.arena, bigger.ints, page_size)
    _rebuild_heap(bigger, policy)
    return bigger


# -- node rows -------------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _tick(t: Tree) -> float:
    now = t.ints[CLOCK]
    t.ints[CLOCK] = now + 1
    return float(now)


@njit(cache=True, error_model="numpy")
def _new_node(
    t: Tree, parent: int, ns: int, start: int, length: int, tokens: int, priority: int
) -> int:
    top = t.ints[FREE_TOP] - 1
    t.ints[FREE_TOP] = top
    n = t.ints[FREE_STACK + top]
    t.nodes[n, PARENT] = parent
    t.nodes[n, N_CHILDREN] = 0
    t.nodes[n, KEY_START] = start
    t.nodes[n, KEY_LEN] = length
    t.nodes[n, KEY_TOKENS] = tokens
    t.nodes[n, NAMESPACE] = ns
    t.nodes[n, LOCK_REF] = 0
    t.nodes[n, HIT_COUNT] = 0
    t.nodes[n, PRIORITY] = priority
    t.times[n, LAST_ACCESS] = _tick(t)
    t.times[n, CREATION] = _tick(t)
    t.nodes[n, VERSION] = 0
    return n


@njit(cache=True, error_model="numpy", inline="always")
def _free_node(t: Tree, n: int) -> None:
    t.nodes[n, VERSION] = -1
    t.ints[FREE_STACK + t.ints[FREE_TOP]] = n
    t.ints[FREE_TOP] += 1


# -- child map ------------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _page_hash(parent: int, ns: int, tokens: np.ndarray, off: int, page_size: int) -> int:
    h = np.int64(_FNV_OFFSET)
    h = (h ^ np.int64(parent)) * np.int64(_FNV_PRIME)
    h = (h ^ np.int64(ns)) * np.int64(_FNV_PRIME)
    for j in range(page_size):
        h = (h ^ np.int64(tokens[off + j])) * np.int64(_FNV_PRIME)
    return h ^ (h >> np.int64(29))


@njit(cache=True, error_model="numpy", inline="always")
def _node_hash(nodes: np.ndarray, arena: np.ndarray, n: int, page_size: int) -> int:
    return _page_hash(nodes[n, PARENT], nodes[n, NAMESPACE], arena, nodes[n, KEY_START], page_size)


@njit(cache=True, error_model="numpy", inline="always")
def _find_child(
    table: np.ndarray,
    nodes: np.ndarray,
    arena: np.ndarray,
    parent: int,
    ns: int,
    tokens: np.ndarray,
    off: int,
    page_size: int,
) -> int:
    """The child of ``parent`` whose key starts with tokens[off : off + page_size], else -1
    (it takes the three arrays it reads, not the tree; inlined, with ``_page_hash``: a call
    would count references to every array it is passed, atomically, once per node walked,
    which took most of the replay's time)."""
    h = _page_hash(parent, ns, tokens, off, page_size)
    mask = len(table) - 1
    s = h & mask
    while True:
        n = table[s, SLOT_NODE]
        if n == EMPTY:
            return -1
        if (
            n >= 0
            and table[s, SLOT_HASH] == h
            and nodes[n, PARENT] == parent
            and nodes[n, NAMESPACE] == ns
        ):
            start = nodes[n, KEY_START]
            same = True
            for j in range(page_size):
                if arena[start + j] != tokens[off + j]:
                    same = False
                    break
            if same:
                return n
        s = (s + 1) & mask


@njit(cache=True, error_model="numpy")
def _slot_of(table: np.ndarray, nodes: np.ndarray, arena: np.ndarray, n: int, ps: int) -> int:
    mask = len(table) - 1
    s = _node_hash(nodes, arena, n, ps) & mask
    while table[s, SLOT_NODE] != n:
        s = (s + 1) & mask
    return s


@njit(cache=True, error_model="numpy")
def _add_child(
    table: np.ndarray, nodes: np.ndarray, arena: np.ndarray, ints: np.ndarray, n: int, ps: int
) -> None:
    """Map the live node ``n`` under its parent and first page (the child map's helpers take
    the arrays they use, not the tree: a call counts references to every array it is passed)."""
    if 2 * (ints[TABLE_FILL] + 1) > len(table):
        # maps every live node, n included: adding it again would leave a second slot, which
        # outlives its eviction and matches a dead row
        _rehash(table, nodes, arena, ints, ps)
        return
    h = _node_hash(nodes, arena, n, ps)
    mask = len(table) - 1
    s = h & mask
    while table[s, SLOT_NODE] >= 0:
        s = (s + 1) & mask
    if table[s, SLOT_NODE] == EMPTY:
        ints[TABLE_FILL] += 1
    table[s, SLOT_NODE] = n
    table[s, SLOT_HASH] = h


@njit(cache=True, error_model="numpy")
def _rehash(
    table: np.ndarray, nodes: np.ndarray, arena: np.ndarray, ints: np.ndarray, ps: int
) -> None:
    """Rebuild the child map without tombstones (same size)."""
    table[:, SLOT_NODE] = EMPTY
    ints[TABLE_FILL] = 0
    mask = len(table) - 1
    for n in range(1, len(nodes)):
        if nodes[n, VERSION] >= 0:
            h = _node_hash(nodes, arena, n, ps)
            s = h & mask
            while table[s, SLOT_NODE] != EMPTY:
                s = (s + 1) & mask
            table[s, SLOT_NODE] = n
            table[s, SLOT_HASH] = h
            ints[TABLE_FILL] += 1


# -- eviction heap ---------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _less(t: Tree, a: int, b: int) -> bool:
    h = t.heap
    if h[a, ENTRY_KEY] != h[b, ENTRY_KEY]:
        return h[a, ENTRY_KEY] < h[b, ENTRY_KEY]
    if h[a, ENTRY_TIE] != h[b, ENTRY_TIE]:
        return h[a, ENTRY_TIE] < h[b, ENTRY_TIE]
    return h[a, ENTRY_NODE] < h[b, ENTRY_NODE]


@njit(cache=True, error_model="numpy", inline="always")
def _swap(t: Tree, a: int, b: int) -> None:
    for c in range(4):
        t.heap[a, c], t.heap[b, c] = t.heap[b, c], t.heap[a, c]


@njit(cache=True, error_model="numpy")
def _sift_down(t: Tree, i: int) -> None:
    size = t.ints[HEAP_SIZE]
    while True:
        smallest, left = i, 2 * i + 1
        if left < size and _less(t, left, smallest):
            smallest = left
        if left + 1 < size and _less(t, left + 1, smallest):
            smallest = left + 1
        if smallest == i:
            return
        _swap(t, i, smallest)
        i = smallest


@njit(cache=True, error_model="numpy", inline="always")
def _eviction_key(t: Tree, n: int, policy: int) -> tuple[float, float]:
    """The policy's sort key (evict_policy.py); ties fall back to the last access time."""
    lat = t.times[n, LAST_ACCESS]
    if policy == LFU:
        return float(t.nodes[n, HIT_COUNT]), lat
    if policy == FIFO:
        return t.times[n, CREATION], lat
    if policy == MRU:
        return -lat, lat
    if policy == FILO:
        return -t.times[n, CREATION], lat
    if policy == BY_PRIORITY:
        return float(t.nodes[n, PRIORITY]), lat
    if policy == SLRU:
        return (1.0 if t.nodes[n, HIT_COUNT] >= t.ints[SLRU_THRESHOLD] else 0.0), lat
    if policy == TLRU:  # TLRUStrategy: tail-safe nodes (-1) go first, then LRU
        budget = max(t.nodes[n, HISTORY] - t.ints[TLRU_TAIL], 0)
        return (-1.0 if t.nodes[n, DEPTH] - t.nodes[n, KEY_TOKENS] >= budget else 0.0), lat
    return lat, lat


@njit(cache=True, error_model="numpy", inline="always")
def _is_evictable_leaf(t: Tree, n: int) -> bool:
    return n != ROOT and t.nodes[n, LOCK_REF] == 0 and t.nodes[n, N_CHILDREN] == 0


@njit(cache=True, error_model="numpy")
def _push(t: Tree, n: int, policy: int) -> None:
    if t.ints[HEAP_SIZE] == len(t.heap):
        _rebuild_heap(t, policy)
        return  # the rebuild pushed every evictable leaf, n included
    i = t.ints[HEAP_SIZE]
    t.ints[HEAP_SIZE] = i + 1
    t.heap[i, ENTRY_KEY], t.heap[i, ENTRY_TIE] = _eviction_key(t, n, policy)
    t.heap[i, ENTRY_NODE] = n
    t.heap[i, ENTRY_VERSION] = t.nodes[n, VERSION]
    while i > 0:
        up = (i - 1) // 2
        if not _less(t, i, up):
            break
        _swap(t, i, up)
        i = up


@njit(cache=True, error_model="numpy")
def _rebuild_heap(t: Tree, policy: int) -> None:
    """Drop stale entries: one fresh entry per evictable leaf."""
    size = 0
    t.ints[HEAP_SIZE] = 0
    if policy == NO_EVICTION:
        return
    for n in range(1, len(t.nodes)):
        if t.nodes[n, VERSION] >= 0 and _is_evictable_leaf(t, n):
            t.heap[size, ENTRY_KEY], t.heap[size, ENTRY_TIE] = _eviction_key(t, n, policy)
            t.heap[size, ENTRY_NODE] = n
            t.heap[size, ENTRY_VERSION] = t.nodes[n, VERSION]
            size += 1
    t.ints[HEAP_SIZE] = size
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(t, i)


@njit(cache=True, error_model="numpy")
def _refresh(t: Tree, n: int, policy: int) -> None:
    """The node's key or evictability changed: retire its heap entry, push a new one if due.
    Callers skip it without eviction (``NO_EVICTION`` keeps no heap, so nothing to retire)."""
    if n == ROOT:
        return
    t.ints[LAST_VERSION] += 1
    t.nodes[n, VERSION] = t.ints[LAST_VERSION]
    if _is_evictable_leaf(t, n):
        _push(t, n, policy)


@njit(cache=True, error_model="numpy")
def _pop_leaf(t: Tree) -> int:
    while t.ints[HEAP_SIZE] > 0:
        n, ver = np.int64(t.heap[0, ENTRY_NODE]), np.int64(t.heap[0, ENTRY_VERSION])
        last = t.ints[HEAP_SIZE] - 1
        _swap(t, np.int64(0), last)
        t.ints[HEAP_SIZE] = last
        _sift_down(t, np.int64(0))
        if t.nodes[n, VERSION] == ver:
            return n
    return -1


# -- tree operations ------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _copy(dst: np.ndarray, at: int, src: np.ndarray, start: int, length: int) -> None:
    """dst[at : at + length] = src[start : start + length], element by element: a slice
    assignment between two arrays that may overlap allocates a temporary copy first."""
    for j in range(length):
        dst[at + j] = src[start + j]


@njit(cache=True, error_model="numpy", inline="always")
def _at(cum: np.ndarray, k: int) -> int:
    """The token position of entry position ``k`` in the request's buffer: ``cum[k]`` (its
    entries' weights summed) for runs, ``k`` itself for tokens (``cum`` empty)."""
    if len(cum) == 0:
        return k
    return cum[k]


@njit(cache=True, error_model="numpy", inline="always")
def _entry_at(cum: np.ndarray, n_entries: int, position: int) -> int:
    """The entry position whose token position is ``position``, among the first ``n_entries``
    (``position`` itself for tokens); a position inside an entry breaks the run contract."""
    if len(cum) == 0:
        return position
    k = np.searchsorted(cum[: n_entries + 1], position)
    if k > n_entries or cum[k] != position:
        raise ValueError("a prefill chunk ends inside a run (run_table was not cut for it)")
    return k


@njit(cache=True, error_model="numpy")
def _run_positions(
    cum: np.ndarray,
    prompt_weights: np.ndarray,
    p0: int,
    p1: int,
    output_weights: np.ndarray,
    o0: int,
    o1: int,
) -> None:
    """``cum[k]``: the tokens of the request's first ``k`` entries (its prompt's, then its
    answer's)."""
    total, k = np.int64(0), 0
    cum[0] = 0
    for j in range(p0, p1):
        total += prompt_weights[j]
        k += 1
        cum[k] = total
    for j in range(o0, o1):
        total += output_weights[j]
        k += 1
        cum[k] = total


@njit(cache=True, error_model="numpy")
def _common_pages(t: Tree, n: int, tokens: np.ndarray, off: int, end: int, ps: int) -> int:
    start, limit = t.nodes[n, KEY_START], min(t.nodes[n, KEY_LEN], end - off)
    common = 0
    while common < limit and t.arena[start + common] == tokens[off + common]:
        common += 1
    return common // ps * ps


@njit(cache=True, error_model="numpy")
def _split(t: Tree, child: int, split_len: int, split_tokens: int, ps: int, policy: int) -> int:
    """Cut ``child`` after ``split_len`` entries (``split_tokens`` tokens); the new parent
    inherits its stats and slot."""
    slot = _slot_of(t.table, t.nodes, t.arena, child, ps)
    new = _new_node(
        t,
        t.nodes[child, PARENT],
        t.nodes[child, NAMESPACE],
        t.nodes[child, KEY_START],
        split_len,
        split_tokens,
        t.nodes[child, PRIORITY],
    )
    t.times[new, CREATION] = t.times[child, CREATION]
    t.nodes[new, HIT_COUNT] = t.nodes[child, HIT_COUNT]
    t.nodes[new, DEPTH] = t.nodes[t.nodes[child, PARENT], DEPTH] + split_tokens
    t.nodes[new, HISTORY] = t.nodes[child, HISTORY]
    t.nodes[new, LOCK_REF] = t.nodes[child, LOCK_REF]
    t.nodes[new, N_CHILDREN] = 1
    t.table[slot, SLOT_NODE] = new
    t.nodes[child, KEY_START] += split_len
    t.nodes[child, KEY_LEN] -= split_len
    t.nodes[child, KEY_TOKENS] -= split_tokens
    t.nodes[child, PARENT] = new
    _add_child(t.table, t.nodes, t.arena, t.ints, child, ps)
    t.times[child, LAST_ACCESS] = _tick(t)
    t.ints[SPLITS] += 1
    if policy != NO_EVICTION:
        _refresh(t, new, policy)
        _refresh(t, child, policy)
    return new


@njit(cache=True, error_model="numpy")
def _match(
    t: Tree, tokens: np.ndarray, cum: np.ndarray, length: int, ns: int, ps: int, policy: int
):
    """Longest cached prefix of tokens[:length] in whole pages (entries, for runs); stamps the
    path (match_prefix)."""
    length = length // ps * ps
    if length == 0:
        return 0, ROOT
    node, matched = np.int64(ROOT), np.int64(0)  # typed ints: one compiled version
    while matched < length:
        child = _find_child(t.table, t.nodes, t.arena, node, ns, tokens, matched, ps)
        if child < 0:
            break
        common = _common_pages(t, child, tokens, matched, length, ps)
        diverged = common < t.nodes[child, KEY_LEN]
        if diverged:
            split_tokens = _at(cum, matched + common) - _at(cum, matched)
            child = _split(t, child, common, split_tokens, ps, policy)
        matched += common
        node = child
        if diverged:
            break
    stamp = _tick(t)
    n = node
    while n >= 0:
        t.times[n, LAST_ACCESS] = stamp
        stamp -= ANCESTOR_STAMP_STEP
        if policy != NO_EVICTION:
            _refresh(t, n, policy)
        n = t.nodes[n, PARENT]
    return matched, node


@njit(cache=True, error_model="numpy")
def _insert(
    t: Tree,
    tokens: np.ndarray,
    cum: np.ndarray,
    length: int,
    ns: int,
    prev_prefix_len: int,
    inserted_len: int,
    priority: int,
    ps: int,
    policy: int,
):
    """Insert tokens[:length] (page-aligned; entries for runs, positions compare as entries);
    returns (last node, duplicate tokens, new leaf tokens)."""
    t.times[ROOT, LAST_ACCESS] = _tick(t)
    t.nodes[ROOT, PRIORITY] = max(t.nodes[ROOT, PRIORITY], priority)
    node, matched, duplicates = np.int64(ROOT), np.int64(0), np.int64(0)
    while matched < length:
        child = _find_child(t.table, t.nodes, t.arena, node, ns, tokens, matched, ps)
        if child < 0:
            break
        t.times[child, LAST_ACCESS] = _tick(t)
        if matched + t.nodes[child, KEY_LEN] <= prev_prefix_len:
            common = t.nodes[child, KEY_LEN]  # the caller's own locked path: no need to compare
        else:
            common = _common_pages(t, child, tokens, matched, length, ps)
        diverged = common < t.nodes[child, KEY_LEN]
        if diverged:
            split_tokens = _at(cum, matched + common) - _at(cum, matched)
            child = _split(t, child, common, split_tokens, ps, policy)
        t.nodes[child, PRIORITY] = max(t.nodes[child, PRIORITY], priority)
        unlocked = max(matched, prev_prefix_len)  # what lies past the caller's locked path
        if matched + common > unlocked:
            duplicates += _at(cum, matched + common) - _at(cum, unlocked)
        matched += common
        if matched > inserted_len:
            t.nodes[child, HIT_COUNT] += 1
        if policy != NO_EVICTION:
            _refresh(t, child, policy)
        node = child
        if diverged:
            break
    if matched == length:
        return node, duplicates, 0
    top = t.ints[ARENA_TOP]
    new_len = length - matched
    new_tokens = _at(cum, length) - _at(cum, matched)
    _copy(t.arena, top, tokens, matched, new_len)
    t.ints[ARENA_TOP] = top + new_len
    leaf = _new_node(t, node, ns, top, new_len, new_tokens, priority)
    depth = t.nodes[node, DEPTH] + new_tokens
    t.nodes[leaf, DEPTH] = depth
    t.nodes[leaf, HISTORY] = depth
    if policy == TLRU:  # raise the branch's high-water mark (only tlru reads it)
        up = node
        while up >= 0 and t.nodes[up, HISTORY] < depth:
            t.nodes[up, HISTORY] = depth
            up = t.nodes[up, PARENT]
    t.nodes[node, N_CHILDREN] += 1
    _add_child(t.table, t.nodes, t.arena, t.ints, leaf, ps)
    t.ints[EVICTABLE] += new_tokens
    if length > inserted_len:
        t.nodes[leaf, HIT_COUNT] += 1
    if policy != NO_EVICTION:
        _refresh(t, leaf, policy)
        _refresh(t, node, policy)
    return leaf, duplicates, new_tokens


@njit(cache=True, error_model="numpy")
def _lock(nodes: np.ndarray, ints: np.ndarray, n: int) -> None:
    """inc_lock_ref: lock the path from ``n`` up; the tokens of a node locked first move from the
    evictable to the protected size. Such a node stops being evictable: with eviction the caller
    then refreshes it (``_refresh_path(..., LOCKED_FIRST, ...)``). The lock walks take the two
    arrays they write, not the tree: a call counts references to every array it is passed."""
    while n != ROOT:
        if nodes[n, LOCK_REF] == 0:
            ints[EVICTABLE] -= nodes[n, KEY_TOKENS]
            ints[PROTECTED] += nodes[n, KEY_TOKENS]
        nodes[n, LOCK_REF] += 1
        n = nodes[n, PARENT]


@njit(cache=True, error_model="numpy")
def _unlock(nodes: np.ndarray, ints: np.ndarray, n: int) -> None:
    """dec_lock_ref: unlock the path from ``n`` up; a node unlocked last becomes evictable (the
    caller refreshes it with eviction: ``_refresh_path(..., UNLOCKED_LAST, ...)``)."""
    while n != ROOT:
        nodes[n, LOCK_REF] -= 1
        if nodes[n, LOCK_REF] == 0:
            ints[EVICTABLE] += nodes[n, KEY_TOKENS]
            ints[PROTECTED] -= nodes[n, KEY_TOKENS]
        n = nodes[n, PARENT]


LOCKED_FIRST, UNLOCKED_LAST = 1, 0  # a node's lock after a walk that changed its evictability


@njit(cache=True, error_model="numpy")
def _refresh_path(t: Tree, n: int, changed: int, policy: int) -> None:
    """Refresh the nodes on the path from ``n`` up whose evictability the lock walk just changed:
    locks move by one, so they are those whose lock is now ``changed``. Refreshing them after the
    walk, not during it, pushes the same heap entries (a node's eviction key does not read
    locks, and only the path's lowest node can be a leaf)."""
    while n != ROOT:
        if t.nodes[n, LOCK_REF] == changed:
            _refresh(t, n, policy)
        n = t.nodes[n, PARENT]


@njit(cache=True, error_model="numpy")
def _evict_to(t: Tree, need: int, bounded: bool, ps: int, policy: int) -> None:
    """evict_to_free_tokens: delete leaves, lowest key first, until ``need`` tokens are free."""
    if not bounded:
        return
    while t.ints[POOL_FREE] < need:
        leaf = _pop_leaf(t)
        if leaf < 0:
            return
        parent = t.nodes[leaf, PARENT]
        t.table[_slot_of(t.table, t.nodes, t.arena, leaf, ps), SLOT_NODE] = TOMB
        t.nodes[parent, N_CHILDREN] -= 1
        size = t.nodes[leaf, KEY_TOKENS]
        t.ints[EVICTABLE] -= size
        t.ints[POOL_FREE] += size
        t.ints[EVICTED] += size
        _free_node(t, leaf)
        if policy != NO_EVICTION:
            _refresh(t, parent, policy)


@njit(cache=True, error_model="numpy", inline="always")
def _take(t: Tree, tokens: int, bounded: bool) -> None:
    if bounded:
        t.ints[POOL_FREE] -= tokens


@njit(cache=True, error_model="numpy")
def _checkpoint(
    t: Tree,
    tokens: np.ndarray,
    cum: np.ndarray,
    up_to: int,
    prompt_len: int,
    ns: int,
    node: int,
    protected: int,
    inserted: int,
    priority: int,
    bounded: bool,
    ps: int,
    policy: int,
):
    """Insert tokens[:up_to] with the request's priority, free duplicates, split at the prompt
    (priority + 1), move the lock."""
    if up_to <= 0:
        return node, protected, inserted, 0
    length = up_to // ps * ps
    last, duplicates, new_tokens = _insert(
        t, tokens, cum, length, ns, protected, inserted, priority, ps, policy
    )
    _take(t, -duplicates, bounded)
    prompt_pages = prompt_len // ps * ps
    if 0 < prompt_pages < length:
        split = rules.sglang_split_priority(priority)
        _insert(t, tokens, cum, prompt_pages, ns, prompt_pages, prompt_pages, split, ps, policy)
    _unlock(t.nodes, t.ints, node)
    if policy != NO_EVICTION:
        _refresh_path(t, node, UNLOCKED_LAST, policy)
    _lock(t.nodes, t.ints, last)
    if policy != NO_EVICTION:
        _refresh_path(t, last, LOCKED_FIRST, policy)
    return last, length, max(inserted, length), new_tokens


@njit(cache=True, error_model="numpy")
def _alloc_extend(t: Tree, start: int, end: int, bounded: bool, ps: int, policy: int) -> None:
    if ps == 1:
        _evict_to(t, end - start, bounded, ps, policy)
        _take(t, end - start, bounded)
    else:
        _evict_to(t, end - start + ps, bounded, ps, policy)
        _take(t, ((end + ps - 1) // ps - (start + ps - 1) // ps) * ps, bounded)


@njit(cache=True, error_model="numpy")
def _decode(t: Tree, start: int, steps: int, bounded: bool, ps: int, policy: int) -> None:
    """``steps`` decode allocations; only the steps after a page was taken can evict."""
    if not bounded or steps == 0:
        return
    if ps == 1:
        left = steps
        while left > 0:
            _evict_to(t, np.int64(1), bounded, ps, policy)
            run = min(left, t.ints[POOL_FREE])
            t.ints[POOL_FREE] -= run
            left -= run
        return
    cur, end = start, start + steps
    while cur < end:
        _evict_to(t, ps, bounded, ps, policy)  # check_decode_mem, then the decode's own page
        if cur % ps == 0:
            t.ints[POOL_FREE] -= ps
            cur += 1
        else:
            cur = min(end, (cur // ps + 1) * ps)


@njit(cache=True, error_model="numpy", inline="always")
def nodes_needed(prompt_len: int, chunk: int) -> int:
    chunks = prompt_len // chunk + 2 if chunk > 0 else 1
    return 2 + 3 * (chunks + 2)


@njit(cache=True, error_model="numpy", nogil=True)
def replay_sequential(
    t: Tree,
    prompt_tokens: np.ndarray,
    prompt_offsets: np.ndarray,
    output_tokens: np.ndarray,
    output_offsets: np.ndarray,
    prompt_weights: np.ndarray,
    output_weights: np.ndarray,
    namespace: np.ndarray,
    stop_finish: np.ndarray,
    priority: np.ndarray,
    hit_limit: np.ndarray,
    overlap: bool,
    first: int,
    bounded: bool,
    capacity_pages: int,
    page_size: int,
    chunk: int,
    refresh: bool,
    policy: int,
    hit: np.ndarray,
    evicted: np.ndarray,
    inserted_tokens: np.ndarray,
    splits: np.ndarray,
    rejected: np.ndarray,
    buf: np.ndarray,
    cum: np.ndarray,
) -> int:
    """Replay requests from ``first`` on, one after another; returns where it stopped (the
    number of requests when done, else a request that needs more node rows or arena).

    Runs (``cum`` holds room for the longest request's entries + 1; else it is empty): the
    "tokens" are run ids, each entry stands for its weight in tokens, and the caller
    (``sglang_radix._run_inputs``) checked what this relies on: page size 1, no hit limit,
    and one-token last entries where the match limit (L - 1) and a decode that leaves the last
    output out (L + N - 1) cut. A prefill chunk's end must fall between entries (``_entry_at``
    raises otherwise)."""
    ps = page_size
    runs = len(cum) > 0
    n_requests = len(prompt_offsets) - 1
    for i in range(first, n_requests):
        p0, p1 = prompt_offsets[i], prompt_offsets[i + 1]
        o0, o1 = output_offsets[i], output_offsets[i + 1]
        prompt_len, n_out = p1 - p0, o1 - o0  # entries (tokens, unless runs)
        if runs:
            _run_positions(cum, prompt_weights, p0, p1, output_weights, o0, o1)
        prompt_tokens_in = _at(cum, prompt_len)
        output_tokens_in = _at(cum, prompt_len + n_out) - prompt_tokens_in
        steps = rules.sglang_kv_steps(output_tokens_in, stop_finish[i], overlap)
        final_tokens = prompt_tokens_in + steps
        final_len = prompt_len + n_out - (output_tokens_in - steps)  # N or N - 1 outputs
        if rules.never_fits(final_tokens, ps, capacity_pages if bounded else -1):
            rejected[i] = 1
            continue
        room = len(t.arena) - t.ints[ARENA_TOP]
        if t.ints[FREE_TOP] < nodes_needed(prompt_tokens_in, chunk) or room < prompt_len + n_out:
            return i
        _copy(buf, 0, prompt_tokens, p0, prompt_len)
        _copy(buf, prompt_len, output_tokens, o0, n_out)
        ns = namespace[i]
        evicted_before, splits_before = t.ints[EVICTED], t.ints[SPLITS]
        if refresh:
            if t.ints[PASSES] % 32 == 0:
                _match(t, buf, cum, prompt_len, ns, ps, policy)
            t.ints[PASSES] += 1
        # L - 1 entries for runs (no hit limit; the prompt's last entry is one token)
        limit = rules.sglang_match_limit(prompt_len, hit_limit[i])
        matched, node = _match(t, buf, cum, limit, ns, ps, policy)
        prio = priority[i]
        hit[i] = _at(cum, matched)
        _lock(t.nodes, t.ints, node)
        if policy != NO_EVICTION:
            _refresh_path(t, node, LOCKED_FIRST, policy)
        protected, inserted, new_tokens = matched, np.int64(0), np.int64(0)
        start, is_first = matched, True
        while True:  # prefill chunks (PrefillAdder), cut in tokens
            end_at = rules.chunk_end(_at(cum, start), prompt_tokens_in, chunk, ps, is_first)
            end = _entry_at(cum, prompt_len, end_at)
            is_first = False
            if bounded:  # an unbounded pool allocates without a call (no refcounting)
                _alloc_extend(t, _at(cum, start), _at(cum, end), bounded, ps, policy)
            if end >= prompt_len:
                break
            node, protected, inserted, added = _checkpoint(
                t,
                buf,
                cum,
                end,
                prompt_len,
                ns,
                node,
                protected,
                inserted,
                prio,
                bounded,
                ps,
                policy,
            )
            new_tokens += added
            start = end
        if steps > 0:
            node, protected, inserted, added = _checkpoint(
                t,
                buf,
                cum,
                prompt_len,
                prompt_len,
                ns,
                node,
                protected,
                inserted,
                prio,
                bounded,
                ps,
                policy,
            )
            new_tokens += added
        if bounded:
            _decode(t, prompt_tokens_in, steps, bounded, ps, policy)
        node, protected, inserted, added = _checkpoint(
            t,
            buf,
            cum,
            final_len,
            prompt_len,
            ns,
            node,
            protected,
            inserted,
            prio,
            bounded,
            ps,
            policy,
        )
        new_tokens += added
        _take(t, -((final_tokens + ps - 1) // ps - _at(cum, protected) // ps) * ps, bounded)
        _unlock(t.nodes, t.ints, node)
        if policy != NO_EVICTION:
            _refresh_path(t, node, UNLOCKED_LAST, policy)
        evicted[i] = t.ints[EVICTED] - evicted_before
        splits[i] = t.ints[SPLITS] - splits_before
        inserted_tokens[i] = new_tokens
    return n_requests


@njit(cache=True, error_model="numpy")
def _compact_arena(t: Tree, old_arena: np.ndarray) -> None:
    """Copy every live node's tokens from ``old_arena`` into ``t.arena``, back to back."""
    top = 0
    for n in range(1, len(t.nodes)):
        if t.nodes[n, VERSION] >= 0:
            length = t.nodes[n, KEY_LEN]
            start = t.nodes[n, KEY_START]
            t.arena[top : top + length] = old_arena[start : start + length]
            t.nodes[n, KEY_START] = top
            top += length
    t.ints[ARENA_TOP] = top
