"""Loss attribution: every request's recomputed tokens split into causes that add up exactly, each
cause never negative, on hand-derived cases and on random traffic."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.diagnose import DiagnoseInput, DiagnoseResult, diagnose
from analyzer.diagnose.dynamic import Spans
from analyzer.diagnose.losses import CATEGORIES
from analyzer.diagnose.plans import Context, Moves, PadTarget
from analyzer.replay import ReplaySettings, replay_all
from cache_models.workload import Workload
from tests.golden.workloads import random_workload
from tests.test_prefix_trie import to_workload


def diagnosed(
    workload: Workload, settings: ReplaySettings, salt_free: np.ndarray | None = None
) -> DiagnoseResult:
    """``diagnose`` on a workload whose namespaces are all salts (unless ``salt_free`` says)."""
    free = np.zeros(workload.n_requests, np.int32) if salt_free is None else salt_free
    replays = replay_all(workload, settings)
    return diagnose(DiagnoseInput(workload, replays, settings, free, None, None, False))


def context_for(workload: Workload, targets: list[PadTarget]) -> Context:
    """A plan context with no dynamic content, for plan tests."""
    empty = np.zeros(0, np.int64)
    spans = Spans(empty, empty, empty, empty)
    return Context(
        workload=workload,
        settings=ReplaySettings(),
        salt_free_namespace=np.zeros(workload.n_requests, np.int32),
        pad_targets=targets,
        sites=[],
        moves=Moves(spans, empty, empty),
        servers=None,
    )


def per_request(result: DiagnoseResult, engine: str) -> list[dict[str, int]]:
    columns = {name: result.per_request[f"{engine}_lost_{name}"] for name in CATEGORIES}
    n = len(next(iter(columns.values())))
    return [{name: int(columns[name][i]) for name in CATEGORIES} for i in range(n)]


def test_hand_derived_losses() -> None:
    system = [1, 2, 3, 4, 5, 6]
    workload = Workload.from_lists(
        [system + [7], system + [8], system + [9]], [[0], [0], [0]], namespace=[0, 0, 1]
    )
    result = diagnosed(workload, ReplaySettings(block_size=4))
    zero = dict.fromkeys(CATEGORIES, 0)
    vllm = per_request(result, "vllm")
    assert vllm[0] == {**zero, "never_seen": 6, "last_token": 1}
    # the ceiling is 6 tokens, vLLM hits one 4-token block
    assert vllm[1] == {**zero, "last_token": 1, "alignment": 2}
    # a salted tenant: nothing is shared with it, though the same prompt was seen
    assert vllm[2] == {**zero, "last_token": 1, "salts": 6}
    sglang = per_request(result, "sglang")
    assert sglang[1] == {**zero, "last_token": 1}
    assert result.diagnosis.losses["vllm"].tokens["salts"] == 6


def test_eviction_is_what_capacity_costs() -> None:
    a, b = list(range(1, 33)), list(range(100, 132))
    workload = Workload.from_lists([a + [1], b + [1], a + [2], b + [2]], [[0]] * 4)
    result = diagnosed(workload, ReplaySettings(block_size=16, capacity_tokens=48))
    vllm = per_request(result, "vllm")
    # room for three blocks: the prompts of a and b (2 + 1 full blocks each, with the answer)
    # cannot both stay, so the second visits recompute what an unbounded cache would serve
    assert [r["eviction"] for r in vllm] == [0, 0, 32, 32]
    assert [r["never_seen"] for r in vllm] == [32, 32, 0, 0]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "settings",
    [
        ReplaySettings(),
        ReplaySettings(block_size=4, capacity_tokens=400),
        ReplaySettings(block_size=32, page_size=4, capacity_tokens=1000),
    ],
)
def test_causes_add_up_on_random_traffic(seed: int, settings: ReplaySettings) -> None:
    workload = to_workload(random_workload(seed, n_requests=150, vocab=6))
    result = diagnosed(workload, settings)
    replays = replay_all(workload, settings)
    lengths = workload.prompt_lengths
    for engine, hits in (("vllm", replays.vllm), ("sglang", replays.sglang)):
        columns = np.stack([result.per_request[f"{engine}_lost_{n}"] for n in CATEGORIES])
        assert (columns >= 0).all()
        assert columns.sum(axis=0).tolist() == (lengths - hits.hit_tokens).tolist()
        assert result.diagnosis.losses[engine].clamped_requests == 0
        totals = result.diagnosis.losses[engine].tokens
        assert sum(totals.values()) == int(lengths.sum() - hits.hit_tokens.sum())
        if settings.capacity_tokens is None:
            assert totals["eviction"] == 0
