"""Measured fleet advice: the best router and routing key on this log, and the capacity per
replica at which the fleet keeps a share of one instance's hits."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl

from analyzer.diagnose.model import Recommendation
from analyzer.fleet import FleetOptions, Placed, place
from analyzer.fleet_keys import FIRST_BLOCK, session_keys
from analyzer.replay import ReplaySettings, replay_all
from cache_models.workload import Workload

KEEP_SHARE = 0.9  # the share of one instance's hits the capacity advice aims at
CAPACITY_STEPS = 10  # per-replica capacities tried: the distinct tokens / N, halved each step
LOAD_AWARE = ("least-load", "sglang-cache-aware", "dynamo-kv")
# A router is recommended only if its busiest replica serves at most this many times the mean
# requests: one that puts everything on one replica is not spreading the load.
BALANCE_LIMIT = 1.5


def candidates(options: FleetOptions, timed: bool) -> list[FleetOptions]:
    """The routers and keys worth trying at this fleet size; load-aware routers only when
    requests overlap in time (without load they send every cold request to one replica)."""
    plain = replace(options, router_params={}, session_field=None)
    names = ("round-robin", *LOAD_AWARE) if timed else ("round-robin",)
    tried = [replace(plain, router=name) for name in names]
    tried.append(replace(plain, router="hash", session_field=FIRST_BLOCK))
    if options.session_field not in (None, FIRST_BLOCK):
        tried.append(replace(plain, router="hash", session_field=options.session_field))
    return tried


def fleet_hits(
    workload: Workload,
    requests: pl.DataFrame,
    models: np.ndarray,
    settings: ReplaySettings,
    options: FleetOptions,
    texts: list[np.ndarray] | None = None,
) -> tuple[dict[str, int], float]:
    """The fleet's hit tokens per engine and its request imbalance (busiest / mean)."""
    keys, _ = session_keys(requests, workload, options.session_field, settings.block_size)
    placement = place(workload, keys, settings, options, texts=texts)
    replays = replay_all(workload, settings, None, models, Placed(placement.replica))
    counts = np.bincount(placement.replica, minlength=options.replicas)
    hits = {"vllm": replays.vllm.total_hit_tokens, "sglang": replays.sglang.total_hit_tokens}
    return hits, float(counts.max() / counts.mean())


def rank_routers(
    workload: Workload,
    requests: pl.DataFrame,
    models: np.ndarray,
    settings: ReplaySettings,
    options: FleetOptions,
    texts: list[np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """Every candidate's measured fleet hit rates, best first (by the sum of both engines')."""
    total = int(workload.prompt_lengths.sum()) or 1
    rows = []
    for option in candidates(options, settings.time_model is not None):
        hits, imbalance = fleet_hits(workload, requests, models, settings, option, texts)
        rows.append(
            {
                "router": option.router,
                "session_field": option.session_field,
                "hit_rate": {e: h / total for e, h in hits.items()},
                "request_imbalance": imbalance,
            }
        )
    return sorted(rows, key=lambda r: -(r["hit_rate"]["vllm"] + r["hit_rate"]["sglang"]))


def capacity_for_share(
    workload: Workload,
    requests: pl.DataFrame,
    models: np.ndarray,
    settings: ReplaySettings,
    options: FleetOptions,
    single_unbounded_hits: int,
    distinct_tokens: int,
    share: float = KEEP_SHARE,
    texts: list[np.ndarray] | None = None,
) -> dict[str, Any]:
    """The smallest per-replica capacity tried (distinct tokens / N, halved step by step) at which
    the fleet's SGLang hits reach ``share`` of one unbounded instance's; None if even unbounded
    replicas do not (then routing, not capacity, is what loses)."""
    target = share * single_unbounded_hits
    unbounded_settings = replace(settings, capacity_tokens=None)
    unbounded = fleet_hits(workload, requests, models, unbounded_settings, options, texts)[0][
        "sglang"
    ]
    result: dict[str, Any] = {
        "share": share,
        "engine": "sglang",
        "target_hit_tokens": target,
        "fleet_unbounded_hit_tokens": unbounded,
        "capacity_tokens": None,
    }
    if unbounded < target:
        return result
    top = max(distinct_tokens // options.replicas, settings.block_size)
    best = top
    for step in range(1, CAPACITY_STEPS):
        capacity = max(top >> step, settings.block_size)
        bounded = replace(settings, capacity_tokens=capacity)
        if fleet_hits(workload, requests, models, bounded, options, texts)[0]["sglang"] < target:
            break
        best = capacity
    result["capacity_tokens"] = best
    return result


def advice(
    ranking: list[dict[str, Any]],
    options: FleetOptions,
    capacity: dict[str, Any],
    scope: str = "this log",
) -> list[Recommendation]:
    """The router and capacity recommendations measured on ``scope`` (this log, or a streamed
    log's diagnosed sample)."""
    balanced = [r for r in ranking if r["request_imbalance"] <= BALANCE_LIMIT]
    best = balanced[0] if balanced else ranking[0]
    key = f" on {best['session_field']}" if best["session_field"] else ""
    timed = any(r["router"] in LOAD_AWARE for r in ranking)
    out = [
        Recommendation(
            kind="router",
            summary=f"Route with {best['router']}{key}: {best['hit_rate']['vllm']:.1%} vLLM / "
            f"{best['hit_rate']['sglang']:.1%} SGLang hit rate on {options.replicas} replicas, "
            f"busiest replica {best['request_imbalance']:.2f}x the mean requests (measured on "
            f"{scope}; the best whose busiest replica serves at most {BALANCE_LIMIT}x the mean; "
            "every candidate in fleet.router_ranking"
            + ("" if timed else "; load-aware routers need --replay-in-time")
            + ").",
            details={"ranking": ranking},
            measured=best["hit_rate"],
        )
    ]
    if capacity["capacity_tokens"] is None:
        unbounded, target = capacity["fleet_unbounded_hit_tokens"], capacity["target_hit_tokens"]
        summary = (
            f"No per-replica capacity keeps {capacity['share']:.0%} of one instance's SGLang hits "
            f"with --router {options.router}: even unbounded replicas hit {unbounded:,} of the "
            f"{target:,.0f} tokens needed; the loss is routing."
        )
    else:
        summary = (
            f"{capacity['capacity_tokens']:,} tokens per replica keep {capacity['share']:.0%} of "
            f"one unbounded instance's SGLang hits with --router {options.router} (measured; "
            "capacities halved step by step from the log's distinct tokens per replica)."
        )
    out.append(Recommendation(kind="fleet_capacity", summary=summary, details=capacity))
    return out
