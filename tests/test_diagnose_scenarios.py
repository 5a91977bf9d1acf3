"""Replays for measured gains: forked workers give the in-process results, and each server (model)
of a log is replayed on caches of its own."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.diagnose import scenarios as scenarios_module
from analyzer.diagnose.scenarios import Gain, Scenario, replay_hits, replay_many
from analyzer.diagnose.sweep import SIZES, size_sweep, sweep_views
from analyzer.replay import ReplaySettings, replay_all
from tests.golden.workloads import random_workload
from tests.test_prefix_trie import to_workload


def test_forked_workers_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = to_workload(random_workload(3, n_requests=120, vocab=6))
    scenarios = [
        Scenario(workload, ReplaySettings(block_size=size, capacity_tokens=600))
        for size in (4, 16, 32)
    ]
    alone = replay_many(scenarios)
    monkeypatch.setattr(scenarios_module, "PARALLEL_MIN_TOKENS", 0)
    forked = replay_many(scenarios)
    for a, b in zip(alone, forked, strict=True):
        assert a.keys() == b.keys()
        for engine in a:
            assert a[engine].tolist() == b[engine].tolist()


def test_each_server_has_its_own_cache() -> None:
    workload = to_workload(random_workload(4, n_requests=120, vocab=6))
    servers = np.where(np.arange(workload.n_requests) % 3 == 0, "model-a", "model-b")
    settings = ReplaySettings(capacity_tokens=400)
    hits = replay_hits(Scenario(workload, settings, servers=servers))
    for name in ("model-a", "model-b"):
        indices = np.flatnonzero(servers == name)
        alone = replay_all(workload.select(indices), settings)
        assert hits["vllm"][indices].tolist() == alone.vllm.hit_tokens.tolist()
        assert hits["sglang"][indices].tolist() == alone.sglang.hit_tokens.tolist()


def test_padding_tokens_count_against_a_fix() -> None:
    gain = Gain(
        prompt_tokens_before=1000,
        hit_tokens_before=500,
        prompt_tokens_after=1100,
        hit_tokens_after=560,
    )
    assert gain.recomputed_tokens_saved == -40
    assert gain.to_dict()["hit_rate_after"] == pytest.approx(560 / 1100)


@pytest.mark.parametrize("seed", range(3))
def test_sweep_read_off_the_replays_trie_is_the_sweeps_own(seed: int) -> None:
    """The replay's trie, fed the sweep's views beside the ceiling, gives every size's hits as
    the sweep's own replays do (and not the other engine's, nor another size's)."""
    workload = to_workload(random_workload(seed, n_requests=150, vocab=5))
    settings = ReplaySettings()
    views = sweep_views(settings)
    replays = replay_all(workload, settings, views=views)
    assert set(replays.views) == set(views) and len(views) == 2 * (len(SIZES) - 1)
    hits = {"vllm": replays.vllm.hit_tokens, "sglang": replays.sglang.hit_tokens}
    own = size_sweep(workload, settings, hits, None)
    assert size_sweep(workload, settings, hits, None, views=replays.views) == own
    sizes = {p.size: p.hit_tokens for p in own["vllm"]}
    assert len(set(sizes.values())) > 2  # sizes the read-off could mix up differ
    assert sweep_views(ReplaySettings(capacity_tokens=1000)) == ()
