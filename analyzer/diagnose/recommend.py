"""Recommendations, each with its gain measured by replaying the fixed log (or the other
configuration) through the same cache models. A fix that does not save at least
``MIN_GAIN_SHARE`` of the prompt tokens on some engine is not recommended."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from analyzer.diagnose.capacity import CapacityCurve
from analyzer.diagnose.model import DynamicSite, Recommendation
from analyzer.diagnose.plans import (
    Context,
    PadTarget,
    Plan,
    move_plan,
    pad_plan,
    reorder_plan,
    salt_plan,
)
from analyzer.diagnose.scenarios import Gain, Scenario, gains, replay_many
from analyzer.diagnose.sweep import SweepPoint
from analyzer.engines import ENGINE_LABELS

MIN_GAIN_SHARE = 0.002
MAX_PAD_TARGETS = 4
MAX_MOVES = 3
# The capacity recommended: where the LRU curve reaches this share of the unbounded hits.
CAPACITY_TARGET = "0.95"
# A coarser block size is preferred when it keeps this share of the best size's gain.
KEEP_OF_BEST_GAIN = 0.8
# vLLM block sizes below this are not recommended: few GPU attention kernels support them.
MIN_RECOMMENDED_BLOCK = 8


@dataclass(frozen=True)
class Evidence:
    """What the recommendations are chosen from."""

    hits: dict[str, np.ndarray]  # each engine's hits as configured (replay order)
    sglang_page1_hits: np.ndarray
    dynamic_sites: list[DynamicSite]
    salt_loss: int
    eviction_loss: int
    curves: dict[str, CapacityCurve]
    sweep: dict[str, list[SweepPoint]]


def recommend(context: Context, evidence: Evidence) -> list[Recommendation]:
    """The measured recommendations, largest saving first."""
    workload = context.workload
    floor = max(1.0, MIN_GAIN_SHARE * int(workload.prompt_offsets[-1]))
    candidates = _candidate_plans(context, evidence)
    results = replay_many(
        [
            Scenario(plan.workload, plan.settings, plan.engines, context.servers)
            for plan, _ in candidates
        ]
    )
    items = []
    for (plan, describe), hits in zip(candidates, results, strict=True):
        measured = gains(workload, evidence.hits, plan.workload, hits)
        items.append(_item(plan.kind, describe(measured), plan.details, measured))
    items += _size_items(context, evidence)
    items.append(_engine_item(context, evidence))
    kept = [item for item in items if item.measured and _best_saving(item) >= floor]
    return sorted(kept, key=lambda item: -_best_saving(item))


Describe = Callable[[dict[str, Gain]], str]


def _candidate_plans(context: Context, evidence: Evidence) -> list[tuple[Plan, Describe]]:
    plans: list[tuple[Plan, Describe]] = []
    block = context.settings.block_size
    for target in _pad_targets(context.pad_targets, block):
        pad = -target.length % block
        text = (
            f"Pad the {target.length}-token prefix shared by {len(target.requests):,} requests "
            f"with {pad} tokens at token {target.insert_at} (to {target.length + pad}, a "
            f"multiple of {block})"
        )
        plans.append((pad_plan(context, [target]), _describer(text)))
    ranked = sorted(range(len(evidence.dynamic_sites)), key=lambda s: -_site_loss(evidence, s))
    for site in [s for s in ranked if _site_loss(evidence, s) > 0][:MAX_MOVES]:
        info = evidence.dynamic_sites[site]
        text = (
            f"Move the {info.kind.replace('_', ' ')} at token {info.position} "
            f"({info.requests:,} requests) after the {info.static_tokens_after}-token static "
            "part that follows it"
        )
        plans.append((move_plan(context, [site]), _describer(text)))
    if context.reordered is not None:
        moved = context.reordered
        text = (
            f"List tool definitions in one order ({moved.tools_reordered:,} requests differ from "
            f"their set's usual order) and put the system prompt first ({moved.system_moved:,} "
            "requests)"
        )
        plans.append((reorder_plan(context), _describer(text)))
    if evidence.salt_loss > 0:
        text = (
            "Share one cache_salt between tenants whose shared prefixes hold nothing private "
            "(a salt isolates every block of a tenant's prompts)"
        )
        plans.append((salt_plan(context), _describer(text)))
    capacity = context.settings.capacity_tokens
    if capacity is not None and evidence.eviction_loss > 0:
        target = max(c.needed.get(CAPACITY_TARGET, 0) for c in evidence.curves.values())
        if target > capacity:
            settings = replace(context.settings, capacity_tokens=target)
            text = (
                f"Give the KV cache {target:,} tokens instead of {capacity:,} (where the LRU "
                f"curve reaches {float(CAPACITY_TARGET):.0%} of the unbounded hits)"
            )
            plan = Plan(
                f"capacity={target}",
                "capacity",
                context.workload,
                settings,
                details={"capacity_tokens_before": capacity, "capacity_tokens_after": target},
            )
            plans.append((plan, _describer(text)))
    return plans


def _pad_targets(targets: list[PadTarget], block: int) -> list[PadTarget]:
    """Unaligned prefixes of at least a block, by the saving they promise (a remainder per later
    request, less the padding)."""

    def promise(t: PadTarget) -> int:
        return (t.length % block) * (len(t.requests) - 1) - (-t.length % block)

    eligible = [t for t in targets if t.length >= block and t.length % block and promise(t) > 0]
    return sorted(eligible, key=promise, reverse=True)[:MAX_PAD_TARGETS]


def _size_items(context: Context, evidence: Evidence) -> list[Recommendation]:
    """A block size (vLLM) or page size (SGLang) that would serve more, from the sweep."""
    floor = max(1.0, MIN_GAIN_SHARE * int(context.workload.prompt_offsets[-1]))
    configured = {"vllm": context.settings.block_size, "sglang": context.settings.page_size}
    flags = {"vllm": "--block-size", "sglang": "--page-size"}
    items = []
    for engine, points in evidence.sweep.items():
        current = next(p for p in points if p.size == configured[engine])
        smallest = MIN_RECOMMENDED_BLOCK if engine == "vllm" else 1
        better = [
            p for p in points if p.size >= smallest and p.hit_tokens - current.hit_tokens >= floor
        ]
        if not better:
            continue
        enough = KEEP_OF_BEST_GAIN * (max(p.hit_tokens for p in better) - current.hit_tokens)
        choice = max(
            (p for p in better if p.hit_tokens - current.hit_tokens >= enough), key=lambda p: p.size
        )
        prompt = int(context.workload.prompt_offsets[-1])
        measured = {engine: Gain(prompt, current.hit_tokens, prompt, choice.hit_tokens)}
        text = (
            f"Use {ENGINE_LABELS[engine]} {flags[engine]} {choice.size} instead of "
            f"{current.size}, if the attention backend supports it"
        )
        details = {"engine": engine, "size_before": current.size, "size_after": choice.size}
        items.append(_item("block_size", _describer(text)(measured), details, measured))
    return items


def _engine_item(context: Context, evidence: Evidence) -> Recommendation:
    """What SGLang-style radix matching (token-granular) would add over vLLM's hash blocks."""
    prompt = int(context.workload.prompt_offsets[-1])
    radix = int(evidence.sglang_page1_hits.sum())
    measured = {"vllm": Gain(prompt, int(evidence.hits["vllm"].sum()), prompt, radix)}
    text = (
        "Radix matching at token granularity (SGLang, --page-size 1) would serve what vLLM's "
        "whole hash blocks leave on this log"
    )
    details = {"engine_before": "vllm", "engine_after": "sglang (page size 1)"}
    return _item("engine", _describer(text)(measured), details, measured)


def _item(kind: str, summary: str, details: dict, measured: dict[str, Gain]) -> Recommendation:
    return Recommendation(
        kind=kind,
        summary=summary,
        details=details,
        measured={engine: gain.to_dict() for engine, gain in measured.items()},
    )


def _describer(action: str) -> Describe:
    def describe(measured: dict[str, Gain]) -> str:
        effects = [
            f"{ENGINE_LABELS[engine]} {gain.hit_tokens_before / gain.prompt_tokens_before:.1%} → "
            f"{gain.hit_tokens_after / gain.prompt_tokens_after:.1%} "
            f"({gain.recomputed_tokens_saved:+,} tokens saved)"
            for engine, gain in measured.items()
            if gain.prompt_tokens_before and gain.prompt_tokens_after
        ]
        return f"{action}: {'; '.join(effects)}."

    return describe


def _best_saving(item: Recommendation) -> int:
    assert item.measured is not None
    return max(gain["recomputed_tokens_saved"] for gain in item.measured.values())


def _site_loss(evidence: Evidence, site: int) -> int:
    return evidence.dynamic_sites[site].lost_tokens
