"""LRU stack distances of a block stream: the hit-vs-capacity curve of an LRU prefix cache in one
pass (Mattson's stack algorithm), instead of one replay per capacity.

The model: a request looks up its leading blocks, then releases every block it caches, deepest
first, so that a prefix is always more recent than its extensions (vLLM appends a request's freed
blocks to its free queue last block first; SGLang stamps a matched path and evicts leaves). A block
is cached at a lookup when fewer than ``capacity`` other blocks were released since its own last
release. A request hits its leading run of cached blocks, and only when its peak fits the cache.

What this leaves out, so the curve is an approximation of an engine's replay (measured against
full replays in the tests and in the report): duplicate copies of a block (vLLM) and whole-node or
one-page-early evictions (SGLang) that take room, requests too big for a small cache that the
engine skips (here they still touch the stack), and every policy but LRU.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models._bits import popcount as _popcount
from cache_models.block_stream import BlockStream


def hit_thresholds(stream: BlockStream, held_back: np.ndarray | None = None) -> np.ndarray:
    """For every lookup block, the smallest capacity (in blocks) at which it hits, ascending.

    ``held_back[r]`` blocks of the cache are unavailable to request r's lookup (vLLM: the previous
    request's partial block, which its free queue keeps at the head). A block that was never
    released before has no threshold and is left out.
    """
    extra = np.zeros(stream.n_requests, np.int64) if held_back is None else held_back
    small = len(stream.items) < np.iinfo(np.int32).max  # release times fit int32
    last = np.full(stream.n_items, -1, np.int32 if small else np.int64)
    # a threshold is at most a distance (< the items) plus the held-back blocks and one, or a
    # peak: int32 halves the array to fill and sort when those fit
    largest = stream.n_items + int(extra.max(initial=0)) + int(stream.peak.max(initial=0)) + 1
    n_lookups = int(np.minimum(stream.lookup, np.diff(stream.offsets)).clip(0).sum())
    out = np.empty(n_lookups, np.int32 if largest < np.iinfo(np.int32).max else np.int64)
    size = _thresholds(stream.items, stream.offsets, stream.lookup, stream.peak, extra, last, out)
    thresholds = out[:size]
    thresholds.sort()
    return thresholds


def hit_blocks(thresholds: np.ndarray, capacity_blocks: np.ndarray) -> np.ndarray:
    """Total hit blocks of the LRU model at each capacity."""
    # in the thresholds' own type (a wider query would copy them to compare): a capacity past
    # that type's range exceeds every threshold, as its largest value does
    top = np.iinfo(thresholds.dtype).max
    capacity = np.minimum(np.asarray(capacity_blocks), top).astype(thresholds.dtype)
    return np.searchsorted(thresholds, capacity, side="right")


@njit(cache=True)
def _thresholds(items, offsets, lookup, peak, extra, last, out):
    """The thresholds of the lookup blocks that have one, in stream order, into ``out`` (room
    for every lookup: the pages never written stay unmapped); returns how many. ``last[item]``:
    the item's last release time (-1 on entry: none yet)."""
    n_requests = len(offsets) - 1
    marks = _new_marks(len(items))  # one marker at each item's last release time
    n_marked = 0
    clock = 0
    size = 0
    for r in range(n_requests):
        first, stop = offsets[r], offsets[r + 1]
        running = np.int64(0)
        # A prefix's blocks were released together, deepest first, so their release times
        # mostly fall one below the other: the count up to a time is then the previous one's
        # less the markers between them, read from one word instead of the tree.
        previous = np.int64(-1)  # the previous lookup's release time (-1: none)
        counted = np.int64(0)  # markers at times <= previous
        for j in range(min(lookup[r], stop - first)):
            item = items[first + j]
            time = np.int64(last[item])
            if time < 0:  # never released: no threshold for it or the blocks after it
                break
            word = time >> 6
            if 0 <= time < previous and word == previous >> 6:
                counted -= _marked_between(marks[0][word], time & 63, previous & 63)
            else:
                counted = _marked_up_to(marks, time)
            previous = time
            distance = n_marked - counted  # releases more recent
            running = max(running, distance + extra[r] + 1, peak[r])
            out[size] = running
            size += 1
        # Release, deepest first, at consecutive times: each marker's bit is set at once, its
        # word's count added to the tree once per word (nothing reads the tree until the next
        # request's lookups; the markers taken away are all older than this request's, and
        # mostly run word by word too, so they leave the tree a word at a time as well).
        pending = 0
        unmarked_word = -1
        unmarked = 0
        for j in range(stop - 1, first - 1, -1):
            item = items[j]
            if last[item] >= 0:
                word = last[item] >> 6
                marks[0][word] &= ~(np.uint64(1) << np.uint64(last[item] & 63))
                if word != unmarked_word:
                    if unmarked:
                        _add(marks[1], unmarked_word, -unmarked)
                    unmarked_word, unmarked = word, 0
                unmarked += 1
            else:
                n_marked += 1
            last[item] = clock
            marks[0][clock >> 6] |= np.uint64(1) << np.uint64(clock & 63)
            pending += 1
            if clock & 63 == 63 or j == first:
                _add(marks[1], clock >> 6, pending)
                pending = 0
            clock += 1
        if unmarked:
            _add(marks[1], unmarked_word, -unmarked)
    return size


# The markers: a bit per release time, and a Fenwick tree of the markers in each 64-bit word.
# A count up to a time reads the tree over whole words and one word's bits: the tree has a
# 64th of the times' entries, so it stays in cache where one entry per time did not.


@njit(cache=True)
def _new_marks(n_times):
    n_words = n_times // 64 + 1
    return np.zeros(n_words, np.uint64), np.zeros(n_words + 1, np.int32)


@njit(cache=True, inline="always")
def _marked_up_to(marks, time):
    """Markers at times <= time."""
    bits, fenwick = marks
    word = time >> 6
    low = bits[word] & _up_to(time & 63)
    return _prefix(fenwick, word) + _popcount(low)


@njit(cache=True, inline="always")
def _marked_between(word_bits, low, high):
    """Markers of one word at bit positions in (low, high], 0 <= low < high <= 63."""
    above_low = np.uint64(0xFFFFFFFFFFFFFFFF) << np.uint64(low + 1)
    return _popcount(word_bits & above_low & _up_to(high))


@njit(cache=True, inline="always")
def _up_to(bit):
    """The mask of bit positions <= bit."""
    return np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(63 - bit)


@njit(cache=True, inline="always")
def _add(fenwick, index, delta):
    i = index + 1
    while i < len(fenwick):
        fenwick[i] += delta
        i += i & -i


@njit(cache=True, inline="always")
def _prefix(fenwick, index):
    """The sum of entries before ``index``."""
    total = 0
    i = index
    while i > 0:
        total += fenwick[i]
        i -= i & -i
    return total
