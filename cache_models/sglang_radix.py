"""SGLang 0.5.23's prefix cache (RadixAttention, ``UnifiedRadixCache``), replayed per request.

Sequential replay (``max_in_flight=1``, no ``time_model``) follows exactly what SGLang's own code
does for one request after another (checked against the oracle that runs it): match with limit
L-1 in whole pages, splits, locks, the allocator's eviction triggers (page size 1; paged prefill's
one extra page per request; decode's ``check_decode_mem`` and paged decode's page demand even
mid-page), chunked prefill with a checkpoint per chunk, the insert on release (all N outputs after
a stop under the overlap scheduler, N-1 after ``max_tokens`` or with ``overlap_schedule`` off:
``--disable-overlap-schedule``), the prompt/output split, each request's ``priority`` on every
insert (+1 on the prompt split), eviction under every policy (``tlru`` and ``slru`` with their
``--radix-eviction-policy-config``), the match capped at ``logprob_start_len``
(``Workload.hit_limit``), the waiting-prefix LRU refresh on every 32nd scheduling pass,
namespaces.

``max_in_flight=K > 1`` without a time model follows SGLang 0.5.23's own ``Scheduler`` loop
with ``--disable-overlap-schedule`` (checked against it, ``tests/golden/sglang_scheduler/``: exact
at 2 and 8 in flight, unbounded and tight pools, with retractions, and with chunked prefill), and
with the overlap scheduler (``overlap_schedule``, SGLang's default) its ``event_loop_overlap``,
which processes each batch's results one iteration late (``_sglang_reference.ReferenceReplay.
run_lockstep_overlap``: a prefill's checkpoint, a finish's release and the next arrival land after
the next batch was scheduled); a ``time_model`` replays a model:

- FCFS admission. Each scheduling pass (an instant when requests wait and a slot is free) counts
  for the waiting-prefix refresh, which touches up to 128 waiting prompts, the head last.
- Admission is ``PrefillAdder``'s (``schedule_policy.py``; ``_prefill_pass`` in the reference
  names each rule): a request joins the batch while fewer than K are in flight and extend +
  remaining ``max_new_tokens`` + one page < free + evictable minus the running requests'
  remaining ``max_new_tokens`` x ``new_token_ratio`` (0.7, decaying over 600 decode steps to
  0.098) minus what the batch has reserved; the first refusal closes admission until a request
  leaves the running batch (``batch_is_full``). ``max_new_tokens`` is the log's limit
  (``Workload.max_new_tokens``), else the answer's length. A decode step that finds too few free
  pages retracts (``retract_decode``: fewest outputs first, their KV freed uncached), and the
  retracted request re-prefills its prompt and outputs later; its hit stays its first match's.
  The match that admission runs happens even when the request then has to wait.
- A running request holds a lock on its tree path; others see its KV only from its checkpoints
  (after each prefill chunk, after prefill, and at release), never while it is computed.
- Without a time model the replay is a closed loop of K clients: a request arrives when one
  finishes, so the queue holds at most K - running. Each iteration is either a prefill pass (match
  and lock every admitted request first, then prefill them in order: requests admitted together
  do not see each other's prompts) or one decode step of every running request, in order. With
  chunked prefill a pass is ``PrefillAdder``'s batch: ``chunked_prefill_size`` tokens, first the
  chunked request's next chunk, then new requests; the one the budget runs out on gets a first
  chunk (whole pages) and continues in the next pass, before any decode step.
- With a time model admission reserves each request's whole remaining KV (nothing is retracted);
  requests arrive at ``arrival_s`` and run independently (no batching slowdown):
  prefill chunks take their uncached tokens / ``prefill_tokens_per_s`` (allocated when a chunk
  starts, checkpointed when it ends), then output j's KV is allocated at prefill end + j decode
  steps of 1 / ``decode_tokens_per_s``, and the request releases after its N-th step.
- With K=1 and no time model this is the sequential replay; with a time model it is too when each
  request arrives after the previous one finished.

A request whose own KV at its peak (prompt + decode tokens, whole pages) exceeds the pool is
rejected before it is scheduled: hit 0, nothing cached, ``rejected`` = 1, and it counts in neither
metric. Unbounded capacity (``capacity_tokens=None``) never evicts.

An unbounded cache at page size 1 replays a sequential log of tokens by the prefix trie instead
(``_sglang_unbounded``: the tree then holds what every earlier request kept, so the hits, the
inserted tokens and the node splits follow from one walk), with the tree's results and no tree;
a session can share its trie with the server's vLLM session (``cache_models.unbounded``).

Sequential replays stream: ``session()`` keeps the tree (its clock, eviction heap, hit counts, node
ids) and the scheduling pass count between the chunks of a log, whose results are the rows of
replaying the whole log at once.

A run-length workload (``cache_models.runs.RunWorkload``: a hash-id trace's runs of synthetic
tokens) replays without its tokens: the tree holds run ids, keys are matched entry by entry (a
match between entries is all or none, by the runs' contract) and everything SGLang counts in
tokens (the pool, the evictable and protected sizes, evictions, hits, duplicates, tlru's depths)
adds the entries' weights. Its results are those of replaying ``expand(workload)``, exactly, for
the sequential replay at page size 1 without a hit limit (every policy, the overlap scheduler on
or off, priorities, the refresh, chunked prefill, any capacity); anything else is refused
(``ValueError``: expand the workload instead), since a page may end inside a run. A prefill
chunk's end is found in tokens and must fall between two entries (``run_table`` with the chunk
size cuts every run where one can end; the kernel raises otherwise).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from cache_models import _sglang_kernel as kernel
from cache_models._sglang_reference import ReferenceReplay
from cache_models._sglang_unbounded import by_trie
from cache_models.config import SglangConfig
from cache_models.result import ReplayResult
from cache_models.runs import RunWorkload
from cache_models.unbounded import UnboundedTrie
from cache_models.workload import Workload

Implementation = Literal["fast", "reference"]  # the numba kernel or the readable reference


class SglangRadixCache:
    """Replays workloads through SGLang's radix cache. ``implementation="fast"`` (the default) runs
    sequential replays in the compiled kernel; ``"reference"`` runs the plain Python model, which
    also serves every concurrent or timed replay. Both give identical results."""

    def __init__(self, config: SglangConfig, implementation: Implementation = "fast") -> None:
        if implementation not in ("fast", "reference"):
            raise ValueError(f"unknown implementation {implementation!r}")
        self.config = config
        self.implementation = implementation

    def replay(self, workload: Workload | RunWorkload) -> ReplayResult:
        config = self.config
        if isinstance(workload, RunWorkload):
            _check_runs_replay(config, self.implementation)
            return self.session().feed(workload)
        if config.time_model is not None:
            if workload.arrival_s is None:
                raise ValueError("a time_model replay needs Workload.arrival_s")
            if not np.isfinite(workload.arrival_s).all():
                raise ValueError("arrival times must be finite")
        sequential = config.max_in_flight == 1 and config.time_model is None
        if self.implementation == "fast" and sequential:
            return self.session().feed(workload)
        replay = ReferenceReplay(config)
        replay.run(workload)
        return _reference_result(workload, replay)

    @property
    def by_trie(self) -> bool:
        """Whether a sequential replay of tokens goes by the prefix trie (unbounded, page size
        1, the fast implementation)."""
        sequential = self.config.max_in_flight == 1 and self.config.time_model is None
        return sequential and by_trie(self.config) and self.implementation == "fast"

    def session(self, trie: UnboundedTrie | None = None) -> SglangSession:
        """A sequential replay fed chunk by chunk (only sequential replays stream). ``trie``: an
        unbounded cache's trie shared with the server's vLLM session (``cache_models.
        unbounded``), which then replays this session's chunks of tokens."""
        if self.config.max_in_flight != 1 or self.config.time_model is not None:
            raise ValueError(
                "only sequential replays stream: a session needs max_in_flight=1 and no time_model"
            )
        if trie is not None and (not self.by_trie or trie.sglang != self.config):
            raise ValueError("a shared trie serves this SGLang cache, unbounded at page size 1")
        return SglangSession(self.config, self.implementation, trie)


class SglangSession:
    """The cache's state between chunks of one log (the tree, its clock and eviction heap, the
    scheduler's pass count): ``feed`` gives each chunk's rows of the whole log's sequential
    replay (metrics of the chunk only, so they add up)."""

    def __init__(
        self,
        config: SglangConfig,
        implementation: Implementation,
        trie: UnboundedTrie | None = None,
    ) -> None:
        self.config = config
        self.implementation = implementation
        self.reference = ReferenceReplay(config) if implementation == "reference" else None
        self.tree: kernel.Tree | None = None  # the fast path's tree, once fed
        self.trie = trie  # an unbounded cache of tokens (``by_trie``), made at the first feed
        self.fed_runs: bool | None = None  # whether it was fed runs (None: not fed yet)

    def feed(self, chunk: Workload | RunWorkload) -> ReplayResult:
        runs = isinstance(chunk, RunWorkload)
        if runs:
            _check_runs_replay(self.config, self.implementation)
        if self.fed_runs is not None and self.fed_runs != runs:
            before, now = ("tokens", "runs") if runs else ("runs", "tokens")
            raise ValueError(
                f"a session replays one form of workload: fed {before}, then {now} "
                "(expand the runs)"
            )
        self.fed_runs = runs
        if self.reference is not None:
            self.reference.run(chunk)
            return _reference_result(chunk, self.reference)
        if not runs and by_trie(self.config):
            self.trie = self.trie or UnboundedTrie(sglang=self.config)
            return _result(chunk, *self.trie.feed("sglang", chunk))
        out, self.tree = _replay_fast(self.config, chunk, self.tree)
        return _result(chunk, out.pop("hit"), out)

    @property
    def nbytes(self) -> int:
        """Bytes held by the fast path's tree (0 for the reference, whose objects are Python's,
        and for an unbounded cache of tokens, whose trie is the log's own size)."""
        return 0 if self.tree is None else sum(array.nbytes for array in self.tree)


def _check_runs_replay(config: SglangConfig, implementation: Implementation) -> None:
    """Refuse a run-length replay the kernel cannot give exactly (the caller then expands)."""
    if implementation != "fast":
        raise ValueError("run-length workloads replay in the fast kernel only: expand() them")
    if config.max_in_flight != 1 or config.time_model is not None:
        raise ValueError(
            "run-length workloads replay sequentially only (max_in_flight=1, no time_model): "
            "expand() them"
        )
    if config.page_size != 1:
        raise ValueError(
            f"run-length workloads replay at page_size 1 only (a {config.page_size}-token page "
            "may end inside a run): expand() them"
        )


def _run_inputs(
    config: SglangConfig, workload: RunWorkload
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's prompt and output weights and SGLang's stop finishes for a run-length
    workload, after checking the boundaries the replay cuts at (``ValueError`` otherwise)."""
    runs = workload.runs
    if (runs.hit_limits >= 0).any():
        raise ValueError(
            "run-length workloads replay without a hit_limit (logprob_start_len may fall inside "
            "a run): expand() them"
        )
    prompt_weights, output_weights = workload.kernel_weights()
    stops = runs.sglang_stops_given(workload.output_lengths)
    if (prompt_weights[runs.prompt_offsets[1:] - 1] != 1).any():
        raise ValueError(
            "a prompt's last entry must be one token: the match stops at L - 1 (run contract)"
        )
    without_last = ~(stops & config.overlap_schedule)  # decode caches N - 1 outputs
    if (output_weights[runs.output_offsets[1:][without_last] - 1] != 1).any():
        raise ValueError(
            "an answer's last entry must be one token where SGLang caches N - 1 outputs "
            "(L + N - 1, run contract)"
        )
    return prompt_weights, output_weights, stops


def _reference_result(workload: Workload, replay: ReferenceReplay) -> ReplayResult:
    counters = {
        "evicted_tokens": replay.evicted,
        "inserted_tokens": replay.inserted,
        "node_splits": replay.splits,
        "rejected": replay.rejected,
    }
    return _result(workload, replay.hit, counters)


def _result(
    workload: Workload | RunWorkload, hit: np.ndarray, counters: dict[str, np.ndarray]
) -> ReplayResult:
    served = counters["rejected"] == 0
    return ReplayResult(
        engine="sglang",
        hit_tokens=hit,
        counters=counters,
        metrics={
            "sglang:cached_tokens_total": int(hit[served].sum()),
            "sglang:prompt_tokens_total": int(workload.prompt_lengths[served].sum()),
        },
    )


def _replay_fast(
    config: SglangConfig, workload: Workload | RunWorkload, tree: kernel.Tree | None = None
) -> tuple[dict[str, np.ndarray], kernel.Tree]:
    """Sequential replay from ``tree`` (None: an empty cache): the per-request hit and counters,
    and the tree it leaves. A run-length workload's tree holds run ids: its arena, rows and
    buffers count entries, its pool tokens."""
    bounded = config.capacity_tokens is not None
    ps = config.page_size
    policy = kernel.POLICY_CODES[config.eviction_policy] if bounded else kernel.NO_EVICTION
    capacity_pages = config.usable_pages or 0
    if isinstance(workload, RunWorkload):
        entries = workload.runs
        prompt_weights, output_weights, stops = _run_inputs(config, workload)
    else:
        entries = workload
        prompt_weights = output_weights = np.zeros(0, np.int32)  # one token per entry
        stops = workload.sglang_stop_finish
    n = entries.n_requests
    out = {name: np.zeros(n, np.int64) for name in ("hit", *kernel.COUNTERS)}
    lengths = entries.prompt_lengths + entries.output_lengths  # entries
    longest = int(lengths.max()) if n else 0
    if tree is None:
        tree = kernel.new_tree(
            kernel.INITIAL_ROWS, max(4 * longest, kernel.INITIAL_ARENA), capacity_pages * ps
        )
    buf = np.zeros(longest, np.int32)
    cum = np.zeros(longest + 1 if len(prompt_weights) else 0, np.int64)  # empty: tokens
    tree.ints[kernel.SLRU_THRESHOLD] = config.slru_protected_threshold
    tree.ints[kernel.TLRU_TAIL] = config.tlru_threshold - config.tlru_next_prompt_estimate
    tokens_in = entries.kernel_inputs()
    inputs = (
        *tokens_in[:4],
        prompt_weights,
        output_weights,
        tokens_in[4],
        stops,
        entries.priorities,
        entries.hit_limits,
        config.overlap_schedule,
    )
    refresh = config.waiting_prefix_refresh and config.eviction_policy == "lru"
    chunk = config.chunked_prefill_size
    first = 0
    while first < n:
        first = kernel.replay_sequential(
            tree,
            *inputs,
            first,
            bounded,
            capacity_pages,
            ps,
            chunk,
            refresh,
            policy,
            out["hit"],
            *(out[name] for name in kernel.COUNTERS),
            buf,
            cum,
        )
        if first < n:  # grow the rows or the arena, then resume at request ``first``
            rows = len(tree.nodes)
            if tree.ints[kernel.FREE_TOP] < kernel.nodes_needed(
                int(workload.prompt_lengths[first]),
                chunk,  # chunks count tokens
            ):
                rows *= 2
            in_use = tree.nodes[:, kernel.VERSION] >= 0
            live = int(tree.nodes[in_use, kernel.KEY_LEN].sum())  # the live keys' entries
            arena = len(tree.arena)
            if 2 * (live + int(lengths[first])) > arena:
                arena = 2 * (live + int(lengths[first]))
            tree = kernel.grown(tree, rows, arena, ps, policy)
    return out, tree
