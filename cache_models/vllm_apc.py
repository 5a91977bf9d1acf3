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

Two implementations give identical results: the numba kernel (``engine="fast"``, the default, in
``_vllm_kernel``) and the plain Python reference below (``engine="reference"``), which reads like
vLLM's own block pool and manager.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cache_models import _vllm_kernel as kernel
from cache_models.config import TimeModel, VllmConfig
from cache_models.result import ReplayResult
from cache_models.workload import Workload

Engine = Literal["fast", "reference"]

COUNTERS: tuple[str, ...] = (
    "evicted_blocks",  # cached blocks this request's allocations evicted
    "evicted_tokens",  # the same, in tokens
    "inserted_blocks",  # full blocks (prompt and output) this request newly cached
    "duplicate_blocks",  # of those, blocks whose key already had a cached copy
    "preemptions",  # times this request was preempted
    "rehit_tokens",  # hit tokens at re-admissions after preemption
    "rejected",  # 1 when the request can never fit the cache
)


class VllmPrefixCache:
    """Replays a workload through vLLM's prefix cache (``engine``: numba kernel or reference)."""

    def __init__(self, config: VllmConfig, engine: Engine = "fast") -> None:
        if engine not in ("fast", "reference"):
            raise ValueError(f"unknown engine {engine!r}")
        self.config = config
        self.engine = engine

    def replay(self, workload: Workload) -> ReplayResult:
        if self.config.time_model is not None:
            if workload.arrival_s is None:
                raise ValueError("a time_model replay needs workload.arrival_s")
            if not np.isfinite(workload.arrival_s).all():
                raise ValueError("a time_model replay needs finite arrival times")
        if self.engine == "reference":
            return ReferenceReplay(self.config).replay(workload)
        return _replay_fast(self.config, workload, None)[0]

    def session(self) -> VllmSession:
        """A sequential replay fed chunk by chunk (only sequential replays stream)."""
        if self.config.max_in_flight != 1 or self.config.time_model is not None:
            raise ValueError(
                "only sequential replays stream: a session needs max_in_flight=1 and no time_model"
            )
        return VllmSession(self.config, self.engine)


class VllmSession:
    """The cache's state between chunks of one log: ``feed`` gives each chunk's rows of the
    whole log's sequential replay (metrics of the chunk only, so they add up)."""

    def __init__(self, config: VllmConfig, engine: Engine) -> None:
        self.config = config
        self.reference = ReferenceReplay(config) if engine == "reference" else None
        self.pool: kernel.Pool | None = None  # the fast path's pool, once fed

    def feed(self, chunk: Workload) -> ReplayResult:
        if self.reference is not None:
            return self.reference.replay(chunk)
        result, self.pool = _replay_fast(self.config, chunk, self.pool)
        return result

    @property
    def nbytes(self) -> int:
        """Bytes held by the fast path's pool (0 for the reference, whose objects are Python's)."""
        return 0 if self.pool is None else sum(array.nbytes for array in self.pool)


def _peak_blocks(workload: Workload, block_size: int) -> np.ndarray:
    """Blocks each request holds at its peak: prompt plus all outputs but the last."""
    peak_tokens = workload.prompt_lengths + workload.output_lengths - 1
    return -(-peak_tokens // block_size)


def _result(
    hit_tokens: np.ndarray,
    counters: dict[str, np.ndarray],
    block_size: int,
    workload: Workload,
) -> ReplayResult:
    """Assemble the result; metrics count first admissions only, as vLLM's exported counters do,
    and not requests that skipped the lookup (``KVCacheManager.record_prefix_cache_stats``)."""
    counters["evicted_tokens"] = counters["evicted_blocks"] * block_size
    counted = (counters["rejected"] == 0) & ~workload.skips_lookup
    metrics = {
        "vllm:prefix_cache_queries": int(workload.prompt_lengths[counted].sum()),
        "vllm:prefix_cache_hits": int(hit_tokens.sum()),
        "vllm:num_preemptions": int(counters["preemptions"].sum()),
    }
    return ReplayResult("vllm", hit_tokens, {name: counters[name] for name in COUNTERS}, metrics)


def _replay_fast(
    config: VllmConfig, workload: Workload, pool: kernel.Pool | None
) -> tuple[ReplayResult, kernel.Pool]:
    """Run the numba kernel of ``config``'s replay mode from ``pool`` (None: an empty cache)."""
    size = config.block_size
    peaks = _peak_blocks(workload, size)
    limit = kernel.UNBOUNDED if config.capacity_tokens is None else config.capacity_tokens // size
    if pool is None:
        pool = kernel.new_pool(limit, min(limit + 1, 1024))
    runnable = peaks <= limit
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
    counters = {
        "evicted_blocks": tally[kernel.EVICTED],
        "inserted_blocks": tally[kernel.INSERTED],
        "duplicate_blocks": tally[kernel.DUPLICATE],
        "preemptions": tally[kernel.PREEMPTIONS],
        "rehit_tokens": tally[kernel.REHIT],
        "rejected": (~runnable).astype(np.int64),
    }
    return _result(tally[kernel.HIT], counters, size, workload), pool


# --------------------------------------------------------------------------------------------------
# The reference: vLLM's BlockPool, FreeKVCacheBlockQueue and KVCacheManager, in plain Python.
# --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Block:
    """One KV-cache block of B token slots."""

    block_id: int
    ref_cnt: int = 0
    key: int | None = None  # chained key of the full block it caches; None: not cached


class FreeBlockQueue:
    """vLLM's FreeKVCacheBlockQueue: the blocks with ref_cnt 0, in eviction order (head first)."""

    def __init__(self, blocks: list[Block]) -> None:
        self._queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Block]:
        return iter(self._queue.values())

    def head(self) -> Block:
        return next(iter(self._queue.values()))

    def popleft(self) -> Block:
        return self._queue.popitem(last=False)[1]

    def remove(self, block: Block) -> None:
        del self._queue[block.block_id]

    def append(self, block: Block) -> None:
        self._queue[block.block_id] = block

    def prepend(self, blocks: list[Block]) -> None:
        """Put ``blocks`` at the head, keeping their order (vLLM's prepend_n)."""
        for block in reversed(blocks):
            self._queue[block.block_id] = block
            self._queue.move_to_end(block.block_id, last=False)


class BlockPool:
    """vLLM's BlockPool: the blocks, the free queue, and the map from key to cached copies.

    An unbounded pool (``num_blocks`` None) adds a new block whenever the queue's head is cached or
    the queue is empty: a pool too large ever to evict, grown on demand.
    """

    def __init__(self, num_blocks: int | None) -> None:
        self.unbounded = num_blocks is None
        self.blocks = [Block(i) for i in range(num_blocks or 1)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.null_block = self.free_queue.popleft()  # block 0: reserved, never cached or freed
        self.cached: dict[int, dict[int, Block]] = {}  # key -> {block_id: copy}, oldest first

    @property
    def num_free(self) -> float:
        """Blocks that can be taken now (an unbounded pool never runs out)."""
        return math.inf if self.unbounded else len(self.free_queue)

    def get_cached_block(self, key: int) -> Block | None:
        """The oldest surviving copy of ``key``, if any."""
        copies = self.cached.get(key)
        return next(iter(copies.values())) if copies else None

    def get_new_blocks(self, n: int) -> tuple[list[Block], int]:
        """Pop n blocks from the head; a popped cached block is evicted now. Returns the blocks and
        how many were evicted."""
        blocks = [self._pop_free() for _ in range(n)]
        evicted = 0
        for block in blocks:
            if block.key is not None:
                self._evict(block)
                evicted += 1
            block.ref_cnt = 1
        return blocks, evicted

    def _pop_free(self) -> Block:
        if self.unbounded and (not self.free_queue or self.free_queue.head().key is not None):
            self.blocks.append(Block(len(self.blocks)))
            return self.blocks[-1]
        return self.free_queue.popleft()

    def _evict(self, block: Block) -> None:
        assert block.key is not None
        copies = self.cached[block.key]
        del copies[block.block_id]
        if not copies:
            del self.cached[block.key]
        block.key = None

    def cache_block(self, block: Block, key: int) -> bool:
        """Register a full block under ``key``; True when a copy was already cached."""
        copies = self.cached.setdefault(key, {})
        duplicate = bool(copies)
        copies[block.block_id] = block
        block.key = key
        return duplicate

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on hit blocks, pulling the unreferenced ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[Block]) -> None:
        """Drop one reference each, in eviction order: at 0, uncached blocks go to the head (reused
        first), cached ones to the tail."""
        uncached: list[Block] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.key is None:
                    uncached.append(block)
                else:
                    self.free_queue.append(block)
        self.free_queue.prepend(uncached)


class BlockKeys:
    """Collision-free chained block keys: key i stands for (namespace, tokens[: (i + 1) * B])."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[tuple[object, bytes], int] = {}

    def chain(self, tokens: np.ndarray, namespace: int) -> list[int]:
        """Keys of every full block of ``tokens``."""
        size = self.block_size
        parent: object = ("namespace", namespace)
        keys: list[int] = []
        for start in range(0, len(tokens) - size + 1, size):
            block = (parent, tokens[start : start + size].tobytes())
            parent = self._ids.setdefault(block, len(self._ids))
            keys.append(parent)
        return keys


NO_BUDGET = 1 << 62  # max_num_batched_tokens None: no per-step token budget


@dataclass
class Budget:
    """What is left of one step's token budget (Scheduler.schedule's ``token_budget``)."""

    left: int

    def chunk(self, remaining: int, threshold: int) -> int:
        """The tokens a request gets now: its remaining ones, capped by a positive threshold
        (--long-prefill-token-threshold) and by the budget left."""
        if 0 < threshold < remaining:
            remaining = threshold
        return min(remaining, self.left)


@dataclass(eq=False)
class Request:
    """A request as the scheduler sees it."""

    index: int
    prompt_len: int
    max_tokens: int  # number of outputs
    keys: list[int]  # key of every full block of ``tokens``
    num_tokens: int  # prompt + tokens generated so far (vLLM's request.num_tokens)
    num_computed: int = 0
    blocks: list[Block] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_preemptions: int = 0

    @property
    def peak_tokens(self) -> int:
        return self.prompt_len + self.max_tokens - 1


class KVCacheManager:
    """vLLM's KVCacheManager for one full-attention group: lookup, admission, decode slots, free."""

    def __init__(self, block_size: int, num_blocks: int | None) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.counters: dict[str, np.ndarray] = {}  # per request of the workload being replayed

    def get_computed_blocks(self, req: Request) -> list[Block]:
        """The hit: leading cached blocks, the last token always left to recompute."""
        hit: list[Block] = []
        for key in req.keys[: (req.num_tokens - 1) // self.block_size]:
            block = self.pool.get_cached_block(key)
            if block is None:
                break
            hit.append(block)
        return hit

    def can_allocate(self, hit: list[Block], num_tokens: int) -> bool:
        """The admission gate (full_sequence_must_fit): the new blocks, plus the hit blocks that
        touching takes out of the free queue, must all be free now."""
        num_new = math.ceil(num_tokens / self.block_size) - len(hit)
        return num_new + sum(block.ref_cnt == 0 for block in hit) <= self.pool.num_free

    def allocate(self, req: Request, hit: list[Block], num_tokens: int) -> None:
        """Admit: touch the hit first (so it cannot be evicted), then add blocks for
        ``num_tokens`` slots and cache their full blocks."""
        self.pool.touch(hit)
        req.blocks = list(hit)
        req.num_cached_blocks = len(hit)
        self._add_blocks(req, num_tokens)
        self.cache_blocks(req, num_tokens)

    def append_slot(self, req: Request) -> bool:
        """Decode: a slot for the last sampled token; False if it needs a block and none is free."""
        return self.allocate_slots(req, req.num_computed + 1)

    def allocate_slots(self, req: Request, num_tokens: int) -> bool:
        """A running request's next chunk: slots up to ``num_tokens``, caching its full blocks;
        False (nothing taken) when the blocks it needs are not all free."""
        num_new = math.ceil(num_tokens / self.block_size) - len(req.blocks)
        if num_new > self.pool.num_free:
            return False
        if num_new > 0:
            self._add_blocks(req, num_tokens)
        self.cache_blocks(req, num_tokens)
        return True

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Cache the request's full blocks among its first ``num_tokens`` tokens."""
        num_full = num_tokens // self.block_size
        for i in range(req.num_cached_blocks, num_full):
            duplicate = self.pool.cache_block(req.blocks[i], req.keys[i])
            self.counters["inserted_blocks"][req.index] += 1
            self.counters["duplicate_blocks"][req.index] += duplicate
        req.num_cached_blocks = max(req.num_cached_blocks, num_full)

    def free(self, req: Request) -> None:
        """Release the request's blocks, last block first (so it is evicted first)."""
        self.pool.free_blocks(reversed(req.blocks))
        req.blocks = []
        req.num_cached_blocks = 0

    def _add_blocks(self, req: Request, num_tokens: int) -> None:
        num_new = math.ceil(num_tokens / self.block_size) - len(req.blocks)
        blocks, evicted = self.pool.get_new_blocks(num_new)
        req.blocks += blocks
        self.counters["evicted_blocks"][req.index] += evicted


class ReferenceReplay:
    """The readable replay: vLLM's objects driven by the scheduler loop of the configured mode.
    The cache outlives a ``replay``: the next one continues from it (a session's chunks)."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        size = config.block_size
        self.usable = None if config.capacity_tokens is None else config.capacity_tokens // size
        self.kv = KVCacheManager(size, None if self.usable is None else self.usable + 1)
        self.keys = BlockKeys(size)

    def replay(self, workload: Workload) -> ReplayResult:
        config = self.config
        size = config.block_size
        n = workload.n_requests
        peaks = _peak_blocks(workload, size)
        self.counters = {name: np.zeros(n, np.int64) for name in COUNTERS}
        if self.usable is not None:
            self.counters["rejected"][:] = peaks > self.usable
        self.hit_tokens = np.zeros(n, np.int64)
        self.skip_lookup = workload.skips_lookup
        self.kv.counters = self.counters
        requests: list[Request] = []
        for i in range(n):
            tokens = np.concatenate([workload.prompt(i), workload.output(i)])
            prompt_len = len(workload.prompt(i))
            request = Request(
                index=i,
                prompt_len=prompt_len,
                max_tokens=len(workload.output(i)),
                keys=self.keys.chain(tokens, int(workload.namespace[i])),
                num_tokens=prompt_len,
            )
            requests.append(request)
        if config.time_model is not None:
            assert workload.arrival_s is not None
            arrival = np.maximum.accumulate(np.asarray(workload.arrival_s, np.float64))
            self._replay_in_time(requests, arrival, config.time_model)
        else:
            self._replay_lock_step([r for r in requests if not self.counters["rejected"][r.index]])
        return _result(self.hit_tokens, self.counters, size, workload)

    def _admit(self, req: Request, must_fit_tokens: int) -> int | None:
        """Lookup and allocation for a waiting request: the hit in tokens, None if it must wait."""
        hit = [] if self.skip_lookup[req.index] else self.kv.get_computed_blocks(req)
        if not self.kv.can_allocate(hit, must_fit_tokens):
            return None
        self.kv.allocate(req, hit, req.num_tokens)
        req.num_computed = req.num_tokens
        hit_tokens = len(hit) * self.kv.block_size
        if req.num_preemptions == 0:
            self.hit_tokens[req.index] = hit_tokens
        else:
            self.counters["rehit_tokens"][req.index] += hit_tokens
        return hit_tokens

    def _replay_lock_step(self, requests: list[Request]) -> None:
        """vLLM's ``Scheduler.schedule`` then ``update_from_output``, step by step, with every
        request waiting from the start (the oracle's ``--engine scheduler``)."""
        config = self.config
        step_budget = config.max_num_batched_tokens or NO_BUDGET
        waiting = deque(requests)
        running: list[Request] = []
        while waiting or running:
            # Scheduler.schedule: the threshold only applies while another request is eligible.
            threshold = config.long_prefill_token_threshold
            if len(running) + len(waiting) <= 1:
                threshold = 0
            budget = Budget(step_budget)
            scheduled, preempted = self._schedule_running(running, waiting, budget, threshold)
            if not preempted:
                while waiting and budget.left > 0 and len(running) < config.max_in_flight:
                    req = waiting[0]
                    if not self._admit_chunk(req, budget, threshold):
                        break
                    waiting.popleft()
                    running.append(req)
                    scheduled.append(req)
            if not scheduled:
                raise RuntimeError("no request could be scheduled")  # unreachable: peaks fit
            for req in scheduled:  # update_from_output: a token for each finished prefill
                if req.num_computed < req.num_tokens:
                    continue  # a partial prefill chunk samples nothing
                req.num_tokens += 1
                if req.num_tokens - req.prompt_len == req.max_tokens:
                    running.remove(req)
                    self.kv.free(req)

    def _admit_chunk(self, req: Request, budget: Budget, threshold: int) -> bool:
        """The waiting loop's body for the queue's head: lookup (skipped for prompt-logprob
        requests), the full-sequence gate, then slots for the first chunk only."""
        hit = [] if self.skip_lookup[req.index] else self.kv.get_computed_blocks(req)
        hit_tokens = len(hit) * self.kv.block_size
        n_new = budget.chunk(req.num_tokens - hit_tokens, threshold)
        if not self.kv.can_allocate(hit, req.num_tokens):
            return False
        self.kv.allocate(req, hit, hit_tokens + n_new)
        req.num_computed = hit_tokens + n_new
        budget.left -= n_new
        if req.num_preemptions == 0:
            self.hit_tokens[req.index] = hit_tokens
        else:
            self.counters["rehit_tokens"][req.index] += hit_tokens
        return True

    def _schedule_running(
        self, running: list[Request], waiting: deque[Request], budget: Budget, threshold: int
    ) -> tuple[list[Request], bool]:
        """The running loop: the next chunk (or decode token) of each running request in order
        while budget is left, preempting the newest when blocks run out."""
        scheduled: list[Request] = []
        preempted = False
        i = 0
        while i < len(running) and budget.left > 0:
            req = running[i]
            n_new = budget.chunk(req.num_tokens - req.num_computed, threshold)
            while not self.kv.allocate_slots(req, req.num_computed + n_new):
                victim = running.pop()
                self.kv.free(victim)
                victim.num_computed = 0
                victim.num_preemptions += 1
                self.counters["preemptions"][victim.index] += 1
                waiting.appendleft(victim)
                preempted = True
                if victim is req:
                    return scheduled, preempted
            req.num_computed += n_new
            budget.left -= n_new
            scheduled.append(req)
            i += 1
        return scheduled, preempted

    def _replay_in_time(
        self, requests: list[Request], arrival: np.ndarray, time_model: TimeModel
    ) -> None:
        max_in_flight = self.config.max_in_flight
        waiting: deque[Request] = deque()
        finishing: list[tuple[float, int, Request]] = []  # heap of (finish time, admission no.)
        next_arrival = 0
        admissions = 0
        while next_arrival < len(requests) or waiting or finishing:
            now = min(
                arrival[next_arrival] if next_arrival < len(requests) else math.inf,
                finishing[0][0] if finishing else math.inf,
            )
            while finishing and finishing[0][0] <= now:
                self.kv.free(heapq.heappop(finishing)[2])
            while next_arrival < len(requests) and arrival[next_arrival] <= now:
                req = requests[next_arrival]
                if not self.counters["rejected"][req.index]:
                    waiting.append(req)
                next_arrival += 1
            while waiting and len(finishing) < max_in_flight:
                req = waiting[0]
                hit_tokens = self._admit(req, req.peak_tokens)
                if hit_tokens is None:
                    break
                waiting.popleft()
                while req.num_computed < req.peak_tokens:  # all of decode, in one go
                    reserved = self.kv.append_slot(req)
                    assert reserved, "the gate counted the peak"
                    req.num_computed += 1
                service = (req.prompt_len - hit_tokens) / time_model.prefill_tokens_per_s
                service += req.max_tokens / time_model.decode_tokens_per_s
                heapq.heappush(finishing, (now + service, admissions, req))
                admissions += 1
