"""Shares, written once: every rate on screen and in the JSON report is one of these."""

from __future__ import annotations

import numpy as np


def share(part: float, whole: float) -> float:
    """``part / whole``; 0.0 of nothing."""
    return part / whole if whole else 0.0


def hit_rate(hit_tokens: np.ndarray, prompt_lengths: np.ndarray) -> float:
    """Hit tokens as a share of prompt tokens."""
    return share(int(hit_tokens.sum()), int(prompt_lengths.sum()))


def mean_request_hit_rate(hit_tokens: np.ndarray, prompt_lengths: np.ndarray) -> float:
    """The mean over requests of each request's hit share of its prompt."""
    return float(np.mean(hit_tokens / prompt_lengths)) if len(prompt_lengths) else 0.0
