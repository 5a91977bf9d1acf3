"""Router names as the CLI spells them, each with its model, the source it reproduces and its
parameters (defaults of that source)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from cache_models.routers.base import Router
from cache_models.routers.cache_aware import (
    SGLANG_DEFAULTS,
    VLLM_ROUTER_DEFAULTS,
    CacheAware,
    CacheAwareConfig,
)
from cache_models.routers.consistent_hash import ConsistentHash
from cache_models.routers.dynamo import DynamoConfig, DynamoKv
from cache_models.routers.gaie import Gaie, GaieConfig
from cache_models.routers.simple import LeastLoad, RoundRobin, SeededRandom, VllmDataParallel


def _cache_aware(defaults: CacheAwareConfig, source: str, sees_text: bool):
    def build(replicas: int, params: dict[str, Any]) -> Router:
        config = CacheAwareConfig(**{**defaults.__dict__, **params})
        return CacheAware(replicas, config, source, sees_text)

    return build


ROUTERS: dict[str, tuple[Callable[[int, dict[str, Any]], Router], tuple[str, ...]]] = {
    "round-robin": (lambda n, p: RoundRobin(n), ()),
    "random": (lambda n, p: SeededRandom(n, **p), ("seed",)),
    "least-load": (lambda n, p: LeastLoad(n), ()),
    "hash": (lambda n, p: ConsistentHash(n), ()),
    "sglang-cache-aware": (
        _cache_aware(SGLANG_DEFAULTS, "sglang-router 0.3.2", True),
        tuple(f.name for f in fields(CacheAwareConfig)),
    ),
    "vllm-router-cache-aware": (
        _cache_aware(VLLM_ROUTER_DEFAULTS, "vllm-router 0.1.17 (/v1/completions)", False),
        tuple(f.name for f in fields(CacheAwareConfig)),
    ),
    "vllm-dp": (lambda n, p: VllmDataParallel(n), ()),
    "dynamo-kv": (
        lambda n, p: DynamoKv(n, DynamoConfig(**p)),
        tuple(f.name for f in fields(DynamoConfig)),
    ),
    "gaie": (lambda n, p: Gaie(n, GaieConfig(**p)), tuple(f.name for f in fields(GaieConfig))),
}


def make_router(name: str, replicas: int, params: dict[str, Any] | None = None) -> Router:
    """A fresh router; ValueError names an unknown router or parameter."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r} (one of {', '.join(ROUTERS)})")
    build, known = ROUTERS[name]
    params = dict(params or {})
    unknown = sorted(set(params) - set(known))
    if unknown:
        allowed = ", ".join(known) or "none"
        raise ValueError(f"router {name!r} has no parameter {unknown[0]!r} (it takes: {allowed})")
    return build(replicas, params)
