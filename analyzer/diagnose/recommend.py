"""Recommendations, each with its gain measured by replaying the fixed log (or the other
configuration) through the same cache models. A fix is recommended for the engines on which it
saves at least ``MIN_GAIN_SHARE`` of the prompt tokens, and for those only; each says in one line
why it works. Switching engines is not a recommendation: the alignment loss already says what
SGLang's token-granular matching would add."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    plan_hits,
    reorder_plan,
    salt_plan,
)
from analyzer.diagnose.scenarios import Gain, gains
from analyzer.diagnose.sweep import SweepPoint
from analyzer.engines import ENGINE_LABELS
from analyzer.settings import ReplaySettings
from analyzer.units import binary_bytes

MIN_GAIN_SHARE = 0.002
MAX_PAD_TARGETS = 4
MAX_MOVES = 3
# The capacity recommended: where the LRU curve reaches this share of the unbounded hits.
CAPACITY_TARGET = "0.95"
# A coarser block size is preferred when it keeps this share of the best size's gain.
KEEP_OF_BEST_GAIN = 0.8
# vLLM block sizes are recommended in multiples of this: FlashAttention, vLLM's default backend on
# CUDA, takes kernel block sizes that are multiples of 16 (vllm/v1/attention/backends/
# flash_attn.py, FlashAttentionBackend.get_supported_kernel_block_sizes).
VLLM_BLOCK_MULTIPLE = 16
WHY = {
    "pad_prefix": "vLLM caches whole blocks only: the template's last partial block is recomputed "
    "for every request, and padding it to a block boundary makes it hittable",
    "move_dynamic_content": "a prefix cache matches from the first token: a value that changes per "
    "request ends the match, so everything after it is recomputed",
    "reorder_parts": "tools or system prompts in a different order make prompts differ from the "
    "first part that moved, though they hold the same text",
    "salt": "a cache_salt exists to stop cross-tenant timing attacks (a hit returns faster, so one "
    "tenant could probe another's prompts): share a salt only among tenants that trust each other",
    "capacity": "requests evicted blocks that later requests would have hit",
    "block_size": "a smaller block (page) leaves fewer tokens of each prompt in a partial block "
    "that is never cached",
}


@dataclass(frozen=True)
class Evidence:
    """What the recommendations are chosen from."""

    hits: dict[str, np.ndarray]  # each engine's hits as configured (replay order)
    dynamic_sites: list[DynamicSite]
    salt_loss: int
    eviction_loss: int
    curves: dict[str, CapacityCurve]
    sweep: dict[str, list[SweepPoint]]
    kv: KvShape | None = None  # the model shape KV capacity is also given in bytes for


@dataclass(frozen=True)
class KvShape:
    """A model shape's KV bytes per token, to give a capacity in bytes as well as tokens."""

    model: str
    bytes_per_token: int

    def bytes(self, tokens: int) -> str:
        return binary_bytes(tokens * self.bytes_per_token)


@dataclass(frozen=True)
class Advice:
    recommendations: list[Recommendation]  # largest measured saving first
    # Per shared prefix considered for padding (its tokens' bytes): the recomputed tokens that
    # padding it saves on the engine it helps most (negative: it costs more than it saves).
    padding_saves: dict[bytes, int]


def recommend(context: Context, evidence: Evidence) -> Advice:
    """The measured recommendations, largest saving first, and what padding each template does."""
    workload = context.workload
    floor = max(1.0, MIN_GAIN_SHARE * int(workload.prompt_offsets[-1]))
    items = []
    padding_saves = {}
    for candidates in _batches(_candidate_plans(context, evidence), context.settings):
        results = plan_hits([plan for plan, _, _ in candidates], context, evidence.hits)
        for (plan, describe, target), hits in zip(candidates, results, strict=True):
            measured = gains(workload, evidence.hits, plan.log, hits)
            items.append(_item(plan.kind, describe, plan.details, measured, floor))
            if target is not None:
                padding_saves[target.tokens.tobytes()] = max(
                    gain.recomputed_tokens_saved for gain in measured.values()
                )
    items += _size_items(context, evidence, floor)
    kept = [item for item in items if item.engines]
    return Advice(sorted(kept, key=lambda item: -_best_saving(item)), padding_saves)


Describe = Callable[[dict[str, Gain]], str]
Candidate = tuple[Plan, Describe, PadTarget | None]


def _batches(
    candidates: Iterator[Candidate], settings: ReplaySettings
) -> Iterator[list[Candidate]]:
    """The plans to replay together: one at a time when the replays are unbounded and sequential
    (each is its own pass in this process, so only one changed copy of the log is held at a
    time), else all at once (they run side by side in worker processes)."""
    if settings.capacity_tokens is None and settings.sequential:
        yield from ([candidate] for candidate in candidates)
    else:
        yield list(candidates)


def _candidate_plans(context: Context, evidence: Evidence) -> Iterator[Candidate]:
    """Each plan, made as it is asked for (a plan holds a changed copy of the log)."""
    block = context.settings.block_size
    for target in _pad_targets(context.pad_targets, block):
        pad = -target.length % block
        text = (
            f"Pad the {target.length}-token prefix shared by {len(target.requests):,} requests "
            f"with {pad} tokens at token {target.insert_at} (to {target.length + pad}, a "
            f"multiple of {block})"
        )
        yield (pad_plan(context, [target]), _describer(text), target)
    ranked = sorted(range(len(evidence.dynamic_sites)), key=lambda s: -_site_loss(evidence, s))
    for site in [s for s in ranked if _site_loss(evidence, s) > 0][:MAX_MOVES]:
        info = evidence.dynamic_sites[site]
        text = (
            f"Move the {info.kind.replace('_', ' ')} at token {info.position} "
            f"({info.requests:,} requests) after the {info.static_tokens_after}-token static "
            "part that follows it"
        )
        yield (move_plan(context, [site]), _describer(text), None)
    if context.reordered is not None:
        moved = context.reordered
        text = (
            f"List tool definitions in one order ({moved.tools_reordered:,} requests differ from "
            f"their set's usual order) and put the system prompt first ({moved.system_moved:,} "
            "requests)"
        )
        yield (reorder_plan(context), _describer(text), None)
    if evidence.salt_loss > 0:
        text = (
            "Tenants that trust each other could share one cache_salt (a salt keeps every "
            "block of a tenant's prompts apart)"
        )
        yield (salt_plan(context), _describer(text), None)
    capacity = context.settings.capacity_tokens
    if capacity is not None and evidence.eviction_loss > 0:
        target = max(c.needed.get(CAPACITY_TARGET, 0) for c in evidence.curves.values())
        if target > capacity:
            settings = replace(context.settings, capacity_tokens=target)
            kv = evidence.kv
            after = f" ({kv.bytes(target)} of KV on {kv.model})" if kv else ""
            before = f" ({kv.bytes(capacity)})" if kv else ""
            text = (
                f"Give the KV cache {target:,} tokens{after} instead of {capacity:,}{before}, "
                f"where the LRU curve reaches {float(CAPACITY_TARGET):.0%} of the unbounded hits"
            )
            details: dict = {"capacity_tokens_before": capacity, "capacity_tokens_after": target}
            if kv is not None:
                details |= {
                    "model_shape": kv.model,
                    "kv_bytes_per_token": kv.bytes_per_token,
                    "capacity_bytes_before": capacity * kv.bytes_per_token,
                    "capacity_bytes_after": target * kv.bytes_per_token,
                }
            plan = Plan(
                f"capacity={target}", "capacity", context.workload, settings, details=details
            )
            yield (plan, _describer(text), None)


def _pad_targets(targets: list[PadTarget], block: int) -> list[PadTarget]:
    """Unaligned prefixes of at least a block, by the saving they promise (a remainder per later
    request, less the padding)."""

    def promise(t: PadTarget) -> int:
        return (t.length % block) * (len(t.requests) - 1) - (-t.length % block)

    eligible = [t for t in targets if t.length >= block and t.length % block and promise(t) > 0]
    return sorted(eligible, key=promise, reverse=True)[:MAX_PAD_TARGETS]


def _size_items(context: Context, evidence: Evidence, floor: float) -> list[Recommendation]:
    """A block size (vLLM, multiples of 16 only) or page size (SGLang) that would serve more,
    from the sweep."""
    configured = {"vllm": context.settings.block_size, "sglang": context.settings.page_size}
    flags = {"vllm": "--block-size", "sglang": "--page-size"}
    items = []
    for engine, points in evidence.sweep.items():
        current = next(p for p in points if p.size == configured[engine])
        better = [
            p
            for p in points
            if (engine != "vllm" or p.size % VLLM_BLOCK_MULTIPLE == 0)
            and p.hit_tokens - current.hit_tokens >= floor
        ]
        if not better:
            continue
        enough = KEEP_OF_BEST_GAIN * (max(p.hit_tokens for p in better) - current.hit_tokens)
        choice = max(
            (p for p in better if p.hit_tokens - current.hit_tokens >= enough), key=lambda p: p.size
        )
        prompt = int(context.workload.prompt_offsets[-1])
        measured = {engine: Gain(prompt, current.hit_tokens, prompt, choice.hit_tokens)}
        caveat = "" if engine == "vllm" else ", if the attention backend supports it"
        text = (
            f"Use {ENGINE_LABELS[engine]} {flags[engine]} {choice.size} instead of "
            f"{current.size}{caveat}"
        )
        details = {"engine": engine, "size_before": current.size, "size_after": choice.size}
        items.append(_item("block_size", _describer(text), details, measured, floor))
    return items


def _item(
    kind: str, describe: Describe, details: dict, measured: dict[str, Gain], floor: float
) -> Recommendation:
    """The recommendation for the engines on which the fix saves at least ``floor`` tokens."""
    helped = sorted(
        (e for e, gain in measured.items() if gain.recomputed_tokens_saved >= floor),
        key=lambda e: -measured[e].recomputed_tokens_saved,
    )
    return Recommendation(
        kind=kind,
        summary=describe({engine: measured[engine] for engine in helped}),
        details=details,
        measured={engine: gain.to_dict() for engine, gain in measured.items()},
        why=WHY[kind],
        engines=helped,
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
    return max(item.measured[engine]["recomputed_tokens_saved"] for engine in item.engines)


def _site_loss(evidence: Evidence, site: int) -> int:
    return evidence.dynamic_sites[site].lost_tokens
