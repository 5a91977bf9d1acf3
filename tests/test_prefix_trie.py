"""The prefix trie: its ceiling equals a brute-force longest-common-prefix search, and its counts
find the planted shared prefixes."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from analyzer.prefixes import shared_prefixes
from cache_models._trie_kernel import find_child
from cache_models.config import SglangConfig, VllmConfig
from cache_models.prefix_trie import PrefixTrie, View, unbounded_hits
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload
from tests.chunking import random_chunks
from tests.golden.workloads import random_workload


def brute_force_ceiling(workload: Workload) -> list[int]:
    cached: list[tuple[int, list[int]]] = []
    hits = []
    for i in range(workload.n_requests):
        prompt = workload.prompt(i).tolist()
        limit = len(prompt) - 1
        best = 0
        for namespace, sequence in cached:
            if namespace != workload.namespace[i]:
                continue
            n = 0
            while n < min(limit, len(sequence)) and sequence[n] == prompt[n]:
                n += 1
            best = max(best, n)
        hits.append(best)
        output = workload.output(i).tolist()
        sequence = prompt + (output if workload.stop_finish[i] else output[:-1])
        known = next((k for k, t in enumerate(sequence) if t < 0), len(sequence))
        cached.append((int(workload.namespace[i]), sequence[:known]))
    return hits


def to_workload(requests: list[dict]) -> Workload:
    salts: dict[str | None, int] = {None: 0}
    return Workload.from_lists(
        [r["prompt_token_ids"] for r in requests],
        [r["output_token_ids"] for r in requests],
        namespace=[salts.setdefault(r.get("cache_salt"), len(salts)) for r in requests],
        stop_finish=[r["finish_reason"] == "stop" for r in requests],
    )


@pytest.mark.parametrize("seed", range(12))
def test_ceiling_equals_brute_force(seed: int) -> None:
    workload = to_workload(random_workload(seed, n_requests=120, vocab=6))
    result = PrefixTrie().replay(workload)
    assert result.hit_tokens.tolist() == brute_force_ceiling(workload)


def test_unknown_outputs_never_match() -> None:
    workload = Workload.from_lists([[1, 2, 3], [1, 2, 3, -1, 5]], [None, [9]])
    # The second prompt cannot contain -1 in a real log; even so, -1 tokens are never stored.
    assert PrefixTrie().replay(workload).hit_tokens.tolist() == [0, 3]


def test_counts_and_shared_prefixes_find_planted_templates() -> None:
    rng = random.Random(3)
    system = [rng.randrange(1000, 2000) for _ in range(37)]
    few_shot = [rng.randrange(2000, 3000) for _ in range(20)]
    prompts = []
    for i in range(60):
        body = [rng.randrange(3000, 9000) for _ in range(rng.randrange(5, 15))]
        prompts.append(system + (few_shot if i % 3 == 0 else []) + body)
    trie = PrefixTrie()
    trie.replay(Workload.from_lists(prompts))
    assert trie.nodes is not None
    found = {(p.length, p.requests) for p in shared_prefixes(trie.nodes, top=5)}
    assert (37, 60) in found
    assert (57, 20) in found
    top = shared_prefixes(trie.nodes, top=1)[0]
    assert np.array_equal(top.tokens, system)
    assert top.first_request == 0
    assert top.padding(16) == 11
    assert top.recompute_saved_per_request(16) == 5


def test_namespaces_keep_prefixes_apart() -> None:
    prompts = [[1, 2, 3, 4, 10 + i] for i in range(6)]
    trie = PrefixTrie()
    result = trie.replay(Workload.from_lists(prompts, namespace=[0, 1, 0, 1, 0, 1]))
    assert result.hit_tokens.tolist() == [0, 0, 4, 4, 4, 4]
    assert trie.nodes is not None
    found = sorted((p.namespace, p.length, p.requests) for p in shared_prefixes(trie.nodes))
    assert found == [(0, 4, 3), (1, 4, 3)]


@pytest.mark.parametrize("seed", range(16))
def test_views_equal_the_engines_unbounded_replays(seed: int) -> None:
    requests = random_workload(seed, n_requests=150, vocab=(4, 8, 50)[seed % 3])
    workload = to_workload(requests)
    if seed % 4 == 0:  # unknown answers: one unique negative token each
        workload = Workload.from_lists(
            [r["prompt_token_ids"] for r in requests],
            None,
            namespace=workload.namespace,
            stop_finish=workload.stop_finish,
        )
    views = [View("vllm", b) for b in (1, 4, 16, 32)] + [View("sglang", p) for p in (1, 4, 16, 64)]
    for view, hits in zip(views, unbounded_hits(workload, views), strict=True):
        if view.engine == "vllm":
            model = VllmPrefixCache(VllmConfig(block_size=view.granularity))
        else:
            model = SglangRadixCache(SglangConfig(page_size=view.granularity))
        assert hits.tolist() == model.replay(workload).hit_tokens.tolist(), view


def test_ideal_view_is_the_ceiling() -> None:
    workload = to_workload(random_workload(3, n_requests=100, vocab=6))
    (ideal,) = unbounded_hits(workload, [View("ideal")])
    assert ideal.tolist() == brute_force_ceiling(workload)


@pytest.mark.parametrize("seed", range(9))
def test_feeding_chunks_equals_one_pass(seed: int) -> None:
    requests = random_workload(seed, n_requests=150, vocab=(4, 8, 50)[seed % 3])
    if seed % 3 == 2:  # unknown answers: one unique negative token each
        for request in requests:
            request["output_token_ids"] = None
    workload = to_workload(requests)
    views = [View("ideal"), *(View("vllm", b) for b in (1, 4, 16)), View("sglang", 16)]
    whole = PrefixTrie(views)
    expected = whole.feed(workload)
    trie = PrefixTrie(views)
    assert trie.nodes.n_nodes == 1
    parts, snapshot = [], None
    for chunk in random_chunks(workload, seed):
        parts.append(trie.feed(chunk))
        if snapshot is None and trie.n_requests > 40:
            snapshot = trie.nodes
            frozen = dataclasses.astuple(snapshot)
    for view, hits in enumerate(expected):
        np.testing.assert_array_equal(np.concatenate([part[view] for part in parts]), hits)
    assert trie.n_requests == workload.n_requests
    for name, column in dataclasses.asdict(whole.nodes).items():
        np.testing.assert_array_equal(getattr(trie.nodes, name), column, err_msg=name)
    assert snapshot is not None  # a snapshot stays as it was while later chunks grow the trie
    for column, before in zip(dataclasses.astuple(snapshot), frozen, strict=True):
        np.testing.assert_array_equal(column, before)
    assert snapshot.n_nodes < trie.nodes.n_nodes


def test_first_request_counts_over_the_whole_stream() -> None:
    trie = PrefixTrie()
    trie.feed(Workload.from_lists([[1, 2, 3], [1, 2, 4]]))
    trie.feed(Workload.from_lists([[7, 8, 9], [1, 2, 3, 5]]))
    nodes = trie.nodes
    firsts = {
        tuple(nodes.tokens(n).tolist()): int(nodes.first_request[n])
        for n in range(2, nodes.n_nodes)
    }
    assert firsts[(7, 8, 9)] == 2
    assert firsts[(1, 2)] == 0 and firsts[(1, 2, 3)] == 0 and firsts[(1, 2, 3, 5)] == 3


def test_the_child_map_grows_and_keeps_every_child() -> None:
    """Thousands of branches double the child map (4096 slots at first, half of them usable)
    several times, mid-feed and across feeds: every view's hits still equal the engines'
    unbounded replays, and every node is found again under its parent."""
    workload = to_workload(random_workload(5, n_requests=2500, vocab=50))
    views = [View("ideal"), View("vllm", 16), View("sglang", 1)]
    trie = PrefixTrie(views)
    parts = [trie.feed(workload.rows(start, start + 500)) for start in range(0, 2500, 500)]
    assert len(trie._children) >= 4 * 4096
    hits = [np.concatenate([part[v] for part in parts]) for v in range(len(views))]
    assert hits[0].tolist() == PrefixTrie().replay(workload).hit_tokens.tolist()
    vllm = VllmPrefixCache(VllmConfig(block_size=16)).replay(workload).hit_tokens
    sglang = SglangRadixCache(SglangConfig()).replay(workload).hit_tokens
    assert hits[1].tolist() == vllm.tolist()
    assert hits[2].tolist() == sglang.tolist()
    nodes = trie.nodes
    for node in range(2, nodes.n_nodes):
        if nodes.parent[node] > 0:
            first = nodes.store[nodes.start[node]]
            assert find_child(trie._children, nodes.parent[node], first) == node
