"""Stateless and load-only routers: round-robin, seeded random, least-load, and vLLM's internal
data-parallel load balancer."""

from __future__ import annotations

import numpy as np

from cache_models.routers.base import FleetLoad, RouteRequest, first_min


class RoundRobin:
    """``RoundRobinPolicy::select_worker`` (sgl-model-gateway 0.3.2 src/policies/round_robin.rs,
    vllm-router 0.1.17 the same): a counter that starts at 0, ``count % healthy workers``."""

    name = "round-robin"
    load_aware = False

    def __init__(self, replicas: int, source: str = "sglang-router 0.3.2") -> None:
        self.replicas = replicas
        self.source = source
        self.counter = 0

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        chosen = self.counter % self.replicas
        self.counter += 1
        return chosen


class SeededRandom:
    """Uniform random placement from a seeded generator (the routers' ``random`` policies draw
    from an unseeded thread RNG, so no run of theirs is reproducible; this one is)."""

    name = "random"
    load_aware = False

    def __init__(self, replicas: int, seed: int = 0) -> None:
        self.replicas = replicas
        self.source = f"prefixcheck (numpy PCG64, seed {seed})"
        self.rng = np.random.default_rng(seed)

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        return int(self.rng.integers(self.replicas))


class LeastLoad:
    """Fewest in-flight requests, the first such replica on ties (the routers' shortest-queue
    step: ``healthy_indices.iter().min_by_key(|i| workers[i].load())``, sgl-model-gateway
    src/policies/cache_aware.rs ``select_worker_min_load``)."""

    name = "least-load"
    load_aware = True
    source = "sglang-router 0.3.2 (shortest queue)"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        return first_min(load.in_flight)


class VllmDataParallel:
    """vLLM 0.33.0's internal DP load balancer, ``DPLBAsyncMPClient.get_core_engine_for_request``
    (vllm/v1/engine/core_client.py): score ``max(client_count · in_flight, waiting + running)``
    plus ``waiting · 6 · max(0, kv_usage − 0.5)``; the first strictly lowest score scanning from
    ``eng_start_index``, which rotates by one after every decision.

    One API-server client (``client_count`` 1, start index 0). The coordinator's waiting + running
    snapshot never exceeds this client's own exact in-flight count, so the score is the in-flight
    count; the KV-pressure penalty is left out (no KV usage is modelled), so it is 0."""

    name = "vllm-dp"
    load_aware = True
    source = "vllm 0.33.0 (DPLBAsyncMPClient)"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.start = 0

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        order = (self.start + np.arange(self.replicas)) % self.replicas
        chosen = int(order[first_min(load.in_flight[order])])
        self.start = (self.start + 1) % self.replicas
        return chosen
