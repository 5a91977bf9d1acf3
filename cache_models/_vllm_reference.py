"""The readable vLLM reference: vLLM 0.33's ``BlockPool``, ``FreeKVCacheBlockQueue`` and
``KVCacheManager`` (vllm/v1/core/block_pool.py, kv_cache_utils.py, kv_cache_manager.py) in plain
Python, with the scheduler loops of each replay mode. ``vllm_apc`` is its facade; the numba
kernel (``_vllm_kernel``) gives identical results.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from cache_models import engine_rules as rules
from cache_models.config import TimeModel, VllmConfig
from cache_models.workload import Workload

COUNTERS: tuple[str, ...] = (
    "evicted_blocks",  # cached blocks this request's allocations evicted
    "evicted_tokens",  # the same, in tokens
    "inserted_blocks",  # full blocks (prompt and output) this request newly cached
    "duplicate_blocks",  # of those, blocks whose key already had a cached copy
    "preemptions",  # times this request was preempted
    "rehit_tokens",  # hit tokens at re-admissions after preemption
    "rejected",  # 1 when the request can never fit the cache
)


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
        """The tokens a request gets now (``engine_rules.vllm_chunk``)."""
        return int(rules.vllm_chunk(remaining, threshold, self.left))


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
        self.usable = config.usable_blocks
        self.kv = KVCacheManager(size, None if self.usable is None else self.usable + 1)
        self.keys = BlockKeys(size)

    def replay(self, workload: Workload) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Per-request hit tokens and counters (``evicted_tokens`` is filled by the facade)."""
        config = self.config
        size = config.block_size
        n = workload.n_requests
        peaks = rules.ceil_div(
            rules.vllm_peak_tokens(workload.prompt_lengths, workload.output_lengths), size
        )
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
        return self.hit_tokens, self.counters

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
            eligible = len(running) + len(waiting)
            threshold = rules.vllm_step_threshold(config.long_prefill_token_threshold, eligible)
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
