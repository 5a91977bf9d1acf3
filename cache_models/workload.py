"""The replay input: a request stream as flat token arrays with offsets (the Arrow list layout)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order; request i's prompt is ``prompt_tokens[prompt_offsets[i] :
    prompt_offsets[i + 1]]``.

    Conventions every cache model relies on:

    - Token ids are int32. Real vocabulary ids are >= 0. Tokens the log does not know (an output of
      known length but unknown text) are unique negative ids, so they never match anything.
    - Every request has at least one output token: the engine always samples one. The last output
      token's KV is never computed by decode (an engine may still cache it, see ``stop_finish``).
    - ``namespace`` groups requests that may share cache entries: equal ids share, different ids
      never do (a ``cache_salt``, a LoRA adapter, or both). 0 is the default namespace.
    - ``stop_finish`` is True when the request ended on a stop token / EOS and False when it hit
      ``max_tokens`` (SGLang's overlap scheduler caches one more output token on a stop).
    - ``arrival_s`` is the arrival time in seconds (None when the log has no timestamps).
    - ``priority`` is SGLang's request ``priority`` (stored in the radix tree; decides eviction
      under ``--radix-eviction-policy priority``). None: every request has priority 0.
    - ``skip_prefix_lookup`` is True for requests that vLLM serves without reading its prefix
      cache (``prompt_logprobs`` set: ``SamplingParams.skip_reading_prefix_cache``). None: none.
    - ``hit_limit`` caps the prompt tokens an SGLang lookup may match (``logprob_start_len`` of a
      request with ``return_logprob``: ``Req._compute_max_prefix_len``); -1 or None: no cap.
    - ``max_new_tokens`` is the request's output limit as the log gives it (OpenAI ``max_tokens``,
      SGLang ``sampling_params.max_new_tokens``); -1 or None: the answer's length. Only SGLang's
      scheduler reads it (``PrefillAdder``'s budget, the overlap loop's in-flight skip).
    """

    prompt_tokens: np.ndarray
    prompt_offsets: np.ndarray
    output_tokens: np.ndarray
    output_offsets: np.ndarray
    namespace: np.ndarray
    stop_finish: np.ndarray
    arrival_s: np.ndarray | None = None
    priority: np.ndarray | None = None
    skip_prefix_lookup: np.ndarray | None = None
    hit_limit: np.ndarray | None = None
    max_new_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_offsets) - 1
        if len(self.output_offsets) != n + 1:
            raise ValueError("prompt_offsets and output_offsets disagree on the number of requests")
        if len(self.namespace) != n or len(self.stop_finish) != n:
            raise ValueError("namespace and stop_finish need one entry per request")
        if self.arrival_s is not None and len(self.arrival_s) != n:
            raise ValueError("arrival_s needs one entry per request")
        for name in ("priority", "skip_prefix_lookup", "hit_limit", "max_new_tokens"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"{name} needs one entry per request")
        if n and (np.diff(self.prompt_offsets).min() < 1 or np.diff(self.output_offsets).min() < 1):
            raise ValueError("every request needs at least one prompt token and one output token")

    @property
    def n_requests(self) -> int:
        return len(self.prompt_offsets) - 1

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)

    @property
    def prompt_token_count(self) -> int:
        """Prompt tokens of all the requests (as ``RunWorkload.prompt_token_count``)."""
        return int(self.prompt_offsets[-1])

    @property
    def output_lengths(self) -> np.ndarray:
        return np.diff(self.output_offsets)

    def kernel_inputs(
        self,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Prompt tokens and offsets, output tokens and offsets, namespace and stop_finish as
        contiguous int32/int64/int32/int64/int64/bool arrays: one dtype and layout each, so that a
        numba kernel taking them compiles once."""
        return (
            np.ascontiguousarray(self.prompt_tokens, np.int32),
            np.ascontiguousarray(self.prompt_offsets, np.int64),
            np.ascontiguousarray(self.output_tokens, np.int32),
            np.ascontiguousarray(self.output_offsets, np.int64),
            np.ascontiguousarray(self.namespace, np.int64),
            np.ascontiguousarray(self.stop_finish, np.bool_),
        )

    @property
    def priorities(self) -> np.ndarray:
        """Each request's priority as int64 (0 where the log gives none)."""
        if self.priority is None:
            return np.zeros(self.n_requests, np.int64)
        return np.ascontiguousarray(self.priority, np.int64)

    @property
    def skips_lookup(self) -> np.ndarray:
        """Per request: True when vLLM skips its prefix lookup (bool)."""
        if self.skip_prefix_lookup is None:
            return np.zeros(self.n_requests, np.bool_)
        return np.ascontiguousarray(self.skip_prefix_lookup, np.bool_)

    @property
    def hit_limits(self) -> np.ndarray:
        """Per request: the most prompt tokens a lookup may match, -1 for no cap (int64)."""
        if self.hit_limit is None:
            return np.full(self.n_requests, -1, np.int64)
        return np.ascontiguousarray(self.hit_limit, np.int64)

    @property
    def max_new_tokens_given(self) -> np.ndarray:
        """Per request: the log's ``max_new_tokens``, -1 where it gives none (int64)."""
        if self.max_new_tokens is None:
            return np.full(self.n_requests, -1, np.int64)
        return np.ascontiguousarray(self.max_new_tokens, np.int64)

    @property
    def output_limits(self) -> np.ndarray:
        """Per request: its ``max_new_tokens`` (int64), the answer's length where the log gives
        none (-1, None) or one below the answer (a limit the answer cannot have run past)."""
        lengths = self.output_lengths.astype(np.int64)
        if self.max_new_tokens is None:
            return lengths
        return np.maximum(np.ascontiguousarray(self.max_new_tokens, np.int64), lengths)

    @property
    def sglang_stop_finish(self) -> np.ndarray:
        """``stop_finish`` as SGLang's overlap scheduler sees it: a stop on the answer's last
        allowed token (``len(output) == max_new_tokens``) is no stop, since the loop skips that
        request's in-flight decode step (``Scheduler._reqs_finishing_inflight`` via
        ``Req.next_output_finishes_by_length``) and ``Req.check_finished`` ends it by length."""
        return self.sglang_stops_given(self.output_lengths)

    def sglang_stops_given(self, output_lengths: np.ndarray) -> np.ndarray:
        """``sglang_stop_finish`` for answers of ``output_lengths`` tokens (a run-length
        workload's entries stand for more than one token each)."""
        stops = np.ascontiguousarray(self.stop_finish, np.bool_)
        if self.max_new_tokens is None:
            return stops
        given = self.max_new_tokens_given
        return stops & ~((given >= 0) & (output_lengths >= given))

    def prompt(self, i: int) -> np.ndarray:
        return self.prompt_tokens[self.prompt_offsets[i] : self.prompt_offsets[i + 1]]

    def output(self, i: int) -> np.ndarray:
        return self.output_tokens[self.output_offsets[i] : self.output_offsets[i + 1]]

    def select(self, indices: np.ndarray) -> Workload:
        """A new workload holding the requests at ``indices``, in that order (array gathers
        only: no per-request arrays)."""
        indices = np.asarray(indices, np.int64)
        prompts, prompt_offsets = gather(self.prompt_tokens, self.prompt_offsets, indices)
        outputs, output_offsets = gather(self.output_tokens, self.output_offsets, indices)
        return Workload(
            prompt_tokens=prompts.astype(np.int32, copy=False),
            prompt_offsets=prompt_offsets,
            output_tokens=outputs.astype(np.int32, copy=False),
            output_offsets=output_offsets,
            namespace=np.asarray(self.namespace[indices], np.int32),
            stop_finish=np.asarray(self.stop_finish[indices], bool),
            arrival_s=None
            if self.arrival_s is None
            else np.asarray(self.arrival_s[indices], np.float64),
            priority=None if self.priority is None else self.priority[indices],
            skip_prefix_lookup=None
            if self.skip_prefix_lookup is None
            else self.skip_prefix_lookup[indices],
            hit_limit=None if self.hit_limit is None else self.hit_limit[indices],
            max_new_tokens=None if self.max_new_tokens is None else self.max_new_tokens[indices],
        )

    def rows(self, start: int, stop: int) -> Workload:
        """Requests ``start..stop-1``, as ``select(range(start, stop))`` gives them, but views
        of this workload's arrays (nothing copied)."""
        p0, p1 = int(self.prompt_offsets[start]), int(self.prompt_offsets[stop])
        o0, o1 = int(self.output_offsets[start]), int(self.output_offsets[stop])
        rows = slice(start, stop)

        def part(column: np.ndarray | None) -> np.ndarray | None:
            return None if column is None else column[rows]

        return Workload(
            prompt_tokens=self.prompt_tokens[p0:p1],
            prompt_offsets=self.prompt_offsets[start : stop + 1] - p0,
            output_tokens=self.output_tokens[o0:o1],
            output_offsets=self.output_offsets[start : stop + 1] - o0,
            namespace=self.namespace[rows],
            stop_finish=self.stop_finish[rows],
            arrival_s=part(self.arrival_s),
            priority=part(self.priority),
            skip_prefix_lookup=part(self.skip_prefix_lookup),
            hit_limit=part(self.hit_limit),
            max_new_tokens=part(self.max_new_tokens),
        )

    @classmethod
    def from_arrays(
        cls,
        prompts: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        namespace: np.ndarray | Sequence[int] | None = None,
        stop_finish: np.ndarray | Sequence[bool] | None = None,
        arrival_s: np.ndarray | Sequence[float] | None = None,
    ) -> Workload:
        """Concatenate per-request arrays (the builder for tests and small inputs)."""
        n = len(prompts)
        return cls(
            prompt_tokens=_concat(prompts),
            prompt_offsets=_offsets(prompts),
            output_tokens=_concat(outputs),
            output_offsets=_offsets(outputs),
            namespace=np.zeros(n, np.int32)
            if namespace is None
            else np.asarray(namespace, np.int32),
            stop_finish=np.ones(n, bool) if stop_finish is None else np.asarray(stop_finish, bool),
            arrival_s=None if arrival_s is None else np.asarray(arrival_s, np.float64),
        )

    @classmethod
    def from_lists(
        cls,
        prompts: Sequence[Sequence[int]],
        outputs: Sequence[Sequence[int] | None] | None = None,
        namespace: Sequence[int] | None = None,
        stop_finish: Sequence[bool] | None = None,
        arrival_s: Sequence[float] | None = None,
    ) -> Workload:
        """Build from Python lists; a missing output becomes one unknown (unique negative) token."""
        outs: list[np.ndarray] = []
        next_unknown = -1
        for i in range(len(prompts)):
            out = None if outputs is None else outputs[i]
            if out:
                outs.append(np.asarray(out, np.int32))
            else:
                outs.append(np.array([next_unknown], np.int32))
                next_unknown -= 1
        return cls.from_arrays(
            [np.asarray(p, np.int32) for p in prompts], outs, namespace, stop_finish, arrival_s
        )


def _concat(parts: Sequence[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, np.int32)
    return np.concatenate([np.asarray(p, np.int32) for p in parts])


def _offsets(parts: Sequence[np.ndarray]) -> np.ndarray:
    return offsets_of(np.array([len(p) for p in parts], np.int64))


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """The offsets of runs of ``lengths`` laid out flat: ``[0, l0, l0 + l1, ...]`` (int64)."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def gather(
    tokens: np.ndarray, offsets: np.ndarray, indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The token runs of ``indices`` (flat tokens + offsets), concatenated in that order."""
    indices = np.asarray(indices, np.int64)
    new_offsets = offsets_of(offsets[indices + 1] - offsets[indices])
    out = np.empty(int(new_offsets[-1]), tokens.dtype)
    _gather(tokens, np.asarray(offsets, np.int64), indices, new_offsets, out)
    return out, new_offsets


@njit(cache=True)
def _gather(tokens, offsets, indices, new_offsets, out):
    """One copy of each run (numpy's repeat-and-take made four passes over the tokens)."""
    for i in range(len(indices)):
        start = offsets[indices[i]]
        out[new_offsets[i] : new_offsets[i + 1]] = tokens[
            start : start + new_offsets[i + 1] - new_offsets[i]
        ]


def concat_workloads(workloads: Sequence[Workload]) -> Workload:
    """Consecutive chunks of one log as one workload."""
    if len(workloads) == 1:
        return workloads[0]
    arrivals = [w.arrival_s for w in workloads]
    return Workload(
        prompt_tokens=np.concatenate([w.prompt_tokens for w in workloads]),
        prompt_offsets=joined_offsets([w.prompt_offsets for w in workloads]),
        output_tokens=np.concatenate([w.output_tokens for w in workloads]),
        output_offsets=joined_offsets([w.output_offsets for w in workloads]),
        namespace=np.concatenate([w.namespace for w in workloads]),
        stop_finish=np.concatenate([w.stop_finish for w in workloads]),
        arrival_s=None if any(a is None for a in arrivals) else np.concatenate(arrivals),
        priority=_joined_column([w.priority for w in workloads], [w.priorities for w in workloads]),
        skip_prefix_lookup=_joined_column(
            [w.skip_prefix_lookup for w in workloads], [w.skips_lookup for w in workloads]
        ),
        hit_limit=_joined_column(
            [w.hit_limit for w in workloads], [w.hit_limits for w in workloads]
        ),
        max_new_tokens=_joined_column(
            [w.max_new_tokens for w in workloads], [w.max_new_tokens_given for w in workloads]
        ),
    )


def _joined_column(
    given: Sequence[np.ndarray | None], filled: Sequence[np.ndarray]
) -> np.ndarray | None:
    """An optional per-request column over joined chunks: None when no chunk has it, otherwise
    each chunk's values (its default where it has none)."""
    return None if all(g is None for g in given) else np.concatenate(filled)


def joined_offsets(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The offsets of consecutive parts (each from 0) as one array over them all."""
    shifted, base = [np.zeros(1, np.int64)], 0
    for offsets in parts:
        shifted.append(offsets[1:] + base)
        base += int(offsets[-1])
    return np.concatenate(shifted)
