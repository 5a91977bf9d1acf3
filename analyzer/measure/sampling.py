"""Which requests to measure: a sample stratified by prompt length and by hit share."""

from __future__ import annotations

import numpy as np

LENGTH_BINS = 4  # prompt-length quartiles of the log
HIT_EDGES = (1e-9, 0.5)  # hit share: none, under half, half or more


def stratified_sample(
    prompt_lengths: np.ndarray, hit_tokens: np.ndarray, size: int, seed: int
) -> np.ndarray:
    """Up to ``size`` request indices (sorted): every stratum (length quartile × hit-share class)
    that has requests gets at least one while ``size`` allows, the rest in proportion to size."""
    n = len(prompt_lengths)
    if size >= n:
        return np.arange(n)
    quantiles = np.quantile(prompt_lengths, np.linspace(0, 1, LENGTH_BINS + 1)[1:-1])
    length_bin = np.searchsorted(quantiles, prompt_lengths, side="right")
    hit_bin = np.searchsorted(HIT_EDGES, hit_tokens / prompt_lengths, side="right")
    strata = length_bin * (len(HIT_EDGES) + 1) + hit_bin
    labels, counts = np.unique(strata, return_counts=True)
    quota = _allocate(counts, size)
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(np.flatnonzero(strata == label), take, replace=False)
        for label, take in zip(labels, quota, strict=True)
        if take
    ]
    return np.sort(np.concatenate(chosen))


def _allocate(counts: np.ndarray, size: int) -> np.ndarray:
    """Split ``size`` over strata: one each (largest first) while it lasts, then by largest
    remainder in proportion to the strata's sizes, never more than a stratum holds."""
    order = np.argsort(-counts, kind="stable")
    quota = np.zeros_like(counts)
    quota[order[: min(size, len(counts))]] = 1
    left = size - int(quota.sum())
    while left > 0:
        room = counts - quota
        share = left * room / room.sum()
        extra = np.minimum(np.floor(share).astype(counts.dtype), room)
        if not extra.any():  # fewer left than strata with room: the largest remainders
            extra[np.argsort(-(share - np.floor(share)), kind="stable")[:left]] = 1
            extra = np.minimum(extra, room)
        quota += extra
        left -= int(extra.sum())
    return quota
