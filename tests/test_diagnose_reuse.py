"""The diagnosis reuses a pass where it gives what a new one would: the replay's trie stands
for the salt-free trie when the namespaces are only renamed, and a fix replays only the
requests its edits can reach."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from analyzer.diagnose import _renamed, scenarios
from analyzer.diagnose.fixes import EditedLog, Edits, apply_edits
from analyzer.diagnose.reach import edited_rows, reached_rows
from analyzer.diagnose.scenarios import Scenario, replay_many
from analyzer.replay import ReplaySettings
from cache_models.prefix_trie import PrefixTrie
from cache_models.workload import Workload


def _workload(namespace: list[int]) -> Workload:
    rng = np.random.default_rng(3)
    heads = [rng.integers(0, 50, 20) for _ in range(3)]
    prompts = [np.concatenate([heads[i % 3], rng.integers(0, 50, 7)]) for i in range(30)]
    outputs = [rng.integers(0, 50, 4) for _ in range(30)]
    return Workload.from_arrays(prompts, outputs, namespace=namespace)


def test_renamed_namespaces_give_the_trie_of_the_renamed_workload() -> None:
    old = [i % 3 for i in range(30)]  # three namespaces, first seen in order 0, 1, 2
    new = [{0: 2, 1: 1, 2: 3}[n] for n in old]
    trie = PrefixTrie()
    trie.replay(_workload(old))
    fresh = PrefixTrie()
    fresh.replay(_workload(new))
    renamed = _renamed(trie.nodes, np.array(old), np.array(new))
    assert renamed is not None
    for name, column in asdict(renamed).items():
        np.testing.assert_array_equal(column, asdict(fresh.nodes)[name], err_msg=name)
    assert not np.array_equal(renamed.namespace, trie.nodes.namespace)


def test_merged_or_split_namespaces_are_not_renamed() -> None:
    trie = PrefixTrie()
    old = np.array([i % 3 for i in range(30)])
    trie.replay(_workload(list(old)))
    assert _renamed(trie.nodes, old, np.minimum(old, 1)) is None  # 1 and 2 merged
    assert _renamed(trie.nodes, old, np.arange(30)) is None  # split


def _random_log(rng: np.random.Generator, n: int) -> tuple[list, list, np.ndarray, np.ndarray]:
    heads = [rng.integers(0, 6, int(rng.integers(1, 40))) for _ in range(6)]
    prompts, outputs = [], []
    for _ in range(n):
        if prompts and rng.random() < 0.3:  # a next turn: an earlier prompt and its answer
            i = int(rng.integers(len(prompts)))
            prompt = np.concatenate([prompts[i], outputs[i], rng.integers(0, 6, 3)])
        else:
            prompt = np.concatenate([heads[int(rng.integers(6))], rng.integers(0, 6, 5)])
        prompts.append(prompt[: int(rng.integers(1, len(prompt) + 1))].astype(np.int32))
        answer = rng.integers(0, 6, int(rng.integers(1, 8)))
        if rng.random() < 0.1:
            answer = -1 - np.arange(3)  # unknown tokens
        outputs.append(answer.astype(np.int32))
    return prompts, outputs, rng.integers(0, 2, n), rng.random(n) < 0.7


@pytest.mark.parametrize("seed", range(12))
def test_replaying_the_reached_requests_alone_gives_the_full_replay(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fix replayed on the requests its edits can reach, the rest keeping the base's hits,
    gives the hits of replaying the whole edited log, at every block and page size."""
    monkeypatch.setattr(scenarios, "SUBSET_MAX_SHARE", 1.0)  # the subset however large
    rng = np.random.default_rng(seed)
    n = 120
    prompts, outputs, namespace, stops = _random_log(rng, n)
    base = Workload.from_arrays(prompts, outputs, namespace=namespace, stop_finish=stops)
    edited_prompts, edited_ns, edited_stops = list(prompts), namespace.copy(), stops.copy()
    for row in rng.choice(n, int(rng.integers(1, 12)), replace=False):
        at = int(rng.integers(0, len(prompts[row]) + 1))
        kind = rng.integers(3)
        if kind == 0:  # padding inserted
            pad = np.full(int(rng.integers(1, 5)), 9, np.int32)
            edited_prompts[row] = np.concatenate([prompts[row][:at], pad, prompts[row][at:]])
        elif kind == 1:  # the namespace (a salt) or the finish changed
            edited_ns[row] = 1 - edited_ns[row]
            edited_stops[row] = not edited_stops[row]
        else:  # the prompt rotated
            edited_prompts[row] = np.roll(prompts[row], at)
    edited = Workload.from_arrays(
        edited_prompts, outputs, namespace=edited_ns, stop_finish=edited_stops
    )
    servers = rng.integers(0, 2, n).astype(str) if seed % 2 else None
    settings = ReplaySettings(
        block_size=int(rng.choice([1, 4, 16])), page_size=int(rng.choice([1, 2, 8]))
    )
    (base_hits,) = replay_many([Scenario(base, settings, servers=servers)])
    (full,) = replay_many([Scenario(edited, settings, servers=servers)])
    (reached,) = replay_many(
        [Scenario(edited, settings, servers=servers, base=base, base_hits=base_hits)]
    )
    for engine in full:
        np.testing.assert_array_equal(reached[engine], full[engine], err_msg=engine)
    rows = reached_rows(base, edited, min(settings.block_size, settings.page_size), servers)
    assert len(rows) < n or settings.page_size == 1  # some requests kept their hits


@pytest.mark.parametrize("seed", range(8))
def test_an_edited_log_builds_and_replays_only_what_its_edits_reach(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``EditedLog`` gives, request for request, the edited workload's requests, the requests
    its edits change (not those an edit leaves as they were), and the full edited replay's hits
    when only the reached requests are built and replayed."""
    monkeypatch.setattr(scenarios, "SUBSET_MAX_SHARE", 1.0)
    rng = np.random.default_rng(100 + seed)
    n = 100
    prompts, outputs, namespace, stops = _random_log(rng, n)
    base = Workload.from_arrays(prompts, outputs, namespace=namespace, stop_finish=stops)
    rows = rng.choice(n, int(rng.integers(1, 15)), replace=False)
    lengths = base.prompt_lengths[rows]
    position = rng.integers(0, lengths + 1)
    delete = np.minimum(rng.integers(0, 2, len(rows)), lengths - position)
    insert = np.where(delete > 0, 1, rng.integers(1, 4, len(rows)))
    token = int(rng.integers(0, 6))  # an edit may put back the token it takes out
    edits = Edits.of(rows, position, delete, insert, token)
    log = EditedLog(base, edits)
    whole = apply_edits(base, edits)
    assert log.prompt_token_count == whole.prompt_token_count
    changed_rows, changed = log.changed
    np.testing.assert_array_equal(changed_rows, np.flatnonzero(edited_rows(base, whole)))
    for name, column in asdict(changed).items():
        np.testing.assert_array_equal(
            column, asdict(whole.select(changed_rows))[name], err_msg=name
        )
    picked = np.sort(rng.choice(n, 30, replace=False))
    for name, column in asdict(log.select(picked)).items():
        np.testing.assert_array_equal(column, asdict(whole.select(picked))[name], err_msg=name)
    settings = ReplaySettings(
        block_size=int(rng.choice([1, 4, 16])), page_size=int(rng.choice([1, 2, 8]))
    )
    (base_hits,) = replay_many([Scenario(base, settings)])
    (full,) = replay_many([Scenario(whole, settings)])
    (reached,) = replay_many([Scenario(log, settings, base=base, base_hits=base_hits)])
    for engine in full:
        np.testing.assert_array_equal(reached[engine], full[engine], err_msg=engine)
    assert "workload" not in log.__dict__  # the whole edited log was never built
