"""The Belady bound: the most lookup hits any eviction policy could get from a cache of a given
number of blocks, knowing the future (an upper bound, not an engine).

What it models, over a ``BlockStream``: requests in order; each accesses its cacheable blocks, root
first, and the accesses of its first ``lookup`` blocks are the ones that can hit. Between two
accesses of a block, the cache may keep it (one block of room throughout) or drop it; a block can
be (re)cached at any access. A hit at a counted access needs the block kept since the previous
access. Choosing which of these intervals to keep, with at most ``capacity`` kept at any moment, is
packing intervals into ``capacity`` tracks, solved exactly by Belady's rule with bypass: at each
access keep the block until its next access when that access can hit, and when over capacity drop
the kept block whose next access is farthest away.

It is an upper bound for an engine of the same granularity and capacity because the engine's hits
are such a packing too, with more constraints: a hit must also be a leading run of blocks, a
running request must hold all its blocks at once, the engine has no foresight, and duplicates and
partial blocks take room. Requests whose peak exceeds the capacity never run, as in the engines.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models.block_stream import BlockStream

_NONE = np.iinfo(np.int64).max


def belady_hit_blocks(stream: BlockStream, capacity_blocks: int) -> np.ndarray:
    """Per request, the blocks the optimal offline cache hits."""
    return _belady(
        stream.items,
        stream.offsets,
        stream.lookup,
        stream.peak <= capacity_blocks,
        stream.n_items,
        capacity_blocks,
    )


@njit(cache=True)
def _next_counted_use(items, offsets, lookup, runs, n_items):
    """For each access, the time of the same block's next access if it can hit, else _NONE."""
    n = len(items)
    following = np.full(n, _NONE, np.int64)
    seen = np.full(n_items, -1, np.int64)  # next access time of each block, during the pass
    seen_counted = np.zeros(n_items, np.bool_)
    for r in range(len(offsets) - 2, -1, -1):
        if not runs[r]:
            continue
        for t in range(offsets[r + 1] - 1, offsets[r] - 1, -1):
            item = items[t]
            if seen[item] >= 0 and seen_counted[item]:
                following[t] = seen[item]
            seen[item] = t
            seen_counted[item] = t - offsets[r] < lookup[r]
    return following


@njit(cache=True)
def _belady(items, offsets, lookup, runs, n_items, capacity):
    hits = np.zeros(len(offsets) - 1, np.int64)
    following = _next_counted_use(items, offsets, lookup, runs, n_items)
    kept_until = np.full(n_items, -1, np.int64)  # -1: not kept
    heap_time = np.zeros(2 * capacity + 64, np.int64)  # max-heap of (next use, block)
    heap_item = np.zeros(2 * capacity + 64, np.int64)
    size = 0
    n_kept = 0
    for r in range(len(offsets) - 1):
        if not runs[r]:
            continue
        for t in range(offsets[r], offsets[r + 1]):
            item = items[t]
            if kept_until[item] == t:
                hits[r] += 1
                kept_until[item] = -1
                n_kept -= 1
            if following[t] == _NONE or capacity == 0:
                continue
            if size == len(heap_time):
                size = _drop_stale(heap_time, heap_item, size, kept_until)
            kept_until[item] = following[t]
            n_kept += 1
            size = _push(heap_time, heap_item, size, following[t], item)
            while n_kept > capacity:
                top_time, top_item = heap_time[0], heap_item[0]
                size = _pop(heap_time, heap_item, size)
                if kept_until[top_item] == top_time:
                    kept_until[top_item] = -1
                    n_kept -= 1
    return hits


@njit(cache=True)
def _drop_stale(heap_time, heap_item, size, kept_until):
    """Keep only the entries of blocks still kept, and re-heapify."""
    live = 0
    for i in range(size):
        if kept_until[heap_item[i]] == heap_time[i]:
            heap_time[live], heap_item[live] = heap_time[i], heap_item[i]
            live += 1
    for i in range(live // 2 - 1, -1, -1):
        _sift_down(heap_time, heap_item, live, i)
    return live


@njit(cache=True)
def _push(heap_time, heap_item, size, time, item):
    i = size
    heap_time[i], heap_item[i] = time, item
    while i > 0 and heap_time[(i - 1) // 2] < heap_time[i]:
        parent = (i - 1) // 2
        heap_time[i], heap_time[parent] = heap_time[parent], heap_time[i]
        heap_item[i], heap_item[parent] = heap_item[parent], heap_item[i]
        i = parent
    return size + 1


@njit(cache=True)
def _pop(heap_time, heap_item, size):
    size -= 1
    heap_time[0], heap_item[0] = heap_time[size], heap_item[size]
    _sift_down(heap_time, heap_item, size, 0)
    return size


@njit(cache=True)
def _sift_down(heap_time, heap_item, size, i):
    while True:
        largest = i
        for child in (2 * i + 1, 2 * i + 2):
            if child < size and heap_time[child] > heap_time[largest]:
                largest = child
        if largest == i:
            return
        heap_time[i], heap_time[largest] = heap_time[largest], heap_time[i]
        heap_item[i], heap_item[largest] = heap_item[largest], heap_item[i]
        i = largest
