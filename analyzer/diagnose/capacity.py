"""Hit rate against cache capacity: the LRU curve of each engine in one pass (stack distances),
checked on request against full replays at a few capacities, with the Belady bound beside it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analyzer.diagnose.scenarios import Scenario, replay_many, server_parts
from analyzer.replay import ReplaySettings
from cache_models import engine_rules as rules
from cache_models.belady import belady_hit_blocks
from cache_models.block_stream import BlockStream, block_streams
from cache_models.config import blocks_in
from cache_models.prefix_trie import TrieNodes
from cache_models.stack_distance import hit_blocks, hit_thresholds
from cache_models.workload import Workload

CURVE_POINTS = 40
# Capacities for "what it takes": these shares of the engine's unbounded hits.
NEEDED_SHARES = (0.5, 0.8, 0.9, 0.95, 0.99)
# Above this many blocks in a stream, the curve is computed on blocks twice as large, and so on
# (memory: about 16 bytes a block); the replay checks then measure the coarser model's error.
MAX_STREAM_BLOCKS = 8_000_000
# The curve is checked by full replays where it reaches these shares (or, when that is less, at
# the largest request's size).
CHECK_SHARES = (0.5, 0.8, 0.95)


@dataclass(frozen=True)
class CurvePoint:
    """One capacity: the LRU model's hits, and where measured the replay's and Belady's."""

    capacity_tokens: int
    model_hit_tokens: int
    replay_hit_tokens: int | None = None
    belady_hit_tokens: int | None = None


@dataclass(frozen=True)
class CapacityCurve:
    engine: str
    granularity: int  # block or page size of the model, in tokens (coarser on huge logs)
    points: list[CurvePoint]  # the curve (LRU model)
    checks: list[CurvePoint]  # replayed with LRU eviction, with the Belady bound
    unbounded_hit_tokens: int
    working_set_tokens: int  # the capacity from which the LRU model loses nothing
    needed: dict[str, int]  # share of the unbounded hits -> capacity tokens (LRU model)
    valid_from_tokens: int  # below this the largest request does not fit: the model is rougher

    def max_abs_error(self, prompt_tokens: int) -> float | None:
        """The largest gap between model and replay at the checks, in hit rate (None: not
        checked)."""
        gaps = [
            abs(p.model_hit_tokens - p.replay_hit_tokens) / prompt_tokens
            for p in self.checks
            if p.replay_hit_tokens is not None
        ]
        return max(gaps, default=None)

    def to_dict(self, prompt_tokens: int) -> dict[str, Any]:
        def point(p: CurvePoint) -> dict[str, Any]:
            rates = {
                "model_hit_rate": p.model_hit_tokens / prompt_tokens,
                "replay_hit_rate": None
                if p.replay_hit_tokens is None
                else p.replay_hit_tokens / prompt_tokens,
                "belady_hit_rate": None
                if p.belady_hit_tokens is None
                else p.belady_hit_tokens / prompt_tokens,
            }
            return {**p.__dict__, **rates}

        return {
            "granularity": self.granularity,
            "points": [point(p) for p in self.points],
            "checks": [point(p) for p in self.checks],
            "max_abs_error": self.max_abs_error(prompt_tokens),
            "unbounded_hit_tokens": self.unbounded_hit_tokens,
            "working_set_tokens": self.working_set_tokens,
            "capacity_needed": self.needed,
            "valid_from_tokens": self.valid_from_tokens,
        }


@dataclass(frozen=True)
class _Model:
    """One engine's streams (one per server, each with a cache of the full capacity) and the
    hit thresholds of all of them."""

    streams: list[BlockStream]
    thresholds: np.ndarray
    block_size: int

    @property
    def largest_request_tokens(self) -> int:
        """The peak of the largest request, in whole blocks: below it the engine rejects it."""
        return max(int(s.peak.max(initial=0)) for s in self.streams) * self.block_size

    def hit_tokens(self, capacity_tokens: int) -> int:
        blocks = blocks_in(capacity_tokens, self.block_size) or 0
        return int(hit_blocks(self.thresholds, np.array([blocks]))[0]) * self.block_size

    def belady_tokens(self, capacity_tokens: int) -> int:
        blocks = blocks_in(capacity_tokens, self.block_size) or 0
        hits = sum(int(belady_hit_blocks(s, blocks).sum()) for s in self.streams)
        return hits * self.block_size


def capacity_curves(
    trie: TrieNodes,
    workload: Workload,
    settings: ReplaySettings,
    servers: np.ndarray | None,
    check: bool = False,
) -> tuple[dict[str, CapacityCurve], dict[str, int] | None]:
    """Each engine's curve at its configured block / page size, and the Belady bound at the
    configured capacity (None when unbounded); ``trie`` is built from ``workload``. With
    ``check``, full LRU replays (and the Belady bound) at ``CHECK_SHARES`` of the unbounded hits
    measure the curve's error (the curve alone costs one pass; the checks a replay each)."""
    models = _models(trie, workload, settings, servers)
    reference = models["vllm"]
    unbounded = len(reference.thresholds) * settings.block_size
    smallest = max(model.largest_request_tokens for model in models.values())
    checks = sorted(
        {
            max(smallest, _capacity_for(reference, share * unbounded, settings))
            for share in CHECK_SHARES
            if unbounded and check
        }
    )
    lru = replace(settings, eviction_policy="lru")
    replays = replay_many(
        [
            Scenario(workload, replace(lru, capacity_tokens=capacity), servers=servers)
            for capacity in checks
        ]
    )
    curves = {}
    for engine, model in models.items():
        size = model.block_size
        total = len(model.thresholds)
        working_set = int(model.thresholds[-1]) * size if total else size
        grid = np.unique(np.geomspace(1, max(2, working_set // size), CURVE_POINTS).round())
        points = [CurvePoint(int(b) * size, model.hit_tokens(int(b) * size)) for b in grid]
        measured = [
            CurvePoint(
                capacity,
                model.hit_tokens(capacity),
                int(hits[engine].sum()),
                model.belady_tokens(capacity),
            )
            for capacity, hits in zip(checks, replays, strict=True)
        ]
        needed = {
            f"{share:g}": _blocks_for(model, share * total) * size
            for share in NEEDED_SHARES
            if total
        }
        curves[engine] = CapacityCurve(
            engine,
            size,
            points,
            measured,
            total * size,
            working_set,
            needed,
            model.largest_request_tokens,
        )
    capacity = settings.capacity_tokens
    belady = None
    if capacity is not None:
        belady = {engine: model.belady_tokens(capacity) for engine, model in models.items()}
    return curves, belady


def _models(
    trie: TrieNodes, workload: Workload, settings: ReplaySettings, servers: np.ndarray | None
) -> dict[str, _Model]:
    lengths = workload.prompt_lengths.astype(np.int64)
    outputs = workload.output_lengths.astype(np.int64)
    cached = {
        "vllm": rules.vllm_peak_tokens(lengths, outputs),  # all but the last output's KV
        "sglang": lengths + rules.sglang_kv_steps(outputs, workload.sglang_stop_finish, True),
    }
    sizes = {"vllm": settings.block_size, "sglang": settings.page_size}
    for engine, size in sizes.items():
        while int(cached[engine].sum()) // size > MAX_STREAM_BLOCKS:
            sizes[engine] = size = 2 * size
    parts = server_parts(servers, workload.n_requests)
    streams: dict[str, list[BlockStream]] = {"vllm": [], "sglang": []}
    thresholds: dict[str, list[np.ndarray]] = {"vllm": [], "sglang": []}
    for indices in parts:
        part = workload if len(parts) == 1 else workload.select(indices)
        engines = list(sizes)
        walked = block_streams(
            trie, part, [sizes[e] for e in engines], [cached[e][indices] for e in engines]
        )
        for engine, stream in zip(engines, walked, strict=True):
            size = sizes[engine]
            held_back = None
            if engine == "vllm":  # vLLM's free queue keeps the last partial block at its head
                partial = (cached[engine][indices] % size != 0).astype(np.int64)
                held_back = np.r_[0, partial[:-1]]
            streams[engine].append(stream)
            thresholds[engine].append(hit_thresholds(stream, held_back))
    return {
        engine: _Model(streams[engine], _merged(thresholds[engine]), size)
        for engine, size in sizes.items()
    }


def _merged(sorted_parts: list[np.ndarray]) -> np.ndarray:
    """Ascending arrays as one ascending array (one is already)."""
    return sorted_parts[0] if len(sorted_parts) == 1 else np.sort(np.concatenate(sorted_parts))


def _blocks_for(model: _Model, hits: float) -> int:
    """The fewest blocks at which the LRU model hits at least ``hits`` blocks."""
    index = max(0, int(np.ceil(hits)) - 1)
    return int(model.thresholds[min(index, len(model.thresholds) - 1)])


def _capacity_for(model: _Model, hit_tokens: float, settings: ReplaySettings) -> int:
    """A capacity in tokens, whole blocks and pages, where the model reaches ``hit_tokens``."""
    unit = np.lcm(settings.block_size, settings.page_size)
    blocks = _blocks_for(model, hit_tokens / settings.block_size)
    return int(-(-blocks * settings.block_size // unit) * unit)
