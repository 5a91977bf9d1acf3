"""The router models against the real router packages: every golden request (the worker that
``sglang-router`` 0.3.2 or ``vllm-router`` 0.1.17 itself chose, behind fake workers, sequential and
with requests held open) must go to the same worker in our model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from analyzer.fleet_text import chat_text
from cache_models.routers.base import FleetLoad, RouteRequest
from cache_models.routers.cache_aware import (
    SGLANG_DEFAULTS,
    VLLM_ROUTER_DEFAULTS,
    CacheAware,
    CacheAwareConfig,
)
from cache_models.routers.consistent_hash import ConsistentHash
from cache_models.routers.simple import RoundRobin
from tests.golden.routers import load_router_goldens

GOLDENS = load_router_goldens()
FLAGS = {
    "--cache-threshold": ("cache_threshold", float),
    "--balance-abs-threshold": ("balance_abs_threshold", int),
    "--balance-rel-threshold": ("balance_rel_threshold", float),
    "--eviction-interval-secs": ("eviction_interval_secs", int),
    "--max-tree-size": ("max_tree_size", int),
}


def model_of(package: str, case: dict[str, Any]):
    n = case["workers"]
    if case["policy"] == "round_robin":
        return RoundRobin(n)
    if case["policy"] == "consistent_hash":
        return ConsistentHash(n, case["urls"])
    assert case["policy"] == "cache_aware"
    config = SGLANG_DEFAULTS if package == "sglang-router" else VLLM_ROUTER_DEFAULTS
    overrides = {}
    args = case["args"]
    for flag, value in zip(args[::2], args[1::2], strict=True):
        name, kind = FLAGS[flag]
        overrides[name] = kind(value)
    config = CacheAwareConfig(**{**config.__dict__, **overrides})
    if package == "vllm-router":  # no routing text on /v1/completions
        return CacheAware(n, config, "vllm-router 0.1.17", sees_text=False)
    return CacheAware(n, config)


def symbols(case: dict[str, Any], i: int) -> np.ndarray:
    """The text the router matched, as prefixcheck extracts it: the prompt, a chat's message
    texts (analyzer.fleet_text), or ``/generate`` input ids as decimal numbers."""
    kind = case.get("kind", "text")
    if kind == "chat":
        text = chat_text(case["messages"][i])
    elif kind == "ids":
        text = " ".join(map(str, case["ids"][i]))
    else:
        text = case["texts"][i]
    return np.array([ord(c) for c in text], dtype=np.int64)


def replay(package: str, case: dict[str, Any]) -> list[int]:
    router = model_of(package, case)
    load = FleetLoad.empty(case["workers"])
    chosen: dict[int, int] = {}
    for event, i in case["events"]:
        if event == "route":
            request = RouteRequest(
                symbols=symbols(case, i),
                session=case["sessions"][i] if case["sessions"] else None,
            )
            chosen[i] = router.route(request, load)
            load.in_flight[chosen[i]] += 1
        else:
            load.in_flight[chosen[i]] -= 1
    return [chosen[i] for i in range(len(case["texts"]))]


@pytest.mark.parametrize("package", ["sglang-router", "vllm-router"])
def test_router_model_chooses_the_real_routers_worker(package: str) -> None:
    golden = GOLDENS[package]
    requests = agree = 0
    wrong = []
    for k, case in enumerate(golden["cases"]):
        ours = replay(package, case)
        same = [a == b for a, b in zip(ours, case["chosen"], strict=True)]
        requests += len(same)
        agree += sum(same)
        if not all(same):
            first = same.index(False)
            wrong.append(
                f"case {k} {case['policy']} {case['args']}: request {first} "
                f"ours {ours[first]} real {case['chosen'][first]}"
            )
    assert requests >= 1000
    assert not wrong, f"{agree}/{requests} agree; " + "; ".join(wrong)


def test_goldens_exercise_every_branch_of_cache_aware() -> None:
    """The sglang goldens reach the imbalance path, cache hits and cold misses, on several
    workers; a least-load router would not reproduce them."""
    decisions = {"load_balance": 0, "cache_hit": 0, "cache_miss": 0}
    least_load_agrees = total = 0
    for case in GOLDENS["sglang-router"]["cases"]:
        if case["policy"] != "cache_aware":
            continue
        router = model_of("sglang-router", case)
        load = FleetLoad.empty(case["workers"])
        chosen: dict[int, int] = {}
        for event, i in case["events"]:
            if event == "finish":
                load.in_flight[chosen[i]] -= 1
                continue
            least_load_agrees += int(np.argmin(load.in_flight)) == case["chosen"][i]
            total += 1
            chosen[i] = router.route(RouteRequest(symbols=symbols(case, i)), load)
            load.in_flight[chosen[i]] += 1
        for name, count in router.decisions.items():
            decisions[name] += count
    assert min(decisions.values()) >= 50, decisions
    assert least_load_agrees < 0.8 * total
