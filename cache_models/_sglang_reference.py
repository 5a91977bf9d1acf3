"""Reference replay of a workload through SGLang's scheduler paths around the radix tree.

Follows the code paths SGLang 0.5.23 runs for one request (what the oracle drives): match with
limit L-1, lock, allocate with the allocator's eviction triggers, chunked prefill with a checkpoint
per chunk, the prefill checkpoint, decode allocations, and ``release_kv_cache``. Sizes are tokens;
a paged pool moves whole pages. The concurrent and timed schedules are the model described in
``sglang_radix``'s docstring.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np

from cache_models import engine_rules as rules
from cache_models._sglang_tree import Node, RadixTree
from cache_models.config import SglangConfig
from cache_models.workload import Workload

# calc_priority touches the waiting prompts on every 32nd scheduling pass, at most 128 of them.
WAITING_PREFIX_REFRESH_INTERVAL = 32
WAITING_PREFIX_REFRESH_MAX = 128

# PrefillAdder clips a request's decode estimate here (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION).
CLIP_MAX_NEW_TOKENS = 4096
# release_req evicts this many tokens per request still decoding after a retraction
# (SGLANG_RETRACT_DECODE_STEPS).
RETRACT_DECODE_STEPS = 20

# NewTokenRatioTracker.from_config: the share of a running request's remaining max_new_tokens
# that admission expects it to still decode (SGLANG_INIT_NEW_TOKEN_RATIO x
# --schedule-conservativeness 1.0; SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR; it decays to the minimum
# over SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS decode steps).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600

# A timed action: when it happens and what it does.
_Event = tuple[float, Callable[[], None]]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def chunk_ends(hit: int, prompt_len: int, chunk: int, page_size: int) -> list[int]:
    """Where each prefill chunk ends (PrefillAdder: the first chunk is page-aligned)."""
    ends = [int(rules.chunk_end(hit, prompt_len, chunk, page_size, True))]
    while ends[-1] < prompt_len:
        ends.append(int(rules.chunk_end(ends[-1], prompt_len, chunk, page_size, False)))
    return ends


def kv_steps(output_len: int, stop_finish: bool, overlap_schedule: bool = True) -> int:
    """Decode steps that compute KV (``engine_rules.sglang_kv_steps``)."""
    return int(rules.sglang_kv_steps(output_len, bool(stop_finish), bool(overlap_schedule)))


def match_limit(prompt_len: int, hit_limit: int) -> int:
    """The match's limit (``engine_rules.sglang_match_limit``)."""
    return int(rules.sglang_match_limit(prompt_len, hit_limit))


def split_priority(priority: int) -> int:
    """The prompt split's insert priority (``engine_rules.sglang_split_priority``)."""
    return int(rules.sglang_split_priority(priority))


def never_fits(prompt_len: int, steps: int, config: SglangConfig) -> bool:
    """True when the request's own KV at its peak exceeds the whole pool."""
    pages = -1 if config.usable_pages is None else config.usable_pages
    return bool(rules.never_fits(prompt_len + steps, config.page_size, pages))


class KvPool:
    """The KV allocator's free count (tokens, whole pages) with the tree as its eviction source."""

    def __init__(self, tree: RadixTree, config: SglangConfig) -> None:
        self.tree = tree
        self.page_size = config.page_size
        self.unbounded = config.capacity_tokens is None
        self.free = (config.usable_pages or 0) * self.page_size
        self.evicted_tokens = 0

    def evict_to(self, num_tokens: int) -> None:
        """``evict_to_free_tokens``: evict until ``num_tokens`` are free or nothing is left."""
        if self.unbounded or self.free >= num_tokens:
            return
        self.tree.evict(lambda: self.free >= num_tokens, self._on_evict)

    def _on_evict(self, tokens: int) -> None:
        self.free += tokens
        self.evicted_tokens += tokens

    def take(self, tokens: int) -> None:
        if not self.unbounded:
            self.free -= tokens
            assert self.free >= 0, "KV pool out of memory"

    def give(self, tokens: int) -> None:
        if not self.unbounded:
            self.free += tokens


@dataclass
class Request:
    """A request's KV row: [0, protected) is the tree's, the rest (up to allocated) its own."""

    index: int
    tokens: np.ndarray  # prompt + outputs
    prompt_len: int
    steps: int  # decode steps that compute KV
    namespace: int
    priority: int  # the request's priority, stored in the tree on every insert
    hit: int
    node: Node  # the locked end of its tree path
    protected: int
    allocated: int
    limit: int = 0  # its max_new_tokens (Workload.output_limits; 0: its output length)
    inserted: int = 0
    fill_len: int = 0  # what its prefill computes: the prompt, + the outputs after a retraction
    retracted: bool = False

    def __post_init__(self) -> None:
        self.fill_len = self.fill_len or self.prompt_len

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.steps

    @property
    def max_new_tokens(self) -> int:
        """``req.sampling_params.max_new_tokens`` as ``PrefillAdder`` reserves it
        (``add_one_req``, ``_get_running_request_total_token_offset``): the log's limit, or the
        recorded output length where the log gives none (``Workload.output_limits``)."""
        return self.limit or len(self.tokens) - self.prompt_len

    @property
    def n_outputs(self) -> int:
        """``len(req.output_ids)``: one sampled per prefill and per decode step."""
        return max(self.allocated - self.prompt_len + 1, 0)

    def decode_estimate(self, new_token_ratio: float, unprocessed: int = 0) -> float:
        """``PrefillAdder._get_running_request_total_token_offset``: the remaining
        ``max_new_tokens``, clipped, times the scheduler's ``new_token_ratio`` (a request that
        may stop on EOS: ``ignore_eos`` is off). ``unprocessed``: outputs sampled but not yet in
        ``req.output_ids`` (the overlap loop's last batch)."""
        outputs = self.n_outputs - unprocessed
        remaining = min(max(self.max_new_tokens - outputs, 0), CLIP_MAX_NEW_TOKENS)
        return remaining * new_token_ratio


class ReferenceReplay:
    """The cache and the scheduler's pass count; ``run`` replays a workload from them with the
    config's schedule and fills its per-request arrays. The next ``run`` continues from the cache
    the last one left (a session's chunks)."""

    def __init__(self, config: SglangConfig) -> None:
        self.config = config
        self.page_size = config.page_size
        self.tree = RadixTree(
            config.page_size,
            config.eviction_policy,
            config.slru_protected_threshold,
            config.tlru_threshold - config.tlru_next_prompt_estimate,
        )
        self.pool = KvPool(self.tree, config)
        self.refresh = config.waiting_prefix_refresh and config.eviction_policy == "lru"
        self.scheduling_passes = 0
        self.retractions = 0  # requests retract_decode took back (lock-step replays)
        # The overlap loop's results of the batch launched this iteration, processed next one
        # (None: results are processed in the iteration that ran the batch).
        self.lagged: list[Callable[[], None]] | None = None
        self.finishing: dict[int, Request] = {}  # finished by their last result, unprocessed
        self.unprocessed: set[int] = set()  # requests of the batch whose results are pending
        self.launched: set[int] = set()  # requests of the batch launched this iteration

    def run(self, workload: Workload) -> None:
        """Replay ``workload`` with the config's schedule, from the cache as it is."""
        self.workload = workload
        self.prompt_lengths = workload.prompt_lengths.tolist()
        self.output_lengths = workload.output_lengths.tolist()
        self.priorities = workload.priorities.tolist()
        self.hit_limits = workload.hit_limits.tolist()
        self.output_limits = workload.output_limits.tolist()
        self.stop_finish = workload.sglang_stop_finish.tolist()
        n = workload.n_requests
        self.hit = np.zeros(n, np.int64)
        self.evicted = np.zeros(n, np.int64)
        self.inserted = np.zeros(n, np.int64)
        self.splits = np.zeros(n, np.int64)
        self.rejected = np.zeros(n, np.int64)
        if self.config.time_model is not None:
            self.run_timed()
        elif self.config.max_in_flight > 1 and self.config.overlap_schedule:
            self.run_lockstep_overlap()
        elif self.config.max_in_flight > 1:
            self.run_lockstep()
        else:
            self.run_sequential()

    # -- per-request steps -----------------------------------------------------------------------
    def _tokens(self, i: int) -> np.ndarray:
        return np.concatenate([self.workload.prompt(i), self.workload.output(i)])

    def _steps(self, i: int) -> int:
        stop = self.stop_finish[i]
        return kv_steps(self.output_lengths[i], stop, self.config.overlap_schedule)

    def _reject_if_too_big(self, i: int) -> bool:
        if never_fits(self.prompt_lengths[i], self._steps(i), self.config):
            self.rejected[i] = 1
            return True
        return False

    def touch_waiting(self, indices: list[int]) -> None:
        """One scheduling pass: every 32nd refreshes the waiting prompts, the head last."""
        if not self.refresh or not indices:
            return
        if self.scheduling_passes % WAITING_PREFIX_REFRESH_INTERVAL == 0:
            for i in reversed(indices[:WAITING_PREFIX_REFRESH_MAX]):
                self._charge(i, lambda i=i: self.tree.match(self.workload.prompt(i), self._ns(i)))
        self.scheduling_passes += 1

    def _ns(self, i: int) -> int:
        return int(self.workload.namespace[i])

    def match(self, i: int) -> Request:
        """Match the prompt up to its limit (L-1, or a logprob start) and lock the matched path
        (admission)."""
        prompt = self.workload.prompt(i)
        limit = match_limit(len(prompt), self.hit_limits[i])
        result = self.tree.match(prompt[:limit], self._ns(i))
        self.tree.lock(result.node)
        self.hit[i] = result.length
        return Request(
            index=i,
            tokens=self._tokens(i),
            prompt_len=len(prompt),
            steps=self._steps(i),
            namespace=self._ns(i),
            priority=self.priorities[i],
            hit=result.length,
            node=result.node,
            protected=result.length,
            allocated=result.length,
            limit=self.output_limits[i],
        )

    def alloc_extend(self, req: Request, end: int) -> None:
        """alloc_token_slots / alloc_paged_token_slots_extend (one page of slack per request)."""
        ps, start = self.page_size, req.allocated
        if ps == 1:
            self.pool.evict_to(end - start)
            self.pool.take(end - start)
        else:
            self.pool.evict_to(end - start + ps)
            self.pool.take((_ceil_div(end, ps) - _ceil_div(start, ps)) * ps)
        req.allocated = end

    def decode_step(self, req: Request) -> None:
        """check_decode_mem, then alloc_token_slots / alloc_paged_token_slots_decode."""
        ps, cur = self.page_size, req.allocated
        self.pool.evict_to(ps if cur % ps == 0 else 0)
        self.pool.evict_to(ps)  # paged decode wants a free page even mid-page
        if cur % ps == 0:
            self.pool.take(ps)
        req.allocated += 1

    def checkpoint(self, req: Request, up_to: int) -> None:
        """Insert tokens[:up_to] (whole pages), free duplicates, move the lock to the new end."""
        if up_to <= 0:
            return
        key = self.tree.page_aligned(req.tokens[:up_to])
        result = self.tree.insert(
            key, req.namespace, req.protected, req.inserted, priority=req.priority
        )
        self.pool.give(result.duplicate_tokens)
        self.inserted[req.index] += result.new_tokens
        req.inserted = max(req.inserted, len(key))
        prompt_len = len(self.tree.page_aligned(req.tokens[: req.prompt_len]))
        if 0 < prompt_len < len(key):  # split at the prompt so the output can go alone
            self.tree.insert(
                key[:prompt_len],
                req.namespace,
                prompt_len,
                prompt_len,
                priority=split_priority(req.priority),
            )
        self.tree.unlock(req.node)
        self.tree.lock(result.node)
        req.node = result.node
        req.protected = len(key)

    def release(self, req: Request) -> None:
        """release_kv_cache: insert what was computed, free the request's own slots, unlock."""
        self.checkpoint(req, req.final_len)
        ps = self.page_size
        self.pool.give((_ceil_div(req.allocated, ps) - req.protected // ps) * ps)
        self.tree.unlock(req.node)

    def prefill(self, req: Request) -> None:
        """Every chunk is allocated then checkpointed; so is a prefill that does not finish."""
        ends = chunk_ends(req.hit, req.prompt_len, self.config.chunked_prefill_size, self.page_size)
        for end in ends[:-1]:
            self.alloc_extend(req, end)
            self.checkpoint(req, end)
        self.alloc_extend(req, ends[-1])
        if req.steps > 0:
            self.checkpoint(req, req.prompt_len)

    def _charge(self, i: int, action):
        """Run ``action`` and book its evictions and splits on request i; its result."""
        evicted, splits = self.pool.evicted_tokens, self.tree.node_splits
        result = action()
        self.evicted[i] += self.pool.evicted_tokens - evicted
        self.splits[i] += self.tree.node_splits - splits
        return result

    # -- schedules -------------------------------------------------------------------------------
    def run_sequential(self) -> None:
        """Each request runs alone, from match to release (what the oracle replays)."""
        for i in range(self.workload.n_requests):
            if self._reject_if_too_big(i):
                continue
            self.touch_waiting([i])
            self._charge(i, lambda i=i: self._serve_alone(i))

    def _serve_alone(self, i: int) -> None:
        req = self.match(i)
        self.prefill(req)
        for _ in range(req.steps):
            self.decode_step(req)
        self.release(req)

    def pages_to_come(self, req: Request) -> int:
        """Pages the request will still allocate until it finishes."""
        ps = self.page_size
        return _ceil_div(req.final_len, ps) - _ceil_div(req.allocated, ps)

    def admit(self, i: int, running: list[Request]) -> Request | None:
        """Match and lock; keep the request only if its remaining KV fits next to the running
        requests' (free + evictable - their reservations). Otherwise unlock: it waits."""
        req = self.match(i)
        if self.pool.unbounded:
            return req
        reserved = sum(self.pages_to_come(r) for r in running) * self.page_size
        need = self.pages_to_come(req) * self.page_size
        if need <= self.pool.free + self.tree.evictable_size - reserved:
            return req
        self.tree.unlock(req.node)
        return None

    def run_lockstep(self) -> None:
        """K requests in flight, no clock: a closed loop of K clients (see sglang_radix).
        ``Scheduler.get_next_batch_to_run``: a prefill batch when ``get_new_batch_prefill`` makes
        one, else ``update_running_batch``'s decode step (which may retract)."""
        k = self.config.max_in_flight
        pending = deque(range(self.workload.n_requests))
        waiting: deque[int | Request] = deque()  # a retracted request comes back as itself
        running: list[Request] = []
        self.chunked: Request | None = None  # the request whose prefill continues next pass
        self.batch_is_full = False  # ScheduleBatch.batch_is_full of the running batch
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        while pending or waiting or running or self.chunked:
            in_flight = len(running) + len(waiting) + (self.chunked is not None)
            while pending and in_flight < k:
                i = pending.popleft()
                if not self._reject_if_too_big(i):
                    waiting.append(i)
                    in_flight += 1
            if not running:
                self.batch_is_full = False  # an empty batch cannot reopen admission otherwise
            if self._prefill_pass(waiting, running, k):
                continue
            if not running:  # the head does not fit an empty pool: SGLang would wait forever
                head = waiting.popleft()
                self.rejected[head if isinstance(head, int) else head.index] = 1
                continue
            self._decode_pass(running, waiting)

    def _prefill_pass(self, waiting: deque[int | Request], running: list[Request], k: int) -> bool:
        """One prefill batch (``Scheduler.get_new_batch_prefill`` with ``PrefillAdder``).

        Skipped while the running batch is full (``batch_is_full``: set when the last batch ran
        out of KV budget or slots, cleared when a request leaves the batch) unless a chunked
        prefill continues. The chunked request's next chunk comes first (``add_chunked_req``),
        then FCFS admissions from the queue head while fewer than K are in flight and the token
        budget lasts (with chunked prefill, ``--chunked-prefill-size`` tokens: the request it
        runs out on gets a first chunk, whole pages, and continues next pass). Every admitted
        request matches before any of the batch is prefilled.

        With a bounded pool the KV budget is ``PrefillBudget``'s: ``remaining_total`` = free +
        evictable - ``total_offset``, where ``total_offset`` starts at the running requests'
        decode estimates (``Request.decode_estimate``) and each admission adds its page-ceiled
        extend + one page + its ``max_new_tokens`` (``_update_prefill_budget`` → ``reserve``).
        A candidate fits when extend + remaining decode + one page < ``remaining_total``
        (``_select_prefill_admission`` → ``check_prefill``, its prefix locked); after each
        admission ``budget_state`` stops the batch once ``remaining_total`` or
        ``remaining_current`` (free + evictable - extends and pages only) is not positive."""
        carried = self.chunked
        if (self.batch_is_full or not waiting) and carried is None:
            return False
        chunk = self.config.chunked_prefill_size
        ps = self.page_size
        bounded = not self.pool.unbounded
        total_offset = self._running_offset(running)
        current_offset = 0
        budget = chunk if chunk > 0 else 1 << 62

        def remaining(offset: int) -> int:
            return self.pool.free + self.tree.evictable_size - offset

        carried_end = 0
        if carried is not None:
            size = chunk
            if bounded:  # PrefillBudget.available_chunk_tokens
                size = min(chunk, remaining(total_offset)) if remaining(total_offset) > 0 else chunk
            carried_end = min(carried.allocated + size, carried.fill_len)
            extend = _ceil_div(carried_end - carried.allocated, ps) * ps
            last = carried_end == carried.fill_len
            total_offset += (
                extend + ps + (min(carried.max_new_tokens, CLIP_MAX_NEW_TOKENS) if last else 0)
            )
            current_offset += extend + ps
            budget -= carried_end - carried.allocated
        batch: list[tuple[Request, int]] = []
        in_flight = len(running) + (carried is not None)
        if waiting and not self.batch_is_full and budget > 0:
            self.touch_waiting(
                [
                    w if isinstance(w, int) else w.index
                    for w in islice(waiting, WAITING_PREFIX_REFRESH_MAX)
                ]
            )
            while waiting:
                if in_flight + len(batch) >= k:
                    self.batch_is_full = bool(running)
                    break
                req = self._match_charged(waiting[0])
                extend = _ceil_div(req.fill_len - req.hit, ps) * ps
                if bounded:
                    outputs = req.fill_len - req.prompt_len
                    new = min(max(req.max_new_tokens - outputs, 0), CLIP_MAX_NEW_TOKENS)
                    if not req.fill_len - req.hit + new + ps < remaining(total_offset):
                        self.tree.unlock(req.node)
                        self.batch_is_full = bool(running)
                        break
                end = req.fill_len
                if extend > budget:  # truncated to what the batch has left, in whole pages
                    end = (req.hit + budget // ps * ps) // ps * ps
                    if end <= req.hit:
                        self.tree.unlock(req.node)
                        break
                waiting.popleft()
                batch.append((req, end))
                budget -= extend
                paged = _ceil_div(end - req.hit, ps) * ps
                last = end == req.fill_len
                total_offset += (
                    paged + ps + (min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) if last else 0)
                )
                current_offset += paged + ps
                if end < req.fill_len or budget <= 0:
                    break
                if bounded and (remaining(total_offset) <= 0 or remaining(current_offset) <= 0):
                    self.batch_is_full = bool(running)
                    break
        if carried is not None:
            self._charge(carried.index, lambda: self._prefill_to(carried, carried_end, running))
        for req, end in batch:
            self._charge(req.index, lambda r=req, e=end: self._prefill_to(r, e, running))
        return carried is not None or bool(batch)

    def _running_offset(self, running: list[Request]) -> float:
        """The running batch's decode estimates. Under the overlap loop the batch still holds
        the requests whose finish is not processed yet (``filter_batch`` drops them after
        ``process_batch_result``), and the last batch's outputs are not in ``output_ids``."""
        if self.lagged is None:
            return sum(r.decode_estimate(self.new_token_ratio) for r in running)
        reqs = running + [r for r in self.finishing.values() if r not in running]
        return sum(
            r.decode_estimate(self.new_token_ratio, int(r.index in self.unprocessed)) for r in reqs
        )

    def _prefill_to(self, req: Request, end: int, running: list[Request]) -> None:
        """Prefill up to ``end``: a chunk that does not end the fill is checkpointed and
        continues next pass; a whole fill is checkpointed and decodes, or finishes."""
        if end < req.fill_len:
            self.alloc_extend(req, end)
            self.checkpoint(req, end)
            self.chunked = req
            return
        if self.chunked is req:
            self.chunked = None
        self.alloc_extend(req, end)
        if self.lagged is not None:
            self._lagged_result(req, running, prefill=True)
            return
        if req.fill_len < req.final_len:
            self.checkpoint(req, req.fill_len)
            running.append(req)
        else:
            self.release(req)
            self.batch_is_full = False  # it leaves the batch

    def _match_charged(self, item: int | Request) -> Request:
        i = item if isinstance(item, int) else item.index
        result: list[Request] = []
        self._charge(
            i, lambda: result.append(self.match(i) if isinstance(item, int) else self.rematch(item))
        )
        return result[0]

    def rematch(self, req: Request) -> Request:
        """A retracted request matches its prompt and the outputs it has (``fill_ids``); its
        ``cached_tokens`` stays its first admission's (``retracted_stain``)."""
        limit = match_limit(req.fill_len, self.hit_limits[req.index])
        result = self.tree.match(req.tokens[:limit], req.namespace)
        self.tree.lock(result.node)
        req.hit = req.protected = req.allocated = result.length
        req.node = result.node
        return req

    def _decode_fits(self, reqs: list[Request]) -> bool:
        """``ScheduleBatch.check_decode_mem``: evict until the step's new pages are free."""
        ps = self.page_size
        need = ps * sum(1 for r in reqs if r.allocated % ps == 0)
        self.pool.evict_to(need)
        return self.pool.unbounded or self.pool.free >= need

    def _decode_pass(self, running: list[Request], waiting: deque[int | Request]) -> None:
        """``update_running_batch``: when the step's pages do not fit, ``retract_decode`` takes
        requests back (fewest outputs first, then the longest prompt), each freeing its own
        KV without caching it and evicting 20 tokens per request left (``release_req``), until
        the step fits or one is left; they rejoin the queue's tail. Then one decode step of
        every running request, in the batch's order."""
        # The batch's evictions are booked on its newest request (whose arrival made it).
        newest = max((r.index for r in running), default=0)
        if running and not self._charge(newest, lambda: self._decode_fits(running)):
            order = list(range(len(running)))
            order.sort(key=lambda j: (running[j].n_outputs, -running[j].prompt_len), reverse=True)
            first = True
            while first or not self._charge(
                newest, lambda: self._decode_fits([running[j] for j in order])
            ):
                if len(order) == 1:
                    break
                first = False
                req, left = running[order.pop()], len(order)
                self._charge(newest, lambda r=req, n=left: self._retract(r, n))
                waiting.append(req)
            if len(order) <= 1 and not self._decode_fits([running[j] for j in order]):
                req = running[order.pop()]  # out of memory even alone: aborted
                self._retract(req, 0)
                self.rejected[req.index] = 1
            running[:] = [running[j] for j in order]
            self.batch_is_full = False
            # NewTokenRatioTracker.estimate_new_token_ratio_after_retract
            decoded = sum(r.n_outputs for r in running) + RETRACT_DECODE_STEPS * len(running)
            self.new_token_ratio = min(1.0, decoded / (sum(r.max_new_tokens for r in running) + 1))
        elif running:
            self.new_token_ratio = max(
                self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO
            )
        if not running:
            return
        # alloc_for_decode: one eviction for the batch (page size 1: a token per request;
        # paged: alloc_paged_token_slots_decode assumes each request needs a new page).
        newest = max(r.index for r in running)
        self._charge(newest, lambda: self.pool.evict_to(len(running) * self.page_size))
        for req in list(running):  # one decode iteration
            self._charge(req.index, lambda r=req: self._decode_or_finish(r, running))

    def _retract(self, req: Request, still_running: int) -> None:
        """``release_req``: ``release_kv_cache(checkpoint=False)``, evict, ``reset_for_retract``."""
        ps = self.page_size
        outputs = req.n_outputs
        self.retractions += 1
        self.pool.give((_ceil_div(req.allocated, ps) - req.protected // ps) * ps)
        self.tree.unlock(req.node)
        self.pool.evict_to(still_running * RETRACT_DECODE_STEPS)
        req.fill_len = req.prompt_len + outputs
        req.inserted = 0
        req.retracted = True

    def _admit_charged(self, i: int, running: list[Request]) -> Request | None:
        result: list[Request | None] = []
        self._charge(i, lambda: result.append(self.admit(i, running)))
        return result[0]

    def _decode_or_finish(self, req: Request, running: list[Request]) -> None:
        if req.allocated % self.page_size == 0:  # the batch's eviction came first
            self.pool.take(self.page_size)
        req.allocated += 1
        if self.lagged is not None:
            self._lagged_result(req, running, prefill=False)
            return
        if req.allocated == req.final_len:
            self.release(req)
            running.remove(req)
            self.batch_is_full = False

    def run_lockstep_overlap(self) -> None:
        """``run_lockstep`` under the overlap scheduler (SGLang's default): ``Scheduler.
        event_loop_overlap`` schedules and launches batch t+1 (``get_next_batch_to_run``:
        matches, ``prepare_for_extend`` / ``prepare_for_decode`` allocations) before
        ``process_batch_result`` of batch t runs (``pop_and_process`` after ``run_batch``). So a
        prefill's checkpoint (``cache_unfinished_req``), a finish's ``release_kv_cache`` and the
        finish the clients see (``req.finished()``, the next arrival) all land one iteration
        after the batch that produced them; see ``_lagged_result``. With no batch to run, the
        last batch's results are still processed in that iteration."""
        k = self.config.max_in_flight
        pending = deque(range(self.workload.n_requests))
        waiting: deque[int | Request] = deque()
        running: list[Request] = []
        self.chunked = None
        self.batch_is_full = False
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.lagged, self.finishing, self.unprocessed, self.launched = [], {}, set(), set()
        last: list[Callable[[], None]] = []  # the results of the batch launched last iteration
        while pending or waiting or running or self.chunked or last:
            in_flight = len(running) + len(waiting) + (self.chunked is not None)
            in_flight += sum(1 for i in self.finishing if all(r.index != i for r in running))
            while pending and in_flight < k:
                i = pending.popleft()
                if not self._reject_if_too_big(i):
                    waiting.append(i)
                    in_flight += 1
            if not running:
                self.batch_is_full = False
            if not self._prefill_pass(waiting, running, k):
                if running:
                    self._decode_pass(running, waiting)
                elif waiting and not last:  # nothing in flight frees KV for the head
                    head = waiting.popleft()
                    self.rejected[head if isinstance(head, int) else head.index] = 1
            for action in last:  # pop_and_process: the previous batch's results
                action()
            last, self.lagged = self.lagged, []
            self.unprocessed, self.launched = self.launched, set()
        self.lagged = None

    def _lagged_result(self, req: Request, running: list[Request], prefill: bool) -> None:
        """What ``process_batch_result_prefill`` / ``_decode`` will do with the output this
        batch samples for ``req``, queued for the next iteration.

        The output that ends the answer (the N-th: ``req.allocated`` = prompt + N - 1) finishes
        it then: ``release_kv_cache`` caches what its KV holds by then (``owned_kv_len``:
        ``kv_committed_len``, which ``prepare_for_decode`` advanced at scheduling). A length
        finish sits out the next decode (``Scheduler._reqs_finishing_inflight``); a stop
        finish joins it (its N-th KV slot: ``sglang_kv_steps``) unless a prefill batch runs
        instead, then leaves the batch. Any other prefill output checkpoints the fill
        (``cache_unfinished_req``)."""
        if req.index in self.finishing:  # the in-flight step after a stop: no new result
            running.remove(req)
            return
        self.launched.add(req.index)
        if req.allocated == len(req.tokens) - 1:
            self.finishing[req.index] = req
            if req in running and req.allocated == req.final_len:
                running.remove(req)  # finishes by length: not decoded again
            elif req not in running and req.allocated < req.final_len:
                running.append(req)

            def finish() -> None:
                self.checkpoint(req, req.allocated)
                ps = self.page_size
                self.pool.give((_ceil_div(req.allocated, ps) - req.protected // ps) * ps)
                self.tree.unlock(req.node)
                if req in running:
                    running.remove(req)
                self.finishing.pop(req.index, None)
                self.batch_is_full = False

            self.lagged.append(lambda: self._charge(req.index, finish))
            return
        if prefill:
            running.append(req)
            self.lagged.append(
                lambda: self._charge(req.index, lambda: self.checkpoint(req, req.fill_len))
            )

    def run_timed(self) -> None:
        """K requests in flight in arrival time, with the TimeModel's service times."""
        k = self.config.max_in_flight
        arrival = self.workload.arrival_s
        assert arrival is not None
        order = [int(i) for i in np.argsort(arrival, kind="stable")]
        next_arrival = 0
        waiting: deque[int] = deque()
        running: list[Request] = []
        events: list[tuple[float, int, Callable[[], None], Iterator[_Event]]] = []
        seq = 0

        def push(lifecycle: Iterator[_Event]) -> None:
            nonlocal seq
            for at, action in lifecycle:
                heapq.heappush(events, (at, seq, action, lifecycle))
                seq += 1
                return

        while next_arrival < len(order) or waiting or events:
            now = min(
                arrival[order[next_arrival]] if next_arrival < len(order) else np.inf,
                events[0][0] if events else np.inf,
            )
            while next_arrival < len(order) and arrival[order[next_arrival]] <= now:
                i = order[next_arrival]
                next_arrival += 1
                if not self._reject_if_too_big(i):
                    waiting.append(i)
            while events and events[0][0] <= now:
                _, _, action, lifecycle = heapq.heappop(events)
                action()
                push(lifecycle)
            if waiting and len(running) < k:
                self.touch_waiting(list(islice(waiting, WAITING_PREFIX_REFRESH_MAX)))
                while waiting and len(running) < k:
                    req = self._admit_charged(waiting[0], running)
                    if req is None:
                        break
                    waiting.popleft()
                    running.append(req)
                    push(self._lifecycle(req, float(now), running))

    def _lifecycle(self, req: Request, start: float, running: list[Request]) -> Iterator[_Event]:
        """The request's actions from admission to release, each at its time."""
        tm = self.config.time_model
        assert tm is not None
        i, at, done = req.index, start, req.hit
        ends = chunk_ends(req.hit, req.prompt_len, self.config.chunked_prefill_size, self.page_size)
        for end in ends:
            yield at, lambda end=end: self._charge(i, lambda: self.alloc_extend(req, end))
            at += (end - done) / tm.prefill_tokens_per_s
            done = end
            if end < req.prompt_len:
                yield at, lambda end=end: self._charge(i, lambda: self.checkpoint(req, end))
        if req.steps > 0:
            yield at, lambda: self._charge(i, lambda: self.checkpoint(req, req.prompt_len))
        step = 1 / tm.decode_tokens_per_s
        for j in range(req.steps):
            yield at + j * step, lambda: self._charge(i, lambda: self.decode_step(req))
        n_outputs = len(req.tokens) - req.prompt_len

        def finish() -> None:
            self._charge(i, lambda: self.release(req))
            running.remove(req)

        yield at + n_outputs * step, finish
