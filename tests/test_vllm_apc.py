"""vLLM APC model: the worked cases of docs/vllm-apc.md §9 (checked there against vLLM's own code),
properties every replay must satisfy, and the numba kernel equal to the reference."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cache_models import _vllm_kernel as kernel
from cache_models.config import TimeModel, VllmConfig
from cache_models.result import ReplayResult
from cache_models.vllm_apc import VllmPrefixCache, VllmSession
from cache_models.workload import Workload
from tests.chunking import assert_chunks_add_up, random_chunks
from tests.golden.vllm import to_workload
from tests.golden.workloads import random_workload

ENGINES = ["fast", "reference"]


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def replay(
    prompts: list[list[int]],
    outputs: list[list[int] | None] | None = None,
    *,
    engine: str,
    block_size: int = 16,
    num_blocks: int | None = None,
    max_in_flight: int = 1,
    namespace: list[int] | None = None,
) -> ReplayResult:
    """Replay with the oracle's conventions: ``num_blocks`` counts vLLM's null block."""
    config = VllmConfig(
        block_size=block_size,
        capacity_tokens=None if num_blocks is None else (num_blocks - 1) * block_size,
        max_in_flight=max_in_flight,
    )
    workload = Workload.from_lists(prompts, outputs, namespace)
    return VllmPrefixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]


def hits(*args: object, **kwargs: object) -> list[int]:
    return replay(*args, **kwargs).hit_tokens.tolist()  # type: ignore[arg-type]


# ---------------------------------------------------------------- §9 worked cases


@pytest.mark.parametrize("engine", ENGINES)
class TestWorkedCases:
    def test_partial_block_is_not_cached(self, engine: str) -> None:
        a = seq(1000, 17)
        assert hits([a, [*a, 5, 6, 7]], engine=engine) == [0, 16]

    def test_hit_stops_at_last_full_block_before_the_last_token(self, engine: str) -> None:
        b = seq(2000, 49)
        assert hits([b, b + [9] * 10], engine=engine) == [0, 48]

    def test_aligned_identical_resend_recomputes_its_last_block(self, engine: str) -> None:
        c = seq(3000, 32)
        assert hits([c, c], engine=engine) == [0, 16]
        assert hits([[*c, 1], [*c, 1]], engine=engine) == [0, 32]

    def test_eviction_takes_the_deepest_block_first(self, engine: str) -> None:
        a, c = seq(100, 8), seq(200, 8)
        assert hits([a, c, [*a, 9]], engine=engine, block_size=4, num_blocks=4) == [0, 0, 4]

    def test_lru_order(self, engine: str) -> None:
        a, c, d = seq(100, 8), seq(200, 8), seq(300, 12)
        prompts = [a, c, a, d, [*a, 9], [*c, 9]]
        assert hits(prompts, engine=engine, block_size=4, num_blocks=5) == [0, 0, 4, 0, 4, 0]

    def test_partial_blocks_are_reused_first(self, engine: str) -> None:
        prompts = [seq(400, 4), seq(500, 6), seq(600, 4), [*seq(400, 4), 9]]
        assert hits(prompts, engine=engine, block_size=4, num_blocks=4) == [0, 0, 0, 4]

    def test_output_blocks_are_cached_except_the_last_token(self, engine: str) -> None:
        p = seq(700, 5)
        prompts = [p, [*p, 1, 2, 3, 9], p, [*p, 1, 2, 3, 9]]
        outputs = [[1, 2, 3], None, [1, 2, 3, 4], None]
        assert hits(prompts, outputs, engine=engine, block_size=4) == [0, 4, 4, 8]

    def test_namespaces_never_share(self, engine: str) -> None:
        s = seq(800, 40)
        prompts = [s, [*s, 1], [*s, 2], [*s, 3]]
        assert hits(prompts, engine=engine, namespace=[1, 2, 1, 0]) == [0, 0, 32, 0]

    @pytest.mark.parametrize("max_in_flight", [1, 3])
    def test_same_step_hits(self, engine: str, max_in_flight: int) -> None:
        x = seq(900, 32)
        prompts = [[*x, 1], [*x, 2], [*x, 3]]
        outputs: list[list[int] | None] = [[5] * 4] * 3
        result = hits(prompts, outputs, engine=engine, num_blocks=100, max_in_flight=max_in_flight)
        assert result == [0, 32, 32]

    def test_admitted_in_the_same_step_as_a_sibling(self, engine: str) -> None:
        x = seq(5000, 64)
        result = hits([[*x, 1], [*x, 2]], [[7, 7]] * 2, engine=engine, max_in_flight=2)
        assert result == [0, 64]

    def test_preemption_and_rehit(self, engine: str) -> None:
        y = seq(1000, 8)
        prompts = [y, [*y, 1], [*y, 2]]
        outputs = [seq(50, 12), seq(70, 12), None]
        result = replay(
            prompts, outputs, engine=engine, block_size=4, num_blocks=8, max_in_flight=2
        )
        assert result.hit_tokens.tolist() == [0, 8, 8]
        assert result.counters["preemptions"].tolist() == [0, 1, 0]
        assert result.counters["rehit_tokens"].tolist() == [0, 16, 0]
        assert result.metrics["vllm:num_preemptions"] == 1
        # A re-admission is not in the exported metrics.
        assert result.metrics["vllm:prefix_cache_queries"] == 8 + 9 + 9
        assert result.metrics["vllm:prefix_cache_hits"] == 16

    def test_a_duplicate_copy_survives_eviction(self, engine: str) -> None:
        p = seq(100, 8)
        prompts = [p, p, seq(200, 4), seq(300, 4), [*p, 9]]
        result = replay(prompts, engine=engine, block_size=4, num_blocks=5)
        assert result.hit_tokens.tolist() == [0, 4, 0, 0, 8]
        assert result.counters["duplicate_blocks"].tolist() == [0, 1, 0, 0, 0]

    def test_evicting_both_copies(self, engine: str) -> None:
        p = seq(100, 8)
        prompts = [p, p, seq(400, 12), [*p, 9]]
        assert hits(prompts, engine=engine, block_size=4, num_blocks=5) == [0, 4, 0, 4]


# ---------------------------------------------------------------- counters and edge cases


@pytest.mark.parametrize("engine", ENGINES)
class TestCounters:
    def test_inserted_blocks_cover_prompt_and_all_outputs_but_the_last(self, engine: str) -> None:
        result = replay([seq(0, 10)], [seq(100, 7)], engine=engine, block_size=4)
        assert result.counters["inserted_blocks"].tolist() == [(10 + 7 - 1) // 4]

    def test_evictions_are_charged_to_the_request_that_evicts(self, engine: str) -> None:
        result = replay([seq(0, 8), seq(100, 8)], engine=engine, block_size=4, num_blocks=3)
        # Two usable blocks: B's prompt takes both of A's cached blocks.
        assert result.counters["evicted_blocks"].tolist() == [0, 2]
        assert result.counters["evicted_tokens"].tolist() == [0, 8]

    def test_unbounded_never_evicts(self, engine: str) -> None:
        workload = to_workload(random_workload(3, 60))
        result = VllmPrefixCache(VllmConfig(block_size=4), implementation=engine).replay(workload)  # type: ignore[arg-type]
        assert not result.counters["evicted_blocks"].any()

    def test_a_request_that_can_never_fit_is_rejected(self, engine: str) -> None:
        a = seq(0, 8)
        prompts = [a, seq(100, 20), [*a, 1]]
        result = replay(prompts, engine=engine, block_size=4, num_blocks=4)
        assert result.hit_tokens.tolist() == [0, 0, 8]  # the rejected one evicted nothing
        assert result.counters["rejected"].tolist() == [0, 1, 0]
        assert result.counters["inserted_blocks"][1] == 0
        assert result.metrics["vllm:prefix_cache_queries"] == 8 + 9

    def test_rejected_by_its_outputs(self, engine: str) -> None:
        # Two usable blocks of 4: the peak 6 + 3 - 1 = 8 tokens fits, 6 + 4 - 1 = 9 does not.
        fits = replay([seq(0, 6)], [seq(50, 3)], engine=engine, block_size=4, num_blocks=3)
        too_big = replay([seq(0, 6)], [seq(50, 4)], engine=engine, block_size=4, num_blocks=3)
        assert fits.counters["rejected"].tolist() == [0]
        assert too_big.counters["rejected"].tolist() == [1]

    def test_metrics_total_the_first_admissions(self, engine: str) -> None:
        workload = to_workload(random_workload(5, 80))
        config = VllmConfig(block_size=16, capacity_tokens=16 * 40, max_in_flight=4)
        result = VllmPrefixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]
        assert result.engine == "vllm"
        assert result.metrics["vllm:prefix_cache_queries"] == workload.prompt_lengths.sum()
        assert result.metrics["vllm:prefix_cache_hits"] == result.hit_tokens.sum()
        assert result.hit_tokens.dtype == np.int64
        assert all(v.dtype == np.int64 for v in result.counters.values())


# ---------------------------------------------------------------- properties


def random_workloads() -> list[Workload]:
    return [to_workload(random_workload(seed, 70)) for seed in range(100, 106)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block_size", [4, 16])
def test_hit_bounds(engine: str, block_size: int) -> None:
    for workload in random_workloads():
        for capacity in (None, 40 * block_size):
            config = VllmConfig(block_size=block_size, capacity_tokens=capacity, max_in_flight=2)
            hit = VllmPrefixCache(config, implementation=engine).replay(workload).hit_tokens  # type: ignore[arg-type]
            assert (hit % block_size == 0).all()
            assert (hit <= (workload.prompt_lengths - 1) // block_size * block_size).all()


@pytest.mark.parametrize("engine", ENGINES)
def test_unbounded_hits_never_below_bounded(engine: str) -> None:
    for workload in random_workloads():
        unbounded = VllmPrefixCache(VllmConfig(block_size=4), implementation=engine).replay(
            workload
        )  # type: ignore[arg-type]
        for blocks in (20, 60, 200):
            config = VllmConfig(block_size=4, capacity_tokens=4 * blocks)
            bounded = VllmPrefixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]
            assert (bounded.hit_tokens <= unbounded.hit_tokens).all()
        assert unbounded.total_hit_tokens > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_namespaces_isolate(engine: str) -> None:
    workload = to_workload(random_workload(7, 80))
    config = VllmConfig(block_size=4)
    cache = VllmPrefixCache(config, implementation=engine)  # type: ignore[arg-type]
    together = cache.replay(workload).hit_tokens
    assert together.sum() > 0
    # Replaying each namespace alone gives the same hits: nothing is shared across them.
    alone = np.zeros_like(together)
    for ns in np.unique(workload.namespace):
        index = np.flatnonzero(workload.namespace == ns)
        alone[index] = cache.replay(workload.select(index)).hit_tokens
    np.testing.assert_array_equal(together, alone)
    # Renaming namespaces changes nothing; a namespace per request removes every hit.
    renamed = replace(workload, namespace=workload.namespace * 7 - 3)
    np.testing.assert_array_equal(cache.replay(renamed).hit_tokens, together)
    isolated = replace(workload, namespace=np.arange(workload.n_requests, dtype=np.int32))
    assert cache.replay(isolated).total_hit_tokens == 0


# ---------------------------------------------------------------- arrival-time replay


def with_arrivals(workload: Workload, arrival_s: np.ndarray) -> Workload:
    return replace(workload, arrival_s=np.asarray(arrival_s, np.float64))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("capacity", [None, 4 * 60])
def test_time_model_reduces_to_sequential(engine: str, capacity: int | None) -> None:
    workload = to_workload(random_workload(11, 80))
    sequential = VllmConfig(block_size=4, capacity_tokens=capacity)
    expected = VllmPrefixCache(sequential, implementation=engine).replay(workload)  # type: ignore[arg-type]
    timed = replace(sequential, max_in_flight=8, time_model=TimeModel())
    # Far apart: each request finishes long before the next arrives.
    far = with_arrivals(workload, np.arange(workload.n_requests) * 1e4)
    result = VllmPrefixCache(timed, implementation=engine).replay(far)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.hit_tokens, expected.hit_tokens)
    for name, values in expected.counters.items():
        np.testing.assert_array_equal(result.counters[name], values, err_msg=name)
    # One in flight: arrival times no longer matter.
    one = replace(timed, max_in_flight=1)
    burst = with_arrivals(workload, np.zeros(workload.n_requests))
    result = VllmPrefixCache(one, implementation=engine).replay(burst)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.hit_tokens, expected.hit_tokens)


@pytest.mark.parametrize("engine", ENGINES)
def test_time_model_frees_in_finish_order(engine: str) -> None:
    a, b, c = seq(0, 8), seq(100, 8), seq(200, 10)
    prompts = [a, b, c, [*a, 9], [*b, 9]]
    outputs: list[list[int] | None] = [[1, 2, 3], None, None, None, None]
    workload = Workload.from_lists(prompts, outputs, arrival_s=[0.0, 0.0, 1.0, 2.0, 3.0])
    config = VllmConfig(
        block_size=4, capacity_tokens=4 * 6, max_in_flight=2, time_model=TimeModel()
    )
    # a (3 blocks) and b (2) run together and b finishes first, so b's blocks reach the free
    # queue before a's: c evicts b's second block and a's follow-up hits all of a.
    together = VllmPrefixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]
    assert together.hit_tokens.tolist() == [0, 0, 0, 8, 4]
    assert together.counters["evicted_blocks"].tolist() == [0, 0, 1, 0, 1]
    # One at a time, a is freed first and c evicts a's second block instead.
    one = replace(config, max_in_flight=1)
    in_turn = VllmPrefixCache(one, implementation=engine).replay(workload)  # type: ignore[arg-type]
    assert in_turn.hit_tokens.tolist() == [0, 0, 0, 4, 4]
    assert in_turn.counters["evicted_blocks"].tolist() == [0, 0, 1, 1, 1]


def test_time_model_needs_finite_arrivals() -> None:
    config = VllmConfig(time_model=TimeModel())
    with pytest.raises(ValueError, match="arrival_s"):
        VllmPrefixCache(config).replay(Workload.from_lists([[1, 2, 3]]))
    with pytest.raises(ValueError, match="finite"):
        VllmPrefixCache(config).replay(Workload.from_lists([[1], [2]], arrival_s=[0.0, np.nan]))


# ---------------------------------------------------------------- the fast path


@pytest.mark.parametrize(
    "config",
    [
        VllmConfig(block_size=1),  # unbounded, many blocks: the pool and map grow
        VllmConfig(block_size=4, capacity_tokens=4 * 30),
        VllmConfig(block_size=4, capacity_tokens=4 * 30, max_in_flight=3),
        VllmConfig(block_size=2, capacity_tokens=2 * 200, max_in_flight=24),  # rows are added
        VllmConfig(block_size=16, capacity_tokens=16 * 12, max_in_flight=5),
        VllmConfig(block_size=4, capacity_tokens=4 * 60, max_in_flight=40, time_model=TimeModel()),
        VllmConfig(block_size=8, max_in_flight=4, time_model=TimeModel(2000.0, 5.0)),
    ],
    ids=repr,
)
def test_fast_equals_reference(config: VllmConfig) -> None:
    for seed in range(200, 204):
        workload = to_workload(random_workload(seed, 120))
        gaps = np.random.default_rng(seed).exponential(0.05, workload.n_requests)
        workload = with_arrivals(workload, np.cumsum(gaps))
        fast = VllmPrefixCache(config, implementation="fast").replay(workload)
        reference = VllmPrefixCache(config, implementation="reference").replay(workload)
        np.testing.assert_array_equal(fast.hit_tokens, reference.hit_tokens)
        for name, values in reference.counters.items():
            np.testing.assert_array_equal(fast.counters[name], values, err_msg=name)
        assert fast.metrics == reference.metrics


def fast_keys(prompts: np.ndarray, namespace: np.ndarray, block_size: int) -> np.ndarray:
    """The kernel's key of every full block of every row of ``prompts``."""
    n, length = prompts.shape
    offsets = np.arange(n + 1, dtype=np.int64) * length
    no_output = np.zeros(n + 1, np.int64)
    keys = np.zeros((n, length // block_size), np.int64)
    tokens = np.ascontiguousarray(prompts, np.int32).ravel()
    for r in range(n):
        kernel.request_keys(
            tokens, offsets, tokens, no_output, namespace[r], r, block_size, keys[r]
        )
    return keys


def test_keys_of_blocks_one_token_apart_never_collide() -> None:
    base = np.random.default_rng(0).integers(0, 8_000, 16)
    values = np.arange(-2_000, 8_000)  # negative ids: the workload's unknown tokens
    blocks = np.repeat(base[None, :], 16 * len(values), axis=0)
    for position in range(16):
        blocks[position * len(values) : (position + 1) * len(values), position] = values
    distinct = len(np.unique(blocks, axis=0))
    keys = fast_keys(blocks, np.zeros(len(blocks), np.int32), 16)[:, 0]
    assert len(np.unique(keys)) == distinct == 16 * (len(values) - 1) + 1


def test_keys_chain_and_namespace() -> None:
    rng = np.random.default_rng(1)
    # The same second block after 20k different first blocks: 20k different keys.
    prompts = np.tile(rng.integers(0, 100, 8), (20_000, 2))
    prompts[:, 0] = np.arange(20_000)
    keys = fast_keys(prompts, np.zeros(20_000, np.int32), 8)
    assert len(np.unique(keys[:, 1])) == 20_000
    # The same tokens in 20k namespaces: 20k different keys; equal inputs, equal keys.
    same = np.tile(rng.integers(0, 100, 8), (20_000, 1))
    namespace = np.arange(-10_000, 10_000, dtype=np.int32)
    assert len(np.unique(fast_keys(same, namespace, 8))) == 20_000
    assert len(np.unique(fast_keys(same, np.zeros(20_000, np.int32), 8))) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_prompts_one_token_apart(engine: str) -> None:
    """Prompts that share a prefix and differ in one token of a late block: only the shared
    blocks hit."""
    rng = np.random.default_rng(2)
    shared = rng.integers(0, 10, 64).tolist()
    prompts = []
    for i in range(300):
        tail = [0] * 16
        tail[i % 16] = 1 + i // 16
        prompts.append([*shared, *tail, 7])
    result = replay(prompts, engine=engine, block_size=16)
    expected = [0] + [64 if i % 16 or i >= 16 else 80 for i in range(1, 300)]
    assert result.hit_tokens.tolist() == expected


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_empty_workload(engine: str, max_in_flight: int) -> None:
    empty = Workload.from_lists([], [])
    config = VllmConfig(capacity_tokens=64, max_in_flight=max_in_flight)
    result = VllmPrefixCache(config, implementation=engine).replay(empty)  # type: ignore[arg-type]
    assert len(result.hit_tokens) == 0
    assert result.metrics["vllm:prefix_cache_queries"] == 0


# ---------------------------------------------------------------- sessions (streaming)


def session_workload(seed: int) -> Workload:
    """A random log; every third one with unknown outputs (one unique negative token each)."""
    requests = random_workload(seed, 150, vocab=(4, 8, 50)[seed % 3])
    if seed % 3 == 2:
        for request in requests:
            request["output_token_ids"] = None
    return to_workload(requests)


def largest_peak(workload: Workload) -> int:
    return int((workload.prompt_lengths + workload.output_lengths - 1).max())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("capacity", [None, 0.7, 1.5, 6.0], ids=lambda c: f"cap{c}")
def test_session_chunks_equal_one_replay(
    engine: str, block_size: int, capacity: float | None
) -> None:
    """Capacities in multiples of the largest request: 0.7 rejects some, 1.5 evicts constantly."""
    for seed in range(300, 306):
        workload = session_workload(seed)
        tokens = None if capacity is None else int(capacity * largest_peak(workload))
        config = VllmConfig(block_size=block_size, capacity_tokens=tokens)
        at_once = VllmPrefixCache(config, implementation=engine).session()  # type: ignore[arg-type]
        whole = at_once.feed(workload)
        session = VllmPrefixCache(config, implementation=engine).session()  # type: ignore[arg-type]
        parts = [session.feed(chunk) for chunk in random_chunks(workload, seed)]
        assert_chunks_add_up(parts, whole)
        assert_chunks_add_up(
            [whole], VllmPrefixCache(config, implementation="reference").replay(workload)
        )
        assert session_state(session) == session_state(at_once)
        if capacity == 1.5:
            assert whole.counters["evicted_blocks"].sum() > 0


def session_state(session: VllmSession) -> list[object]:
    """What must carry over chunks: the free queue in order, the cached copies, block ids."""
    if session.reference is not None:
        pool = session.reference.kv.pool
        queue = [(block.block_id, block.key) for block in pool.free_queue]
        return [queue, {key: list(copies) for key, copies in pool.cached.items()}]
    if session.trie is not None:  # unbounded: by the prefix trie, no pool
        assert session.pool is None
        nodes = session.trie.trie.nodes
        return [nodes.parent.tolist(), nodes.depth.tolist(), nodes.store.tolist()]
    assert session.pool is not None
    pool = session.pool
    used = int(pool.state[kernel.NEXT_FRESH])  # block ids handed out; the rest never used
    cached = {
        int(key): int(copies)
        for key, copies in pool.map.tolist()
        if copies & kernel.LOW32 != kernel.LOW32
    }  # the map by key: its slots depend on how far the pool has grown
    state = pool.state[: kernel.TOUCHED].tolist()  # TOUCHED: what warm-up loads read
    return [pool.blocks[:used].tolist(), pool.key[:used].tolist(), cached, state]


def test_session_memory_follows_the_capacity_not_the_log() -> None:
    config = VllmConfig(block_size=4, capacity_tokens=4 * 300)
    session = VllmPrefixCache(config).session()
    sizes = []
    for seed in range(40):  # new content in every chunk
        result = session.feed(to_workload(random_workload(seed, 100)))
        sizes.append(session.nbytes)
    assert result.counters["evicted_blocks"].sum() > 0
    assert session.pool is not None and len(session.pool.key) == 301
    assert sizes[-1] == sizes[5]


def test_unbounded_session_memory_follows_the_distinct_blocks() -> None:
    """Requests sent again and again: their recomputed blocks are duplicates, not new memory."""
    prompts = [seq(100 * i, 32) for i in range(20)]  # whole blocks: the last one is recomputed
    chunk = Workload.from_lists(prompts, [seq(5000 + 10 * i, 9) for i in range(20)])
    session = VllmPrefixCache(VllmConfig(block_size=4)).session()
    first = session.feed(chunk)
    sizes = []
    for _ in range(30):
        again = session.feed(chunk)
        sizes.append(session.nbytes)
    assert first.total_hit_tokens == 0
    assert again.hit_tokens.tolist() == [28] * 20
    assert again.counters["duplicate_blocks"].tolist() == [3] * 20
    assert sizes[-1] == sizes[0]


@pytest.mark.parametrize(
    "config", [VllmConfig(max_in_flight=2), VllmConfig(time_model=TimeModel())], ids=repr
)
def test_only_sequential_replays_stream(config: VllmConfig) -> None:
    with pytest.raises(ValueError, match="sequential"):
        VllmPrefixCache(config).session()
