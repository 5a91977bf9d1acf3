"""vLLM v1 automatic prefix caching (APC), replayed with vLLM 0.33.0's exact rules.

The rules (docs/vllm-apc.md): chained keys over full blocks of B tokens, the namespace (salt /
LoRA) in the first block's key; a lookup hits the leading cached blocks among the first
``(num_tokens - 1) // B``; every full block is cached when it is scheduled, output blocks included
(the last output token's KV is never computed); duplicates of a key are kept, a lookup takes the
oldest surviving copy; blocks with ref_cnt 0 wait in the free queue (uncached ones at the head,
cached ones at the tail in reverse block order) and a cached block is evicted only when popped.

Replay modes, chosen by the config:

- **Sequential** (``max_in_flight == 1``, no ``time_model``): each request is admitted once the
  previous one has finished. Only this mode streams: ``session()`` keeps the cache between the
  chunks of a log, whose results are the rows of replaying the whole log at once.
- **Lock-step** (``max_in_flight = K > 1``, no ``time_model``): vLLM's ``Scheduler.schedule`` /
  ``update_from_output`` loop (``v1/core/sched/scheduler.py``) with every request waiting from the
  start, as the oracle's ``--engine scheduler`` drives it. Each step has a token budget
  (``max_num_batched_tokens``, vLLM's ``--max-num-batched-tokens``; None: unlimited). The running
  requests come first, in order, while budget is left: each gets its remaining tokens (the rest of
  its prompt, or one decode token), capped by ``long_prefill_token_threshold`` (vLLM's
  ``--long-prefill-token-threshold``, default 0 = off; applied only while more than one request is
  running or waiting) and by the budget left. A chunk that finds too few free blocks preempts the
  newest running request (its blocks are freed, it goes back to the head of the queue), and no
  request is admitted in that step. Otherwise waiting requests are admitted FCFS while fewer than
  K run and budget is left: lookup, the capacity gate on the whole prompt
  (``scheduler_reserve_full_isl``), then slots for the first chunk only; the first one that does
  not fit stops admission. Blocks are hittable from the step that schedules them, so a request
  admitted while a sibling is mid-prefill sees only the sibling's chunks so far. A request samples
  a token in a step that completes its prefill or decodes; finished requests are freed at the end
  of the step. A preempted request is looked up again on re-admission (prompt plus generated
  tokens); its first hit is the one reported, later ones go to ``rehit_tokens``. vLLM 0.33 has no
  ``--max-num-partial-prefills`` (that was the V0 engine's): any number of prefills share a step.
- **Arrival time** (``time_model`` set; needs ``Workload.arrival_s``): request i arrives at
  ``arrival_s[i]`` (made non-decreasing, so no request overtakes an earlier one). Events are
  taken in time order; at each instant the requests finishing then are freed first (by finish
  time, then admission order), then the arrivals queue, then waiting requests are admitted FCFS
  while fewer than ``max_in_flight`` run and the head fits. The capacity gate counts the
  request's peak KV (prompt plus all outputs but the last), and the request is then scheduled
  whole: it takes its prompt's blocks and, in decode order, its output blocks, caching each full
  block, so it is never preempted and a later request can hit its outputs at once (a follow-up
  turn that arrives before the modelled finish still finds the answer it repeats). It holds its
  blocks until ``admission + uncached / prefill_tokens_per_s + n_outputs / decode_tokens_per_s``.
  With arrivals far apart, or one request in flight, this is exactly the sequential replay.

A request whose peak KV exceeds the capacity even in an empty cache never runs (vLLM refuses it):
hit 0, nothing cached, ``rejected`` = 1, not counted in the metrics. A request with
``Workload.skip_prefix_lookup`` (vLLM: ``prompt_logprobs`` set, so ``SamplingParams`` sets
``skip_reading_prefix_cache``) hits 0 and is not counted in the metrics, but caches its blocks.
The token budget applies to the lock-step mode; the sequential replay is the same with or without
one (a lone request's chunks take the same blocks in the same order), and the arrival-time mode
schedules each request whole.

Two implementations give identical results: the numba kernel (``implementation="fast"``, the
default, in ``_vllm_kernel``) and the plain Python reference (``implementation="reference"``, in
``_vllm_reference``), which reads like vLLM's own block pool and manager. This facade holds the
config, the adapter to the kernel and the result; the engine rules both use are
``engine_rules``.

A run-length workload (``cache_models.runs``, a hash-id trace's runs of synthetic tokens) replays
sequentially in the fast path (``_vllm_runs``: a key per block over the runs it holds), whole or
in a session, with the per-request results of replaying ``expand(workload)``; the other modes and
the reference take tokens only (expand first). With an unbounded cache, a sequential replay of
runs or tokens goes by the prefix trie instead (``_vllm_unbounded``: nothing is evicted, so a
block is cached exactly when an earlier request kept its prefix), with the pool's hits and
counters and no pool; a session of tokens can share its trie with the server's SGLang session
(``cache_models.unbounded``), so the log is walked once for both.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from cache_models import _vllm_kernel as kernel
from cache_models import _vllm_runs as run_kernel
from cache_models import engine_rules as rules
from cache_models._vllm_reference import COUNTERS, NO_BUDGET, ReferenceReplay
from cache_models._vllm_unbounded import UnboundedVllm
from cache_models.config import VllmConfig
from cache_models.result import ReplayResult
from cache_models.runs import RunWorkload
from cache_models.unbounded import UnboundedTrie
from cache_models.workload import Workload, offsets_of

MIN_SLICE_BLOCKS = 1 << 16  # the fewest peak blocks a slice of a run-length replay may hold

Implementation = Literal["fast", "reference"]  # the numba kernel or the readable reference


class VllmPrefixCache:
    """Replays a workload through vLLM's prefix cache (``implementation``: the numba kernel or
    the reference)."""

    def __init__(self, config: VllmConfig, implementation: Implementation = "fast") -> None:
        if implementation not in ("fast", "reference"):
            raise ValueError(f"unknown implementation {implementation!r}")
        self.config = config
        self.implementation = implementation

    def replay(self, workload: Workload | RunWorkload) -> ReplayResult:
        """Per-request hits and counters of ``workload``; a run-length workload
        (``cache_models.runs``) replays sequentially only, with the results of its expansion."""
        if isinstance(workload, RunWorkload):
            _check_runs(self.config, self.implementation)
            if self.config.usable_blocks is None:
                return _unbounded_result(UnboundedVllm(self.config.block_size), workload)
            return _replay_runs(self.config, workload, None)[0]
        if self.config.time_model is not None:
            if workload.arrival_s is None:
                raise ValueError("a time_model replay needs workload.arrival_s")
            if not np.isfinite(workload.arrival_s).all():
                raise ValueError("a time_model replay needs finite arrival times")
        if self.implementation == "reference":
            return _reference_result(ReferenceReplay(self.config), workload)
        if _by_trie(self.config):
            trie = UnboundedTrie(block_size=self.config.block_size)
            return _result(*trie.feed("vllm", workload), self.config.block_size, workload)
        return _replay_fast(self.config, workload, None)[0]

    @property
    def by_trie(self) -> bool:
        """Whether a replay of tokens goes by the prefix trie (unbounded, sequential, fast)."""
        return _by_trie(self.config) and self.implementation == "fast"

    def session(self, trie: UnboundedTrie | None = None) -> VllmSession:
        """A sequential replay fed chunk by chunk (only sequential replays stream). ``trie``: an
        unbounded cache's trie shared with the server's SGLang session (``cache_models.
        unbounded``), which then replays this session's chunks of tokens."""
        if self.config.max_in_flight != 1 or self.config.time_model is not None:
            raise ValueError(
                "only sequential replays stream: a session needs max_in_flight=1 and no time_model"
            )
        if trie is not None and (not self.by_trie or trie.block_size != self.config.block_size):
            raise ValueError("a shared trie serves an unbounded cache of its block size")
        return VllmSession(self.config, self.implementation, trie)


class VllmSession:
    """The cache's state between chunks of one log: ``feed`` gives each chunk's rows of the
    whole log's sequential replay (metrics of the chunk only, so they add up)."""

    def __init__(
        self, config: VllmConfig, implementation: Implementation, trie: UnboundedTrie | None = None
    ) -> None:
        self.config = config
        self.reference = ReferenceReplay(config) if implementation == "reference" else None
        self.pool: kernel.Pool | None = None  # the fast path's pool, once fed
        self.unbounded: UnboundedVllm | None = None  # an unbounded cache of runs (``_by_trie``)
        self.trie = trie  # an unbounded cache of tokens (``_by_trie``), made at the first feed
        self.runs: bool | None = None  # whether it is fed run-length chunks (None: not yet fed)

    def feed(self, chunk: Workload | RunWorkload) -> ReplayResult:
        runs = isinstance(chunk, RunWorkload)
        if self.runs is not None and runs != self.runs:
            raise ValueError("a session is fed tokens or runs, not both")
        if runs:
            _check_runs(self.config, "reference" if self.reference is not None else "fast")
        self.runs = runs
        if isinstance(chunk, RunWorkload):
            if self.config.usable_blocks is None:
                self.unbounded = self.unbounded or UnboundedVllm(self.config.block_size)
                return _unbounded_result(self.unbounded, chunk)
            result, self.pool = _replay_runs(self.config, chunk, self.pool)
            return result
        if self.reference is not None:
            return _reference_result(self.reference, chunk)
        if _by_trie(self.config):
            self.trie = self.trie or UnboundedTrie(block_size=self.config.block_size)
            return _result(*self.trie.feed("vllm", chunk), self.config.block_size, chunk)
        result, self.pool = _replay_fast(self.config, chunk, self.pool, room_ahead=True)
        return result

    @property
    def nbytes(self) -> int:
        """Bytes held by the fast path's pool (0 for the reference, whose objects are Python's)."""
        return 0 if self.pool is None else sum(array.nbytes for array in self.pool)


def _peak_blocks(workload: Workload | RunWorkload, block_size: int) -> np.ndarray:
    """Blocks each request holds at its peak: prompt plus all outputs but the last."""
    peak_tokens = rules.vllm_peak_tokens(workload.prompt_lengths, workload.output_lengths)
    return rules.ceil_div(peak_tokens, block_size)


def _check_runs(config: VllmConfig, implementation: Implementation) -> None:
    """Run-length workloads replay sequentially, in the fast path only."""
    if config.max_in_flight != 1 or config.time_model is not None or implementation != "fast":
        raise ValueError(
            "run-length workloads replay sequentially (max_in_flight=1, no time_model, the fast "
            "implementation): expand them first (cache_models.runs.expand)"
        )


def _by_trie(config: VllmConfig) -> bool:
    """Whether a replay of tokens goes by the prefix trie: unbounded and sequential."""
    return config.usable_blocks is None and config.max_in_flight == 1 and config.time_model is None


def _unbounded_result(cache: UnboundedVllm, workload: RunWorkload) -> ReplayResult:
    """An unbounded cache's sequential replay of runs, by the prefix trie (``_vllm_unbounded``:
    no pool, the pool's hits and counters)."""
    hit_tokens, counters = cache.feed(workload)
    return _result(hit_tokens, counters, cache.block_size, workload)


def _reference_result(reference: ReferenceReplay, workload: Workload) -> ReplayResult:
    hit_tokens, counters = reference.replay(workload)
    return _result(hit_tokens, counters, reference.config.block_size, workload)


def _result(
    hit_tokens: np.ndarray,
    counters: dict[str, np.ndarray],
    block_size: int,
    workload: Workload | RunWorkload,
) -> ReplayResult:
    """Assemble the result; metrics count first admissions only, as vLLM's exported counters do,
    and not requests that skipped the lookup (``KVCacheManager.record_prefix_cache_stats``)."""
    counters["evicted_tokens"] = counters["evicted_blocks"] * block_size
    skips = (
        workload.runs.skips_lookup if isinstance(workload, RunWorkload) else workload.skips_lookup
    )
    counted = (counters["rejected"] == 0) & ~skips
    metrics = {
        "vllm:prefix_cache_queries": int(workload.prompt_lengths[counted].sum()),
        "vllm:prefix_cache_hits": int(hit_tokens.sum()),
        "vllm:num_preemptions": int(counters["preemptions"].sum()),
    }
    return ReplayResult("vllm", hit_tokens, {name: counters[name] for name in COUNTERS}, metrics)


def _empty_or_grown(
    config: VllmConfig, peaks: np.ndarray, pool: kernel.Pool | None, room_ahead: bool
) -> tuple[kernel.Pool, np.ndarray]:
    """The pool to replay from (None: an empty cache), grown ahead for a session's chunk, and
    which requests can run at all (their peak fits the capacity)."""
    limit = kernel.UNBOUNDED if config.usable_blocks is None else config.usable_blocks
    if pool is None:
        pool = kernel.pool_arrays(limit, min(limit + 1, 1024))
    runnable = peaks <= limit
    if room_ahead:  # allocated here by numpy (huge pages); the kernel grows it if need be
        pool = kernel.with_room(pool, int(peaks[runnable].sum()))
    return pool, runnable


def _counters(tally: np.ndarray, runnable: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "evicted_blocks": tally[kernel.EVICTED],
        "inserted_blocks": tally[kernel.INSERTED],
        "duplicate_blocks": tally[kernel.DUPLICATE],
        "preemptions": tally[kernel.PREEMPTIONS],
        "rehit_tokens": tally[kernel.REHIT],
        "rejected": (~runnable).astype(np.int64),
    }


def _replay_runs(
    config: VllmConfig, workload: RunWorkload, pool: kernel.Pool | None
) -> tuple[ReplayResult, kernel.Pool]:
    """The sequential replay of a run-length workload (``_vllm_runs``) from ``pool`` (None: an
    empty cache), in slices of requests whose peak blocks fit the pool's size: before each, the
    pool grows here (numpy's huge pages, about twice as fast on the map's random probes as the
    kernel's own growth), at most doubling, so memory follows the blocks kept."""
    size = config.block_size
    peaks = _peak_blocks(workload, size)
    if pool is None and workload.log_tokens_hint:  # the log's blocks at once: no regrowth
        limit = kernel.UNBOUNDED if config.usable_blocks is None else config.usable_blocks
        blocks = workload.log_tokens_hint // size + workload.n_requests
        pool = kernel.pool_arrays(limit, min(limit + 1, blocks))
    pool, runnable = _empty_or_grown(config, peaks, pool, room_ahead=False)
    held = offsets_of(np.where(runnable, peaks, 0))
    tally = np.zeros((6, workload.n_requests), np.int64)
    runs = workload.runs
    prompt_weights, output_weights = workload.kernel_weights()
    arrays = (
        np.ascontiguousarray(runs.prompt_tokens, np.int32),
        prompt_weights,
        np.ascontiguousarray(runs.prompt_offsets, np.int64),
        np.ascontiguousarray(runs.output_tokens, np.int32),
        output_weights,
        np.ascontiguousarray(runs.output_offsets, np.int64),
        workload.prompt_lengths,
        workload.output_lengths,
        np.ascontiguousarray(runs.namespace, np.int32),
        runnable,
        runs.skips_lookup,
        size,
        max(1, int(peaks[runnable].max(initial=0))),
        tally,
    )
    first = 0
    while first < workload.n_requests:
        bound = held[first] + max(len(pool.key), MIN_SLICE_BLOCKS)
        stop = max(first + 1, int(np.searchsorted(held, bound, "right")) - 1)
        pool = kernel.with_room(pool, int(held[stop] - held[first]))
        pool = run_kernel.replay_sequential(pool, *arrays, first, stop)
        first = stop
    return _result(tally[kernel.HIT], _counters(tally, runnable), size, workload), pool


def _replay_fast(
    config: VllmConfig, workload: Workload, pool: kernel.Pool | None, room_ahead: bool = False
) -> tuple[ReplayResult, kernel.Pool]:
    """Run the numba kernel of ``config``'s replay mode from ``pool`` (None: an empty cache).
    ``room_ahead``: grow the pool here first, for every block the requests hold at their peaks
    (a session's chunks: the bound is one chunk's blocks; a whole log's replay grows as it
    goes, as its bound, every block of the log, can be far above the blocks it keeps)."""
    size = config.block_size
    peaks = _peak_blocks(workload, size)
    pool, runnable = _empty_or_grown(config, peaks, pool, room_ahead)
    tally = np.zeros((6, workload.n_requests), np.int64)
    args = (
        np.ascontiguousarray(workload.prompt_tokens, np.int32),
        np.ascontiguousarray(workload.prompt_offsets, np.int64),
        np.ascontiguousarray(workload.output_tokens, np.int32),
        np.ascontiguousarray(workload.output_offsets, np.int64),
        np.ascontiguousarray(workload.namespace, np.int32),
        runnable,
        workload.skips_lookup,
        size,
        config.max_in_flight,
        max(1, int(peaks[runnable].max(initial=0))),
        tally,
    )
    time_model = config.time_model
    if time_model is not None:
        assert workload.arrival_s is not None
        arrival = np.maximum.accumulate(np.asarray(workload.arrival_s, np.float64))
        rates = (time_model.prefill_tokens_per_s, time_model.decode_tokens_per_s)
        pool = kernel.replay_in_time(pool, *args, arrival, *rates)
    elif config.max_in_flight == 1:
        pool = kernel.replay_in_time(pool, *args, np.zeros(workload.n_requests), 1.0, 1.0)
    else:
        budget = config.max_num_batched_tokens or NO_BUDGET
        pool = kernel.replay_lock_step(pool, *args, budget, config.long_prefill_token_threshold)
    return _result(tally[kernel.HIT], _counters(tally, runnable), size, workload), pool
