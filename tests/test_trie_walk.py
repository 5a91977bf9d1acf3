"""Walking a built trie: the child map finds every node by (parent, first token) and nothing
else, and the marked nodes on each prompt's path are those a brute-force prefix test finds."""

from __future__ import annotations

import numpy as np
import pytest

from cache_models.prefix_trie import PrefixTrie
from cache_models.trie_walk import child_map, child_of, nodes_on_paths
from cache_models.workload import Workload
from tests.golden.workloads import random_workload
from tests.test_prefix_trie import to_workload


def _trie(seed: int) -> tuple[PrefixTrie, Workload]:
    workload = to_workload(random_workload(seed, n_requests=120, vocab=6))
    trie = PrefixTrie()
    trie.replay(workload)
    return trie, workload


@pytest.mark.parametrize("seed", range(4))
def test_child_map_finds_each_node_and_nothing_else(seed: int) -> None:
    trie, _ = _trie(seed)
    nodes = trie.nodes
    children = child_map(nodes)
    keys = set()
    for node in range(1, nodes.n_nodes):
        if nodes.parent[node] == 0:
            key = (0, int(nodes.namespace[node]))
        elif nodes.length[node] > 0:
            key = (int(nodes.parent[node]), int(nodes.store[nodes.start[node]]))
        else:
            continue
        keys.add(key)
        assert child_of(children, *key) == node
    rng = np.random.default_rng(seed)
    for parent, token in zip(
        rng.integers(0, nodes.n_nodes, 500), rng.integers(-3, 9, 500), strict=True
    ):
        if (int(parent), int(token)) not in keys:
            assert child_of(children, int(parent), int(token)) == -1


@pytest.mark.parametrize("seed", range(6))
def test_marked_nodes_on_paths_are_the_prompts_prefixes(seed: int) -> None:
    trie, workload = _trie(seed)
    nodes = trie.nodes
    rng = np.random.default_rng(seed)
    marked = np.zeros(nodes.n_nodes, np.bool_)
    marked[rng.choice(np.arange(1, nodes.n_nodes), min(8, nodes.n_nodes - 1), replace=False)] = True
    requests, found = nodes_on_paths(nodes, workload, marked)
    expected = []
    for r in range(workload.n_requests):
        prompt = workload.prompt(r)
        on_path = []
        for node in np.flatnonzero(marked):
            tokens = nodes.tokens(int(node))
            if (
                nodes.namespace[node] == workload.namespace[r]
                and len(tokens) <= len(prompt)
                and np.array_equal(prompt[: len(tokens)], tokens)
            ):
                on_path.append((int(nodes.depth[node]), int(node)))
        expected += [(r, node) for _, node in sorted(on_path)]
    assert list(zip(requests.tolist(), found.tolist(), strict=True)) == expected
    assert expected  # the walk found some
