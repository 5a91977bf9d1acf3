"""The Gateway API Inference Extension's default endpoint picker (also llm-d's approximate prefix
routing): prefix-cache scorer, queue scorer and KV-cache-utilization scorer, summed with weights,
highest score wins.

Sources (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/scheduling/framework/plugins):
prefixcachescorer/plugin.go ``hashPrompt`` (blocks of ``BlockSize`` chained with xxhash64, the
first seeded by the model; the last partial block ignored; at most ``MaxPrefixBlocksToMatch``
256), ``Score`` (leading blocks found on the pod / the request's blocks), ``PreRequest`` (the
chosen pod's LRU of ``LRUCapacityPerServer`` 31,250 hashes, or its GPU blocks with AutoTune);
queuescorer/queue.go (``(max − q) / (max − min)``, 1.0 when all equal);
kvcacheutilizationscorer (``1 − usage``); default weights queue 2, KV 2, prefix 3
(config/charts/inferencepool epp-config.yaml); max-score picker with random ties.

Blocks here are 16 tokens (``BlockSize`` 64 characters at the plugin's own 4 characters per token,
what AutoTune derives from vLLM's block size 16), hashed by prefixcheck's chained block hash, not
xxhash over bytes: equal prefixes still give equal hashes. Queue and KV usage come from the fleet
model: requests past a replica's ``--concurrency`` wait, and usage is the tokens its in-flight
requests hold over its capacity. Checked on worked cases, not goldens (its Go binary is not run).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from cache_models.routers.base import FleetLoad, RouteRequest


@dataclass(frozen=True)
class GaieConfig:
    block_size: int = 16  # tokens per hashed block (64 characters / 4)
    max_prefix_blocks: int = 256  # maxPrefixBlocksToMatch
    lru_capacity_per_server: int = 31_250  # lruCapacityPerServer
    queue_weight: float = 2.0
    kv_cache_weight: float = 2.0
    prefix_weight: float = 3.0
    seed: int = 0  # the picker's random ties


class Gaie:
    name = "gaie"
    load_aware = True
    source = "gateway-api-inference-extension (prefix-cache, queue, kv-cache scorers 3/2/2)"

    def __init__(self, replicas: int, config: GaieConfig | None = None) -> None:
        self.replicas = replicas
        self.config = config or GaieConfig()
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self.pods: dict[int, set[int]] = {}  # hash -> replicas whose LRU holds it
        self.rng = np.random.default_rng(self.config.seed)

    def prefix_scores(self, blocks: np.ndarray) -> np.ndarray:
        """``matchLongestPrefix``: per pod, leading blocks found (a pod counts while every block
        so far is found somewhere), over the request's blocks."""
        matched = np.zeros(self.replicas)
        for block in blocks.tolist():
            pods = self.pods.get(block)
            if not pods:
                break
            for pod in pods:
                matched[pod] += 1
        return matched / len(blocks) if len(blocks) else matched

    def scores(self, request: RouteRequest, load: FleetLoad) -> np.ndarray:
        c = self.config
        blocks = self._blocks(request)
        queue = load.waiting
        low, high = queue.min(), queue.max()
        queue_score = np.ones(self.replicas) if high == low else (high - queue) / (high - low)
        kv_score = 1.0 - load.kv_usage
        return (
            c.queue_weight * queue_score
            + c.kv_cache_weight * kv_score
            + c.prefix_weight * self.prefix_scores(blocks)
        )

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        scores = self.scores(request, load)
        best = np.flatnonzero(scores == scores.max())
        chosen = int(best[0] if len(best) == 1 else best[self.rng.integers(len(best))])
        self._add(self._blocks(request), chosen, load)
        return chosen

    def _blocks(self, request: RouteRequest) -> np.ndarray:
        blocks = request.blocks if request.blocks is not None else np.empty(0, np.uint64)
        return blocks[: self.config.max_prefix_blocks]

    def _add(self, blocks: np.ndarray, pod: int, load: FleetLoad) -> None:
        """``indexer.Add``: every hash into the pod's LRU first (evicting its oldest past
        capacity, which drops the pod from that hash), then the pod onto every hash."""
        capacity = self.config.lru_capacity_per_server
        if load.capacity_tokens:  # AutoTune: the pod's own number of GPU blocks
            capacity = max(load.capacity_tokens // self.config.block_size, 1)
        lru = self.lru[pod]
        hashes = blocks.tolist()
        for block in hashes:
            if block in lru:
                lru.move_to_end(block)
                continue
            lru[block] = None
            if len(lru) > capacity:
                old, _ = lru.popitem(last=False)
                holders = self.pods.get(old)
                if holders is not None:
                    holders.discard(pod)
                    if not holders:
                        del self.pods[old]
        for block in hashes:
            self.pods.setdefault(block, set()).add(pod)
