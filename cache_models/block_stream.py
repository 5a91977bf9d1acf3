"""Each request's cacheable blocks as dense item ids: the access stream that offline cache analyses
(LRU stack distances, the Belady bound) read.

A block item stands for one (namespace, prefix) ending on a block boundary, as an engine's chained
block key does. Ids come from the prefix trie of the same workload: the id of the block that ends at
prompt position ``i`` is the trie's store index of token ``i`` on the request's path, which is
unique per (namespace, prefix). Blocks the trie does not hold (after an unknown output token) can
never be hit; each gets an id of its own above the trie's. Each stream's ids are then renumbered
0..n-1 in their order (``_dense``): the analyses' per-item arrays hold the blocks used, not one
entry per distinct token of the trie (98 MB on the Mooncake trace, whose fresh pages cost up to
a quarter of a second to fault in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from cache_models import engine_rules as rules
from cache_models._bits import popcount
from cache_models.prefix_trie import TrieNodes
from cache_models.trie_walk import child_map, child_of
from cache_models.workload import Workload


@dataclass(frozen=True)
class BlockStream:
    """Request r's cacheable full blocks are ``items[offsets[r] : offsets[r + 1]]``, root first."""

    items: np.ndarray  # item ids: int32 (int64 when they would not fit)
    offsets: np.ndarray  # int64, one more than requests
    lookup: np.ndarray  # int64 per request: its leading blocks a lookup may hit, (L - 1) // B
    peak: np.ndarray  # int64 per request: blocks it holds at its peak (whole blocks)
    n_items: int  # ids are 0..n_items - 1, each used
    block_size: int

    @property
    def n_requests(self) -> int:
        return len(self.offsets) - 1


def block_stream(
    trie: TrieNodes, workload: Workload, block_size: int, cached_tokens: np.ndarray
) -> BlockStream:
    """The stream at ``block_size``; request r caches the full blocks of its first
    ``cached_tokens[r]`` tokens of prompt + outputs (``trie`` must be built from ``workload``)."""
    return block_streams(trie, workload, [block_size], [cached_tokens])[0]


def block_streams(
    trie: TrieNodes,
    workload: Workload,
    block_sizes: Sequence[int],
    cached_tokens: Sequence[np.ndarray],
) -> list[BlockStream]:
    """``block_stream`` at each of ``block_sizes`` (with its ``cached_tokens``), in one walk of
    the workload's tokens."""
    trie = trie.expanded  # store indices are token positions
    prompt_lengths = workload.prompt_lengths.astype(np.int64)
    total = prompt_lengths + workload.output_lengths
    cached = np.stack([np.minimum(np.asarray(c, np.int64), total) for c in cached_tokens])
    sizes = np.asarray(block_sizes, np.int64)
    offsets = np.zeros((len(sizes), workload.n_requests + 1), np.int64)
    np.cumsum(cached // sizes[:, None], axis=1, out=offsets[:, 1:])
    bases = np.r_[0, np.cumsum(offsets[:, -1])]
    # ids stay below the store's size plus the blocks: int32 halves the streams' memory
    small = len(trie.store) + int(bases[-1]) < np.iinfo(np.int32).max
    items = np.empty(bases[-1], np.int32 if small else np.int64)
    n_items = _walk(
        child_map(trie),
        trie.start,
        trie.length,
        trie.store,
        workload.prompt_tokens,
        workload.prompt_offsets,
        workload.output_tokens,
        workload.output_offsets,
        workload.namespace.astype(np.int64),
        cached,
        sizes,
        offsets + bases[:-1, None],
        items,
    )
    peak_tokens = rules.vllm_peak_tokens(prompt_lengths, workload.output_lengths)
    streams = []
    for k, size in enumerate(sizes):
        stream_items = items[bases[k] : bases[k + 1]]
        streams.append(
            BlockStream(
                items=stream_items,
                offsets=offsets[k],
                lookup=(prompt_lengths - 1) // size,
                peak=rules.ceil_div(peak_tokens, size),
                n_items=int(_dense(stream_items, n_items[k])),
                block_size=int(size),
            )
        )
    return streams


@njit(cache=True)
def _dense(items, n_items):
    """``items`` (ids below ``n_items``) renumbered in place 0..n-1 in the order of the ids: a
    bitmap of the ids used and its running counts; returns n."""
    words = (n_items + 63) >> 6
    used = np.zeros(words, np.uint64)
    for x in items:
        used[x >> 6] |= np.uint64(1) << np.uint64(x & 63)
    before = np.empty(words, np.int64)
    total = 0
    for w in range(words):
        before[w] = total
        total += popcount(used[w])
    one = np.uint64(1)
    for i in range(len(items)):
        x = items[i]
        lower = used[x >> 6] & ((one << np.uint64(x & 63)) - one)
        items[i] = before[x >> 6] + popcount(lower)
    return total


@njit(cache=True)
def _walk(
    children,
    start,
    length,
    store,
    prompt_tokens,
    prompt_offsets,
    output_tokens,
    output_offsets,
    namespace,
    cached,
    sizes,
    offsets,
    items,
):
    """Each request's path through the trie, an edge's run of tokens at a time; at every block
    end of each size ``k`` (within ``cached[k, r]``) the block's item goes to ``items`` (stream
    k's blocks of request r from ``offsets[k, r]``). Returns each stream's number of items."""
    n_sizes = len(sizes)
    next_unique = np.full(n_sizes, len(store), np.int64)
    out = np.empty(n_sizes, np.int64)
    for r in range(len(prompt_offsets) - 1):
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        o0 = output_offsets[r]
        prompt_len = p1 - p0
        node = child_of(children, 0, namespace[r])
        pos = 0  # tokens of ``node`` matched so far
        walked = 0
        for k in range(n_sizes):
            out[k] = offsets[k, r]
            walked = max(walked, cached[k, r])
        i = 0  # tokens of the request walked so far
        while i < walked:
            if node >= 0 and pos == length[node]:
                token = (
                    prompt_tokens[p0 + i] if i < prompt_len else output_tokens[o0 + i - prompt_len]
                )
                node = child_of(children, node, token)
                pos = 0
            if node < 0:  # off the trie: every block that ends from here on is new
                for k in range(n_sizes):
                    for _ in range(cached[k, r] // sizes[k] - i // sizes[k]):
                        items[out[k]] = next_unique[k]
                        next_unique[k] += 1
                        out[k] += 1
                break
            # the run of tokens that follow the node's edge, the prompt's then the answer's
            edge = start[node] + pos
            span = min(length[node] - pos, walked - i)
            m = 0
            while m < span and i + m < prompt_len:
                token = prompt_tokens[p0 + i + m]
                if token < 0 or store[edge + m] != token:
                    break
                m += 1
            if i + m >= prompt_len:
                while m < span:
                    token = output_tokens[o0 + i + m - prompt_len]
                    if token < 0 or store[edge + m] != token:
                        break
                    m += 1
            for k in range(n_sizes):
                size = sizes[k]
                end = i // size * size + size - 1  # the first block end from i
                while end < min(i + m, cached[k, r]):
                    items[out[k]] = edge + end - i
                    out[k] += 1
                    end += size
            i += m
            pos += m
            if m < span:  # token i differs from the trie's
                node = -1
    return next_unique
