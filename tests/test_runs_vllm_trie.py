"""Run-length workloads (``cache_models.runs``) replayed by vLLM's sequential kernel and by the
prefix trie give, request for request, the results of replaying their token expansion.

Random hash-id traces: small id spaces (ids repeat), ids chained like Mooncake's (a shared
prefix of an earlier request, then fresh ids) or drawn unchained, partial last blocks, answers of
1..5 tokens, some requests whose ids spell their answer too, two namespaces, skipped lookups;
trace blocks of 8..32 tokens against engine blocks of 1, 3 and 16.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest

from analyzer.diagnose.dynamic import find_dynamic_content
from analyzer.prefixes import shared_prefixes
from cache_models import vllm_apc
from cache_models.block_stream import block_stream
from cache_models.config import TimeModel, VllmConfig
from cache_models.hash_runs import HashTrace, run_table, run_workload
from cache_models.prefix_trie import PrefixTrie, TrieNodes, View, unbounded_hits
from cache_models.runs import RunWorkload, expand
from cache_models.trie_walk import nodes_on_paths
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import offsets_of

SEEDS = range(10)
BLOCK_SIZES = (1, 3, 16)
CHUNK = 7  # requests per session chunk


def random_trace(rng: np.random.Generator, n: int = 36) -> HashTrace:
    """A hash-id trace whose ids repeat (see the module docstring)."""
    size = int(rng.integers(8, 33))
    chained = rng.random() < 0.6
    rows: list[list[int]] = []
    prompt, answer, known = [], [], []
    fresh = 100
    for _ in range(n):
        length = int(rng.integers(1, 4 * size + 1))
        n_out = int(rng.integers(1, 6))
        spelled = length + n_out if rng.random() < 0.3 else length
        n_ids = -(-spelled // size)
        if chained and rows and rng.random() < 0.8:
            parent = rows[int(rng.integers(len(rows)))]
            shared = int(rng.integers(0, min(len(parent), n_ids) + 1))
            ids = parent[:shared] + list(range(fresh, fresh + n_ids - shared))
            fresh += n_ids - shared
        else:
            ids = [int(h) for h in rng.integers(0, 5, n_ids)]
        rows.append(ids)
        prompt.append(length)
        answer.append(n_out)
        known.append(spelled)
    return HashTrace(
        ids=np.array([h for ids in rows for h in ids], np.int64),
        id_offsets=offsets_of(np.array([len(ids) for ids in rows], np.int64)),
        block_size=size,
        prompt_lengths=np.array(prompt, np.int64),
        output_lengths=np.array(answer, np.int64),
        known_lengths=np.array(known, np.int64),
        namespace=rng.integers(0, 2, n).astype(np.int32),
        stop_finish=rng.random(n) < 0.5,
    )


def with_request_flags(workload: RunWorkload, rng: np.random.Generator) -> RunWorkload:
    """Some requests skip vLLM's lookup, some stop on their last allowed token (``max_tokens``
    reached: no stop for SGLang's overlap loop)."""
    n = workload.n_requests
    skips = rng.random(n) < 0.15
    limits = np.where(rng.random(n) < 0.3, workload.output_lengths, -1)
    runs = replace(workload.runs, skip_prefix_lookup=skips, max_new_tokens=limits)
    return replace(workload, runs=runs)


def cases():
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        trace = random_trace(rng)
        table = run_table(trace)
        workload = with_request_flags(run_workload(trace, table)[0], rng)
        yield seed, trace, table, workload


def configs():
    for size in BLOCK_SIZES:
        for blocks in (None, 24, 9):
            yield VllmConfig(
                block_size=size, capacity_tokens=None if blocks is None else blocks * size
            )


def assert_same(runs, tokens) -> None:
    np.testing.assert_array_equal(runs.hit_tokens, tokens.hit_tokens)
    assert runs.counters.keys() == tokens.counters.keys()
    for name, values in tokens.counters.items():
        np.testing.assert_array_equal(runs.counters[name], values, err_msg=name)
    assert runs.metrics == tokens.metrics


def test_vllm_replays_runs_as_their_expansion() -> None:
    hit_some = evicted_some = rejected_some = False
    for _, _, _, workload in cases():
        tokens, _ = expand(workload)
        for config in configs():
            runs = VllmPrefixCache(config).replay(workload)
            assert_same(runs, VllmPrefixCache(config).replay(tokens))
            hit_some |= bool(runs.hit_tokens.any())
            evicted_some |= bool(runs.counters["evicted_blocks"].any())
            rejected_some |= bool(runs.counters["rejected"].any())
    assert hit_some and evicted_some and rejected_some  # the cases reach every path


def test_unbounded_vllm_by_the_trie_is_the_pool_replay() -> None:
    """An unbounded cache replays runs by the prefix trie (``_vllm_unbounded``): every hit and
    counter of the pool's replay of the same runs, whole and in a session; the cases hit,
    recompute cached blocks (duplicates, some past the prompt) and skip lookups."""
    duplicates = past_prompt = skipped = 0
    for _, trace, table, workload in cases():
        for size in BLOCK_SIZES:
            config = VllmConfig(block_size=size)
            by_trie = VllmPrefixCache(config).replay(workload)
            by_pool, _ = vllm_apc._replay_runs(config, workload, None)
            assert_same(by_trie, by_pool)
            session, pool, next_run = VllmPrefixCache(config).session(), None, -1
            for lo in range(0, trace.n_requests, CHUNK):
                chunk, next_run = run_workload(trace.select(slice(lo, lo + CHUNK)), table, next_run)
                expected, pool = vllm_apc._replay_runs(config, chunk, pool)
                assert_same(session.feed(chunk), expected)
            assert session.pool is None and session.unbounded is not None
            dup = by_pool.counters["duplicate_blocks"]
            duplicates += int(dup.sum())
            hit_blocks = by_pool.hit_tokens // size
            prompt_blocks = workload.prompt_lengths // size
            past_prompt += int((hit_blocks + dup > prompt_blocks).sum())
            skipped += int((workload.runs.skips_lookup & (dup > 0)).sum())
    assert duplicates and past_prompt and skipped


def test_vllm_run_replay_in_slices_is_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole replay grows the pool between slices of requests: slices as small as the pool
    allows give the results of one pass (an unbounded pool too, which ``replay`` leaves to the
    trie)."""
    calls = []
    kernel = vllm_apc.run_kernel.replay_sequential
    monkeypatch.setattr(vllm_apc, "MIN_SLICE_BLOCKS", 1)
    monkeypatch.setattr(
        vllm_apc.run_kernel, "replay_sequential", lambda *args: calls.append(1) or kernel(*args)
    )
    for _, _, _, workload in cases():
        tokens, _ = expand(workload)
        for config in configs():
            calls.clear()
            assert_same(
                vllm_apc._replay_runs(config, workload, None)[0],
                VllmPrefixCache(config).replay(tokens),
            )
            if config.block_size == 1 and config.capacity_tokens is None:
                assert len(calls) > 1


def test_vllm_session_of_run_chunks_is_the_token_session() -> None:
    for _, trace, table, _ in cases():
        for config in configs():
            runs_session = VllmPrefixCache(config).session()
            tokens_session = VllmPrefixCache(config).session()
            next_run, next_token = -1, -1
            hits = []
            for lo in range(0, trace.n_requests, CHUNK):
                chunk, next_run = run_workload(trace.select(slice(lo, lo + CHUNK)), table, next_run)
                tokens, next_token = expand(chunk, next_token)
                fed = runs_session.feed(chunk)
                assert_same(fed, tokens_session.feed(tokens))
                hits.append(fed.hit_tokens)
            whole = VllmPrefixCache(config).replay(expand(run_workload(trace, table)[0])[0])
            np.testing.assert_array_equal(np.concatenate(hits), whole.hit_tokens)


@pytest.mark.parametrize(
    "config",
    [VllmConfig(max_in_flight=2), VllmConfig(time_model=TimeModel())],
    ids=["lock-step", "arrival-time"],
)
def test_vllm_runs_refused_outside_the_sequential_replay(config: VllmConfig) -> None:
    _, _, _, workload = next(cases())
    with pytest.raises(ValueError, match="replay sequentially"):
        VllmPrefixCache(config).replay(workload)


def test_vllm_runs_refused_by_the_reference_and_mixed_sessions() -> None:
    _, _, _, workload = next(cases())
    with pytest.raises(ValueError, match="replay sequentially"):
        VllmPrefixCache(VllmConfig(), "reference").replay(workload)
    with pytest.raises(ValueError, match="replay sequentially"):
        VllmPrefixCache(VllmConfig(), "reference").session().feed(workload)
    session = VllmPrefixCache(VllmConfig()).session()
    session.feed(workload)
    with pytest.raises(ValueError, match="not both"):
        session.feed(expand(workload)[0])


# ------------------------------------------------------------------------------ the prefix trie

VIEWS = [View("ideal"), View("vllm", 3), View("vllm", 16), View("sglang", 1), View("sglang", 4)]
NODE_COLUMNS = ("parent", "start", "length", "depth", "count", "first_request", "namespace")


def assert_same_nodes(runs: TrieNodes, tokens: TrieNodes) -> None:
    """The run trie is the token trie node for node: its columns in tokens, its store expanded."""
    assert runs.of_runs and not tokens.of_runs
    for name in ("parent", "length", "depth", "count", "first_request", "namespace"):
        np.testing.assert_array_equal(getattr(runs, name), getattr(tokens, name), err_msg=name)
    expanded = runs.expanded
    for name in (*NODE_COLUMNS, "store"):
        np.testing.assert_array_equal(getattr(expanded, name), getattr(tokens, name), err_msg=name)
    for node in range(tokens.n_nodes):
        np.testing.assert_array_equal(runs.tokens(node), tokens.tokens(node))


def test_trie_feeds_runs_as_their_expansion() -> None:
    for _, _, _, workload in cases():
        tokens, _ = expand(workload)
        runs_trie, tokens_trie = PrefixTrie(VIEWS), PrefixTrie(VIEWS)
        for fed_runs, fed_tokens in zip(
            runs_trie.feed(workload), tokens_trie.feed(tokens), strict=True
        ):
            np.testing.assert_array_equal(fed_runs, fed_tokens)
        assert_same_nodes(runs_trie.nodes, tokens_trie.nodes)
        np.testing.assert_array_equal(
            PrefixTrie().replay(workload).hit_tokens, PrefixTrie().replay(tokens).hit_tokens
        )
        for by_runs, by_tokens in zip(
            unbounded_hits(workload, VIEWS), unbounded_hits(tokens, VIEWS), strict=True
        ):
            np.testing.assert_array_equal(by_runs, by_tokens)
        assert runs_trie.feed(workload)[0].any()  # a second pass hits


def test_a_renamed_run_trie_shares_the_expansion_renamed_too() -> None:
    """``with_namespace``: the same nodes under other namespace ids, and its expansion is the
    original's (one store of tokens for both), renamed."""
    for _, _, _, workload in cases():
        trie = PrefixTrie()
        trie.replay(workload)
        nodes = trie.nodes
        assert nodes is not None and nodes.of_runs
        namespace = nodes.namespace + 7
        renamed = nodes.with_namespace(namespace)
        np.testing.assert_array_equal(renamed.namespace, namespace)
        np.testing.assert_array_equal(renamed.expanded.namespace, namespace)
        assert renamed.expanded.store is nodes.expanded.store
        for name in ("parent", "start", "length", "depth", "count", "first_request"):
            np.testing.assert_array_equal(
                getattr(renamed.expanded, name), getattr(nodes.expanded, name), err_msg=name
            )


def test_trie_fed_run_chunks_is_the_token_trie() -> None:
    for _, trace, table, _ in cases():
        runs_trie, tokens_trie = PrefixTrie(VIEWS), PrefixTrie(VIEWS)
        next_run, next_token = -1, -1
        for lo in range(0, trace.n_requests, CHUNK):
            chunk, next_run = run_workload(trace.select(slice(lo, lo + CHUNK)), table, next_run)
            tokens, next_token = expand(chunk, next_token)
            for fed_runs, fed_tokens in zip(
                runs_trie.feed(chunk), tokens_trie.feed(tokens), strict=True
            ):
                np.testing.assert_array_equal(fed_runs, fed_tokens)
            assert_same_nodes(runs_trie.nodes, tokens_trie.nodes)
        with pytest.raises(ValueError, match="not both"):
            runs_trie.feed(tokens)


def test_trie_consumers_read_a_run_trie_as_the_token_trie() -> None:
    """Shared prefixes, dynamic sites, the walks of prompts down the trie and the block streams
    of the capacity curves: the same from a trie fed runs as from one fed their expansion."""
    found_prefixes = False
    for _, _, _, workload in cases():
        tokens, _ = expand(workload)
        runs_trie, tokens_trie = PrefixTrie(), PrefixTrie()
        runs_trie.feed(workload)
        tokens_trie.feed(tokens)
        by_runs, by_tokens = runs_trie.nodes, tokens_trie.nodes
        prefixes = shared_prefixes(by_runs, top=20)
        expected = shared_prefixes(by_tokens, top=20)
        assert len(prefixes) == len(expected)
        for got, want in zip(prefixes, expected, strict=True):
            assert asdict(got).keys() == asdict(want).keys()
            assert [got.node, got.length, got.requests, got.first_request] == [
                want.node,
                want.length,
                want.requests,
                want.first_request,
            ]
            assert got.shared_beyond_parent == want.shared_beyond_parent
            np.testing.assert_array_equal(got.tokens, want.tokens)
        found_prefixes |= bool(prefixes)
        marked = by_tokens.count >= 2
        for got, want in zip(
            nodes_on_paths(by_runs, tokens, marked),
            nodes_on_paths(by_tokens, tokens, marked),
            strict=True,
        ):
            np.testing.assert_array_equal(got, want)
        sites, spans = find_dynamic_content(by_runs, tokens, 4, None)
        want_sites, want_spans = find_dynamic_content(by_tokens, tokens, 4, None)
        assert [(s.node, s.divergence, s.start, s.kind) for s in sites] == [
            (s.node, s.divergence, s.start, s.kind) for s in want_sites
        ]
        np.testing.assert_array_equal(spans.request, want_spans.request)
        cached = tokens.prompt_lengths + tokens.output_lengths - 1
        for size in BLOCK_SIZES:
            got_stream = block_stream(by_runs, tokens, size, cached)
            want_stream = block_stream(by_tokens, tokens, size, cached)
            np.testing.assert_array_equal(got_stream.items, want_stream.items)
            assert got_stream.n_items == want_stream.n_items
    assert found_prefixes


def test_unbounded_vllm_of_tokens_by_the_trie_is_the_pool_replay() -> None:
    """A sequential unbounded replay of tokens goes by the prefix trie too (its reach over what
    each request keeps): every hit and counter of the pool's (``_replay_fast``), whole and in a
    session; the cases include answers of one token, unknown answers, answers hit by later
    turns, two namespaces and skipped lookups."""
    from cache_models.workload import Workload

    rng = np.random.default_rng(7)
    duplicates = answers_hit = 0
    for _ in range(12):
        prompts, outputs, history = [], [], []
        unknown = -1
        for _ in range(40):
            if history and rng.random() < 0.5:
                prompt = history[int(rng.integers(len(history)))] + rng.integers(0, 4, 3).tolist()
            else:
                prompt = rng.integers(0, 3, int(rng.integers(1, 40))).tolist()
            kind = rng.integers(3)
            if kind == 2:
                output = [int(rng.integers(0, 3))]  # one token: none of it kept
            elif kind == 0:
                output, unknown = list(range(unknown, unknown - 3, -1)), unknown - 3
            else:
                output = rng.integers(0, 3, int(rng.integers(1, 20))).tolist()
            prompts.append(prompt)
            outputs.append(output)
            history.append(prompt + (output if kind else []))  # unknown ids are never repeated
        n = len(prompts)
        workload = replace(
            Workload.from_arrays(
                [np.array(p, np.int32) for p in prompts],
                [np.array(o, np.int32) for o in outputs],
                namespace=rng.integers(0, 2, n),
            ),
            skip_prefix_lookup=rng.random(n) < 0.15,
        )
        for size in BLOCK_SIZES:
            config = VllmConfig(block_size=size)
            by_pool, _ = vllm_apc._replay_fast(config, workload, None)
            assert_same(VllmPrefixCache(config).replay(workload), by_pool)
            session = VllmPrefixCache(config).session()
            for lo in range(0, n, CHUNK):
                rows = np.arange(lo, min(lo + CHUNK, n))
                expected = by_pool.hit_tokens[rows]
                got = session.feed(workload.select(rows))
                assert np.array_equal(got.hit_tokens, expected)
                for name, values in got.counters.items():
                    assert np.array_equal(values, by_pool.counters[name][rows]), name
            assert session.pool is None and session.trie is not None
            duplicates += int(by_pool.counters["duplicate_blocks"].sum())
            lengths = workload.prompt_lengths
            answers_hit += int((by_pool.hit_tokens > np.minimum(lengths, 40) // 2).sum())
    assert duplicates and answers_hit
