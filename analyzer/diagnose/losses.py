"""Why each prompt token was recomputed: per request, the gap between the prompt and an engine's
hit, split by counterfactual replays into causes that add up to it exactly.

For a request of L prompt tokens and engine hit H, with the ceilings of the ideal cache (unbounded,
token-exact, the last token always recomputed):

- ``last_token`` = 1: the engine needs the last prompt token's logits, so it is always computed;
- ``never_seen`` = (L - 1) - the ceiling with salts removed and dynamic values made constant:
  tokens no earlier request (or answer) had, in any tenant; unavoidable;
- ``dynamic_content`` = that ceiling - the ceiling with salts removed: what varying values
  (timestamps, ids) before otherwise shared text cost;
- ``salts`` = the ceiling with salts removed - the ceiling: what per-tenant ``cache_salt`` cost
  (LoRA adapters stay apart: their KV differs);
- ``alignment`` = the ceiling - the engine's sequential hit with unbounded capacity: whole blocks or
  pages only, and what the engine never caches (vLLM: the last output token);
- ``concurrency`` = that - the engine's unbounded hit in the replay mode used: what requests in
  flight together could not share (0 in a sequential replay);
- ``eviction`` = the engine's unbounded hit - its hit at the configured capacity (requests too big
  for the cache included);
- ``routing`` (fleet replays only) = the hit of one instance holding the fleet's total capacity -
  the request's hit on the replica its router chose: what spreading the traffic cost.

Each counterfactual can only add hits, so every term is >= 0; where a replay disagrees (a model's
quirk), the chain is clamped to stay monotone and ``clamped`` counts the requests concerned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CATEGORIES = (
    "never_seen",
    "last_token",
    "dynamic_content",
    "salts",
    "alignment",
    "concurrency",
    "eviction",
    "routing",
)


@dataclass(frozen=True)
class Ceilings:
    """Per-request ideal-cache hits, each with one more obstacle removed."""

    ceiling: np.ndarray
    salt_free: np.ndarray
    salt_free_constant_values: np.ndarray


@dataclass(frozen=True)
class Losses:
    """One engine's recomputed prompt tokens by cause, per request (replay order)."""

    engine: str
    per_request: dict[str, np.ndarray]
    clamped: int

    def totals(self) -> dict[str, int]:
        return {name: int(self.per_request[name].sum()) for name in CATEGORIES}


def attribute(
    engine: str,
    prompt_lengths: np.ndarray,
    hit: np.ndarray,
    unbounded_hit: np.ndarray,
    sequential_unbounded_hit: np.ndarray,
    ceilings: Ceilings,
    routed_hit: np.ndarray | None = None,
) -> Losses:
    """Split L - hit of every request into the causes above; with ``routed_hit`` (the fleet's
    hits) the split is of L - routed_hit and ``hit`` is the single instance's."""
    levels = [
        hit if routed_hit is None else routed_hit,
        hit,
        unbounded_hit,
        sequential_unbounded_hit,
        ceilings.ceiling,
        ceilings.salt_free,
        ceilings.salt_free_constant_values,
    ]
    clamped = np.zeros(len(hit), bool)
    monotone = [levels[0].astype(np.int64)]
    for level in levels[1:]:
        raised = np.maximum(level, monotone[-1])
        clamped |= raised != level
        monotone.append(raised)
    top = prompt_lengths.astype(np.int64) - 1
    clamped |= monotone[-1] > top
    f, h, u, s, c, c_salt_free, c_constant = (np.minimum(level, top) for level in monotone)
    per_request = {
        "never_seen": top - c_constant,
        "last_token": np.ones(len(hit), np.int64),
        "dynamic_content": c_constant - c_salt_free,
        "salts": c_salt_free - c,
        "alignment": c - s,
        "concurrency": s - u,
        "eviction": u - h,
        "routing": h - f,
    }
    return Losses(engine, per_request, int(clamped.sum()))
