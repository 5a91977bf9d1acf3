"""The pool of caches: every key's requests on caches of their own, kept between feeds, results
in the chunk's order; a router may give requests replica keys."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analyzer.pool import UNNAMED, CacheKey, CachePool, Routes, model_labels
from analyzer.replay import ReplaySettings
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload
from tests.chunking import assert_chunks_add_up, random_chunks


def _workload(n: int = 60, seed: int = 3) -> tuple[Workload, np.ndarray]:
    rng = np.random.default_rng(seed)
    heads = [rng.integers(0, 50, 40) for _ in range(3)]
    prompts = [np.r_[heads[i % 3], rng.integers(0, 50, rng.integers(1, 30))] for i in range(n)]
    outputs = [rng.integers(0, 50, rng.integers(1, 8)) for _ in range(n)]
    models = np.array(["a", "b", "a", "c"] * (n // 4))
    return Workload.from_arrays(prompts, outputs), models


class RoundRobin:
    """Two replicas per model, requests dealt in turn across feeds."""

    def __init__(self) -> None:
        self.next = 0

    def route(self, workload: Workload, models: np.ndarray | None) -> Routes:
        assert models is not None
        replica = (self.next + np.arange(workload.n_requests)) % 2
        self.next += workload.n_requests
        labels = np.array([f"{m}\0{r}" for m, r in zip(models, replica, strict=True)])
        return Routes.of_labels(labels, lambda s: CacheKey(s.split("\0")[0], int(s.split("\0")[1])))


@pytest.mark.parametrize("router", [None, RoundRobin])
def test_each_key_replays_alone_and_chunks_add_up(router: type[RoundRobin] | None) -> None:
    workload, models = _workload()
    settings = ReplaySettings(block_size=4, page_size=2, capacity_tokens=120)
    whole, _ = CachePool(settings, settings.engines, router and router()).feed(workload, models)
    pool = CachePool(settings, settings.engines, router and router())
    parts = []
    start = 0
    for chunk in random_chunks(workload, seed=5):
        rows = np.arange(start, start + chunk.n_requests)
        parts.append(pool.feed(chunk, models[rows])[0])
        start += chunk.n_requests
    for engine in settings.engines:
        assert_chunks_add_up([p[engine] for p in parts], whole[engine])
    replica = np.arange(workload.n_requests) % 2 if router else np.zeros(workload.n_requests)
    expected_keys = {CacheKey(str(m), int(r)) for m, r in zip(models, replica, strict=True)}
    assert set(pool.caches) == expected_keys
    for key in expected_keys:  # each key's requests, replayed on their own caches
        rows = np.flatnonzero((models == key.model) & (replica == key.replica))
        alone = workload.select(rows)
        vllm = VllmPrefixCache(settings.vllm()).replay(alone)
        sglang = SglangRadixCache(settings.sglang()).replay(alone)
        np.testing.assert_array_equal(whole["vllm"].hit_tokens[rows], vllm.hit_tokens)
        np.testing.assert_array_equal(whole["sglang"].hit_tokens[rows], sglang.hit_tokens)
    assert whole["vllm"].metrics["vllm:prefix_cache_hits"] == int(whole["vllm"].hit_tokens.sum())


def test_a_replay_with_requests_in_flight_takes_the_whole_log() -> None:
    workload, models = _workload(8)
    pool = CachePool(ReplaySettings(max_in_flight=4))
    pool.feed(workload, models)
    with pytest.raises(ValueError, match="only sequential replays stream"):
        pool.feed(workload, models)


@pytest.mark.parametrize(
    "models",
    [["m-7b"] * 5, ["a", None, "model-b", "a", None], [None, None], [], ["", ""], ["é", "x", "é"]],
)
def test_model_labels_and_routes_follow_each_request_s_model(models: list[str | None]) -> None:
    """Each request's label is its model (no model: UNNAMED), as a unicode array as wide as the
    longest; equal labels share a key, keys in order of first appearance."""
    labels = model_labels(pl.Series("model", models, dtype=pl.String))
    named = [UNNAMED if m is None else m for m in models]
    assert labels.tolist() == named
    assert labels.dtype == np.array(named or [""], str).dtype
    routes = Routes.of_labels(labels, CacheKey)
    keys = list(dict.fromkeys(named))
    assert [key.model for key in routes.keys] == keys
    assert routes.of.tolist() == [keys.index(m) for m in named]
