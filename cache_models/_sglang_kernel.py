"""Compiled sequential replay of SGLang's radix cache: ``_sglang_reference`` on flat arrays.

Nodes are rows of arrays (no Python object per node); a node's tokens are a span of one token
arena. Children are found through an open-addressing map keyed by (parent, namespace, first page).
Evictable leaves sit in a persistent binary heap with lazy deletion: every change to a node's key
or evictability gives it a new version, and only the entry carrying the current version counts.
The replay stops before a request when node rows or arena room run short; the caller grows them
and resumes, so memory follows the live tree and the pool, not the log.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from cache_models.config import SglangConfig
from cache_models.workload import Workload

POLICY_CODES = {"lru": 0, "lfu": 1, "fifo": 2, "mru": 3, "filo": 4, "priority": 5, "slru": 6}
LRU, LFU, FIFO, MRU, FILO, PRIORITY, SLRU = range(7)
SLRU_PROTECTED_HITS = 2
ANCESTOR_STAMP_STEP = 0.00001
ROOT = 0
EMPTY, TOMB = -1, -2
ROOT_PRIORITY = -(2**63 - 1)

# Slots of Tree.ints.
FREE_TOP, ARENA_TOP, EVICTABLE, PROTECTED, POOL_FREE, HEAP_SIZE, HT_FILL = range(7)
SPLITS, EVICTED, PASSES, VERSION, N_INTS = 7, 8, 9, 10, 11

_FNV_OFFSET = -3750763034362895579  # 0xcbf29ce484222325 as int64
_FNV_PRIME = 1099511628211


class Tree(NamedTuple):
    """The radix tree, the pool's free count and the eviction heap, as arrays."""

    parent: np.ndarray  # int32 per node; -1 for the root
    n_children: np.ndarray  # int32
    key_start: np.ndarray  # int64: where the node's tokens start in ``arena``
    key_len: np.ndarray  # int64
    namespace: np.ndarray  # int32
    lock_ref: np.ndarray  # int32
    last_access: np.ndarray  # float64 (SGLang's logical clock)
    creation: np.ndarray  # float64
    hit_count: np.ndarray  # int64
    priority: np.ndarray  # int64
    version: np.ndarray  # int64: the node's current heap version (-1: not in use)
    free_ids: np.ndarray  # int32 stack of unused rows
    arena: np.ndarray  # int32 tokens
    ht_node: np.ndarray  # int32 child-map slots: node, EMPTY or TOMB
    ht_hash: np.ndarray  # int64
    heap_k1: np.ndarray  # float64 policy key
    heap_k2: np.ndarray  # float64 last access (the tie-break)
    heap_node: np.ndarray  # int32
    heap_ver: np.ndarray  # int64
    ints: np.ndarray  # int64 scalars, see the slot names above
    clock: np.ndarray  # float64[1]


def new_tree(n_nodes: int, arena_tokens: int, pool_tokens: int) -> Tree:
    """An empty tree with room for ``n_nodes`` rows (the root included)."""
    n_nodes = max(n_nodes, 16)
    ht_size = 1 << int(4 * n_nodes - 1).bit_length()
    tree = Tree(
        parent=np.full(n_nodes, -1, np.int32),
        n_children=np.zeros(n_nodes, np.int32),
        key_start=np.zeros(n_nodes, np.int64),
        key_len=np.zeros(n_nodes, np.int64),
        namespace=np.zeros(n_nodes, np.int32),
        lock_ref=np.zeros(n_nodes, np.int32),
        last_access=np.zeros(n_nodes, np.float64),
        creation=np.zeros(n_nodes, np.float64),
        hit_count=np.zeros(n_nodes, np.int64),
        priority=np.zeros(n_nodes, np.int64),
        version=np.full(n_nodes, -1, np.int64),
        free_ids=np.arange(n_nodes - 1, 0, -1, dtype=np.int32),
        arena=np.zeros(max(arena_tokens, 16), np.int32),
        ht_node=np.full(ht_size, EMPTY, np.int32),
        ht_hash=np.zeros(ht_size, np.int64),
        heap_k1=np.zeros(2 * n_nodes + 2, np.float64),
        heap_k2=np.zeros(2 * n_nodes + 2, np.float64),
        heap_node=np.zeros(2 * n_nodes + 2, np.int32),
        heap_ver=np.zeros(2 * n_nodes + 2, np.int64),
        ints=np.zeros(N_INTS, np.int64),
        clock=np.zeros(1, np.float64),
    )
    tree.ints[FREE_TOP] = n_nodes - 1
    tree.ints[POOL_FREE] = pool_tokens
    tree.lock_ref[ROOT] = 1
    tree.priority[ROOT] = ROOT_PRIORITY
    tree.version[ROOT] = 0
    return tree


def grown(tree: Tree, n_nodes: int, arena_tokens: int, page_size: int, policy: int) -> Tree:
    """A copy of ``tree`` with at least ``n_nodes`` rows and a compacted arena of
    ``arena_tokens``; the child map and the heap are rebuilt."""
    old = len(tree.parent)
    n_nodes = max(n_nodes, old)
    bigger = new_tree(n_nodes, arena_tokens, 0)
    for name in Tree._fields[:11]:
        getattr(bigger, name)[:old] = getattr(tree, name)
    top = int(tree.ints[FREE_TOP])
    bigger.free_ids[:top] = tree.free_ids[:top]
    bigger.free_ids[top : top + n_nodes - old] = np.arange(n_nodes - 1, old - 1, -1)
    bigger.ints[:] = tree.ints
    bigger.ints[FREE_TOP] = top + n_nodes - old
    bigger.clock[:] = tree.clock
    _compact_arena(bigger, tree.arena)
    _rehash(bigger, page_size)
    _rebuild_heap(bigger, policy)
    return bigger


# -- node rows -------------------------------------------------------------------------------------
@njit(cache=True)
def _tick(t: Tree) -> float:
    now = t.clock[0]
    t.clock[0] = now + 1.0
    return now


@njit(cache=True)
def _new_node(t: Tree, parent: int, ns: int, start: int, length: int, priority: int) -> int:
    top = t.ints[FREE_TOP] - 1
    t.ints[FREE_TOP] = top
    n = t.free_ids[top]
    t.parent[n] = parent
    t.n_children[n] = 0
    t.key_start[n] = start
    t.key_len[n] = length
    t.namespace[n] = ns
    t.lock_ref[n] = 0
    t.hit_count[n] = 0
    t.priority[n] = priority
    t.last_access[n] = _tick(t)
    t.creation[n] = _tick(t)
    t.version[n] = 0
    return n


@njit(cache=True)
def _free_node(t: Tree, n: int) -> None:
    t.version[n] = -1
    t.free_ids[t.ints[FREE_TOP]] = n
    t.ints[FREE_TOP] += 1


# -- child map ------------------------------------------------------------------------------------
@njit(cache=True)
def _page_hash(parent: int, ns: int, tokens: np.ndarray, off: int, page_size: int) -> int:
    h = np.int64(_FNV_OFFSET)
    h = (h ^ np.int64(parent)) * np.int64(_FNV_PRIME)
    h = (h ^ np.int64(ns)) * np.int64(_FNV_PRIME)
    for j in range(page_size):
        h = (h ^ np.int64(tokens[off + j])) * np.int64(_FNV_PRIME)
    return h ^ (h >> np.int64(29))


@njit(cache=True)
def _node_hash(t: Tree, n: int, page_size: int) -> int:
    return _page_hash(t.parent[n], t.namespace[n], t.arena, t.key_start[n], page_size)


@njit(cache=True)
def _find_child(t: Tree, parent: int, ns: int, tokens: np.ndarray, off: int, page_size: int) -> int:
    h = _page_hash(parent, ns, tokens, off, page_size)
    mask = len(t.ht_node) - 1
    s = h & mask
    while True:
        n = t.ht_node[s]
        if n == EMPTY:
            return -1
        if n >= 0 and t.ht_hash[s] == h and t.parent[n] == parent and t.namespace[n] == ns:
            start = t.key_start[n]
            same = True
            for j in range(page_size):
                if t.arena[start + j] != tokens[off + j]:
                    same = False
                    break
            if same:
                return n
        s = (s + 1) & mask


@njit(cache=True)
def _slot_of(t: Tree, n: int, page_size: int) -> int:
    mask = len(t.ht_node) - 1
    s = _node_hash(t, n, page_size) & mask
    while t.ht_node[s] != n:
        s = (s + 1) & mask
    return s


@njit(cache=True)
def _add_child(t: Tree, n: int, page_size: int) -> None:
    if 2 * (t.ints[HT_FILL] + 1) > len(t.ht_node):
        _rehash(t, page_size)
    h = _node_hash(t, n, page_size)
    mask = len(t.ht_node) - 1
    s = h & mask
    while t.ht_node[s] >= 0:
        s = (s + 1) & mask
    if t.ht_node[s] == EMPTY:
        t.ints[HT_FILL] += 1
    t.ht_node[s] = n
    t.ht_hash[s] = h


@njit(cache=True)
def _rehash(t: Tree, page_size: int) -> None:
    """Rebuild the child map without tombstones (same size)."""
    t.ht_node[:] = EMPTY
    t.ints[HT_FILL] = 0
    mask = len(t.ht_node) - 1
    for n in range(1, len(t.parent)):
        if t.version[n] >= 0:
            h = _node_hash(t, n, page_size)
            s = h & mask
            while t.ht_node[s] != EMPTY:
                s = (s + 1) & mask
            t.ht_node[s] = n
            t.ht_hash[s] = h
            t.ints[HT_FILL] += 1


# -- eviction heap ---------------------------------------------------------------------------------
@njit(cache=True)
def _less(t: Tree, a: int, b: int) -> bool:
    if t.heap_k1[a] != t.heap_k1[b]:
        return t.heap_k1[a] < t.heap_k1[b]
    if t.heap_k2[a] != t.heap_k2[b]:
        return t.heap_k2[a] < t.heap_k2[b]
    return t.heap_node[a] < t.heap_node[b]


@njit(cache=True)
def _swap(t: Tree, a: int, b: int) -> None:
    t.heap_k1[a], t.heap_k1[b] = t.heap_k1[b], t.heap_k1[a]
    t.heap_k2[a], t.heap_k2[b] = t.heap_k2[b], t.heap_k2[a]
    t.heap_node[a], t.heap_node[b] = t.heap_node[b], t.heap_node[a]
    t.heap_ver[a], t.heap_ver[b] = t.heap_ver[b], t.heap_ver[a]


@njit(cache=True)
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


@njit(cache=True)
def _eviction_key(t: Tree, n: int, policy: int) -> tuple[float, float]:
    """The policy's sort key (evict_policy.py); ties fall back to the last access time."""
    lat = t.last_access[n]
    if policy == LFU:
        return float(t.hit_count[n]), lat
    if policy == FIFO:
        return t.creation[n], lat
    if policy == MRU:
        return -lat, lat
    if policy == FILO:
        return -t.creation[n], lat
    if policy == PRIORITY:
        return float(t.priority[n]), lat
    if policy == SLRU:
        return (1.0 if t.hit_count[n] >= SLRU_PROTECTED_HITS else 0.0), lat
    return lat, lat


@njit(cache=True)
def _is_evictable_leaf(t: Tree, n: int) -> bool:
    return n != ROOT and t.lock_ref[n] == 0 and t.n_children[n] == 0


@njit(cache=True)
def _push(t: Tree, n: int, policy: int) -> None:
    if t.ints[HEAP_SIZE] == len(t.heap_node):
        _rebuild_heap(t, policy)
        return  # the rebuild pushed every evictable leaf, n included
    i = t.ints[HEAP_SIZE]
    t.ints[HEAP_SIZE] = i + 1
    t.heap_k1[i], t.heap_k2[i] = _eviction_key(t, n, policy)
    t.heap_node[i] = n
    t.heap_ver[i] = t.version[n]
    while i > 0:
        up = (i - 1) // 2
        if not _less(t, i, up):
            break
        _swap(t, i, up)
        i = up


@njit(cache=True)
def _rebuild_heap(t: Tree, policy: int) -> None:
    """Drop stale entries: one fresh entry per evictable leaf."""
    size = 0
    for n in range(1, len(t.parent)):
        if t.version[n] >= 0 and _is_evictable_leaf(t, n):
            t.heap_k1[size], t.heap_k2[size] = _eviction_key(t, n, policy)
            t.heap_node[size] = n
            t.heap_ver[size] = t.version[n]
            size += 1
    t.ints[HEAP_SIZE] = size
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(t, i)


@njit(cache=True)
def _refresh(t: Tree, n: int, policy: int) -> None:
    """The node's key or evictability changed: retire its heap entry, push a new one if due."""
    if n == ROOT:
        return
    t.ints[VERSION] += 1
    t.version[n] = t.ints[VERSION]
    if _is_evictable_leaf(t, n):
        _push(t, n, policy)


@njit(cache=True)
def _pop_leaf(t: Tree) -> int:
    while t.ints[HEAP_SIZE] > 0:
        n, ver = t.heap_node[0], t.heap_ver[0]
        last = t.ints[HEAP_SIZE] - 1
        _swap(t, 0, last)
        t.ints[HEAP_SIZE] = last
        _sift_down(t, 0)
        if t.version[n] == ver:
            return n
    return -1


# -- tree operations ------------------------------------------------------------------------------
@njit(cache=True)
def _common_pages(t: Tree, n: int, tokens: np.ndarray, off: int, end: int, ps: int) -> int:
    start, limit = t.key_start[n], min(t.key_len[n], end - off)
    common = 0
    while common < limit and t.arena[start + common] == tokens[off + common]:
        common += 1
    return common // ps * ps


@njit(cache=True)
def _split(t: Tree, child: int, split_len: int, ps: int, policy: int) -> int:
    """Cut ``child`` after ``split_len`` tokens; the new parent inherits its stats and slot."""
    slot = _slot_of(t, child, ps)
    new = _new_node(
        t, t.parent[child], t.namespace[child], t.key_start[child], split_len, t.priority[child]
    )
    t.creation[new] = t.creation[child]
    t.hit_count[new] = t.hit_count[child]
    t.lock_ref[new] = t.lock_ref[child]
    t.n_children[new] = 1
    t.ht_node[slot] = new
    t.key_start[child] += split_len
    t.key_len[child] -= split_len
    t.parent[child] = new
    _add_child(t, child, ps)
    t.last_access[child] = _tick(t)
    t.ints[SPLITS] += 1
    _refresh(t, new, policy)
    _refresh(t, child, policy)
    return new


@njit(cache=True)
def _match(t: Tree, tokens: np.ndarray, length: int, ns: int, ps: int, policy: int):
    """Longest cached prefix of tokens[:length] in whole pages; stamps the path (match_prefix)."""
    length = length // ps * ps
    if length == 0:
        return 0, ROOT
    node, matched = ROOT, 0
    while matched < length:
        child = _find_child(t, node, ns, tokens, matched, ps)
        if child < 0:
            break
        common = _common_pages(t, child, tokens, matched, length, ps)
        diverged = common < t.key_len[child]
        if diverged:
            child = _split(t, child, common, ps, policy)
        matched += common
        node = child
        if diverged:
            break
    stamp = _tick(t)
    n = node
    while n >= 0:
        t.last_access[n] = stamp
        stamp -= ANCESTOR_STAMP_STEP
        _refresh(t, n, policy)
        n = t.parent[n]
    return matched, node


@njit(cache=True)
def _insert(
    t: Tree,
    tokens: np.ndarray,
    length: int,
    ns: int,
    prev_prefix_len: int,
    inserted_len: int,
    priority: int,
    ps: int,
    policy: int,
):
    """Insert tokens[:length] (page-aligned); returns (last node, duplicates, new leaf tokens)."""
    t.last_access[ROOT] = _tick(t)
    t.priority[ROOT] = max(t.priority[ROOT], priority)
    node, matched, duplicates = ROOT, 0, 0
    while matched < length:
        child = _find_child(t, node, ns, tokens, matched, ps)
        if child < 0:
            break
        t.last_access[child] = _tick(t)
        common = _common_pages(t, child, tokens, matched, length, ps)
        diverged = common < t.key_len[child]
        if diverged:
            child = _split(t, child, common, ps, policy)
        t.priority[child] = max(t.priority[child], priority)
        duplicates += common - min(common, max(0, prev_prefix_len - matched))
        matched += common
        if matched > inserted_len:
            t.hit_count[child] += 1
        _refresh(t, child, policy)
        node = child
        if diverged:
            break
    if matched == length:
        return node, duplicates, 0
    top = t.ints[ARENA_TOP]
    new_len = length - matched
    t.arena[top : top + new_len] = tokens[matched:length]
    t.ints[ARENA_TOP] = top + new_len
    leaf = _new_node(t, node, ns, top, new_len, priority)
    t.n_children[node] += 1
    _add_child(t, leaf, ps)
    t.ints[EVICTABLE] += new_len
    if length > inserted_len:
        t.hit_count[leaf] += 1
    _refresh(t, leaf, policy)
    _refresh(t, node, policy)
    return leaf, duplicates, new_len


@njit(cache=True)
def _lock(t: Tree, n: int, policy: int) -> None:
    while n != ROOT:
        if t.lock_ref[n] == 0:
            t.ints[EVICTABLE] -= t.key_len[n]
            t.ints[PROTECTED] += t.key_len[n]
            t.lock_ref[n] = 1
            _refresh(t, n, policy)
        else:
            t.lock_ref[n] += 1
        n = t.parent[n]


@njit(cache=True)
def _unlock(t: Tree, n: int, policy: int) -> None:
    while n != ROOT:
        t.lock_ref[n] -= 1
        if t.lock_ref[n] == 0:
            t.ints[EVICTABLE] += t.key_len[n]
            t.ints[PROTECTED] -= t.key_len[n]
            _refresh(t, n, policy)
        n = t.parent[n]


@njit(cache=True)
def _evict_to(t: Tree, need: int, bounded: bool, ps: int, policy: int) -> None:
    """evict_to_free_tokens: delete leaves, lowest key first, until ``need`` tokens are free."""
    if not bounded:
        return
    while t.ints[POOL_FREE] < need:
        leaf = _pop_leaf(t)
        if leaf < 0:
            return
        parent = t.parent[leaf]
        t.ht_node[_slot_of(t, leaf, ps)] = TOMB
        t.n_children[parent] -= 1
        size = t.key_len[leaf]
        t.ints[EVICTABLE] -= size
        t.ints[POOL_FREE] += size
        t.ints[EVICTED] += size
        _free_node(t, leaf)
        _refresh(t, parent, policy)


@njit(cache=True)
def _take(t: Tree, tokens: int, bounded: bool) -> None:
    if bounded:
        t.ints[POOL_FREE] -= tokens


@njit(cache=True)
def _checkpoint(
    t: Tree,
    tokens: np.ndarray,
    up_to: int,
    prompt_len: int,
    ns: int,
    node: int,
    protected: int,
    inserted: int,
    bounded: bool,
    ps: int,
    policy: int,
):
    """Insert tokens[:up_to], free duplicates, split at the prompt, move the lock."""
    if up_to <= 0:
        return node, protected, inserted, 0
    length = up_to // ps * ps
    last, duplicates, new_tokens = _insert(
        t, tokens, length, ns, protected, inserted, 0, ps, policy
    )
    _take(t, -duplicates, bounded)
    prompt_pages = prompt_len // ps * ps
    if 0 < prompt_pages < length:
        _insert(t, tokens, prompt_pages, ns, prompt_pages, prompt_pages, 1, ps, policy)
    _unlock(t, node, policy)
    _lock(t, last, policy)
    return last, length, max(inserted, length), new_tokens


@njit(cache=True)
def _alloc_extend(t: Tree, start: int, end: int, bounded: bool, ps: int, policy: int) -> None:
    if ps == 1:
        _evict_to(t, end - start, bounded, ps, policy)
        _take(t, end - start, bounded)
    else:
        _evict_to(t, end - start + ps, bounded, ps, policy)
        _take(t, ((end + ps - 1) // ps - (start + ps - 1) // ps) * ps, bounded)


@njit(cache=True)
def _decode(t: Tree, start: int, steps: int, bounded: bool, ps: int, policy: int) -> None:
    """``steps`` decode allocations; only the steps after a page was taken can evict."""
    if not bounded or steps == 0:
        return
    if ps == 1:
        left = steps
        while left > 0:
            _evict_to(t, 1, bounded, ps, policy)
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


@njit(cache=True)
def _nodes_needed(prompt_len: int, chunk: int) -> int:
    chunks = prompt_len // chunk + 2 if chunk > 0 else 1
    return 2 + 3 * (chunks + 2)


@njit(cache=True)
def replay_sequential(
    t: Tree,
    prompt_tokens: np.ndarray,
    prompt_offsets: np.ndarray,
    output_tokens: np.ndarray,
    output_offsets: np.ndarray,
    namespace: np.ndarray,
    stop_finish: np.ndarray,
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
) -> int:
    """Replay requests from ``first`` on, one after another; returns where it stopped (the
    number of requests when done, else a request that needs more node rows or arena)."""
    ps = page_size
    n_requests = len(prompt_offsets) - 1
    for i in range(first, n_requests):
        p0, p1 = prompt_offsets[i], prompt_offsets[i + 1]
        o0, o1 = output_offsets[i], output_offsets[i + 1]
        prompt_len, n_out = p1 - p0, o1 - o0
        steps = n_out if stop_finish[i] else n_out - 1
        final_len = prompt_len + steps
        if bounded and (final_len + ps - 1) // ps > capacity_pages:
            rejected[i] = 1
            continue
        room = len(t.arena) - t.ints[ARENA_TOP]
        if t.ints[FREE_TOP] < _nodes_needed(prompt_len, chunk) or room < prompt_len + n_out:
            return i
        buf[:prompt_len] = prompt_tokens[p0:p1]
        buf[prompt_len : prompt_len + n_out] = output_tokens[o0:o1]
        ns = namespace[i]
        evicted_before, splits_before = t.ints[EVICTED], t.ints[SPLITS]
        if refresh:
            if t.ints[PASSES] % 32 == 0:
                _match(t, buf, prompt_len, ns, ps, policy)
            t.ints[PASSES] += 1
        matched, node = _match(t, buf, prompt_len - 1, ns, ps, policy)
        hit[i] = matched
        _lock(t, node, policy)
        protected, inserted, new_tokens = matched, 0, 0
        start, is_first = matched, True
        while True:  # prefill chunks (PrefillAdder)
            remaining = prompt_len - start
            if chunk > 0 and is_first and (remaining + ps - 1) // ps * ps > chunk:
                end = (start + chunk // ps * ps) // ps * ps
            elif chunk > 0 and not is_first and remaining > chunk:
                end = start + chunk
            else:
                end = prompt_len
            is_first = False
            _alloc_extend(t, start, end, bounded, ps, policy)
            if end >= prompt_len:
                break
            node, protected, inserted, added = _checkpoint(
                t, buf, end, prompt_len, ns, node, protected, inserted, bounded, ps, policy
            )
            new_tokens += added
            start = end
        if steps > 0:
            node, protected, inserted, added = _checkpoint(
                t, buf, prompt_len, prompt_len, ns, node, protected, inserted, bounded, ps, policy
            )
            new_tokens += added
        _decode(t, prompt_len, steps, bounded, ps, policy)
        node, protected, inserted, added = _checkpoint(
            t, buf, final_len, prompt_len, ns, node, protected, inserted, bounded, ps, policy
        )
        new_tokens += added
        _take(t, -((final_len + ps - 1) // ps - protected // ps) * ps, bounded)
        _unlock(t, node, policy)
        evicted[i] = t.ints[EVICTED] - evicted_before
        splits[i] = t.ints[SPLITS] - splits_before
        inserted_tokens[i] = new_tokens
    return n_requests


@njit(cache=True)
def _compact_arena(t: Tree, old_arena: np.ndarray) -> None:
    """Copy every live node's tokens from ``old_arena`` into ``t.arena``, back to back."""
    top = 0
    for n in range(1, len(t.parent)):
        if t.version[n] >= 0:
            length = t.key_len[n]
            start = t.key_start[n]
            t.arena[top : top + length] = old_arena[start : start + length]
            t.key_start[n] = top
            top += length
    t.ints[ARENA_TOP] = top


def replay(config: SglangConfig, workload: Workload) -> dict[str, np.ndarray]:
    """Sequential replay; the per-request hit and counters."""
    ps, policy = config.page_size, POLICY_CODES[config.eviction_policy]
    bounded = config.capacity_tokens is not None
    capacity_pages = (config.capacity_tokens or 0) // ps
    n = workload.n_requests
    out = {name: np.zeros(n, np.int64) for name in ("hit", *COUNTERS)}
    lengths = workload.prompt_lengths + workload.output_lengths
    longest = int(lengths.max()) if n else 0
    tree = new_tree(1024, 4 * longest + 1024, capacity_pages * ps)
    buf = np.zeros(longest, np.int32)
    refresh = config.waiting_prefix_refresh and config.eviction_policy == "lru"
    chunk = config.chunked_prefill_size
    first = 0
    while first < n:
        first = replay_sequential(
            tree,
            workload.prompt_tokens,
            workload.prompt_offsets,
            workload.output_tokens,
            workload.output_offsets,
            workload.namespace,
            workload.stop_finish,
            first,
            bounded,
            capacity_pages,
            ps,
            chunk,
            refresh,
            policy,
            out["hit"],
            *(out[name] for name in COUNTERS),
            buf,
        )
        if first < n:  # grow the rows or the arena, then resume at request ``first``
            rows = len(tree.parent)
            if tree.ints[FREE_TOP] < _nodes_needed(int(workload.prompt_lengths[first]), chunk):
                rows *= 2
            live = int(tree.ints[EVICTABLE] + tree.ints[PROTECTED])
            arena = len(tree.arena)
            if 2 * (live + int(lengths[first])) > arena:
                arena = 2 * (live + int(lengths[first]))
            tree = grown(tree, rows, arena, ps, policy)
    return out


COUNTERS = ("evicted_tokens", "inserted_tokens", "node_splits", "rejected")
