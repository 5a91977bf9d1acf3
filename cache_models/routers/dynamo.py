"""NVIDIA Dynamo's KV router cost, in its approximate mode (``--no-router-kv-events``: the router
predicts each worker's cached blocks from its own routing decisions, expiring after
``router_ttl_secs``).

``DefaultWorkerScorer::worker_logit`` (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/
default.rs; docs/components/router/router-concepts.md, router-configuration.md):
``logit = prefill_load_scale · max(raw_prefill_blocks − credit · device_overlap_blocks, 0)
+ decode_blocks + decode_active_request_weight · active_requests``, lowest wins, ties drawn at
random (``minimum_cost_index``, reservoir sampling: here from a seeded generator).
``raw_prefill_blocks`` is the worker's active prefill plus this request's blocks and
``decode_blocks`` the blocks its active requests hold. Dynamo's runtime cannot be driven here
request by request, so this model is checked on worked cases of that formula, not goldens; its
load is the requests in flight (a routed request counts as past prefill: active prefill is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cache_models.routers.base import FleetLoad, RouteRequest


@dataclass(frozen=True)
class DynamoConfig:
    """Defaults of ai-dynamo 1.6.1's router flags (router-configuration.md)."""

    block_size: int = 16  # the engines' KV block size, which the router hashes by
    overlap_score_credit: float = 1.0  # --router-kv-overlap-score-credit
    prefill_load_scale: float = 1.0  # --router-prefill-load-scale
    decode_active_request_weight: float = 0.0
    router_ttl_secs: float = 120.0  # --router-ttl-secs (approximate mode)
    seed: int = 0  # ties


class DynamoKv:
    name = "dynamo-kv"
    load_aware = True
    source = "ai-dynamo 1.6.1 (KV router, approximate mode)"

    def __init__(self, replicas: int, config: DynamoConfig | None = None) -> None:
        self.replicas = replicas
        self.config = config or DynamoConfig()
        self.blocks: list[dict[int, float]] = [{} for _ in range(replicas)]  # hash -> expiry
        self.rng = np.random.default_rng(self.config.seed)
        self.routed = 0

    def overlap(self, worker: int, blocks: np.ndarray, now: float) -> int:
        """Leading blocks of the request the router believes ``worker`` still holds.

        A block is predicted with all the blocks before it, and a later prediction renews them
        all, so expiries never rise along a chain: the held blocks are a prefix (binary search).
        """
        held = self.blocks[worker]

        def live(k: int) -> bool:
            expiry = held.get(int(blocks[k]))
            return expiry is not None and expiry > now

        lo, hi = 0, len(blocks)  # blocks[:lo] live; blocks[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if live(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def costs(self, request: RouteRequest, load: FleetLoad) -> np.ndarray:
        c = self.config
        blocks = request.blocks if request.blocks is not None else np.empty(0, np.uint64)
        request_blocks = -(-request.prompt_tokens // c.block_size)
        overlaps = np.array(
            [self.overlap(w, blocks, request.arrival_s) for w in range(self.replicas)], float
        )
        prefill = np.maximum(request_blocks - c.overlap_score_credit * overlaps, 0.0)
        decode = load.active_tokens / c.block_size
        return (
            c.prefill_load_scale * prefill
            + decode
            + c.decode_active_request_weight * load.in_flight
        )

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        costs = self.costs(request, load)
        best = np.flatnonzero(costs == costs.min())
        chosen = int(best[0] if len(best) == 1 else best[self.rng.integers(len(best))])
        if request.blocks is not None:
            expiry = request.arrival_s + self.config.router_ttl_secs
            self.blocks[chosen].update(dict.fromkeys(request.blocks.tolist(), expiry))
        self.routed += 1
        if self.routed % 4096 == 0:  # drop expired predictions (the TTL sweep)
            now = request.arrival_s
            self.blocks = [{b: t for b, t in h.items() if t > now} for h in self.blocks]
        return chosen
