"""Logs that hold several models: each model is replayed on its own caches (its own server), and
the run's figures are the sums over models."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from analyzer.progress import NoProgress, Progress
from analyzer.replay import Replays, ReplaySettings, hit_rate, replay_all
from cache_models.prefix_trie import PrefixTrie
from cache_models.result import ReplayResult
from cache_models.workload import Workload

UNNAMED = "(no model)"


@dataclass(frozen=True)
class ModelSummary:
    """One model's share of the run: its requests and each engine's hits on its own caches."""

    requests: int
    prompt_tokens: int
    hit_tokens: dict[str, int]
    hit_rate: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "engines": {
                engine: {"hit_tokens": self.hit_tokens[engine], "hit_rate": self.hit_rate[engine]}
                for engine in self.hit_tokens
            },
        }


def model_labels(models: pl.Series) -> np.ndarray:
    return models.fill_null(UNNAMED).to_numpy().astype(str)


def replay_by_model(
    workload: Workload,
    models: np.ndarray,
    settings: ReplaySettings,
    progress: Progress | None = None,
) -> Replays:
    """Replay each model's requests on caches of its own; one model is one plain replay.

    The ceiling and the shared prefixes come from one trie over the whole workload, in which the
    workload's namespaces already keep the models apart.
    """
    names = list(dict.fromkeys(models))
    if len(names) <= 1:
        return replay_all(workload, settings, progress)
    progress = progress or NoProgress()
    parts = []
    for name in names:
        indices = np.flatnonzero(models == name)
        parts.append((indices, replay_all(workload.select(indices), settings, progress)))
    trie = PrefixTrie()
    ideal = trie.replay(workload)
    assert trie.nodes is not None
    return Replays(
        vllm=merged_results([(i, r.vllm) for i, r in parts], workload.n_requests),
        sglang=merged_results([(i, r.sglang) for i, r in parts], workload.n_requests),
        sglang_page1=merged_results([(i, r.sglang_page1) for i, r in parts], workload.n_requests),
        ideal=ideal,
        trie=trie.nodes,
    )


def merged_results(parts: list[tuple[np.ndarray, ReplayResult]], n: int) -> ReplayResult:
    """Per-model results of one engine put back in workload order, metrics summed."""
    if len(parts) == 1 and len(parts[0][0]) == n:
        return parts[0][1]
    first = parts[0][1]
    hits = np.zeros(n, dtype=first.hit_tokens.dtype)
    counters = {name: np.zeros(n, dtype=values.dtype) for name, values in first.counters.items()}
    metrics = dict.fromkeys(first.metrics, 0)
    for indices, result in parts:
        hits[indices] = result.hit_tokens
        for name, values in result.counters.items():
            counters[name][indices] = values
        for name, value in result.metrics.items():
            metrics[name] += value
    return replace(first, hit_tokens=hits, counters=counters, metrics=metrics)


def model_summaries(
    models: np.ndarray, prompt_lengths: np.ndarray, replays: Replays
) -> dict[str, ModelSummary]:
    """Per-model figures, when the log holds more than one model."""
    names = list(dict.fromkeys(models))
    if len(names) <= 1:
        return {}
    summaries = {}
    for name in names:
        mask = models == name
        lengths = prompt_lengths[mask]
        engines = {"vllm": replays.vllm.hit_tokens[mask], "sglang": replays.sglang.hit_tokens[mask]}
        summaries[name] = ModelSummary(
            requests=int(mask.sum()),
            prompt_tokens=int(lengths.sum()),
            hit_tokens={engine: int(hits.sum()) for engine, hits in engines.items()},
            hit_rate={engine: hit_rate(hits, lengths) for engine, hits in engines.items()},
        )
    return summaries
