"""The offline cache analyses: block items name (namespace, prefix) blocks, the one-pass LRU curve
agrees with full replays, and the Belady bound is the exhaustive optimum and bounds every replay."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from cache_models.belady import belady_hit_blocks
from cache_models.block_stream import BlockStream, block_stream, block_streams
from cache_models.config import SglangConfig, VllmConfig
from cache_models.prefix_trie import PrefixTrie, TrieNodes
from cache_models.sglang_radix import SglangRadixCache
from cache_models.stack_distance import hit_blocks, hit_thresholds
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload
from tests.golden.workloads import random_workload
from tests.test_prefix_trie import to_workload


def vllm_stream(workload: Workload, block: int) -> tuple[BlockStream, np.ndarray]:
    trie = PrefixTrie()
    trie.replay(workload)
    assert trie.nodes is not None
    cached = workload.prompt_lengths + workload.output_lengths - 1
    stream = block_stream(trie.nodes, workload, block, cached)
    partial = (cached % block != 0).astype(np.int64)
    return stream, np.r_[0, partial[:-1]]


def sglang_stream(workload: Workload) -> BlockStream:
    trie = PrefixTrie()
    trie.replay(workload)
    assert trie.nodes is not None
    outputs = workload.output_lengths
    cached = workload.prompt_lengths + np.where(workload.stop_finish, outputs, outputs - 1)
    return block_stream(trie.nodes, workload, 1, cached)


def test_block_items_name_namespace_and_prefix() -> None:
    workload = Workload.from_lists(
        [[1, 2, 3, 4, 5], [1, 2, 3, 4, 9], [1, 2, 7, 4, 5], [1, 2, 3, 4, 5]],
        [[6], [6], [6], [6]],
        namespace=[0, 0, 0, 1],
    )
    stream, _ = vllm_stream(workload, 2)
    blocks = [stream.items[stream.offsets[r] : stream.offsets[r + 1]].tolist() for r in range(4)]
    assert [len(b) for b in blocks] == [2, 2, 2, 2]  # (5 + 1 - 1) // 2 full blocks each
    assert blocks[0] == blocks[1]  # [1,2] and [1,2,3,4] shared
    assert blocks[2][0] == blocks[0][0] and blocks[2][1] != blocks[0][1]
    assert not set(blocks[3]) & set(blocks[0])  # another namespace shares nothing
    assert stream.lookup.tolist() == [2, 2, 2, 2]


def token_by_token_items(trie: TrieNodes, workload: Workload, block: int, cached: np.ndarray):
    """The stream's items by their definition, walking the trie one token at a time."""
    children = {
        (0, int(trie.namespace[n]))
        if trie.parent[n] == 0
        else (int(trie.parent[n]), int(trie.store[trie.start[n]])): n
        for n in range(1, trie.n_nodes)
        if trie.parent[n] == 0 or trie.length[n] > 0
    }
    items, unique = [], len(trie.store)
    for r in range(workload.n_requests):
        tokens = np.r_[workload.prompt(r), workload.output(r)][: int(cached[r])].tolist()
        node, pos = children.get((0, int(workload.namespace[r])), -1), 0
        for i, token in enumerate(tokens):
            if node >= 0 and pos == trie.length[node]:
                node, pos = children.get((node, token), -1), 0
            if node >= 0 and (token < 0 or trie.store[trie.start[node] + pos] != token):
                node = -1
            pos += 1
            if (i + 1) % block == 0:
                items.append(trie.start[node] + pos - 1 if node >= 0 else unique)
                unique += node < 0
    return items, unique


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block", [1, 3, 16])
def test_block_items_are_the_token_walks(seed: int, block: int) -> None:
    workload = to_workload(random_workload(seed, n_requests=120, vocab=5))
    rng = np.random.default_rng(seed)
    unknown = rng.random(len(workload.output_tokens)) < 0.1  # unknown answer tokens
    outputs = np.where(unknown, -1 - np.arange(len(unknown)), workload.output_tokens)
    workload = replace(workload, output_tokens=outputs.astype(workload.output_tokens.dtype))
    trie = PrefixTrie()
    trie.replay(workload)
    total = workload.prompt_lengths + workload.output_lengths
    for cached in (total, total - 1, rng.integers(0, total + 1)):
        stream = block_stream(trie.nodes, workload, block, cached)
        items, _ = token_by_token_items(trie.nodes, workload, block, cached)
        used, renumbered = np.unique(np.array(items, np.int64), return_inverse=True)
        assert stream.items.tolist() == renumbered.tolist()  # the ids used, 0.. in their order
        assert stream.n_items == len(used)


def test_unknown_outputs_get_blocks_of_their_own() -> None:
    workload = Workload.from_lists([[1, 2], [1, 2]], [[-1, -2, -3], [-4, -5, -6]])
    stream, _ = vllm_stream(workload, 2)
    first, second = stream.items[:2].tolist(), stream.items[2:].tolist()
    assert first[0] == second[0] and first[1] != second[1]


@pytest.mark.parametrize("seed", range(4))
def test_one_walk_gives_each_size_its_own_stream(seed: int) -> None:
    """block_streams walks the tokens once for several sizes: each stream is the one walked
    alone (its items, unknown blocks' ids, offsets, lookups and peaks)."""
    rng = np.random.default_rng(seed)
    workload = to_workload(random_workload(seed, n_requests=80, vocab=5))
    trie = PrefixTrie()
    trie.replay(workload)
    assert trie.nodes is not None
    total = workload.prompt_lengths + workload.output_lengths
    sizes = [4, 1, 3]
    cached = [rng.integers(0, total + 1) for _ in sizes]
    together = block_streams(trie.nodes, workload, sizes, cached)
    for stream, size, tokens in zip(together, sizes, cached, strict=True):
        alone = block_stream(trie.nodes, workload, size, tokens)
        assert np.array_equal(stream.items, alone.items)
        assert np.array_equal(stream.offsets, alone.offsets)
        assert np.array_equal(stream.lookup, alone.lookup)
        assert np.array_equal(stream.peak, alone.peak)
        assert stream.n_items == alone.n_items and stream.block_size == size


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block", [1, 4, 16])
def test_lru_curve_is_vllm_replay(seed: int, block: int) -> None:
    """vLLM's sequential replay is an LRU over released blocks; duplicate copies, chains cut in
    the middle and requests too big for the cache make the curve an approximation (these
    six-token vocabularies are its worst case: within 3% of the prompt tokens)."""
    workload = to_workload(random_workload(seed, n_requests=150, vocab=6))
    stream, held_back = vllm_stream(workload, block)
    thresholds = hit_thresholds(stream, held_back)
    prompt = int(workload.prompt_lengths.sum())
    for blocks in (4, 10, 25, 60, 200):
        replay = VllmPrefixCache(VllmConfig(block, capacity_tokens=blocks * block)).replay(workload)
        model = int(hit_blocks(thresholds, np.array([blocks]))[0]) * block
        assert abs(model - replay.total_hit_tokens) <= 0.03 * prompt
    unbounded = VllmPrefixCache(VllmConfig(block)).replay(workload).total_hit_tokens
    assert len(thresholds) * block == unbounded


@pytest.mark.parametrize("seed", range(6))
def test_lru_curve_is_close_to_sglang_replay(seed: int) -> None:
    """SGLang evicts whole leaf nodes, so its cache holds a little less than the model's: within
    8% of the prompt tokens from two requests' worth of capacity, 1% from twenty."""
    workload = to_workload(random_workload(seed, n_requests=150, vocab=6))
    thresholds = hit_thresholds(sglang_stream(workload))
    prompt = int(workload.prompt_lengths.sum())
    largest = int((workload.prompt_lengths + workload.output_lengths).max())
    for requests, tolerance in ((2, 0.08), (5, 0.08), (20, 0.01)):
        capacity = requests * largest
        replay = SglangRadixCache(SglangConfig(capacity_tokens=capacity)).replay(workload)
        model = int(hit_blocks(thresholds, np.array([capacity]))[0])
        assert abs(model - replay.total_hit_tokens) <= tolerance * prompt
    assert len(thresholds) == SglangRadixCache(SglangConfig()).replay(workload).total_hit_tokens


def test_lru_curve_exact_case() -> None:
    """A, B, C, A: each release holds 6 tokens (prompt + stop output), so A's first token is hit
    from 13 tokens of capacity (B and C released since) and its 4-token lookup from 16."""
    a, b, c = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]
    workload = Workload.from_lists([a, b, c, a], [[0]] * 4)
    thresholds = hit_thresholds(sglang_stream(workload))
    assert hit_blocks(thresholds, np.array([12, 13, 14, 15, 16, 99])).tolist() == [0, 1, 2, 3, 4, 4]


def reference_thresholds(stream: BlockStream, held_back: np.ndarray) -> list[int]:
    """hit_thresholds by the definition, on a recency list (most recent release last)."""
    released: list[int] = []
    out = []
    for r in range(stream.n_requests):
        blocks = stream.items[stream.offsets[r] : stream.offsets[r + 1]].tolist()
        running = 0
        for item in blocks[: stream.lookup[r]]:
            if item not in released or running is None:
                running = None
                continue
            newer = len(released) - 1 - released.index(item)
            running = max(running, newer + int(held_back[r]) + 1, int(stream.peak[r]))
            out.append(running)
        for item in reversed(blocks):  # deepest first
            if item in released:
                released.remove(item)
            released.append(item)
    return sorted(out)


@pytest.mark.parametrize("seed", range(8))
def test_thresholds_are_the_stack_distances(seed: int) -> None:
    """The one-pass kernel (markers in 64-bit words) against the definition, on streams long
    enough to cross many words, with items reused at every distance."""
    rng = np.random.default_rng(seed)
    n_requests = int(rng.integers(20, 60))
    lengths = rng.integers(0, 30, n_requests)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    n_items = int(rng.integers(5, 200))
    items = rng.integers(0, n_items, int(offsets[-1])).astype(np.int64)
    stream = BlockStream(
        items=items,
        offsets=offsets,
        lookup=rng.integers(0, 32, n_requests).astype(np.int64),
        peak=rng.integers(0, 40, n_requests).astype(np.int64),
        n_items=n_items,
        block_size=1,
    )
    held_back = rng.integers(0, 2, n_requests).astype(np.int64)
    assert hit_thresholds(stream, held_back).tolist() == reference_thresholds(stream, held_back)


@pytest.mark.parametrize("seed", range(6))
def test_thresholds_of_prefix_streams_are_the_stack_distances(seed: int) -> None:
    """Streams as logs make them, each request an earlier one's blocks and then new ones (the
    release times of a prefix fall one below the other, within a word and across words: the
    kernel's short count between them), against the definition."""
    rng = np.random.default_rng(50 + seed)
    requests: list[list[int]] = []
    n_items = 0
    for _ in range(int(rng.integers(40, 90))):
        head = requests[int(rng.integers(len(requests)))] if requests and rng.random() < 0.8 else []
        head = head[: int(rng.integers(0, len(head) + 1))]
        new = int(rng.integers(0, 90))
        requests.append(head + list(range(n_items, n_items + new)))
        n_items += new
    lengths = np.array([len(r) for r in requests])
    stream = BlockStream(
        items=np.array([i for r in requests for i in r], np.int64),
        offsets=np.r_[0, np.cumsum(lengths)].astype(np.int64),
        lookup=np.maximum(lengths - rng.integers(0, 3, len(lengths)), 0).astype(np.int64),
        peak=rng.integers(0, 20, len(lengths)).astype(np.int64),
        n_items=max(n_items, 1),
        block_size=1,
    )
    held_back = rng.integers(0, 2, len(lengths)).astype(np.int64)
    assert hit_thresholds(stream, held_back).tolist() == reference_thresholds(stream, held_back)


def brute_force_optimum(stream: BlockStream, capacity: int) -> int:
    """The most counted hits of any keep/drop schedule (exhaustive; tiny streams only)."""
    accesses = []
    for r in range(stream.n_requests):
        if stream.peak[r] > capacity:
            continue
        for j in range(stream.offsets[r], stream.offsets[r + 1]):
            accesses.append((int(stream.items[j]), j - stream.offsets[r] < stream.lookup[r]))

    @functools.cache
    def best(t: int, kept: frozenset[int]) -> int:
        if t == len(accesses):
            return 0
        item, counted = accesses[t]
        gained = int(counted and item in kept)
        pool = sorted(kept | {item})
        result = 0
        for mask in range(1 << len(pool)):
            chosen = frozenset(p for k, p in enumerate(pool) if mask >> k & 1)
            if len(chosen) <= capacity:
                result = max(result, best(t + 1, chosen))
        return gained + result

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(8))
def test_belady_is_the_exhaustive_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 3, rng.integers(2, 5)).tolist() for _ in range(5)]
    workload = Workload.from_lists(prompts, [[int(rng.integers(1, 3))] for _ in prompts])
    stream = sglang_stream(workload)
    for capacity in (1, 2, 3):
        assert belady_hit_blocks(stream, capacity).sum() == brute_force_optimum(stream, capacity)


@pytest.mark.parametrize("seed", range(6))
def test_belady_bounds_every_replay(seed: int) -> None:
    workload = to_workload(random_workload(seed, n_requests=150, vocab=6))
    stream, _ = vllm_stream(workload, 4)
    sglang = sglang_stream(workload)
    for capacity in (16, 60, 200, 1000):
        for policy in ("lru", "lfu", "fifo"):
            replay = SglangRadixCache(
                SglangConfig(capacity_tokens=capacity, eviction_policy=policy)
            )
            assert (
                replay.replay(workload).total_hit_tokens
                <= belady_hit_blocks(sglang, capacity).sum()
            )
        vllm = VllmPrefixCache(VllmConfig(4, capacity_tokens=capacity)).replay(workload)
        assert vllm.total_hit_tokens <= belady_hit_blocks(stream, capacity // 4).sum() * 4


def test_hit_blocks_of_narrow_thresholds_at_any_capacity() -> None:
    """Thresholds kept as int32 count the same hits as int64 ones, at capacities past int32."""
    rng = np.random.default_rng(7)
    wide = np.sort(rng.integers(1, 1000, 500))
    capacities = np.array([0, 1, 500, 999, 1000, 2**31 - 1, 2**31, 2**40])
    expected = np.searchsorted(wide, capacities, side="right")
    for thresholds in (wide, wide.astype(np.int32)):
        assert hit_blocks(thresholds, capacities).tolist() == expected.tolist()
