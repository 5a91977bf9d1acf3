"""The fast path of the vLLM APC model: ``vllm_apc``'s rules over arrays, compiled with numba.

It gives the reference's results (tested on random workloads and on every golden case) in all
three replay modes. The reference's objects map to arrays:

- **Keys.** A 64-bit chained hash per full block: the state starts from the parent's key (for
  block 0, from the namespace), mixes in each token, and ends with murmur3's fmix64. Every step is
  a bijection of the state for a given token and injective in the token, so two blocks never
  collide when their parents differ and their tokens do not, or when they share a parent and
  differ in one token. Other pairs collide with probability about 2^-64: with D distinct blocks
  in a log, the chance of any collision is about D^2 / 2^65 (1e8 blocks: 3e-4), and a collision
  can only add a hit.
- **Blocks.** One row each: ref_cnt and four links: the copies of one key form a list in
  insertion order (DUP_NEXT / DUP_PREV), the free queue's cached run a doubly linked FIFO
  (Q_NEXT / Q_PREV); and the block's key. The map is open addressing with linear probing, at
  most half the slots used, deleted by backward shift: one 16-byte row per slot, the key and its
  oldest and newest copy packed in one int64 (a probe reads one cache line, not one per array):
  28 bytes per block id, 32 to 64 per block in the map.
- **Free queue.** vLLM's queue is always three runs, kept as three structures: uncached freed
  blocks at the head (a stack linked through Q_NEXT: vLLM prepends them), never-used blocks in id
  order (ids are handed out lazily, so memory follows the blocks in use, never more than the
  capacity), and cached freed blocks (the FIFO: appended at the tail, touched out of the middle,
  evicted from the head).
- **Unbounded pools** never evict, so a copy of a key after the first is never looked up: it is
  uncached when its last reference goes (the results are the same) and memory follows the distinct
  blocks, not how often a block is recomputed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from cache_models import engine_rules as rules

# The numpy error model drops the division-by-zero checks (block size and rates are validated
# positive by the config), which makes the hot loops about 1.5x faster.
jit = njit(cache=True, error_model="numpy")

NONE = -1
UNBOUNDED = 1 << 62  # the block limit of an unbounded cache
P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
M1 = np.uint64(0xFF51AFD7ED558CCD)
M2 = np.uint64(0xC4CEB9FE1A85EC53)
SEED = np.uint64(0x243F6A8885A308D3)
SHIFT = np.uint64(33)

# Columns of Pool.blocks, Pool.map, Slots.info; rows of the tally; entries of Pool.state.
REF_CNT, DUP_NEXT, DUP_PREV, Q_NEXT, Q_PREV = range(5)
MAP_KEY, MAP_COPIES = range(2)
EMPTY_SLOT = -1  # MAP_COPIES of an empty slot: its oldest copy (the low half) is NONE
LOW32 = 0xFFFFFFFF
REQ, N_BLOCKS, N_CACHED, N_COMPUTED = range(4)
HIT, EVICTED, INSERTED, DUPLICATE, PREEMPTIONS, REHIT = range(6)
Q_HEAD, Q_TAIL, Q_LEN, STACK_TOP, STACK_LEN, NEXT_FRESH, LIMIT, TOUCHED = range(8)


class Pool(NamedTuple):
    """The block pool, its key map and free queue (see the module docstring)."""

    blocks: np.ndarray  # int32 [block, 5]: REF_CNT, DUP_NEXT, DUP_PREV, Q_NEXT, Q_PREV
    key: np.ndarray  # int64 per block, valid while cached
    map: np.ndarray  # int64 [slot, 2]: MAP_KEY, MAP_COPIES (oldest copy low, newest high)
    state: np.ndarray  # int64: Q_HEAD, Q_TAIL, Q_LEN, STACK_TOP, STACK_LEN, NEXT_FRESH, LIMIT,
    # TOUCHED (what ``touch_slots`` read: kept so that its loads are)


class Slots(NamedTuple):
    """Rows for running requests: block table, keys, and counts; rows are reused and added on
    demand, so memory follows the peak number in flight, not ``max_in_flight``."""

    tables: np.ndarray  # int32 [row, width]
    keys: np.ndarray  # int64 [row, width]
    info: np.ndarray  # int64 [row, 4]: REQ, N_BLOCKS, N_CACHED, N_COMPUTED
    free: np.ndarray  # int64: a stack of unused rows, sized for the most rows ever needed
    n_free: np.ndarray  # int64 [1]


# ------------------------------------------------------------------------------------ keys


@jit
def _fmix(h: np.uint64) -> np.uint64:
    h = (h ^ (h >> SHIFT)) * M1
    h = (h ^ (h >> SHIFT)) * M2
    return h ^ (h >> SHIFT)


@jit
def _absorb(
    h: np.uint64,
    tokens: np.ndarray,
    start: int,
    stop: int,
    filled: int,
    block_size: int,
    keys: np.ndarray,
    n_keys: int,
) -> tuple[np.uint64, int, int]:
    """Mix tokens[start:stop] into the chain; each full block's key goes to ``keys``."""
    for j in range(start, stop):
        h ^= np.uint64(np.uint32(tokens[j])) * P2
        h = ((h << np.uint64(31)) | (h >> SHIFT)) * P1
        filled += 1
        if filled == block_size:
            h = _fmix(h)
            keys[n_keys] = np.int64(h)
            n_keys += 1
            filled = 0
    return h, filled, n_keys


@jit
def request_keys(
    p_tok: np.ndarray,
    p_off: np.ndarray,
    o_tok: np.ndarray,
    o_off: np.ndarray,
    namespace: int,
    r: int,
    block_size: int,
    keys: np.ndarray,
) -> None:
    """Keys of the full blocks of request r's prompt followed by all its outputs but the last
    (whose KV is never computed, so no block holding it is ever cached or looked up)."""
    h = _fmix(SEED ^ np.uint64(np.uint32(namespace)))
    h, filled, n_keys = _absorb(h, p_tok, p_off[r], p_off[r + 1], 0, block_size, keys, 0)
    _absorb(h, o_tok, o_off[r], o_off[r + 1] - 1, filled, block_size, keys, n_keys)


# ------------------------------------------------------------------------------------ the pool


def pool_arrays(limit: int, size: int) -> Pool:
    """``new_pool`` allocated by numpy, outside the kernels: numpy asks the kernel for huge
    pages on large arrays (``madvise``), numba's runtime does not, and on the pool's random
    probes that saves most TLB misses and page faults. The replay adapter grows the pool
    with this before a chunk (``with_room``); the kernels' own growth is the fallback."""
    return new_pool.py_func(limit, size)  # the same body, its arrays made here by numpy


def with_room(pool: Pool, n_new: int) -> Pool:
    """``reserve`` done outside the kernels (numpy's allocation, see ``pool_arrays``)."""
    size, needed = _needed(pool, n_new)
    if needed <= size:
        return pool
    grown = pool_arrays(int(pool.state[LIMIT]), needed)
    _copy_into(pool, grown)
    return grown


@jit
def _n_slots(size: int) -> int:
    n_slots = 4
    while n_slots < 2 * size:
        n_slots *= 2
    return n_slots


@jit
def _init_pool(pool: Pool, limit: int) -> None:
    state, blocks, key_map = pool.state, pool.blocks, pool.map
    state[Q_HEAD] = NONE
    state[Q_TAIL] = NONE
    state[STACK_TOP] = NONE
    state[NEXT_FRESH] = 1
    state[LIMIT] = limit
    for b in range(len(blocks)):
        blocks[b, REF_CNT] = 0
        for c in range(1, 5):
            blocks[b, c] = NONE
    for i in range(len(key_map)):
        key_map[i, MAP_KEY] = 0
        key_map[i, MAP_COPIES] = EMPTY_SLOT


@jit
def new_pool(limit: int, size: int) -> Pool:
    """Blocks 1..limit usable (block 0 is the null block); arrays for ``size`` block ids."""
    pool = Pool(
        np.empty((size, 5), np.int32),
        np.zeros(size, np.int64),
        np.empty((_n_slots(size), 2), np.int64),
        np.zeros(8, np.int64),
    )
    _init_pool(pool, limit)
    return pool


@jit
def _needed(pool: Pool, n_new: int) -> tuple[int, int]:
    """The pool's size and the size that gives room for ``n_new`` more never-used blocks:
    at least doubling, up to the most the map's slots hold at half load (the map's size is a
    power of two), never beyond the usable blocks (the size itself when there is room)."""
    size = len(pool.key)
    limit = pool.state[LIMIT] + 1
    needed = min(pool.state[NEXT_FRESH] + n_new, limit)
    if needed <= size:
        return size, size
    return size, min(_n_slots(max(needed, 2 * size)) // 2, limit)


@jit
def reserve(pool: Pool, n_new: int) -> Pool:
    """The pool with room for ``n_new`` more never-used blocks: arrays and map grow together,
    doubling, never beyond the usable blocks."""
    size, needed = _needed(pool, n_new)
    if needed <= size:
        return pool
    grown = new_pool(pool.state[LIMIT], needed)
    _copy_into(pool, grown)
    return grown


@jit
def _copy_into(pool: Pool, grown: Pool) -> None:
    """Copy every block and state entry of ``pool`` into the larger ``grown``, and rehash."""
    for b in range(len(pool.key)):
        for c in range(5):
            grown.blocks[b, c] = pool.blocks[b, c]
        grown.key[b] = pool.key[b]
    for i in range(len(pool.state)):
        grown.state[i] = pool.state[i]
    for i in range(len(pool.map)):  # rehash
        if not _is_empty(pool.map[i, MAP_COPIES]):
            j = _slot(grown, pool.map[i, MAP_KEY])
            grown.map[j, MAP_KEY] = pool.map[i, MAP_KEY]
            grown.map[j, MAP_COPIES] = pool.map[i, MAP_COPIES]


@njit(cache=True, error_model="numpy", inline="always")
def _first(copies: int) -> int:
    """The oldest copy of a slot's packed MAP_COPIES (the low 32 bits, sign-extended)."""
    return ((copies & LOW32) ^ 0x80000000) - 0x80000000


@njit(cache=True, error_model="numpy", inline="always")
def _last(copies: int) -> int:
    """The newest copy of a slot's packed MAP_COPIES (the high 32 bits)."""
    return copies >> 32


@njit(cache=True, error_model="numpy", inline="always")
def _packed(first: int, last: int) -> int:
    return (np.int64(last) << 32) | (np.int64(first) & LOW32)


@njit(cache=True, error_model="numpy", inline="always")
def _is_empty(copies: int) -> bool:
    return (copies & LOW32) == LOW32  # the oldest copy is NONE


@jit
def _slot(pool: Pool, key: int) -> int:
    """The map slot holding ``key``, or else the empty slot where it would go."""
    key_map = pool.map
    mask = len(key_map) - 1
    i = key & mask
    while not _is_empty(key_map[i, MAP_COPIES]) and key_map[i, MAP_KEY] != key:
        i = (i + 1) & mask
    return i


@jit
def _unlink(pool: Pool, block: int) -> None:
    """Take a block out of the cached run of the free queue."""
    links = pool.blocks
    prev, nxt = links[block, Q_PREV], links[block, Q_NEXT]
    if prev == NONE:
        pool.state[Q_HEAD] = nxt
    else:
        links[prev, Q_NEXT] = nxt
    if nxt == NONE:
        pool.state[Q_TAIL] = prev
    else:
        links[nxt, Q_PREV] = prev
    pool.state[Q_LEN] -= 1


@njit(cache=True, error_model="numpy", inline="always")  # in the eviction loop: inlined
def _uncache(pool: Pool, block: int) -> None:
    """Take a cached block out of its key's copies; the key leaves the map with its last copy."""
    links = pool.blocks
    slot = _slot(pool, pool.key[block])
    copies = pool.map[slot, MAP_COPIES]
    first, last = _first(copies), _last(copies)
    prev, nxt = links[block, DUP_PREV], links[block, DUP_NEXT]
    if prev == NONE:
        first = nxt
    else:
        links[prev, DUP_NEXT] = nxt
    if nxt == NONE:
        last = prev
    else:
        links[nxt, DUP_PREV] = prev
    if first == NONE:
        _delete_slot(pool, slot)
    else:
        pool.map[slot, MAP_COPIES] = _packed(first, last)


@jit
def add_blocks(
    pool: Pool, table: np.ndarray, start: int, stop: int, tally: np.ndarray, r: int
) -> None:
    """Fill table[start:stop] from the queue head (needs ``reserve`` first); a cached block popped
    from the FIFO is evicted."""
    st, links = pool.state, pool.blocks
    for i in range(start, stop):
        if st[STACK_LEN] > 0:
            block = st[STACK_TOP]
            st[STACK_TOP] = links[block, Q_NEXT]
            st[STACK_LEN] -= 1
        elif st[NEXT_FRESH] <= st[LIMIT]:
            block = st[NEXT_FRESH]
            st[NEXT_FRESH] += 1
        else:
            block = st[Q_HEAD]
            st[Q_HEAD] = links[block, Q_NEXT]
            if st[Q_HEAD] == NONE:
                st[Q_TAIL] = NONE
            else:
                links[st[Q_HEAD], Q_PREV] = NONE
            st[Q_LEN] -= 1
            tally[EVICTED, r] += 1
            _uncache(pool, block)
        links[block, REF_CNT] = 1
        table[i] = block


@jit
def _delete_slot(pool: Pool, hole: int) -> None:
    """Linear probing's backward-shift deletion: entries after the hole move back unless their
    home lies cyclically in (hole, j]."""
    key_map = pool.map
    mask = len(key_map) - 1
    j = hole
    while True:
        j = (j + 1) & mask
        if _is_empty(key_map[j, MAP_COPIES]):
            break
        home = key_map[j, MAP_KEY] & mask
        if (hole < home <= j) if hole <= j else (hole < home or home <= j):
            continue
        key_map[hole, MAP_KEY] = key_map[j, MAP_KEY]
        key_map[hole, MAP_COPIES] = key_map[j, MAP_COPIES]
        hole = j
    key_map[hole, MAP_COPIES] = EMPTY_SLOT


@jit
def cache_blocks(
    pool: Pool,
    table: np.ndarray,
    keys: np.ndarray,
    start: int,
    stop: int,
    tally: np.ndarray,
    r: int,
) -> None:
    """Cache table[start:stop] under their keys, each as the newest copy of its key."""
    links, key_map = pool.blocks, pool.map
    for i in range(start, stop):
        block, key = table[i], keys[i]
        pool.key[block] = key
        links[block, DUP_NEXT] = NONE
        slot = _slot(pool, key)
        copies = key_map[slot, MAP_COPIES]
        if _is_empty(copies):
            key_map[slot, MAP_KEY] = key
            first, last = block, NONE
        else:
            first, last = _first(copies), _last(copies)
            links[last, DUP_NEXT] = block
            tally[DUPLICATE, r] += 1
        links[block, DUP_PREV] = last
        key_map[slot, MAP_COPIES] = _packed(first, block)
        tally[INSERTED, r] += 1


@jit
def touch_slots(pool: Pool, keys: np.ndarray, n_keys: int) -> None:
    """Read the home slot of each of ``keys[:n_keys]``: independent loads the CPU overlaps, so
    the lookups and inserts that follow, one after another, find their slots in cache (the
    vLLM replay of Mooncake's 16-token blocks: a fifth faster). What was read goes to the
    state's TOUCHED, so the loads are kept."""
    mask = len(pool.map) - 1
    read = 0
    for k in range(n_keys):
        read ^= pool.map[keys[k] & mask, MAP_KEY]
    pool.state[TOUCHED] ^= read


@jit
def lookup(pool: Pool, keys: np.ndarray, max_blocks: int, table: np.ndarray) -> int:
    """The hit: the oldest copies of the leading cached keys among the first ``max_blocks``,
    written to ``table``; returns their number."""
    k = 0
    while k < max_blocks:
        block = _first(pool.map[_slot(pool, keys[k]), MAP_COPIES])
        if block == NONE:
            break
        table[k] = block
        k += 1
    return k


@jit
def can_allocate(pool: Pool, table: np.ndarray, n_hit: int, n_blocks: int) -> bool:
    """The admission gate: new blocks plus unreferenced hit blocks must all be free now."""
    evictable = 0
    for i in range(n_hit):
        evictable += pool.blocks[table[i], REF_CNT] == 0
    return n_blocks - n_hit + evictable <= free_blocks(pool)


@jit
def allocate(
    pool: Pool,
    table: np.ndarray,
    keys: np.ndarray,
    n_hit: int,
    n_tokens: int,
    block_size: int,
    tally: np.ndarray,
    r: int,
) -> Pool:
    """Admit: touch the hit (unreferenced blocks leave the queue), then take blocks for
    ``n_tokens`` slots and cache their full blocks."""
    for i in range(n_hit):
        block = table[i]
        if pool.blocks[block, REF_CNT] == 0:
            _unlink(pool, block)
        pool.blocks[block, REF_CNT] += 1
    n_blocks = (n_tokens + block_size - 1) // block_size
    pool = reserve(pool, n_blocks - n_hit)
    add_blocks(pool, table, n_hit, n_blocks, tally, r)
    cache_blocks(pool, table, keys, n_hit, n_tokens // block_size, tally, r)
    return pool


# ------------------------------------------------------------------------------------ running rows


@jit
def new_slots(max_rows: int, width: int) -> Slots:
    rows = min(max_rows, 16)
    free = np.zeros(max_rows, np.int64)
    for i in range(rows):
        free[i] = rows - 1 - i
    n_free = np.zeros(1, np.int64)
    n_free[0] = rows
    return Slots(
        np.zeros((rows, width), np.int32),
        np.zeros((rows, width), np.int64),
        np.zeros((rows, 4), np.int64),
        free,
        n_free,
    )


@jit
def next_slot(slots: Slots) -> tuple[Slots, int]:
    """The row the next admission takes (rows are added when none is free)."""
    if slots.n_free[0] == 0:
        rows, width = slots.tables.shape
        more = min(2 * rows, len(slots.free))
        tables = np.zeros((more, width), np.int32)
        keys = np.zeros((more, width), np.int64)
        info = np.zeros((more, 4), np.int64)
        for i in range(rows):
            for j in range(width):
                tables[i, j] = slots.tables[i, j]
                keys[i, j] = slots.keys[i, j]
            for j in range(4):
                info[i, j] = slots.info[i, j]
        for i in range(more - rows):
            slots.free[i] = more - 1 - i
        slots.n_free[0] = more - rows
        slots = Slots(tables, keys, info, slots.free, slots.n_free)
    return slots, slots.free[slots.n_free[0] - 1]


@jit
def release(pool: Pool, slots: Slots, s: int) -> None:
    """vLLM's free of the request in row s, last block first: the uncached tail goes to the head
    of the queue (reused last block first), cached blocks that reach ref_cnt 0 to the FIFO's
    tail (in an unbounded pool a later copy of a key is uncached instead). Then the row is free."""
    table, n_blocks, n_cached = slots.tables[s], slots.info[s, N_BLOCKS], slots.info[s, N_CACHED]
    st, links = pool.state, pool.blocks
    for i in range(n_cached, n_blocks):  # the last one pushed becomes the head
        links[table[i], REF_CNT] -= 1
        _push_uncached(pool, table[i])
    for i in range(n_cached - 1, -1, -1):
        block = table[i]
        links[block, REF_CNT] -= 1
        if links[block, REF_CNT] > 0:
            continue
        if st[LIMIT] == UNBOUNDED and links[block, DUP_PREV] != NONE:
            _uncache(pool, block)
            _push_uncached(pool, block)
            continue
        links[block, Q_PREV] = st[Q_TAIL]
        links[block, Q_NEXT] = NONE
        if st[Q_TAIL] == NONE:
            st[Q_HEAD] = block
        else:
            links[st[Q_TAIL], Q_NEXT] = block
        st[Q_TAIL] = block
        st[Q_LEN] += 1
    slots.free[slots.n_free[0]] = s
    slots.n_free[0] += 1


@jit
def _push_uncached(pool: Pool, block: int) -> None:
    """Put a freed uncached block on top of the stack (the head of vLLM's queue)."""
    pool.blocks[block, Q_NEXT] = pool.state[STACK_TOP]
    pool.state[STACK_TOP] = block
    pool.state[STACK_LEN] += 1


@jit
def free_blocks(pool: Pool) -> int:
    """Blocks that can be taken now: the uncached stack, never-used ids, the cached FIFO."""
    st = pool.state
    return st[STACK_LEN] + st[LIMIT] + 1 - st[NEXT_FRESH] + st[Q_LEN]


@jit
def allocate_slots(
    pool: Pool, slots: Slots, s: int, n_tokens: int, block_size: int, tally: np.ndarray
) -> tuple[Pool, bool]:
    """A running request's next chunk (or decode token): slots up to ``n_tokens``, caching its
    full blocks; False (nothing taken) when the blocks it needs are not all free."""
    info = slots.info[s]
    need = (n_tokens + block_size - 1) // block_size - info[N_BLOCKS]
    if need > 0:
        if need > free_blocks(pool):
            return pool, False
        pool = reserve(pool, need)
        add_blocks(pool, slots.tables[s], info[N_BLOCKS], info[N_BLOCKS] + need, tally, info[REQ])
        info[N_BLOCKS] += need
    n_full = n_tokens // block_size
    cache_blocks(pool, slots.tables[s], slots.keys[s], info[N_CACHED], n_full, tally, info[REQ])
    info[N_CACHED] = max(info[N_CACHED], n_full)
    return pool, True


# ------------------------------------------------------------------------------------ replays


@njit(cache=True, error_model="numpy", nogil=True)
def replay_lock_step(
    pool: Pool,
    p_tok: np.ndarray,
    p_off: np.ndarray,
    o_tok: np.ndarray,
    o_off: np.ndarray,
    namespace: np.ndarray,
    runnable: np.ndarray,
    skip: np.ndarray,
    block_size: int,
    max_in_flight: int,
    width: int,
    tally: np.ndarray,
    budget: int,
    threshold: int,
) -> Pool:
    """vLLM's Scheduler.schedule step by step (see ``vllm_apc``): the running requests' next
    chunks or decode tokens first, preempting the newest running request when blocks run out;
    FCFS admission of first chunks in steps without a preemption, while budget is left.

    ``budget`` is ``--max-num-batched-tokens`` (vLLM's default is the GPU's, ``NO_BUDGET`` for
    none), ``threshold`` ``--long-prefill-token-threshold`` (default 0, off; applied only while
    more than one request runs or waits), ``skip`` the requests with ``prompt_logprobs``
    (``skip_reading_prefix_cache``: no lookup)."""
    n = len(runnable)
    prompt_len = p_off[1:] - p_off[:-1]
    n_out = o_off[1:] - o_off[:-1]
    num_tokens = prompt_len.copy()  # prompt + generated so far, per request
    runnable_from = np.zeros(n + 1, np.int64)  # runnable requests at index >= i
    for i in range(n - 1, -1, -1):
        runnable_from[i] = runnable_from[i + 1] + runnable[i]
    max_rows = max(1, min(max_in_flight, n))
    slots = new_slots(max_rows, width)
    head_keys = np.zeros(width, np.int64)  # keys of the waiting head, kept while it waits
    head_req = NONE
    running = np.zeros(max_rows, np.int64)  # rows, oldest admission first
    n_running = 0
    scheduled = np.zeros(max_rows, np.int64)
    waiting = np.zeros(n, np.int64)  # preempted requests, on top of the new ones next_new..
    n_preempted = 0
    next_new = 0
    while True:
        while next_new < n and not runnable[next_new]:
            next_new += 1
        if n_running == 0 and n_preempted == 0 and next_new == n:
            return pool
        eligible = n_running + n_preempted + runnable_from[next_new]
        step_threshold = rules.vllm_step_threshold(threshold, eligible)
        left = budget
        n_scheduled = 0
        preempted = False
        i = 0
        while i < n_running and left > 0:
            s = running[i]
            r = slots.info[s, REQ]
            n_new = rules.vllm_chunk(
                num_tokens[r] - slots.info[s, N_COMPUTED], step_threshold, left
            )
            n_to = slots.info[s, N_COMPUTED] + n_new
            pool, ok = allocate_slots(pool, slots, s, n_to, block_size, tally)
            while not ok:  # preempt the newest running request, maybe s itself
                n_running -= 1
                victim = running[n_running]
                tally[PREEMPTIONS, slots.info[victim, REQ]] += 1
                waiting[n_preempted] = slots.info[victim, REQ]
                n_preempted += 1
                release(pool, slots, victim)
                preempted = True
                if victim == s:
                    break
                pool, ok = allocate_slots(pool, slots, s, n_to, block_size, tally)
            if not ok:
                break
            slots.info[s, N_COMPUTED] = n_to
            left -= n_new
            scheduled[n_scheduled] = s
            n_scheduled += 1
            i += 1
        while not preempted and n_running < max_in_flight and left > 0:
            while next_new < n and not runnable[next_new]:
                next_new += 1
            if n_preempted:
                r = waiting[n_preempted - 1]
            elif next_new < n:
                r = next_new
            else:
                break
            if head_req != r:
                request_keys(p_tok, p_off, o_tok, o_off, namespace[r], r, block_size, head_keys)
                head_req = r
            slots, s = next_slot(slots)
            table = slots.tables[s]
            n_hit = 0
            if not skip[r]:
                n_hit = lookup(pool, head_keys, (num_tokens[r] - 1) // block_size, table)
            n_blocks = (num_tokens[r] + block_size - 1) // block_size
            if not can_allocate(pool, table, n_hit, n_blocks):
                break
            n_new = rules.vllm_chunk(num_tokens[r] - n_hit * block_size, step_threshold, left)
            n_to = n_hit * block_size + n_new
            if n_preempted:
                n_preempted -= 1
            else:
                next_new += 1
            slots.n_free[0] -= 1
            for j in range(width):
                slots.keys[s, j] = head_keys[j]
            pool = allocate(pool, table, head_keys, n_hit, n_to, block_size, tally, r)
            slots.info[s, REQ] = r
            slots.info[s, N_BLOCKS] = (n_to + block_size - 1) // block_size
            slots.info[s, N_CACHED] = max(n_hit, n_to // block_size)
            slots.info[s, N_COMPUTED] = n_to
            tally[HIT if tally[PREEMPTIONS, r] == 0 else REHIT, r] += n_hit * block_size
            left -= n_new
            running[n_running] = s
            n_running += 1
            scheduled[n_scheduled] = s
            n_scheduled += 1
        if n_scheduled == 0:
            raise RuntimeError("no request could be scheduled")  # unreachable: peaks fit
        for j in range(n_scheduled):  # update_from_output: a token per finished prefill
            s = scheduled[j]
            r = slots.info[s, REQ]
            if slots.info[s, N_COMPUTED] < num_tokens[r]:
                continue  # a partial prefill chunk samples nothing
            num_tokens[r] += 1
            if num_tokens[r] - prompt_len[r] == n_out[r]:
                k = 0
                while running[k] != s:
                    k += 1
                n_running -= 1
                for m in range(k, n_running):
                    running[m] = running[m + 1]
                release(pool, slots, s)


@njit(cache=True, error_model="numpy", nogil=True)
def replay_in_time(
    pool: Pool,
    p_tok: np.ndarray,
    p_off: np.ndarray,
    o_tok: np.ndarray,
    o_off: np.ndarray,
    namespace: np.ndarray,
    runnable: np.ndarray,
    skip: np.ndarray,
    block_size: int,
    max_in_flight: int,
    width: int,
    tally: np.ndarray,
    arrival: np.ndarray,
    prefill_rate: float,
    decode_rate: float,
) -> Pool:
    """Arrival-time replay, each request scheduled whole at admission (see ``vllm_apc``); the
    sequential replay is the case of arrivals all 0 and one in flight."""
    n = len(runnable)
    max_rows = max(1, min(max_in_flight, n))
    slots = new_slots(max_rows, width)
    head_keys = np.zeros(width, np.int64)
    head_req = NONE
    # The running requests' rows, a binary heap on (finish time, admission number).
    heap_time = np.zeros(max_rows, np.float64)
    heap_order = np.zeros(max_rows, np.int64)
    heap_row = np.zeros(max_rows, np.int64)
    n_running = 0
    admissions = 0
    next_arrival = 0
    waiting = 0  # the waiting requests are waiting..next_arrival-1, in order
    while next_arrival < n or waiting < next_arrival or n_running:
        now = arrival[next_arrival] if next_arrival < n else np.inf
        if n_running and heap_time[0] < now:
            now = heap_time[0]
        while n_running and heap_time[0] <= now:
            release(pool, slots, heap_row[0])
            n_running -= 1
            _heap_pop(heap_time, heap_order, heap_row, n_running)
        while next_arrival < n and arrival[next_arrival] <= now:
            next_arrival += 1
        while n_running < max_in_flight:
            while waiting < next_arrival and not runnable[waiting]:
                waiting += 1
            if waiting == next_arrival:
                break
            r = waiting
            prompt_len = p_off[r + 1] - p_off[r]
            peak_tokens = rules.vllm_peak_tokens(prompt_len, o_off[r + 1] - o_off[r])
            if head_req != r:
                request_keys(p_tok, p_off, o_tok, o_off, namespace[r], r, block_size, head_keys)
                touch_slots(pool, head_keys, peak_tokens // block_size)
                head_req = r
            peak = rules.ceil_div(peak_tokens, block_size)
            slots, s = next_slot(slots)
            table = slots.tables[s]
            n_hit = 0
            if not skip[r]:
                n_hit = lookup(pool, head_keys, (prompt_len - 1) // block_size, table)
            if not can_allocate(pool, table, n_hit, peak):
                break
            waiting += 1
            slots.n_free[0] -= 1
            pool = reserve(pool, peak - n_hit)
            # Scheduled whole, in vLLM's order: the prompt is allocated and cached, then each
            # output block is taken once the blocks before it are full and cached.
            pool = allocate(pool, table, head_keys, n_hit, prompt_len, block_size, tally, r)
            n_cached = max(n_hit, prompt_len // block_size)
            for b in range((prompt_len + block_size - 1) // block_size, peak):
                cache_blocks(pool, table, head_keys, n_cached, b, tally, r)
                n_cached = max(n_cached, b)
                add_blocks(pool, table, b, b + 1, tally, r)
            cache_blocks(pool, table, head_keys, n_cached, peak_tokens // block_size, tally, r)
            tally[HIT, r] = n_hit * block_size
            slots.info[s, N_BLOCKS] = peak
            slots.info[s, N_CACHED] = peak_tokens // block_size
            service = (prompt_len - n_hit * block_size) / prefill_rate
            service += (o_off[r + 1] - o_off[r]) / decode_rate
            _heap_push(heap_time, heap_order, heap_row, n_running, now + service, admissions, s)
            n_running += 1
            admissions += 1
    return pool


@jit
def _heap_push(
    time: np.ndarray,
    order: np.ndarray,
    row: np.ndarray,
    size: int,
    t: float,
    o: int,
    s: int,
) -> None:
    """Add (t, o, s) to the heap of ``size`` entries ordered by (time, order)."""
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if time[parent] < t or (time[parent] == t and order[parent] < o):
            break
        time[i], order[i], row[i] = time[parent], order[parent], row[parent]
        i = parent
    time[i], order[i], row[i] = t, o, s


@jit
def _heap_pop(time: np.ndarray, order: np.ndarray, row: np.ndarray, size: int) -> None:
    """Drop the top; ``size`` entries remain (the last one sifts down from the top)."""
    t, o, s = time[size], order[size], row[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (
            time[right] < time[child]
            or (time[right] == time[child] and order[right] < order[child])
        ):
            child = right
        if t < time[child] or (t == time[child] and o < order[child]):
            break
        time[i], order[i], row[i] = time[child], order[child], row[child]
        i = child
    time[i], order[i], row[i] = t, o, s
