"""Workload transforms: edits, the hit mapping back to original prompts, rotation, and plans."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from analyzer.diagnose import DiagnoseInput, diagnose
from analyzer.diagnose.fixes import (
    DYNAMIC_TOKEN,
    PAD_TOKEN,
    Edits,
    apply_edits,
    original_hits,
    rotate,
    with_namespace,
)
from analyzer.diagnose.plans import (
    KnownReplay,
    PadTarget,
    pad_plan,
    salt_plan,
    settings_plan,
    what_if_plan,
)
from analyzer.diagnose.scenarios import Scenario, replay_hits
from analyzer.errors import PrefixcheckError
from analyzer.replay import ReplaySettings, replay_all
from cache_models.workload import Workload
from tests.test_diagnose_losses import context_for


def prompts(workload: Workload) -> list[list[int]]:
    return [workload.prompt(i).tolist() for i in range(workload.n_requests)]


def test_edits_insert_and_replace() -> None:
    workload = Workload.from_lists([[1, 2, 3, 4, 5], [6, 7, 8], [9, 10]], [[0], [0], [0]])
    edits = Edits.of(
        np.array([1, 0, 0]), np.array([1, 3, 1]), np.array([2, 0, 1]), np.array([1, 2, 1]), 99
    )
    edited = apply_edits(workload, edits)
    assert prompts(edited) == [[1, 99, 3, 99, 99, 4, 5], [6, 99], [9, 10]]
    assert edited.output_tokens.tolist() == workload.output_tokens.tolist()
    assert edited.prompt_offsets.tolist() == [0, 7, 9, 11]


def test_hits_map_back_to_original_positions() -> None:
    lengths = np.array([30, 30, 30, 30, 30])
    # request r: its value [10, 15) replaced by one token; request 4 has no edit
    edits = Edits.of(np.arange(4), np.full(4, 10), 5, 1, DYNAMIC_TOKEN)
    hits = np.array([10, 11, 20, 7, 12])  # in edited coordinates
    # 10: stops before the value; 11: the value token matched, so all 5 of it; 20 -> 24
    assert original_hits(hits, edits, lengths).tolist() == [10, 15, 24, 7, 12]
    pad = Edits.of(np.array([0, 1]), np.array([37, 37]), 0, 11, PAD_TOKEN)
    # inside the padding: the hit stops at the prefix; past it: minus the padding; no edit and
    # a hit past the last prompt token: capped at L - 1
    mapped = original_hits(np.array([40, 50, 60]), pad, np.array([50, 50, 50]))
    assert mapped.tolist() == [37, 39, 49]


def test_rotate_moves_a_value_after_the_static_part() -> None:
    workload = Workload.from_lists([[1, 2, 70, 71, 5, 6, 7, 8], [1, 2, 3]], [[0], [0]])
    moved = rotate(workload, np.array([0]), np.array([2]), np.array([4]), np.array([7]))
    assert prompts(moved) == [[1, 2, 5, 6, 7, 70, 71, 8], [1, 2, 3]]
    assert workload.prompt(0).tolist() == [1, 2, 70, 71, 5, 6, 7, 8]  # a copy


def test_nested_pads_keep_both_prefixes_aligned() -> None:
    system = list(range(1, 38))  # 37 tokens
    few_shot = system + list(range(100, 120))  # 57 tokens
    workload = Workload.from_lists(
        [system + [500], few_shot + [501], system + [502]], [[0], [0], [0]]
    )
    targets = [
        PadTarget(np.array(few_shot, np.int32), np.array([1]), len(few_shot)),
        PadTarget(np.array(system, np.int32), np.array([0, 1, 2]), 30),
    ]
    plan = pad_plan(context_for(workload, targets), targets)
    padded = prompts(plan.workload)
    # the system prompt padded inside, at token 30 (the end of its last message, say)
    pad_system = system[:30] + [PAD_TOKEN] * 11 + system[30:]
    assert padded[0] == pad_system + [500]
    # 57 + 11 = 68 -> 12 more to 80
    assert padded[1] == pad_system + list(range(100, 120)) + [PAD_TOKEN] * 12 + [501]
    assert [p["padding_tokens"] for p in plan.details["prefixes"]] == [11, 12]


def test_what_if_names_and_combinations() -> None:
    workload = Workload.from_lists([[1, 2, 3]] * 2, [[0], [0]], namespace=[0, 1])
    context = context_for(workload, [])
    assert what_if_plan(context, "block-size=32").settings.block_size == 32
    assert what_if_plan(context, "block-size=32").engines == ("vllm",)
    assert what_if_plan(context, "capacity=1e6").settings.capacity_tokens == 1_000_000
    assert what_if_plan(context, "capacity=none").settings.capacity_tokens is None
    combined = what_if_plan(context, "no-salt+page-size=16")
    assert combined.settings.page_size == 16 and combined.engines == ("vllm", "sglang")
    assert combined.workload.namespace.tolist() == [0, 0]
    for bad in ("pad", "block-size=0", "capacity=x", "block-size=2.5", "eviction-policy=rand"):
        with pytest.raises(PrefixcheckError):
            what_if_plan(context, bad)
    with pytest.raises(PrefixcheckError):
        what_if_plan(context, "pad-prefixes+move-dynamic")
    with pytest.raises(PrefixcheckError, match="no dynamic content"):
        what_if_plan(context, "move-dynamic")
    with pytest.raises(PrefixcheckError, match="no shared template"):
        what_if_plan(context, "pad-prefixes")
    with pytest.raises(PrefixcheckError):
        settings_plan(context, "block-size", "-3")
    assert ReplaySettings().block_size == 16  # plans never change the caller's settings


def test_workload_select_gathers_requests_in_order() -> None:
    workload = Workload.from_lists(
        [[1, 2, 3], [4], [5, 6]], [[7], [8, 9], None], namespace=[0, 1, 2], arrival_s=[3, 1, 2]
    )
    order = np.array([2, 0, 1, 0])
    mine = workload.select(order)
    theirs = Workload.from_arrays(
        [workload.prompt(int(i)) for i in order],
        [workload.output(int(i)) for i in order],
        workload.namespace[order],
        workload.stop_finish[order],
        workload.arrival_s[order],
    )
    for field in ("prompt_tokens", "prompt_offsets", "output_tokens", "output_offsets"):
        assert getattr(mine, field).tolist() == getattr(theirs, field).tolist()
        assert getattr(mine, field).dtype == getattr(theirs, field).dtype
    assert mine.namespace.tolist() == [2, 0, 1, 0]
    assert mine.arrival_s is not None and mine.arrival_s.tolist() == [2, 3, 1, 3]


def test_what_if_flags_the_engines_refuse() -> None:
    context = context_for(Workload.from_lists([[1, 2, 3]], [[0]]), [])
    small = replace(context, settings=ReplaySettings(capacity_tokens=32))
    with pytest.raises(PrefixcheckError, match="at least one block"):
        what_if_plan(small, "block-size=64")
    with pytest.raises(PrefixcheckError, match="at least one block"):
        what_if_plan(context, "capacity=8")


def test_no_salt_hits_come_from_the_salt_free_pass_for_its_own_log_only() -> None:
    """The no-salt fix is measured with the hits of the pass that built the salt-free trie: the
    same as replaying its log, and only reused for that log with those settings."""
    rng = np.random.default_rng(3)
    system = list(range(1, 40))
    prompts = [
        system + rng.integers(100, 200, int(rng.integers(1, 30))).tolist() for _ in range(80)
    ]
    namespace = rng.integers(0, 3, 80)
    workload = Workload.from_lists(prompts, [[5, 6, 7]] * 80, namespace=namespace.tolist())
    settings = ReplaySettings(block_size=16, page_size=4)
    free = np.zeros(workload.n_requests, np.int32)
    inputs = DiagnoseInput(
        workload, replay_all(workload, settings), settings, free, None, None, False, ("no-salt",)
    )
    result = diagnose(inputs)
    replayed = replay_hits(Scenario(with_namespace(workload, free), settings))
    (what_if,) = result.diagnosis.what_if
    for engine, hits in replayed.items():
        assert what_if.measured[engine].hit_tokens_after == int(hits.sum())
    (salt,) = [r for r in result.diagnosis.recommendations if r.kind == "salt"]
    assert salt.measured["vllm"]["hit_tokens_after"] == int(replayed["vllm"].sum())
    assert salt.measured["vllm"]["hit_tokens_after"] > salt.measured["vllm"]["hit_tokens_before"]

    known = KnownReplay(workload, settings, replayed)
    context = replace(context_for(workload, []), settings=settings, salt_free_replay=known)
    assert salt_plan(context).hits is replayed
    other = replace(context, workload=workload.select(np.arange(workload.n_requests)))
    assert salt_plan(other).hits is None  # another log (a fix applied before): replayed
    assert salt_plan(replace(context, settings=replace(settings, block_size=32))).hits is None
