"""The SGLang router's ``cache_aware`` policy (also vllm-router's): approximate prefix tree over
request text, shortest queue when the fleet is imbalanced.

``CacheAwarePolicy::select_worker`` in sgl-model-gateway 0.3.2 (``sglang-router`` 0.3.2,
src/policies/cache_aware.rs) and vllm-router 0.1.17 (src/policies/cache_aware.rs, completions
path): loads are the router's in-flight counts; if ``max − min > balance_abs_threshold`` and
``max > min · balance_rel_threshold`` (f32) the least-loaded worker is chosen and the text is still
inserted under it; otherwise the tree is matched, and if ``matched / len > cache_threshold`` the
matching tenant is chosen, else the least-loaded worker (the first on ties: with no load every
cold request goes to worker 0). The text is inserted under the choice. A background thread evicts
every ``eviction_interval_secs`` down to ``max_tree_size`` symbols per tenant; here that happens
at request arrival times, every interval after the first request.

vllm-router 0.1.17 passes no routing text for ``/v1/completions`` (its goldens show it: a request
sharing a long prefix with one in flight still goes to the idle worker), so its ``cache_aware``
matches the empty string and routes to the least-loaded worker; ``sees_text=False`` models that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cache_models.routers.approx_tree import ApproxTree
from cache_models.routers.base import FleetLoad, RouteRequest, first_min


@dataclass(frozen=True)
class CacheAwareConfig:
    """Defaults of ``RouterArgs`` in each package's sglang_router/vllm_router router_args.py."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: int = 60
    max_tree_size: int = 2**26


SGLANG_DEFAULTS = CacheAwareConfig()  # sglang-router 0.3.2
VLLM_ROUTER_DEFAULTS = CacheAwareConfig(eviction_interval_secs=120, max_tree_size=2**25)


class CacheAware:
    name = "cache-aware"
    load_aware = True

    def __init__(
        self,
        replicas: int,
        config: CacheAwareConfig = SGLANG_DEFAULTS,
        source: str = "sglang-router 0.3.2",
        sees_text: bool = True,
    ) -> None:
        self.replicas = replicas
        self.config = config
        self.source = source
        self.sees_text = sees_text
        self.tree = ApproxTree()
        for worker in range(replicas):  # ``init_workers``: every worker at the root
            self.tree.insert(np.empty(0, np.int64), worker)
        self.threshold = np.float32(config.cache_threshold)
        self.rel = np.float32(config.balance_rel_threshold)
        self.next_eviction: float | None = None
        self.decisions = {"load_balance": 0, "cache_hit": 0, "cache_miss": 0}

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        self._evict_due(request.arrival_s)
        loads = load.in_flight
        low, high = int(loads.min()), int(loads.max())
        text = request.symbols if self.sees_text else request.symbols[:0]
        if (
            high - low > self.config.balance_abs_threshold
            and np.float32(high) > np.float32(low) * self.rel
        ):
            chosen = first_min(loads)
            self.decisions["load_balance"] += 1
        else:
            matched, tenant = self.tree.prefix_match(text)
            rate = np.float32(matched) / np.float32(len(text)) if len(text) else np.float32(0)
            if rate > self.threshold and tenant is not None:
                chosen = tenant
                self.decisions["cache_hit"] += 1
            else:
                chosen = first_min(loads)
                self.decisions["cache_miss"] += 1
        self.tree.insert(text, chosen)
        return chosen

    def _evict_due(self, now: float) -> None:
        interval = self.config.eviction_interval_secs
        if interval <= 0:
            return
        if self.next_eviction is None:
            self.next_eviction = now + interval
        while now >= self.next_eviction:
            self.tree.evict_tenant_by_size(self.config.max_tree_size)
            self.next_eviction += interval
