"""What the diagnosis adds to the report: losses by cause, dynamic content, curves, bounds,
measured recommendations and what-ifs, with their JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from analyzer.diagnose.capacity import CapacityCurve
from analyzer.diagnose.losses import CATEGORIES
from analyzer.diagnose.scenarios import Gain
from analyzer.diagnose.sweep import SweepPoint
from analyzer.engines import ENGINE_LABELS
from analyzer.shares import share

LOSS_DEFINITIONS = {
    "never_seen": "(L - 1) - the ceiling with salts removed and dynamic values made constant: "
    "tokens no earlier prompt or answer had (unavoidable)",
    "last_token": "1 per request: the last prompt token is always computed for its logits",
    "dynamic_content": "the ceiling with salts removed and dynamic values made constant - the "
    "ceiling with salts removed: what varying values before shared text cost",
    "salts": "the ceiling with salts removed - the ceiling: what per-tenant cache_salt cost "
    "(LoRA adapters stay apart)",
    "alignment": "the ceiling - the engine's sequential hits with unbounded capacity: whole "
    "blocks or pages only, and what the engine never caches",
    "concurrency": "the engine's sequential unbounded hits - its unbounded hits in the replay mode "
    "used: what requests in flight together could not share (0 when sequential)",
    "eviction": "the engine's hits with unbounded capacity - its hits at the configured capacity",
    "routing": "fleet replays: the hits of one instance with the fleet's total capacity - the "
    "hits on the replicas the router chose (0 for one instance)",
    "ceiling": "the ideal cache: unbounded, token-exact, every prompt and cacheable answer kept",
}


@dataclass(frozen=True)
class Recommendation:
    kind: str
    summary: str  # the fix and its measured effect on the engines it helps
    details: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] | None = None
    why: str = ""  # one line: why it recovers tokens (and what it costs)
    engines: list[str] = field(default_factory=list)  # the engines it saves tokens on


@dataclass(frozen=True)
class DiagnosisScope:
    """The requests the diagnosis covered: the whole log, or its leading sample when streamed.

    It is the one denominator of every share the diagnosis shows (losses, curves, sweeps, bounds,
    what-ifs): each renderer takes its shares and its description from here, so no table divides
    a sample's tokens by the whole log's."""

    requests: int
    prompt_tokens: int
    ceiling_hit_tokens: int
    whole_log: bool
    log_requests: int
    log_prompt_tokens: int
    hit_tokens: dict[str, int]  # each engine's hits on these requests (replayed with the log)

    def share(self, tokens: float) -> float:
        """``tokens`` as a share of the scope's prompt tokens."""
        return share(tokens, self.prompt_tokens)

    @property
    def description(self) -> str:
        """What the shares are over, in words, for the caption beside each table."""
        if self.whole_log:
            return (
                f"over the whole log: {self.requests:,} requests, "
                f"{self.prompt_tokens:,} prompt tokens"
            )
        rates = ", ".join(
            f"{ENGINE_LABELS.get(engine, engine)} {self.share(hits):.1%}"
            for engine, hits in self.hit_tokens.items()
        )
        return (
            f"over the first {self.requests:,} requests, {self.prompt_tokens:,} prompt tokens "
            f"({share(self.prompt_tokens, self.log_prompt_tokens):.1%} of the log's "
            f"{self.log_prompt_tokens:,}), where the hit rates are {rates}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "share_of_log_prompt_tokens": share(self.prompt_tokens, self.log_prompt_tokens),
            "hit_rate": {engine: self.share(hits) for engine, hits in self.hit_tokens.items()},
            "ceiling_hit_rate": self.share(self.ceiling_hit_tokens),
            "description": self.description,
        }


@dataclass(frozen=True)
class EngineLosses:
    """One engine's recomputed prompt tokens by cause; they add up to prompt - hit tokens."""

    tokens: dict[str, int]
    clamped_requests: int

    def to_dict(self, scope: DiagnosisScope) -> dict[str, Any]:
        return {
            name: {"tokens": tokens, "share": scope.share(tokens)}
            for name, tokens in self.tokens.items()
        }


@dataclass(frozen=True)
class DynamicSite:
    """A varying value in a template and what it costs."""

    position: int  # token position where the value starts
    kind: str
    requests: int
    value_tokens: int  # the longest value, in tokens
    static_tokens_after: int  # the shared run after it that the value keeps from being reused
    lost_tokens: int  # the dynamic_content loss of the requests that pass it first
    examples: list[str] | None


@dataclass(frozen=True)
class WhatIf:
    name: str
    kind: str
    measured: dict[str, Gain]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "measured": {engine: gain.to_dict() for engine, gain in self.measured.items()},
            "details": self.details,
        }


@dataclass(frozen=True)
class Diagnosis:
    losses: dict[str, EngineLosses]
    dynamic_content: list[DynamicSite]
    recommendations: list[Recommendation]
    capacity_curves: dict[str, CapacityCurve]
    size_sweep: dict[str, list[SweepPoint]]
    belady: dict[str, int] | None  # hit tokens at the configured capacity
    what_if: list[WhatIf]
    eviction_policy: str

    def to_dict(self, scope: DiagnosisScope) -> dict[str, Any]:
        """The report's diagnosis keys (recommendations are the report's own key); every share is
        over the scope's prompt tokens, the requests the diagnosis was measured on."""
        prompt_tokens = scope.prompt_tokens
        bounds: dict[str, Any] = {
            "ceiling": {
                "hit_tokens": scope.ceiling_hit_tokens,
                "hit_rate": scope.share(scope.ceiling_hit_tokens),
                "definition": LOSS_DEFINITIONS["ceiling"],
            },
            "belady": None,
        }
        if self.belady is not None:
            bounds["belady"] = {
                engine: {"hit_tokens": hits, "hit_rate": scope.share(hits)}
                for engine, hits in self.belady.items()
            }
            bounds["belady_definition"] = (
                "the most lookup hits any eviction policy could get at the configured capacity "
                "knowing the future: blocks (vLLM) or pages (SGLang) keyed by namespace and "
                "prefix, each request touching its cacheable blocks, a block kept between two "
                "touches taking one block of room; Belady's rule with bypass is optimal for "
                "that, and every engine schedule is one such schedule, so it is an upper bound"
            )
        return {
            "losses": {engine: losses.to_dict(scope) for engine, losses in self.losses.items()},
            "loss_totals": {
                engine: {
                    "recomputed_tokens": sum(losses.tokens.values()),
                    "clamped_requests": losses.clamped_requests,
                }
                for engine, losses in self.losses.items()
            },
            "loss_definitions": {name: LOSS_DEFINITIONS[name] for name in CATEGORIES},
            "dynamic_content": [asdict(site) for site in self.dynamic_content],
            "capacity_curve": {
                engine: curve.to_dict(prompt_tokens)
                for engine, curve in self.capacity_curves.items()
            },
            "capacity_curve_model": (
                "LRU stack distances over blocks (vLLM) or pages (SGLang), one pass; with "
                "--check-curves, checked against full LRU replays (max_abs_error, in hit rate; "
                f"null when not checked); the configured SGLang policy is {self.eviction_policy}"
            ),
            "block_size_sweep": {
                engine: [
                    {
                        "size": p.size,
                        "hit_tokens": p.hit_tokens,
                        "hit_rate": scope.share(p.hit_tokens),
                    }
                    for p in points
                ]
                for engine, points in self.size_sweep.items()
            },
            "upper_bounds": bounds,
            "what_if": [item.to_dict() for item in self.what_if],
        }
