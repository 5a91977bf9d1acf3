"""An unbounded SGLang cache at page size 1 replayed by the prefix trie (``_sglang_unbounded``)
gives, request for request, every hit and counter of the radix tree kernel's replay.

Random token logs built to split the tree everywhere it can split: a tiny alphabet, prompts that
extend, cut short or branch off earlier requests (or their answers) mid-node, answers known or
unknown, stops and length finishes (some on ``max_new_tokens``), ``logprob_start_len`` caps, two
namespaces, priorities, every eviction policy (none evicts); prefill chunks of 1 to 8 tokens or
none, the overlap scheduler on or off, the waiting-prefix refresh on or off; fed whole and in
chunks. A server's vLLM and SGLang caches share that walk (``cache_models.unbounded``).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.pool import Cache, CacheKey, engine_cache, engine_caches
from analyzer.replay import replay_all
from analyzer.settings import ReplaySettings
from cache_models import sglang_radix
from cache_models.config import SGLANG_EVICTION_POLICIES, SglangConfig
from cache_models.prefix_trie import PrefixTrie, View
from cache_models.result import ReplayResult
from cache_models.workload import Workload
from tests.test_runs_sglang import assert_same
from tests.test_sglang_radix import policy_params


def random_log(rng: np.random.Generator, n: int = 60) -> Workload:
    """A log whose requests share prefixes with earlier ones (see the module docstring)."""
    sequences: list[list[int]] = []
    prompts, outputs = [], []
    for _ in range(n):
        if sequences and rng.random() < 0.8:
            base = sequences[int(rng.integers(len(sequences)))]
            prompt = base[: int(rng.integers(0, len(base) + 1))]
        else:
            prompt = []
        prompt = prompt + [int(t) for t in rng.integers(0, 3, int(rng.integers(0, 7)))]
        prompt = prompt or [int(rng.integers(0, 3))]
        answer = [int(t) for t in rng.integers(0, 3, int(rng.integers(1, 5)))]
        known = rng.random() < 0.7
        prompts.append(prompt)
        outputs.append(answer if known else None)
        sequences.append(prompt + (answer if known else []))
    workload = Workload.from_lists(
        prompts,
        outputs,
        namespace=[int(k) for k in rng.integers(0, 2, n)],
        stop_finish=[bool(s) for s in rng.random(n) < 0.5],
    )
    lengths = workload.prompt_lengths
    caps = np.where(rng.random(n) < 0.2, rng.integers(0, lengths + 1), -1)
    answered = workload.output_lengths
    limits = np.where(rng.random(n) < 0.3, answered, -1)
    priority = rng.integers(-3, 4, n).astype(np.int64)
    return replace(
        workload, hit_limit=caps.astype(np.int64), max_new_tokens=limits, priority=priority
    )


def by_kernel(config: SglangConfig, chunks: list[Workload]) -> list[ReplayResult]:
    tree = None
    results = []
    for chunk in chunks:
        out, tree = sglang_radix._replay_fast(config, chunk, tree)
        results.append(sglang_radix._result(chunk, out.pop("hit"), out))
    return results


def check(seed: int) -> int:
    """Replay one random log every way; returns the splits the kernel made."""
    rng = np.random.default_rng(seed)
    workload = random_log(rng)
    cuts = np.sort(rng.integers(0, workload.n_requests + 1, 3))
    bounds = [0, *cuts.tolist(), workload.n_requests]
    chunks = [workload.select(np.arange(a, b)) for a, b in pairwise(bounds)]
    splits = 0
    for chunk_size in (0, 1, 3, 8):
        for overlap in (True, False):
            policy = str(rng.choice(SGLANG_EVICTION_POLICIES))  # unbounded: none evicts
            config = SglangConfig(
                chunked_prefill_size=chunk_size,
                overlap_schedule=overlap,
                waiting_prefix_refresh=bool(rng.random() < 0.5),
                eviction_policy=policy,  # type: ignore[arg-type]
                **policy_params(policy),
            )
            session = sglang_radix.SglangRadixCache(config).session()
            for fed, expected in zip(
                [session.feed(c) for c in chunks], by_kernel(config, chunks), strict=True
            ):
                assert_same(fed, expected)
                splits += int(expected.counters["node_splits"].sum())
            assert session.tree is None and session.trie is not None
            whole = sglang_radix.SglangRadixCache(config).replay(workload)
            assert_same(whole, by_kernel(config, [workload])[0])
    return splits


@pytest.mark.parametrize("seed", range(12))
def test_trie_replays_sglang_as_its_tree(seed: int) -> None:
    assert check(seed) > 0  # the logs split the tree


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_trie_replays_sglang_as_its_tree_on_any_log(seed: int) -> None:
    check(seed)


def test_paged_or_bounded_caches_keep_the_tree() -> None:
    workload = random_log(np.random.default_rng(0))
    for config in (SglangConfig(page_size=4), SglangConfig(capacity_tokens=40)):
        session = sglang_radix.SglangRadixCache(config).session()
        session.feed(workload)
        assert session.trie is None and session.tree is not None


@pytest.mark.parametrize("page_size", [1, 4])
def test_one_servers_unbounded_engines_walk_the_log_once(page_size: int) -> None:
    """A server's unbounded caches share one trie (``analyzer.pool.engine_caches``; at page
    size 4 SGLang's page-1 twin shares it): fed in step, each gives the results of its own
    session, and the trie holds each request once."""
    settings = ReplaySettings(block_size=3, page_size=page_size, chunked_prefill_size=5)
    engines = ("vllm", "sglang", "sglang_page1") if page_size > 1 else ("vllm", "sglang")
    shared = engine_caches(engines, settings)
    alone = {engine: engine_cache(engine, settings) for engine in engines}
    by_trie = [e for e in engines if e != "sglang" or page_size == 1]
    tries = {id(shared[e].trie) for e in by_trie}  # type: ignore[attr-defined]
    assert len(tries) == 1 and all(alone[e].trie is None for e in by_trie)  # type: ignore[attr-defined]
    workload = random_log(np.random.default_rng(5))
    for rows in np.array_split(np.arange(workload.n_requests), 3):
        chunk = workload.select(rows)
        for engine in reversed(engines):
            assert_same(shared[engine].feed(chunk), alone[engine].feed(chunk))
    trie = shared["vllm"].trie  # type: ignore[attr-defined]
    assert trie.trie.n_requests == workload.n_requests


def test_a_shared_trie_is_fed_in_step() -> None:
    caches = engine_caches(("vllm", "sglang"), ReplaySettings())
    workload = random_log(np.random.default_rng(6))
    first, second = workload.select(np.arange(10)), workload.select(np.arange(10, 20))
    caches["vllm"].feed(first)
    with pytest.raises(ValueError, match="in step"):
        caches["vllm"].feed(second)


@pytest.mark.parametrize("overlap", [True, False])
def test_one_servers_log_walks_one_trie_for_its_caches_and_its_ceiling(
    monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """``replay_all`` of one server's log: the ceiling, its views and the unbounded caches come
    from one walk (two under ``--disable-overlap-schedule``, where SGLang keeps one token fewer
    than the ceiling), with the results, views and nodes of a trie each."""
    walks: list[int] = []
    feed = PrefixTrie.feed_tokens
    monkeypatch.setattr(
        PrefixTrie, "feed_tokens", lambda self, *a: walks.append(1) or feed(self, *a)
    )
    settings = ReplaySettings(block_size=2, chunked_prefill_size=4, overlap_schedule=overlap)
    workload = random_log(np.random.default_rng(8))
    views = [View("vllm", 4), View("sglang", 3)]
    one = replay_all(workload, settings, views=views)
    assert len(walks) == (1 if overlap else 2)
    walks.clear()
    apart = replay_all(workload, settings, caches=separate_caches, views=views)
    assert len(walks) == 3
    for name, result in one.each().items():
        assert_same(result, apart.each()[name])
    for view in views:
        np.testing.assert_array_equal(one.views[view], apart.views[view])
    for column in ("parent", "start", "depth", "count", "first_request", "store"):
        np.testing.assert_array_equal(getattr(one.trie, column), getattr(apart.trie, column))


def separate_caches(
    key: CacheKey, engines: tuple[str, ...], settings: ReplaySettings
) -> dict[str, Cache]:
    """Each engine's cache on its own (no shared trie)."""
    return {engine: engine_cache(engine, settings) for engine in engines}
