"""Hash-id traces as runs of tokens: the builder keeps the run-length contract and stands for
exactly the loader's expansion, and ``analyze`` replaying a trace as runs reports what replaying
its expanded tokens reports, held whole or streamed, with or without the diagnosis."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import analyzer.pipeline as pipeline
import cache_models.hash_runs as hash_runs
from analyzer.ingest import IngestOptions
from analyzer.loaders.hash_trace import expand_hash_ids
from analyzer.pipeline import AnalyzeOptions, analyze
from analyzer.replay import ReplaySettings
from cache_models.hash_runs import HashTrace, cut_points, run_table, run_workload, trace_runs
from cache_models.runs import RunWorkload, expand

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def random_trace(
    rng: np.random.Generator, n: int, block: int, ids: int, chained: bool = False
) -> HashTrace:
    """Conversations (a turn repeats an earlier prompt's ids, then new ones) with partial last
    blocks; some requests carry their answer's ids (known = L + n). Unless ``chained``, a turn
    may also take one of ``ids`` shared ids after its parent's (an id at several positions)."""
    prompts: list[list[int]] = []
    lengths, outputs, known = [], [], []
    fresh = ids
    for _ in range(n):
        if prompts and rng.random() < 0.7:
            parent = prompts[int(rng.integers(len(prompts)))]
            keep = int(rng.integers(0, len(parent) + 1))
            shared = 0 if chained else int(rng.integers(0, 2))
            chain = parent[:keep] + [int(rng.integers(ids))] * shared
        else:
            chain = []
        extra = int(rng.integers(0 if chain else 1, 4))
        chain = chain + list(range(fresh, fresh + extra))
        fresh += extra
        prompt = (len(chain) - 1) * block + int(rng.integers(1, block + 1))
        answer = int(rng.integers(1, 6))
        with_ids = rng.random() < 0.3
        total = prompt + answer if with_ids else prompt
        blocks = -(-total // block)
        chain = chain + list(range(fresh, fresh + blocks - len(chain)))
        fresh += max(0, blocks - len(chain))
        prompts.append(chain[:blocks])
        lengths.append(prompt)
        outputs.append(answer)
        known.append(total)
    return HashTrace(
        ids=np.array([i for p in prompts for i in p], np.int64),
        id_offsets=np.cumsum([0] + [len(p) for p in prompts]).astype(np.int64),
        block_size=block,
        prompt_lengths=np.array(lengths, np.int64),
        output_lengths=np.array(outputs, np.int64),
        known_lengths=np.array(known, np.int64),
        namespace=rng.integers(0, 2, n).astype(np.int32),
        stop_finish=rng.random(n) < 0.7,
    )


@pytest.mark.parametrize("seed", range(6))
def test_runs_stand_for_the_loaders_tokens_and_keep_the_contract(seed: int) -> None:
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 120, int(rng.integers(3, 20)), 6)
    if seed % 2:  # any int64 ids, negative and huge ones too
        trace = replace(trace, ids=trace.ids * 7_000_000_000_003 - 2**62)
    table = run_table(trace)
    runs, next_unknown = run_workload(trace, table, -7)
    tokens, _ = expand(runs, -7)
    lengths = trace.prompt_lengths + trace.output_lengths
    assert np.array_equal(runs.prompt_lengths, trace.prompt_lengths)
    assert np.array_equal(runs.output_lengths, trace.output_lengths)
    unknown = int((lengths - trace.known_lengths).sum())
    for i in range(trace.n_requests):
        ids = trace.ids[trace.id_offsets[i] : trace.id_offsets[i + 1]]
        spelled = expand_hash_ids(ids, int(trace.known_lengths[i]), trace.block_size)
        stream = np.concatenate([tokens.prompt(i), tokens.output(i)])
        assert np.array_equal(stream[: len(spelled)], spelled)
        assert (stream[len(spelled) :] < 0).all()
    # every negative token is unique, and the next id follows the ones used
    negatives = tokens.output_tokens[tokens.output_tokens < 0]
    assert len(np.unique(negatives)) == len(negatives) == unknown
    assert next_unknown == -7 - int((runs.runs.output_tokens < 0).sum())
    # each point a replay acts at is an entry boundary; equal ids are equal runs
    weights = np.concatenate([runs.prompt_weights, runs.output_weights])
    for i in range(trace.n_requests):
        entries = np.r_[
            runs.prompt_weights[runs.runs.prompt_offsets[i] : runs.runs.prompt_offsets[i + 1]],
            runs.output_weights[runs.runs.output_offsets[i] : runs.runs.output_offsets[i + 1]],
        ]
        bounds = set(np.cumsum(entries).tolist()) | {0}
        assert set(cut_points(trace)[i].tolist()) <= bounds
    ids = np.concatenate([runs.runs.prompt_tokens, runs.runs.output_tokens])
    known = ids >= 0
    assert np.array_equal(weights[known], table.lengths[ids[known]])


def test_a_chunk_of_the_trace_reads_as_the_same_requests() -> None:
    trace = random_trace(np.random.default_rng(9), 60, 8, 4)
    table = run_table(trace)
    whole, _ = run_workload(trace, table)
    head, next_unknown = run_workload(trace.select(slice(0, 25)), table)
    tail, _ = run_workload(trace.select(slice(25, 60)), table, next_unknown)
    for part, rows in ((head, range(25)), (tail, range(25, 60))):
        for j, i in enumerate(rows):
            assert np.array_equal(part.runs.prompt(j), whole.runs.prompt(i))
    # A view of the whole pass is the chunk's own pass, unknown ids included.
    for part, (lo, hi) in ((head, (0, 25)), (tail, (25, 60))):
        view = whole.rows(lo, hi)
        for column in ("prompt_tokens", "prompt_offsets", "output_tokens", "output_offsets"):
            assert np.array_equal(getattr(view.runs, column), getattr(part.runs, column))
        assert np.array_equal(view.prompt_weights, part.prompt_weights)
        assert np.array_equal(view.output_weights, part.output_weights)
    assert whole.rows(5, 5).n_requests == 0
    assert isinstance(whole.select(np.arange(10, 20)), RunWorkload)
    assert np.array_equal(
        whole.select(np.arange(10, 20)).prompt_lengths, trace.prompt_lengths[10:20]
    )


@pytest.mark.parametrize("chunk", [0, 8, 24])
def test_trace_runs_is_the_table_and_the_trace_read_under_it(chunk: int) -> None:
    """The fixpoint's last round stands for a separate pass: the same table, runs and ids."""
    trace = random_trace(np.random.default_rng(11), 80, 8, 4)
    table, runs, next_unknown = trace_runs(trace, chunk, -3)
    expected_table = run_table(trace, chunk)
    expected, expected_next = run_workload(trace, expected_table, -3)
    assert np.array_equal(table.keys, expected_table.keys)
    assert table.distinct_tokens == expected_table.distinct_tokens
    assert next_unknown == expected_next
    assert runs.log_tokens_hint == expected.log_tokens_hint == table.distinct_tokens
    for column in ("prompt_tokens", "prompt_offsets", "output_tokens", "output_offsets"):
        assert np.array_equal(getattr(runs.runs, column), getattr(expected.runs, column))
    assert np.array_equal(runs.prompt_weights, expected.prompt_weights)
    assert np.array_equal(runs.output_weights, expected.output_weights)


@pytest.mark.parametrize("spread", [1, 3, 40, 10**9])
def test_ids_are_numbered_as_numpy_numbers_them(spread: int) -> None:
    """The run table numbers ids by a table of presence when they are dense, by a sort when
    not: numpy's unique values and inverse either way, and unknown ids refused."""
    rng = np.random.default_rng(spread)
    values = rng.integers(0, spread * 500, 2000)
    for inverse in (True, False):
        unique, codes = hash_runs._unique(values, inverse)
        expected, expected_codes = np.unique(values, return_inverse=True)
        assert np.array_equal(unique, expected)
        assert codes is None if not inverse else np.array_equal(codes, expected_codes)
    queries = rng.choice(expected, 300)
    assert np.array_equal(hash_runs._codes(expected, queries), np.searchsorted(expected, queries))
    gaps = np.flatnonzero(np.diff(expected) > 1)[:3]
    missing = [-1, int(expected[-1]) + 1, *(int(expected[g]) + 1 for g in gaps)]
    for absent in missing:
        with pytest.raises(ValueError, match="not in the run table"):
            hash_runs._codes(expected, np.r_[queries, absent])
    # Membership among sorted distinct keys, by a table or by a search: numpy's isin.
    probes = np.r_[rng.integers(-5, spread * 600, 3000), expected[:50], -1, expected[-1] + 1]
    assert np.array_equal(hash_runs._among(probes, expected), np.isin(probes, expected))
    assert not hash_runs._among(probes, expected[:0]).any()


def _trace_file(path: Path, rng: np.random.Generator) -> Path:
    trace = random_trace(rng, 90, 16, 5)
    lines = []
    for i in range(trace.n_requests):
        ids = trace.ids[trace.id_offsets[i] : trace.id_offsets[i + 1]].tolist()
        prompt_blocks = -(-int(trace.prompt_lengths[i]) // 16)
        line = {
            "timestamp": i * 10,
            "input_length": int(trace.prompt_lengths[i]),
            "output_length": int(trace.output_lengths[i]),
            "hash_ids": ids[:prompt_blocks],
        }
        if trace.known_lengths[i] > trace.prompt_lengths[i]:
            line["output_hash_ids"] = ids[prompt_blocks:]
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("settings", "sample", "diagnose"),
    [
        (ReplaySettings(block_size=16), None, True),
        (ReplaySettings(block_size=8, capacity_tokens=600), 2000, True),
        (ReplaySettings(block_size=16, capacity_tokens=900, eviction_policy="lfu"), 1500, False),
        (ReplaySettings(chunked_prefill_size=32, capacity_tokens=700), 1500, True),
    ],
)
def test_analyze_as_runs_reports_what_the_expanded_tokens_do(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: ReplaySettings,
    sample: int | None,
    diagnose: bool,
) -> None:
    log = _trace_file(tmp_path / "trace.jsonl", np.random.default_rng(3))
    options = AnalyzeOptions(
        ingest=IngestOptions(hash_block_size=16),
        settings=settings,
        sample_tokens=sample,
        chunk_records=20,
        diagnose=diagnose,
    )
    assert pipeline.replays_runs(options)
    as_runs = analyze([log], options)
    report = as_runs.report.to_dict()
    assert report["requests"] == 90
    # replayed as runs (the diagnosis expands its sample; without one the runs are kept)
    assert isinstance(as_runs.tokenized.workload, RunWorkload) is not diagnose
    if diagnose:
        assert report["diagnosis_scope"]["whole_log"] is (sample is None)
    monkeypatch.setattr(pipeline, "replays_runs", lambda options, on_executor=False: False)
    as_tokens = analyze([log], options)
    assert as_runs.report.to_dict() == as_tokens.report.to_dict()
    assert as_runs.per_request.equals(as_tokens.per_request)
    for fixture in ("mooncake_trace.jsonl", "bailian_trace.jsonl"):
        monkeypatch.undo()
        options = replace(options, ingest=IngestOptions(), sample_tokens=None)
        a = analyze([FIXTURES / fixture], options)
        monkeypatch.setattr(pipeline, "replays_runs", lambda options, on_executor=False: False)
        b = analyze([FIXTURES / fixture], options)
        assert a.report.to_dict() == b.report.to_dict()


def test_the_log_tokens_hint_sizes_vllms_pool_once_and_changes_no_result() -> None:
    from cache_models.config import VllmConfig
    from cache_models.vllm_apc import VllmPrefixCache

    trace = random_trace(np.random.default_rng(5), 200, 16, 8, chained=True)
    table = run_table(trace)
    assert table.distinct_tokens >= len(np.unique(trace.ids)) * 16
    config = VllmConfig(block_size=4, capacity_tokens=4 << 20)  # a pool (unbounded: a trie)
    hinted, plain = (VllmPrefixCache(config).session() for _ in range(2))
    sizes, next_unknown = [], -1
    for rows in (slice(0, 50), slice(50, 120), slice(120, 200)):
        part, next_unknown = run_workload(trace.select(rows), table, next_unknown)
        assert part.log_tokens_hint == table.distinct_tokens
        a, b = hinted.feed(part), plain.feed(replace(part, log_tokens_hint=0))
        assert np.array_equal(a.hit_tokens, b.hit_tokens)
        assert a.counters.keys() == b.counters.keys()
        assert all(np.array_equal(a.counters[k], b.counters[k]) for k in a.counters)
        assert hinted.pool is not None
        sizes.append(len(hinted.pool.key))
    assert len(set(sizes)) == 1  # sized at the first feed for the whole log: never regrown


def test_traces_of_two_block_sizes_together_are_replayed_as_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Mooncake (512) and a Bailian (16) trace in one run: one table cannot cut both, so the
    log is expanded: the report of the token path."""
    both = [FIXTURES / "mooncake_trace.jsonl", FIXTURES / "bailian_trace.jsonl"]
    together = analyze(both, AnalyzeOptions(diagnose=False))
    assert together.report.to_dict()["requests"] == 4
    assert not isinstance(together.tokenized.workload, RunWorkload)
    monkeypatch.setattr(pipeline, "replays_runs", lambda options, on_executor=False: False)
    assert (
        together.report.to_dict() == analyze(both, AnalyzeOptions(diagnose=False)).report.to_dict()
    )
