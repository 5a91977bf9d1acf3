"""SGLang radix-cache model: the hand-made cases SGLang's own code was run on, and properties."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cache_models import _sglang_kernel
from cache_models.config import SGLANG_EVICTION_POLICIES, SglangConfig, TimeModel
from cache_models.result import ReplayResult
from cache_models.sglang_radix import SglangRadixCache, SglangSession, _replay_fast
from cache_models.workload import Workload
from tests.chunking import assert_chunks_add_up, random_chunks
from tests.golden.workloads import random_workload
from tests.test_sglang_golden import tokens_workload

ENGINES = ("reference", "fast")

# The oracle's hand-made cases (oracles/sglang/tests/crafted.py, also sglang-radix.md §7), with
# the hits SGLang 0.5.23 produced on all three of its tree implementations.
S17 = list(range(1, 18))
P10, O5 = list(range(1, 11)), list(range(51, 56))
P30, O10 = list(range(1, 31)), list(range(101, 111))
A10, B10 = list(range(1000, 1010)), list(range(2000, 2010))
C25 = list(range(3000, 3025))
A8, B8, C8, D8 = ([k * 100 + i for i in range(8)] for k in (11, 12, 13, 14))
A24 = list(range(4000, 4024))
U10, U12 = list(range(5000, 5010)), list(range(6000, 6012))


def r(prompt: list[int], output: list[int] | None = None, **kw: str) -> dict[str, Any]:
    return {"prompt": prompt, "output": output, **kw}


LRU_CASE = [r(A10), r(B10), r(A10 + [7]), r(C25), r(A10 + [8]), r(B10 + [9])]
CRAFTED: list[tuple[str, list[dict[str, Any]], dict[str, Any], list[int]]] = [
    ("shared 17, divergent suffix, ps1", [r(S17 + [100, 101]), r(S17 + [200, 201])], {}, [0, 17]),
    (
        "shared 17, divergent suffix, ps16",
        [r(S17 + [100, 101]), r(S17 + [200, 201])],
        {"page_size": 16},
        [0, 16],
    ),
    ("identical 17-token prompts, ps1", [r(S17), r(S17)], {}, [0, 16]),
    ("identical 17-token prompts, ps16", [r(S17), r(S17)], {"page_size": 16}, [0, 16]),
    ("A=S17, B=S17+[x], ps1", [r(S17), r([*S17, 99])], {}, [0, 17]),
    ("A=S17, B=S17+[x], ps16", [r(S17), r([*S17, 99])], {"page_size": 16}, [0, 16]),
    ("A=S17+[x], B=S17, ps1", [r([*S17, 5]), r(S17)], {}, [0, 16]),
    ("identical 40-token prompt x3, ps1", [r(list(range(40)))] * 3, {}, [0, 39, 39]),
    (
        "identical 40-token prompt x3, ps16",
        [r(list(range(40)))] * 3,
        {"page_size": 16},
        [0, 32, 32],
    ),
    ("output reuse, ps1", [r(P10, O5), r([*P10, *O5, 99])], {}, [0, 14]),
    ("output reuse, stop finish", [r(P10, O5), r([*P10, *O5, 99])], {"stop": True}, [0, 15]),
    ("output reuse, ps4", [r(P10, O5), r([*P10, *O5, 99])], {"page_size": 4}, [0, 12]),
    (
        "two-turn chat P30/O10 then P30+O10+U",
        [r(P30, O10), r(P30 + O10 + list(range(900, 905)), [7])],
        {},
        [0, 39],
    ),
    (
        "LRU keeps a re-used prefix (cap 40)",
        LRU_CASE,
        {"capacity_tokens": 40},
        [0, 0, 10, 0, 10, 0],
    ),
    (
        "MRU evicts a re-used prefix (cap 40)",
        LRU_CASE,
        {"capacity_tokens": 40, "eviction_policy": "mru"},
        [0, 0, 10, 0, 0, 10],
    ),
    (
        "paged prefill evicts one extra page (ps4, cap 32)",
        [r(A8), r(B8), r(C8), r(D8), r(A8), r(C8)],
        {"page_size": 4, "capacity_tokens": 32},
        [0, 0, 0, 0, 0, 4],
    ),
    (
        "cache_salt isolates namespaces",
        [r([*S17, 1], salt="x"), r([*S17, 1], salt="y"), r([*S17, 1], salt="x")],
        {},
        [0, 0, 17],
    ),
    (
        "extra_key isolates namespaces",
        [r([*S17, 1], salt="lora-a"), r([*S17, 1]), r([*S17, 1], salt="lora-a")],
        {},
        [0, 0, 17],
    ),
    (
        "prompt/output split: only the output leaf is evicted (cap 30)",
        [
            r(A10, list(range(7000, 7006))),
            r(B10),
            r(list(range(8000, 8008))),
            r(A10 + list(range(7000, 7005)) + [1]),
        ],
        {"capacity_tokens": 30},
        [0, 0, 0, 10],
    ),
    (
        "paged decode keeps a free page: evicts mid-page (ps4, cap 20)",
        [r(A8[:4]), r(B8[:4], list(range(9000, 9011))), r([*A8[:4], 1])],
        {"page_size": 4, "capacity_tokens": 20},
        [0, 0, 0],
    ),
    (
        "one decode step fewer: no eviction (ps4, cap 20)",
        [r(A8[:4]), r(B8[:4], list(range(9000, 9010))), r([*A8[:4], 1])],
        {"page_size": 4, "capacity_tokens": 20},
        [0, 0, 4],
    ),
    (
        "no chunking: the whole 24-token leaf is evicted (cap 40)",
        [r(A24), r(U10), r(U12), r([*A24, 1])],
        {"capacity_tokens": 40},
        [0, 0, 0, 0],
    ),
    (
        "chunked prefill 8: only the last chunk is evicted (cap 40)",
        [r(A24), r(U10), r(U12), r([*A24, 1])],
        {"capacity_tokens": 40, "chunked_prefill_size": 8},
        [0, 0, 0, 16],
    ),
]


def build(requests: list[dict[str, Any]], stop: bool = False) -> Workload:
    salts = {None: 0}
    namespace = [salts.setdefault(q.get("salt"), len(salts)) for q in requests]
    return Workload.from_lists(
        [q["prompt"] for q in requests],
        [q["output"] for q in requests],
        namespace=namespace,
        stop_finish=[stop] * len(requests),
    )


def replay(workload: Workload, engine: str = "reference", **config: Any) -> ReplayResult:
    cache = SglangRadixCache(SglangConfig(**config), implementation=engine)  # type: ignore[arg-type]
    return cache.replay(workload)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("name", "requests", "options", "expected"), CRAFTED, ids=lambda x: x)
def test_crafted_cases_match_sglang(
    engine: str,
    name: str,
    requests: list[dict[str, Any]],
    options: dict[str, Any],
    expected: list[int],
) -> None:
    options = dict(options)
    workload = build(requests, stop=options.pop("stop", False))
    assert replay(workload, engine, **options).hit_tokens.tolist() == expected


# -- properties ----------------------------------------------------------------------------------
def random_tokens_workload(seed: int, n: int = 100) -> Workload:
    return tokens_workload(random_workload(seed, n))


def largest_request(workload: Workload) -> int:
    return int((workload.prompt_lengths + workload.output_lengths).max())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_hits_are_whole_pages_below_the_last_prompt_token(engine: str, page_size: int) -> None:
    workload = random_tokens_workload(3)
    for capacity in (None, 2 * largest_request(workload)):
        hits = replay(workload, engine, page_size=page_size, capacity_tokens=capacity).hit_tokens
        assert np.all(hits % page_size == 0)
        assert np.all(hits <= (workload.prompt_lengths - 1) // page_size * page_size)
        assert hits.sum() > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_namespaces_never_share(engine: str) -> None:
    same = Workload.from_lists([S17 + [1]] * 4, namespace=[0, 1, 2, 3])
    assert replay(same, engine).hit_tokens.tolist() == [0, 0, 0, 0]
    # A copy of a log in another namespace replays exactly like the original, as if alone.
    base = random_tokens_workload(5, 60)
    twice = Workload.from_arrays(
        [base.prompt(i) for i in range(60)] * 2,
        [base.output(i) for i in range(60)] * 2,
        np.concatenate([base.namespace, base.namespace + 10]),
        np.concatenate([base.stop_finish, base.stop_finish]),
    )
    alone = replay(base, engine, page_size=4).hit_tokens
    together = replay(twice, engine, page_size=4).hit_tokens
    assert together.tolist() == alone.tolist() * 2


def policy_params(policy: str) -> dict[str, int]:
    """A --radix-eviction-policy-config SGLang accepts for ``policy`` (tlru needs one)."""
    if policy == "tlru":
        return {"tlru_threshold": 48, "tlru_next_prompt_estimate": 8}
    return {}


@pytest.mark.parametrize("policy", SGLANG_EVICTION_POLICIES)
@pytest.mark.parametrize(("page_size", "chunk"), [(1, 0), (4, 10), (16, 0)])
def test_unbounded_never_hits_less_than_bounded(policy: str, page_size: int, chunk: int) -> None:
    workload = random_tokens_workload(7)
    common = {"page_size": page_size, "chunked_prefill_size": chunk, "eviction_policy": policy}
    common |= policy_params(policy)
    unbounded = replay(workload, "fast", **common).hit_tokens
    bounded = replay(workload, "fast", capacity_tokens=largest_request(workload) + 40, **common)
    assert np.all(bounded.hit_tokens <= unbounded)
    assert bounded.hit_tokens.sum() < unbounded.sum()
    assert bounded.counters["evicted_tokens"].sum() > 0


@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("policy", SGLANG_EVICTION_POLICIES)
@pytest.mark.parametrize(("page_size", "chunk"), [(1, 0), (1, 7), (4, 10), (16, 32), (8, 4)])
def test_fast_engine_equals_reference(seed: int, policy: str, page_size: int, chunk: int) -> None:
    workload = random_tokens_workload(seed, 120)
    tight = (largest_request(workload) + page_size - 1) // page_size * page_size + 16
    for capacity in (None, tight):
        for refresh in (True, False):
            config = {
                "page_size": page_size,
                "capacity_tokens": capacity,
                "eviction_policy": policy,
                "chunked_prefill_size": chunk,
                "waiting_prefix_refresh": refresh,
                **policy_params(policy),
            }
            fast, ref = replay(workload, "fast", **config), replay(workload, "reference", **config)
            assert fast.hit_tokens.tolist() == ref.hit_tokens.tolist()
            assert fast.metrics == ref.metrics
            for name, values in ref.counters.items():
                assert fast.counters[name].tolist() == values.tolist(), name


@pytest.mark.parametrize("engine", ENGINES)
def test_counters_add_up_to_the_tree(engine: str) -> None:
    workload = random_tokens_workload(13)
    capacity = largest_request(workload) + 24
    result = replay(workload, engine, page_size=4, capacity_tokens=capacity)
    c = result.counters
    assert set(c) == {"evicted_tokens", "inserted_tokens", "node_splits", "rejected"}
    assert all(v.dtype == np.int64 and len(v) == workload.n_requests for v in c.values())
    tree = np.cumsum(c["inserted_tokens"] - c["evicted_tokens"])
    assert tree.min() >= 0 and tree.max() <= capacity
    assert c["node_splits"].sum() > 0 and c["rejected"].sum() == 0
    assert result.engine == "sglang"
    assert result.metrics == {
        "sglang:cached_tokens_total": int(result.hit_tokens.sum()),
        "sglang:prompt_tokens_total": int(workload.prompt_lengths.sum()),
    }


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_request_that_never_fits_is_rejected_and_leaves_no_trace(
    engine: str, page_size: int
) -> None:
    prompts = [A10, list(range(100)), A10 + [1], A10 + [2]]
    workload = Workload.from_lists(prompts, [[7, 8]] * 4)
    result = replay(workload, engine, page_size=page_size, capacity_tokens=40)
    assert result.counters["rejected"].tolist() == [0, 1, 0, 0]
    assert result.hit_tokens[1] == 0 and result.counters["inserted_tokens"][1] == 0
    without = replay(
        workload.select(np.array([0, 2, 3])), engine, page_size=page_size, capacity_tokens=40
    )
    assert result.hit_tokens[[0, 2, 3]].tolist() == without.hit_tokens.tolist()
    assert result.metrics["sglang:prompt_tokens_total"] == 30 + 2


# -- the concurrency model -----------------------------------------------------------------------
def assert_same(a: ReplayResult, b: ReplayResult) -> None:
    assert a.hit_tokens.tolist() == b.hit_tokens.tolist()
    for name in a.counters:
        assert a.counters[name].tolist() == b.counters[name].tolist(), name


@pytest.mark.parametrize(("page_size", "chunk"), [(1, 0), (4, 10)])
def test_one_in_flight_is_the_sequential_replay(page_size: int, chunk: int) -> None:
    workload = random_tokens_workload(17)
    config = {
        "page_size": page_size,
        "chunked_prefill_size": chunk,
        "capacity_tokens": largest_request(workload) + 32,
    }
    sequential = replay(workload, "fast", **config)
    with_arrivals = Workload.from_arrays(
        [workload.prompt(i) for i in range(workload.n_requests)],
        [workload.output(i) for i in range(workload.n_requests)],
        workload.namespace,
        workload.stop_finish,
        arrival_s=np.arange(workload.n_requests) * 1000.0,
    )
    assert_same(replay(workload, "reference", max_in_flight=1, **config), sequential)
    timed = {"max_in_flight": 4, "time_model": TimeModel(), **config}
    assert_same(replay(with_arrivals, "reference", **timed), sequential)
    assert_same(replay(with_arrivals, "fast", **timed), sequential)


def test_requests_in_flight_together_do_not_see_each_other() -> None:
    prompt = list(range(100, 140))
    pair = Workload.from_lists([prompt, prompt], [[1, 2, 3]] * 2)
    assert replay(pair, max_in_flight=1).hit_tokens.tolist() == [0, 39]
    assert replay(pair, max_in_flight=2).hit_tokens.tolist() == [0, 0]
    timed = {"max_in_flight": 2, "time_model": TimeModel(prefill_tokens_per_s=1000.0)}
    prefill_s = 40 / 1000.0
    for gap, expected in ((prefill_s / 2, 0), (prefill_s * 1.5, 39)):
        arrivals = Workload.from_lists([prompt, prompt], [[1, 2, 3]] * 2, arrival_s=[0.0, gap])
        assert replay(arrivals, **timed).hit_tokens.tolist() == [0, expected]


@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_concurrent_replays_fit_and_never_beat_sequential_unbounded(
    policy: str, page_size: int
) -> None:
    workload = random_tokens_workload(19, 150)
    arrivals = np.cumsum(np.random.default_rng(0).exponential(0.05, workload.n_requests))
    timed_workload = Workload.from_arrays(
        [workload.prompt(i) for i in range(workload.n_requests)],
        [workload.output(i) for i in range(workload.n_requests)],
        workload.namespace,
        workload.stop_finish,
        arrival_s=arrivals,
    )
    common = {"page_size": page_size, "eviction_policy": policy}
    ceiling = replay(workload, "fast", **common).hit_tokens
    tight = 3 * largest_request(workload)
    runs = [
        replay(workload, max_in_flight=8, **common),
        replay(workload, max_in_flight=8, capacity_tokens=tight, **common),
        replay(timed_workload, max_in_flight=8, time_model=TimeModel(), **common),
        replay(
            timed_workload, max_in_flight=8, time_model=TimeModel(), capacity_tokens=tight, **common
        ),
    ]
    for result in runs:
        assert np.all(result.hit_tokens <= ceiling)
        assert np.all(result.hit_tokens % page_size == 0)
        tree = np.cumsum(result.counters["inserted_tokens"] - result.counters["evicted_tokens"])
        assert tree.min() >= 0
    assert runs[0].hit_tokens.sum() < ceiling.sum()


# -- the compiled kernel ---------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [None, 300])
@pytest.mark.parametrize(("page_size", "chunk"), [(1, 0), (1, 5), (4, 10)])
def test_fast_engine_grows_its_arrays_without_changing_a_hit(
    monkeypatch: pytest.MonkeyPatch, capacity: int | None, page_size: int, chunk: int
) -> None:
    workload = random_tokens_workload(23, 200)
    config = {"page_size": page_size, "capacity_tokens": capacity, "chunked_prefill_size": chunk}
    monkeypatch.setattr(_sglang_kernel, "INITIAL_ROWS", 16)
    monkeypatch.setattr(_sglang_kernel, "INITIAL_ARENA", 16)
    out, tree = _replay_fast(SglangConfig(**config), workload)
    assert len(tree.nodes) > 16
    if capacity is None:  # the arena grew
        assert len(tree.arena) > 4 * largest_request(workload)
    else:  # the arena was compacted: evicted tokens are gone from it
        assert tree.ints[_sglang_kernel.ARENA_TOP] < out["inserted_tokens"].sum()
    assert_same(replay(workload, "fast", **config), replay(workload, "reference", **config))


def test_fast_engine_memory_follows_the_pool_not_the_log() -> None:
    workload = random_tokens_workload(29, 3000)
    capacity = 2 * largest_request(workload)
    out, tree = _replay_fast(SglangConfig(capacity_tokens=capacity), workload)
    assert out["evicted_tokens"].sum() > 10 * capacity
    assert len(tree.nodes) == _sglang_kernel.INITIAL_ROWS
    assert len(tree.arena) <= max(4 * largest_request(workload), _sglang_kernel.INITIAL_ARENA)


def test_the_child_map_holds_each_live_node_once() -> None:
    """A map full of tombstones is rebuilt when a node is added: the rebuild maps every live node,
    the new one included, which must not get a second slot (that slot outlived its eviction and
    matched the dead row: a hit on evicted KV, found on the Mooncake trace at a 2M-token pool)."""
    k = _sglang_kernel
    tree = k.new_tree(16, 64, 0)
    tokens = np.arange(1, 9, dtype=np.int32)
    tree.arena[:8] = tokens
    tree.ints[k.ARENA_TOP] = 8
    tree.ints[k.TABLE_FILL] = len(tree.table) // 2  # the tombstones of evicted nodes
    node = k._new_node(tree, k.ROOT, 0, 0, 8, 8, 0)
    k._add_child(tree.table, tree.nodes, tree.arena, tree.ints, node, 1)
    mapped = tree.table[:, k.SLOT_NODE]
    assert mapped[mapped >= 0].tolist() == [node]
    assert tree.ints[k.TABLE_FILL] == 1
    assert k._find_child(tree.table, tree.nodes, tree.arena, k.ROOT, 0, tokens, 0, 1) == node


@pytest.mark.parametrize("engine", ENGINES)
def test_an_empty_workload_replays_to_nothing(engine: str) -> None:
    result = replay(Workload.from_lists([]), engine, capacity_tokens=64)
    assert len(result.hit_tokens) == 0 and result.total_hit_tokens == 0
    assert result.metrics["sglang:prompt_tokens_total"] == 0


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="implementation"):
        SglangRadixCache(SglangConfig(), implementation="gpu")  # type: ignore[arg-type]
    timed = SglangRadixCache(SglangConfig(time_model=TimeModel()))
    with pytest.raises(ValueError, match="arrival_s"):
        timed.replay(Workload.from_lists([[1, 2]]))
    with pytest.raises(ValueError, match="finite"):
        timed.replay(Workload.from_lists([[1, 2], [1, 2]], arrival_s=[0.0, float("nan")]))


# -- sessions (streaming) --------------------------------------------------------------------------
def session_workload(seed: int) -> Workload:
    """A random log; every third one with unknown outputs (one unique negative token each)."""
    requests = random_workload(seed, 120, vocab=(4, 8, 50)[seed % 3])
    if seed % 3 == 2:
        for request in requests:
            request["output_token_ids"] = None
    return tokens_workload(requests)


@pytest.mark.parametrize("policy", SGLANG_EVICTION_POLICIES)
@pytest.mark.parametrize(("page_size", "chunk"), [(1, 0), (1, 7), (4, 10), (16, 0), (16, 40)])
def test_session_chunks_equal_one_replay(policy: str, page_size: int, chunk: int) -> None:
    """Capacities in multiples of the largest request: 0.8 rejects some, 1.3 evicts constantly."""
    for seed in range(400, 403):
        workload = session_workload(seed)
        largest = largest_request(workload)
        capacities = [int(0.8 * largest), int(1.3 * largest) + page_size, 5 * largest]
        if policy == "lru":
            capacities.append(None)
        for capacity in capacities:
            config = SglangConfig(
                page_size=page_size,
                capacity_tokens=capacity,
                eviction_policy=policy,  # type: ignore[arg-type]
                chunked_prefill_size=chunk,
                **policy_params(policy),
            )
            at_once = {engine: new_session(config, engine) for engine in ENGINES}
            whole = at_once["reference"].feed(workload)
            at_once["fast"].feed(workload)
            for engine in ENGINES:
                session = new_session(config, engine)
                parts = [session.feed(part) for part in random_chunks(workload, seed + page_size)]
                assert_chunks_add_up(parts, whole)
                assert session_state(session) == session_state(at_once[engine])


def new_session(config: SglangConfig, engine: str) -> SglangSession:
    return SglangRadixCache(config, implementation=engine).session()  # type: ignore[arg-type]


def session_state(session: SglangSession) -> list[object]:
    """What must carry over chunks: the pass count, the clock, node ids, stamps, stats, tokens."""
    if session.reference is not None:
        tree = session.reference.tree
        passes = session.reference.scheduling_passes
        return [passes, tree.clock, tree.node_splits, tree.evictable_size]
    if session.trie is not None:  # unbounded at page size 1: by the prefix trie
        trie = session.trie.trie
        return [trie.n_requests, trie.nodes.parent.tolist(), trie.nodes.depth.tolist()]
    k, t = _sglang_kernel, session.tree
    assert t is not None
    live = np.flatnonzero(t.nodes[:, k.VERSION] >= 0)
    columns = [k.PARENT, k.N_CHILDREN, k.NAMESPACE, k.LOCK_REF, k.HIT_COUNT, k.PRIORITY]
    spans = t.nodes[live][:, [k.KEY_START, k.KEY_LEN]].tolist()
    scalars = [k.PASSES, k.CLOCK, k.SPLITS, k.EVICTED, k.EVICTABLE, k.PROTECTED, k.POOL_FREE]
    return [
        live.tolist(),
        t.nodes[live][:, columns].tolist(),
        t.times[live].tolist(),
        [t.arena[start : start + length].tolist() for start, length in spans],
        t.ints[scalars].tolist(),
    ]


def test_session_memory_follows_the_capacity_not_the_log() -> None:
    config = SglangConfig(page_size=4, capacity_tokens=600)
    session = SglangRadixCache(config).session()
    sizes = []
    for seed in range(40):  # new content in every chunk
        result = session.feed(random_tokens_workload(seed, 100))
        sizes.append(session.nbytes)
    assert result.counters["evicted_tokens"].sum() > 0
    assert session.tree is not None and len(session.tree.nodes) == _sglang_kernel.INITIAL_ROWS
    assert sizes[-1] == sizes[5]


@pytest.mark.parametrize(
    "config", [SglangConfig(max_in_flight=2), SglangConfig(time_model=TimeModel())], ids=repr
)
def test_only_sequential_replays_stream(config: SglangConfig) -> None:
    with pytest.raises(ValueError, match="sequential"):
        SglangRadixCache(config).session()
