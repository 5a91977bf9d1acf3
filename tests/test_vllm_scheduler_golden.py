"""vLLM 0.33.0's own Scheduler (the oracle's ``--engine scheduler``) at its default token budgets,
with and without ``--long-prefill-token-threshold``, 2 to 64 requests in flight, prompts of
hundreds to thousands of tokens and some requests asking for prompt logprobs: both engines must
give every request's hit, preemptions and re-hits, and the metric totals, exactly."""

from __future__ import annotations

from typing import Any

import pytest

from cache_models.config import VllmConfig
from tests.golden.vllm import load_scheduler_goldens
from tests.test_vllm_golden import check

GOLDENS = load_scheduler_goldens()


def scheduler_config(case: dict[str, Any]) -> VllmConfig:
    return VllmConfig(
        block_size=case["block_size"],
        capacity_tokens=None
        if case["capacity"] == "unbounded"
        else (case["num_blocks"] - 1) * case["block_size"],
        max_in_flight=case["max_in_flight"],
        max_num_batched_tokens=case["max_num_batched_tokens"],
        long_prefill_token_threshold=case["long_prefill_token_threshold"],
    )


def test_goldens_cover_the_defaults() -> None:
    cases = [c for g in GOLDENS for c in g["configs"]]
    assert len(GOLDENS) >= 6
    assert {c["max_num_batched_tokens"] for c in cases} >= {2048, 8192, 16384}
    assert {c["max_in_flight"] for c in cases} >= {2, 64}
    assert any(c["long_prefill_token_threshold"] for c in cases)
    assert sum(any(c["preemptions"]) for c in cases) >= 10
    assert all(any(r.get("prompt_logprobs") for r in g["requests"]) for g in GOLDENS)


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"seed{g['seed']}")
def test_matches_vllm_scheduler(golden: dict[str, Any], engine: str) -> None:
    check(golden, engine, scheduler_config)
