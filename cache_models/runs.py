"""Run-length workloads: a request stream whose entries each stand for a run of tokens.

A hash-id trace names one id per block of ``T`` tokens (Mooncake: 512), and its synthetic tokens
(``analyzer.loaders.hash_trace``) only ever diverge where an id changes or where a request's
stream ends inside a block. So the replay needs one entry per run between such points, not one per
token: ``RunWorkload`` holds those entries (``runs``, a ``Workload`` whose "tokens" are run ids)
and each entry's length in tokens (``prompt_weights`` / ``output_weights``).

The contract every run-length replay relies on, kept by the builder (``cache_models.hash_runs``):

- Equal ids >= 0 are equal runs (the same tokens, the same length); runs with different ids
  differ at their first token, so a match between two entries is all of it or none of it.
- Negative ids are unknown tokens (an answer of known length, unknown text): each entry is that
  many unique tokens, matching nothing.
- Every point at which a replay acts falls between two entries: each prompt's end ``L``, the last
  token a lookup may match (``L - 1``), and the ends of what an engine caches of the answer
  (``L + n - 1`` and ``L + n``), and, when the table was cut for SGLang's chunked prefill, every
  end a prefill chunk can have (the SGLang kernel checks each). Block and page boundaries are
  *not* entry boundaries: a vLLM block may start or end inside a run (its key is built from the
  pieces it holds).

``expand`` turns a run-length workload into the token workload it stands for, so a replay of
either gives the same per-request hits. The token at offset ``k`` of a run whose id is ``u >= 0``
is ``first_tokens[u] + k * RUN_STEP`` modulo 2^31 (the synthetic tokens of a hash id are such a
progression); ``first_tokens`` is the builder's table of each run's first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from cache_models.workload import Workload, concat_workloads, gather, offsets_of

RUN_STEP = 0x7FEB352D  # the step between consecutive tokens of a run (mod 2^31)
TOKEN_MASK = 0x7FFFFFFF


@dataclass(frozen=True)
class RunWorkload:
    """``runs``: the requests with run ids for tokens (offsets count entries); the weights: each
    entry's tokens (int32, >= 1); ``first_tokens``: the first token of each run id >= 0;
    ``log_tokens_hint``: about how many distinct tokens the whole log these requests belong to
    holds (0: unknown), which a cache may size itself by before its first feed (it grows past
    it as it needs: results never depend on it)."""

    runs: Workload
    prompt_weights: np.ndarray
    output_weights: np.ndarray
    first_tokens: np.ndarray
    log_tokens_hint: int = 0

    def __post_init__(self) -> None:
        if len(self.prompt_weights) != len(self.runs.prompt_tokens) or len(
            self.output_weights
        ) != len(self.runs.output_tokens):
            raise ValueError("one weight per entry")
        if len(self.prompt_weights) and self.prompt_weights.min() < 1:
            raise ValueError("every entry stands for at least one token")
        if len(self.output_weights) and self.output_weights.min() < 1:
            raise ValueError("every entry stands for at least one token")

    @property
    def n_requests(self) -> int:
        return self.runs.n_requests

    @property
    def prompt_lengths(self) -> np.ndarray:
        """Tokens per prompt (int64)."""
        return _run_sums(self.prompt_weights, self.runs.prompt_offsets)

    @property
    def output_lengths(self) -> np.ndarray:
        """Tokens per answer (int64)."""
        return _run_sums(self.output_weights, self.runs.output_offsets)

    @property
    def arrival_s(self) -> np.ndarray | None:
        return self.runs.arrival_s

    @property
    def prompt_token_count(self) -> int:
        """Prompt tokens of all the requests."""
        return int(self.prompt_weights.sum(dtype=np.int64))

    def select(self, indices: np.ndarray) -> RunWorkload:
        """The requests at ``indices``, in that order."""
        indices = np.asarray(indices, np.int64)
        runs = self.runs
        return RunWorkload(
            runs.select(indices),
            gather(self.prompt_weights, runs.prompt_offsets, indices)[0].astype(np.int32),
            gather(self.output_weights, runs.output_offsets, indices)[0].astype(np.int32),
            self.first_tokens,
            self.log_tokens_hint,
        )

    def rows(self, start: int, stop: int) -> RunWorkload:
        """Requests ``start..stop-1`` (views: nothing copied)."""
        offsets = self.runs.prompt_offsets, self.runs.output_offsets
        (p0, p1), (o0, o1) = ((int(o[start]), int(o[stop])) for o in offsets)
        return RunWorkload(
            self.runs.rows(start, stop),
            self.prompt_weights[p0:p1],
            self.output_weights[o0:o1],
            self.first_tokens,
            self.log_tokens_hint,
        )

    def kernel_weights(self) -> tuple[np.ndarray, np.ndarray]:
        """The prompt and output weights as contiguous int32 arrays (one compiled version)."""
        return (
            np.ascontiguousarray(self.prompt_weights, np.int32),
            np.ascontiguousarray(self.output_weights, np.int32),
        )


def _run_sums(weights: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per request, the sum of its entries' weights (int64)."""
    totals = offsets_of(np.asarray(weights, np.int64))
    return totals[offsets[1:]] - totals[offsets[:-1]]


def expand_entries(
    ids: np.ndarray, weights: np.ndarray, first_tokens: np.ndarray, next_unknown: int = -1
) -> tuple[np.ndarray, int]:
    """The tokens entries stand for (int32), and the next unknown id: a known run's tokens are
    its progression, an unknown entry's ``w`` tokens are fresh unique negative ids."""
    weights = np.ascontiguousarray(weights, np.int64)
    tokens = np.empty(int(weights.sum()), np.int32)
    next_unknown = _expand(
        np.ascontiguousarray(ids, np.int64),
        weights,
        np.ascontiguousarray(first_tokens, np.int64),
        next_unknown,
        tokens,
    )
    return tokens, next_unknown


@njit(cache=True, nogil=True)
def _expand(
    ids: np.ndarray, weights: np.ndarray, first_tokens: np.ndarray, unknown: int, out: np.ndarray
) -> int:
    """Write the tokens of each entry into ``out``; returns the next unknown id."""
    at = 0
    for e in range(len(ids)):
        run, width = ids[e], weights[e]
        if run >= 0:
            token = first_tokens[run]
            for _ in range(width):
                out[at] = token
                token = (token + RUN_STEP) & TOKEN_MASK
                at += 1
        else:
            for _ in range(width):
                out[at] = unknown
                unknown -= 1
                at += 1
    return unknown


def expand(workload: RunWorkload, next_unknown: int = -1) -> tuple[Workload, int]:
    """The token workload ``workload`` stands for, and the next unknown id."""
    runs = workload.runs
    prompts, next_unknown = expand_entries(
        runs.prompt_tokens, workload.prompt_weights, workload.first_tokens, next_unknown
    )
    outputs, next_unknown = expand_entries(
        runs.output_tokens, workload.output_weights, workload.first_tokens, next_unknown
    )
    expanded = replace(  # every per-request column as it is; the tokens and their offsets new
        runs,
        prompt_tokens=prompts,
        prompt_offsets=offsets_of(workload.prompt_lengths),
        output_tokens=outputs,
        output_offsets=offsets_of(workload.output_lengths),
    )
    return expanded, next_unknown


def concat_runs(parts: Sequence[RunWorkload]) -> RunWorkload:
    """Consecutive run-length chunks of one log (one run table) as one."""
    return RunWorkload(
        concat_workloads([p.runs for p in parts]),
        np.concatenate([p.prompt_weights for p in parts]),
        np.concatenate([p.output_weights for p in parts]),
        parts[0].first_tokens,
        parts[0].log_tokens_hint,
    )


def as_tokens(workload: Workload | RunWorkload) -> Workload:
    """``workload`` as tokens: a run-length one expanded, a token one as it is."""
    return expand(workload)[0] if isinstance(workload, RunWorkload) else workload
