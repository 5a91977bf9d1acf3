"""SGLang's radix cache fed run-length workloads: exactly the token replay of their expansion.

Random hash-id traces (small id spaces, so ids repeat; chained and unchained ids; partial last
blocks; answers of 1..5 tokens, some spelled by the ids) become runs through one table of the
whole trace; every replay of the runs, whole or fed chunk by chunk, must give the per-request
hits, counters and metrics of replaying ``expand()`` of the same requests.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_models import _sglang_kernel
from cache_models.config import SGLANG_EVICTION_POLICIES, SglangConfig
from cache_models.hash_runs import HashTrace, run_table, run_workload
from cache_models.result import ReplayResult
from cache_models.runs import RunWorkload, expand
from cache_models.sglang_radix import SglangRadixCache
from cache_models.workload import Workload, offsets_of


def random_trace(seed: int, n_requests: int = 40) -> HashTrace:
    """Requests whose ids continue an earlier request's (chained) or are drawn afresh from a
    small space (so an id recurs at other positions and in other namespaces)."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(4, 33))
    space = int(rng.integers(3, 12))
    histories: list[list[int]] = []
    ids, prompts, answers, known = [], [], [], []
    for _ in range(n_requests):
        prompt = int(rng.integers(1, 6 * size))
        answer = int(rng.integers(1, 6))
        spelled = prompt + answer if rng.random() < 0.3 else prompt
        blocks = -(-spelled // size)
        if histories and rng.random() < 0.6:  # a conversation's next turn
            base = histories[int(rng.integers(len(histories)))]
            keep = int(rng.integers(0, len(base) + 1))
            own = base[:keep] + rng.integers(0, 4 * space, blocks).tolist()
        else:
            own = rng.integers(0, space, blocks).tolist()
        own = own[:blocks]
        histories.append(own)
        ids.append(own)
        prompts.append(prompt)
        answers.append(answer)
        known.append(spelled)
    n = n_requests
    return HashTrace(
        ids=np.concatenate([np.asarray(row, np.int64) for row in ids]),
        id_offsets=offsets_of(np.array([len(row) for row in ids], np.int64)),
        block_size=size,
        prompt_lengths=np.asarray(prompts, np.int64),
        output_lengths=np.asarray(answers, np.int64),
        known_lengths=np.asarray(known, np.int64),
        namespace=(rng.random(n) < 0.2).astype(np.int32),
        stop_finish=rng.random(n) < 0.6,
    )


def with_settings(workload: RunWorkload, rng: np.random.Generator) -> RunWorkload:
    """Random priorities, and a max_new_tokens on some answers (a stop on the last allowed
    token is no stop for the overlap scheduler)."""
    runs = workload.runs
    n = runs.n_requests
    limits = np.where(rng.random(n) < 0.3, workload.output_lengths, -1)
    runs = replace(runs, priority=rng.integers(-3, 4, n), max_new_tokens=limits)
    weights = workload.prompt_weights, workload.output_weights
    return RunWorkload(runs, *weights, workload.first_tokens)


def chunks_of(trace: HashTrace, seed: int) -> list[slice]:
    """Consecutive slices covering the trace, some empty, some of one request."""
    rng = np.random.default_rng(seed)
    n = trace.n_requests
    edges = np.sort(np.concatenate([[0, 0, n], rng.integers(0, n + 1, 6), [1, 2]]))
    return [slice(int(a), int(b)) for a, b in pairwise(edges)]


def policy_params(policy: str) -> dict[str, int]:
    return {"tlru_threshold": 48, "tlru_next_prompt_estimate": 8} if policy == "tlru" else {}


def configs(workload: RunWorkload) -> list[SglangConfig]:
    """Every policy, overlap on and off, unbounded and capacities in multiples of the largest
    request (0.8 rejects some, 1.3 evicts all the time)."""
    largest = int((workload.prompt_lengths + workload.output_lengths).max())
    out = []
    for policy in SGLANG_EVICTION_POLICIES:
        for capacity in (None, int(0.8 * largest), int(1.3 * largest) + 1, 4 * largest):
            for overlap in (True, False):
                out.append(
                    SglangConfig(
                        capacity_tokens=capacity,
                        eviction_policy=policy,  # type: ignore[arg-type]
                        overlap_schedule=overlap,
                        **policy_params(policy),
                    )
                )
    return out


def assert_same(runs: ReplayResult, tokens: ReplayResult) -> None:
    np.testing.assert_array_equal(runs.hit_tokens, tokens.hit_tokens)
    assert runs.counters.keys() == tokens.counters.keys()
    for name, values in tokens.counters.items():
        np.testing.assert_array_equal(runs.counters[name], values, err_msg=name)
    assert runs.metrics == tokens.metrics


def replay_both(trace: HashTrace, seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = run_table(trace)
    whole, _ = run_workload(trace, table)
    whole = with_settings(whole, rng)
    tokens, _ = expand(whole)
    cuts = chunks_of(trace, seed)
    for config in configs(whole):
        cache = SglangRadixCache(config)
        at_once = cache.replay(whole)
        assert_same(at_once, cache.replay(tokens))
        run_session, token_session = cache.session(), cache.session()
        next_run, next_token = -1, -1
        start = 0
        for rows in cuts:
            part, next_run = run_workload(trace.select(rows), table, next_run)
            assert whole.runs.priority is not None
            settled = replace(
                part.runs,
                priority=whole.runs.priority[rows],
                max_new_tokens=whole.runs.max_new_tokens[rows],
            )
            part = RunWorkload(settled, part.prompt_weights, part.output_weights, part.first_tokens)
            part_tokens, next_token = expand(part, next_token)
            fed = run_session.feed(part)
            assert_same(fed, token_session.feed(part_tokens))
            stop = start + part.n_requests
            np.testing.assert_array_equal(fed.hit_tokens, at_once.hit_tokens[start:stop])
            start = stop


@pytest.mark.parametrize("seed", range(4))
def test_runs_replay_as_their_expansion(seed: int) -> None:
    replay_both(random_trace(seed), seed)


@pytest.mark.parametrize("seed", range(3))
def test_chunked_prefill_replays_runs_cut_for_its_chunk(seed: int) -> None:
    """Prefill chunks end at the match plus multiples of the chunk size: a table cut for that
    size (``run_table(trace, chunk)``) puts every such end between entries."""
    trace = random_trace(seed, n_requests=50)
    rng = np.random.default_rng(seed)
    for chunk in (trace.block_size, 2 * trace.block_size + 3, 5):
        whole, _ = run_workload(trace, run_table(trace, chunk))
        whole = with_settings(whole, rng)
        tokens, _ = expand(whole)
        largest = int((whole.prompt_lengths + whole.output_lengths).max())
        for policy in ("lru", "lfu", "tlru"):
            for capacity in (None, int(1.3 * largest) + 1):
                config = SglangConfig(
                    capacity_tokens=capacity,
                    eviction_policy=policy,  # type: ignore[arg-type]
                    chunked_prefill_size=chunk,
                    **policy_params(policy),
                )
                cache = SglangRadixCache(config)
                runs = cache.replay(whole)
                assert_same(runs, cache.replay(tokens))
        assert runs.counters["node_splits"].sum() > 0
    uncut, _ = run_workload(trace, run_table(trace))
    if int((uncut.prompt_lengths > 5 + 1).sum()):
        with pytest.raises(ValueError, match="inside a run"):
            SglangRadixCache(SglangConfig(chunked_prefill_size=5)).replay(uncut)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31))
def test_runs_replay_as_their_expansion_on_any_trace(seed: int) -> None:
    trace = random_trace(seed, n_requests=int(np.random.default_rng(seed).integers(1, 30)))
    rng = np.random.default_rng(seed)
    whole, _ = run_workload(trace, run_table(trace))
    whole = with_settings(whole, rng)
    tokens, _ = expand(whole)
    config = configs(whole)[int(rng.integers(len(configs(whole))))]
    cache = SglangRadixCache(config)
    assert_same(cache.replay(whole), cache.replay(tokens))


def test_runs_share_hits_across_requests() -> None:
    """The runs' replay is not vacuous: the traces hit, and tight pools evict."""
    trace = random_trace(0)
    whole, _ = run_workload(trace, run_table(trace))
    assert len(whole.runs.prompt_tokens) < whole.prompt_token_count
    unbounded = SglangRadixCache(SglangConfig()).replay(whole)
    assert unbounded.hit_tokens.sum() > 0.2 * whole.prompt_token_count
    largest = int((whole.prompt_lengths + whole.output_lengths).max())
    tight = SglangRadixCache(SglangConfig(capacity_tokens=2 * largest)).replay(whole)
    assert tight.counters["evicted_tokens"].sum() > 0


@pytest.mark.parametrize("chunk", [0, 3])
def test_a_runs_replay_grows_its_arrays_without_changing_a_hit(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Rows and arena grow as the replay needs (with chunked prefill, the rows a prompt's
    chunks need follow its tokens, not its entries)."""
    trace = random_trace(7, n_requests=120)
    whole, _ = run_workload(trace, run_table(trace, chunk))
    tokens, _ = expand(whole)
    expected = {
        c: SglangRadixCache(SglangConfig(capacity_tokens=c, chunked_prefill_size=chunk))
        for c in (None, 400)
    }
    before = {c: (cache.replay(whole), cache.replay(tokens)) for c, cache in expected.items()}
    monkeypatch.setattr(_sglang_kernel, "INITIAL_ROWS", 16)
    monkeypatch.setattr(_sglang_kernel, "INITIAL_ARENA", 16)
    for capacity, cache in expected.items():
        session = cache.session()
        assert_same(session.feed(whole), before[capacity][1])
        assert session.tree is not None and len(session.tree.nodes) > 16


def small_runs() -> RunWorkload:
    trace = random_trace(3, n_requests=6)
    return run_workload(trace, run_table(trace))[0]


@pytest.mark.parametrize(
    ("settings_", "reason"),
    [
        ({"page_size": 16}, "page_size 1"),
        ({"max_in_flight": 2}, "sequentially"),
    ],
)
def test_runs_refuse_what_they_cannot_replay_exactly(settings_: dict, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        SglangRadixCache(SglangConfig(**settings_)).replay(small_runs())


def test_runs_refuse_the_reference_a_hit_limit_and_a_mixed_session() -> None:
    workload = small_runs()
    with pytest.raises(ValueError, match="fast kernel"):
        SglangRadixCache(SglangConfig(), implementation="reference").replay(workload)
    limited = replace(workload.runs, hit_limit=np.zeros(workload.n_requests, np.int64))
    with pytest.raises(ValueError, match="hit_limit"):
        SglangRadixCache(SglangConfig()).replay(
            RunWorkload(
                limited, workload.prompt_weights, workload.output_weights, workload.first_tokens
            )
        )
    session = SglangRadixCache(SglangConfig()).session()
    session.feed(workload)
    with pytest.raises(ValueError, match="one form"):
        session.feed(expand(workload)[0])
    session = SglangRadixCache(SglangConfig()).session()
    session.feed(expand(workload)[0])
    with pytest.raises(ValueError, match="one form"):
        session.feed(workload)


def one_request(prompt_weight: int, output_weight: int, stop: bool) -> RunWorkload:
    """One request: a prompt of one run, an answer of one unknown entry."""
    runs = Workload.from_arrays([np.array([0])], [np.array([-1])], [0], [stop])
    return RunWorkload(runs, np.array([prompt_weight]), np.array([output_weight]), np.array([7]))


def test_runs_refuse_entries_that_straddle_a_point_the_replay_cuts_at() -> None:
    cache = SglangRadixCache(SglangConfig())
    with pytest.raises(ValueError, match="L - 1"):
        cache.replay(one_request(3, 1, stop=True))
    with pytest.raises(ValueError, match="L \\+ N - 1"):
        cache.replay(one_request(1, 2, stop=False))
    result = cache.replay(one_request(1, 2, stop=True))  # all N outputs cached: no cut inside
    assert result.counters["inserted_tokens"].tolist() == [3]
