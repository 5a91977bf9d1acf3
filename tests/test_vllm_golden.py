"""Every stored golden case (vLLM 0.33.0's own KVCacheManager) replayed by both engines: each
request's hit, preemptions and re-hits, and the metric totals, must equal the oracle's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cache_models.config import VllmConfig
from cache_models.vllm_apc import VllmPrefixCache
from tests.golden.vllm import load_edge_cases, load_golden_files, to_workload

GOLDENS = load_golden_files()
EDGE_CASES = load_edge_cases()


def test_goldens_are_present() -> None:
    assert len(GOLDENS) >= 30
    assert sum(len(g["configs"]) for g in GOLDENS) >= 30 * 18
    assert len(EDGE_CASES) >= 500
    preempted = sum(any(c["preemptions"]) for g in EDGE_CASES for c in g["configs"])
    assert preempted >= 50


def config_of(case: dict[str, Any]) -> VllmConfig:
    return VllmConfig(
        block_size=case["block_size"],
        capacity_tokens=None
        if case["capacity"] == "unbounded"
        else (case["num_blocks"] - 1) * case["block_size"],
        max_in_flight=case["max_in_flight"],
    )


def check(
    golden: dict[str, Any],
    engine: str,
    configure: Callable[[dict[str, Any]], VllmConfig] = config_of,
) -> None:
    """Every configuration of one golden workload, request by request."""
    workload = to_workload(golden["requests"])
    for case in golden["configs"]:
        config = configure(case)
        result = VllmPrefixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]
        where = f"seed {golden['seed']} {case['capacity']} {config}"
        np.testing.assert_array_equal(result.hit_tokens, case["hit"], err_msg=where)
        np.testing.assert_array_equal(
            result.counters["preemptions"], case["preemptions"], err_msg=where
        )
        np.testing.assert_array_equal(result.counters["rehit_tokens"], case["rehit"], err_msg=where)
        assert result.metrics["vllm:prefix_cache_queries"] == case["queries"], where
        assert result.metrics["vllm:prefix_cache_hits"] == case["hits"], where
        assert not result.counters["rejected"].any(), where


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"seed{g['seed']}")
def test_matches_vllm(golden: dict[str, Any], engine: str) -> None:
    check(golden, engine)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_edge_cases_match_vllm(engine: str) -> None:
    for golden in EDGE_CASES:
        check(golden, engine)
