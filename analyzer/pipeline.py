"""The analyze pipeline in four named steps: read (load, render, tokenize), replay (every request
through the pool of caches), diagnose, report."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from analyzer.analysis import Analysis
from analyzer.diagnose import DiagnoseResult, diagnose_log
from analyzer.diagnose.parts import PartsSource
from analyzer.diagnose.recommend import KvShape
from analyzer.diagnose.sweep import sweep_views
from analyzer.diagnose.what_if import WhatIfSpec
from analyzer.fleet import FleetOptions
from analyzer.fleet_fields import routing_fields, with_routing_fields
from analyzer.fleet_run import FleetRun, fleet_notes, fleet_recommendations, run_fleet
from analyzer.fleet_stream import stream_fleet
from analyzer.fleet_text import routing_symbols
from analyzer.ingest import CHUNK_RECORDS, Chunk, ChunkedIngest, Ingested, IngestOptions
from analyzer.loaders import LoadResult
from analyzer.measure.estimate import KV_DTYPE_BYTES, prefill_estimate
from analyzer.measure.presets import DEFAULT_ESTIMATE_PRESET, preset
from analyzer.pool import model_labels
from analyzer.prefixes import (
    TEMPLATE_MIN_TOKENS,
    SharedPrefix,
    shared_prefixes,
    template_groups,
)
from analyzer.progress import NoProgress, Progress
from analyzer.records import Record, any_messages
from analyzer.replay import Replayed, Replays, ReplaySettings, replay_log, sample_of
from analyzer.report import (
    DiagnosisScope,
    EngineSummary,
    ModelSummary,
    PrefixSummary,
    Report,
    SkipSummary,
)
from analyzer.server_compare import compare_with_server, tokenization_note
from analyzer.shares import hit_rate, mean_request_hit_rate
from analyzer.snippets import snippet
from analyzer.token_cache import CacheStats
from analyzer.tokenizer import Tokenizer
from analyzer.workload import LogTable, TokenizedLog
from cache_models.result import ReplayResult
from cache_models.runs import RunWorkload, as_tokens

if TYPE_CHECKING:
    from analyzer.executors import Executor

DEFAULT_SAMPLE_TOKENS = 32_000_000


@dataclass(frozen=True)
class AnalyzeOptions:
    ingest: IngestOptions = field(default_factory=IngestOptions)  # how logs are read, tokenized
    settings: ReplaySettings = field(default_factory=ReplaySettings)
    top_prefixes: int = 10
    redact: bool = False
    what_if: tuple[WhatIfSpec | str, ...] = ()  # --what-if: named fixes to replay
    model_preset: str = DEFAULT_ESTIMATE_PRESET  # the model shape of the prefill estimate
    # Logs with more prompt tokens stream through the engines chunk by chunk; the diagnosis
    # (counterfactual replays, curves) covers this many leading tokens. None: never stream.
    sample_tokens: int | None = DEFAULT_SAMPLE_TOKENS
    chunk_records: int = CHUNK_RECORDS  # requests read and tokenized at a time
    diagnose: bool = True  # --no-diagnosis: hit rates, ceiling and shared prefixes only
    check_curves: bool = False  # --check-curves: full LRU replays where the curves are checked
    fleet: FleetOptions | None = None  # --replicas: replay a fleet behind a router
    fleet_what_if: tuple[str, ...] = ()  # --what-if router=, replicas=, session-field=

    def __post_init__(self) -> None:
        """What-ifs parsed (if given as text) and checked against the settings before any read."""
        specs = tuple(s if isinstance(s, WhatIfSpec) else WhatIfSpec.parse(s) for s in self.what_if)
        for spec in specs:
            spec.check(self.settings)
        object.__setattr__(self, "what_if", specs)


def analyze(
    paths: list[Path],
    options: AnalyzeOptions,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> Analysis:
    """Read the log, replay it, diagnose it (its leading sample when streamed), report.
    ``executor`` runs the reading and the replay elsewhere (a Ray cluster); None: here."""
    progress = progress or NoProgress()
    try:
        reader = (
            None
            if executor is None
            else executor.reader(
                paths, options.ingest, progress, sample_budget(options, on_executor=True)
            )
        )
        analysis = _analyzed(paths, options, progress, executor, reader)
        if executor is None:
            return analysis
        ran = replace(
            analysis.report,
            executor=executor.describe(),
            run_notes=analysis.report.run_notes + executor.notes(),
        )
        return replace(analysis, report=ran)
    finally:
        if executor is not None:
            executor.close()


def _analyzed(
    paths: list[Path],
    options: AnalyzeOptions,
    progress: Progress,
    executor: Executor | None,
    reader: ChunkedIngest | None,
) -> Analysis:
    log = read(paths, options, progress, reader)
    if options.fleet is not None:  # routed and replayed as a whole, or streamed
        fleet_run = _fleet_run(log, options, progress, executor)
        replayed = fleet_run.replayed
    else:
        fleet_run = None
        replayed = replay_log(
            log.sample.tokenized,
            (chunk.tokenized for chunk in log.rest),
            options.settings,
            progress,
            namespace_labels=log.labels,
            sample_trie=options.diagnose,
            caches=None if executor is None else executor.caches(),
            trie=None if executor is None else executor.trie,
            views=sweep_views(options.settings) if options.diagnose else (),
        )
    if not options.diagnose:
        return report(log, replayed, None, options, fleet_run)
    runs = replayed.sample.workload
    replayed = _with_token_sample(replayed)
    if fleet_run is None and not options.settings.sequential and replayed.order is None:
        # replayed whole in memory for its mode: diagnosed on its leading sample all the same
        replayed = _leading_sample(replayed, options.sample_tokens)
    runs_sample = runs if isinstance(runs, RunWorkload) else None
    diagnosed = diagnose(log, replayed, options, progress, fleet_run, runs_sample)
    return report(log, replayed, diagnosed, options, fleet_run)


def _fleet_run(
    log: ReadLog, options: AnalyzeOptions, progress: Progress, executor: Executor | None
) -> FleetRun:
    """The fleet of a log held whole (``run_fleet``) or streamed past its sample."""
    assert options.fleet is not None

    def texts(records: list[Record], tokenized: TokenizedLog) -> list[np.ndarray] | None:
        return routing_symbols(records, tokenized, _hash_trace(log.reader.loaded))

    sample = log.sample.tokenized
    following = next(log.rest, None)
    if following is not None:
        rest = (
            (chunk.tokenized, texts(chunk.records, chunk.tokenized))
            for chunk in chain([following], log.rest)
        )
        return stream_fleet(
            sample,
            texts(log.reader.loaded.records, sample),
            rest,
            options.settings,
            options.fleet,
            options.fleet_what_if,
            log.labels,
            options.diagnose,
        )
    return run_fleet(
        sample,
        options.settings,
        options.fleet,
        progress,
        options.fleet_what_if,
        options.sample_tokens,
        texts(log.reader.loaded.records, sample),
        None if executor is None else (executor.caches(), executor.caches()),
    )


@dataclass
class ReadLog:
    """The log as read: its leading sample in memory (the whole log when it fits), then the
    chunks after it, to stream (none when it fits)."""

    reader: ChunkedIngest
    sample: Ingested
    rest: Iterator[Chunk]

    def labels(self) -> list[str]:
        """Namespace labels of everything read so far (the whole log once streamed)."""
        return self.reader.state.labels()


def read(
    paths: list[Path],
    options: AnalyzeOptions,
    progress: Progress,
    reader: ChunkedIngest | None = None,
) -> ReadLog:
    """Read and tokenize chunks until ``sample_tokens`` prompt tokens (a replay that is not
    sequential reads the whole log); the rest is read as the replay streams it."""
    budget = sample_budget(options, on_executor=reader is not None)
    routed = routing_fields(options.fleet, options.fleet_what_if)
    ingest = replace(
        with_routing_fields(options.ingest, routed),
        hash_runs=options.settings.chunked_prefill_size
        if replays_runs(options, on_executor=reader is not None)
        else None,
    )
    if reader is None:
        reader = ChunkedIngest(paths, ingest, progress)
    else:  # an executor's reader: the same options
        reader.options = ingest
    chunks = reader.chunks(options.chunk_records)
    head = _head(chunks, budget)
    sample = reader.finished(head)
    return ReadLog(reader, sample, _replaying(reader, chunks))


def _replaying(reader: ChunkedIngest, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """The chunks after the sample, each reported to the input's progress bar as it goes to the
    replay."""
    for chunk in chunks:
        reader.report("replaying")
        yield chunk


def replays_runs(options: AnalyzeOptions, on_executor: bool = False) -> bool:
    """Whether a hash-id trace is replayed as runs of tokens, never expanded: when every replay
    of the log reads runs (sequential, in this process, one server, SGLang at page size 1). The
    diagnosis expands its sample (``_with_token_sample``)."""
    settings = options.settings
    return (
        settings.sequential
        and not on_executor
        and options.fleet is None
        and not options.fleet_what_if
        and settings.page_size == 1
    )


def _with_token_sample(replayed: Replayed) -> Replayed:
    """``replayed`` with its sample as tokens: a hash-id trace replayed as runs is expanded here
    for the diagnosis (only its sample, when it streamed; the whole log's rows and results stay
    as they are). The sample's trie stays the one fed its runs: its nodes are the token trie's,
    and what walks its tokens reads ``TrieNodes.expanded``."""
    sample = replayed.sample
    if not isinstance(sample.workload, RunWorkload):
        return replayed
    tokens = replace(sample, workload=as_tokens(sample.workload))
    return replace(replayed, log=replayed.log if replayed.streamed else tokens, sample=tokens)


def sample_budget(options: AnalyzeOptions, on_executor: bool = False) -> int | None:
    """The prompt tokens read before the replay starts and diagnosed (None: the whole log, as a
    replay that is not sequential, or a fleet on an executor, needs: its routing pass reads
    every request's tokens on the driver)."""
    streams = options.settings.sequential and (options.fleet is None or not on_executor)
    return options.sample_tokens if streams else None


def diagnose(
    log: ReadLog,
    replayed: Replayed,
    options: AnalyzeOptions,
    progress: Progress,
    fleet_run: FleetRun | None = None,
    runs: RunWorkload | None = None,
) -> DiagnoseResult:
    """Losses by cause, dynamic content, curves and measured fixes of the (sample of the) log;
    for a fleet, of one instance with its total capacity, then the routing cause. ``runs``: the
    sample as runs, when a hash trace was replayed as runs (what reads runs reads it)."""
    tokenizer, loaded = log.reader.tokenizer, log.reader.loaded
    shape = preset(options.model_preset)
    sample_replays, settings, fleet_hits = replayed.sample_replays, options.settings, None
    if fleet_run is not None:
        sample_replays, settings = fleet_run.sample_single, fleet_run.settings
        fleet = replayed.sample_replays
        fleet_hits = {"vllm": fleet.vllm.hit_tokens, "sglang": fleet.sglang.hit_tokens}
    return diagnose_log(
        replayed.sample.workload,
        sample_replays,
        replayed.order,
        replayed.sample.requests,
        settings,
        _decoder(log),
        options.redact,
        options.what_if,
        PartsSource(loaded.records, tokenizer, log.sample.renderer, options.ingest.cache_dir)
        if tokenizer
        else None,
        progress,
        kv=KvShape(shape.name, shape.kv_bytes_per_token(KV_DTYPE_BYTES)),
        fleet_hits=fleet_hits,
        check_curves=options.check_curves,
        runs=runs,
    )


def report(
    log: ReadLog,
    replayed: Replayed,
    diagnosed: DiagnoseResult | None,
    options: AnalyzeOptions,
    fleet_run: FleetRun | None = None,
) -> Analysis:
    """The report and the per-request table."""
    settings = options.settings
    whole, replays, sample = replayed.log, replayed.replays, replayed.sample
    loaded, tokenizer, renderer = log.reader.loaded, log.reader.tokenizer, log.sample.renderer
    decoder = _decoder(log)
    prompt_lengths = whole.requests["prompt_tokens"].to_numpy()
    server_comparison = compare_with_server(whole.requests, replays, settings.block_size)
    candidates = [  # templates, not the shared heads of varying values
        prefix
        for prefix in shared_prefixes(
            replays.trie, top=4 * options.top_prefixes + 10, min_extension=TEMPLATE_MIN_TOKENS
        )
        if diagnosed is None or not diagnosed.values.ends_inside(prefix.tokens)
    ]
    # The top prefixes, and the leading prefix of each of the top templates (so that a template's
    # variants do not crowd the others out).
    templates = template_groups(candidates)
    leads = {templates.index(group) for group in set(templates) if group < options.top_prefixes}
    chosen = sorted(leads | set(range(min(options.top_prefixes, len(candidates)))))
    prefixes = [(candidates[i], templates[i]) for i in chosen]
    block_size = settings.block_size
    report = Report(
        inputs=loaded.formats,
        tokenizer=tokenizer.description if tokenizer else None,
        chat_template=renderer.description if _has_chats(loaded) else None,
        replay_mode=settings.mode,
        requests=whole.requests.height,
        prompt_tokens=int(prompt_lengths.sum()),
        output_tokens=int(whole.requests["output_tokens"].sum()),
        skipped=SkipSummary.of(loaded.skips + whole.skips),
        engines={
            "vllm": _summary(
                replays.vllm,
                prompt_lengths,
                f"vLLM (block {block_size})",
                asdict(settings.vllm()),
            ),
            "sglang": _summary(
                replays.sglang,
                prompt_lengths,
                f"SGLang (page {settings.page_size}, {settings.eviction_policy})",
                asdict(settings.sglang()),
            ),
        },
        ceiling=_summary(
            replays.ideal,
            prompt_lengths,
            "ceiling (unbounded, token-exact)",
            {"capacity_tokens": None, "granularity": 1},
        ),
        alignment_loss_tokens=replays.sglang_page1.total_hit_tokens - replays.vllm.total_hit_tokens,
        block_size=block_size,
        models=_model_summaries(model_labels(whole.requests["model"]), prompt_lengths, replays),
        server_comparison=server_comparison,
        shared_prefixes=[
            _prefix_summary(
                prefix,
                block_size,
                decoder,
                options.redact,
                whole,
                diagnosed.padding_saves if diagnosed else {},
            )
            for prefix in prefixes
        ],
        recommendations=(diagnosed.diagnosis.recommendations if diagnosed else [])
        + ([] if fleet_run is None else fleet_recommendations(fleet_run.summary, options.fleet)),
        diagnosis=diagnosed.diagnosis if diagnosed else None,
        diagnosis_scope=_diagnosis_scope(replayed) if diagnosed else None,
        notes=tokenization_note(server_comparison)
        + _notes(whole, _hash_trace(loaded), options.ingest.hash_block_size)
        + _loading_notes(loaded.answers_joined)
        + (
            ["Requests replayed in timestamp order (the log is not sorted by arrival)."]
            if replayed.order is not None
            else []
        )
        + ([_sample_note(sample, whole, settings)] if replayed.streamed and diagnosed else [])
        + (
            []
            if fleet_run is None
            else fleet_notes(fleet_run.summary, options.sample_tokens, replayed.streamed)
        ),
        run_notes=cache_notes(whole.token_cache),
        prefill_estimate=prefill_estimate(
            preset(options.model_preset),
            prompt_lengths,
            {"vllm": replays.vllm.hit_tokens, "sglang": replays.sglang.hit_tokens},
            distinct_tokens=int(replays.trie.length.sum()),
            capacity_tokens=settings.capacity_tokens,
        ),
        fleet=None if fleet_run is None else fleet_run.summary,
    )
    per_request = _per_request(whole.requests, replays)
    if diagnosed is not None:
        losses = pl.DataFrame(diagnosed.per_request)
        if replayed.streamed:  # per-request causes for the diagnosed sample only
            losses = pl.concat([losses, _nulls(losses, whole.requests.height - losses.height)])
        per_request = per_request.hstack(losses)
    return Analysis(
        report=report,
        per_request=_with_fleet(per_request, fleet_run),
        tokenized=sample,
        replays=replayed.sample_replays,
    )


def _diagnosis_scope(replayed: Replayed) -> DiagnosisScope:
    """The requests the diagnosis covers (the leading sample when streamed) and their hits: the
    denominator of every share the diagnosis shows."""
    sample, replays = replayed.sample, replayed.sample_replays
    return DiagnosisScope(
        requests=sample.workload.n_requests,
        prompt_tokens=sample.workload.prompt_token_count,
        ceiling_hit_tokens=replays.ideal.total_hit_tokens,
        whole_log=not replayed.streamed,
        log_requests=replayed.log.requests.height,
        log_prompt_tokens=int(replayed.log.requests["prompt_tokens"].sum()),
        hit_tokens={
            "vllm": int(replays.vllm.hit_tokens.sum()),
            "sglang": int(replays.sglang.hit_tokens.sum()),
        },
    )


def _head(chunks: Iterator[Chunk], budget: int | None) -> list[Chunk]:
    """Chunks read until ``budget`` prompt tokens (None: all of them)."""
    head: list[Chunk] = []
    tokens = 0
    for chunk in chunks:
        head.append(chunk)
        tokens += chunk.tokenized.workload.prompt_token_count
        if budget is not None and tokens >= budget:
            break
    return head


def _hash_trace(loaded: LoadResult) -> bool:
    return bool({"hash-trace", "bailian-trace"} & set(loaded.formats.values()))


def _decoder(log: ReadLog) -> Tokenizer | None:
    """The tokenizer that turns tokens back into text (none for ids or hash-id traces)."""
    tokenizer = log.reader.tokenizer
    return tokenizer if tokenizer is not None and not _hash_trace(log.reader.loaded) else None


def _model_summaries(
    models: np.ndarray, prompt_lengths: np.ndarray, replays: Replays
) -> dict[str, ModelSummary]:
    """Per-model figures, when the log holds more than one model."""
    if len(models) == 0 or (models == models[0]).all():  # one model: no string per request
        return {}
    names = list(dict.fromkeys(models))
    summaries = {}
    for name in names:
        mask = models == name
        lengths = prompt_lengths[mask]
        engines = {"vllm": replays.vllm.hit_tokens[mask], "sglang": replays.sglang.hit_tokens[mask]}
        summaries[name] = ModelSummary(
            requests=int(mask.sum()),
            prompt_tokens=int(lengths.sum()),
            hit_tokens={engine: int(hits.sum()) for engine, hits in engines.items()},
            hit_rate={engine: hit_rate(hits, lengths) for engine, hits in engines.items()},
        )
    return summaries


def _has_chats(loaded: LoadResult) -> bool:
    return any_messages(loaded.records)


def _leading_sample(replayed: Replayed, budget: int | None) -> Replayed:
    """``replayed`` with its diagnosis sample cut to the leading requests up to ``budget`` prompt
    tokens (at least one): a replay in arrival order or with requests in flight is causal, so
    its first k requests' results are those of the first k alone."""
    log = replayed.sample
    offsets = log.workload.prompt_offsets
    if budget is None or int(offsets[-1]) <= budget:
        return replayed
    n = max(1, int(np.searchsorted(offsets, budget, side="right")) - 1)
    sample = replace(log, requests=log.requests.head(n), workload=log.workload.select(np.arange(n)))
    return replace(
        replayed, sample=sample, sample_replays=sample_of(replayed.replays, sample.workload)
    )


def _sample_note(sample: TokenizedLog, whole: LogTable, settings: ReplaySettings) -> str:
    how = "streamed" if settings.sequential else "replayed whole, in its replay mode"
    return (
        f"The log was {how}: hit rates, the ceiling and shared prefixes cover all "
        f"{whole.requests.height:,} requests; losses by cause, dynamic content, recommendations "
        f"and curves were measured on the first {sample.workload.n_requests:,} "
        f"({int(sample.workload.prompt_offsets[-1]):,} prompt tokens; raise --diagnose-tokens "
        "to cover more)."
    )


def _nulls(like: pl.DataFrame, rows: int) -> pl.DataFrame:
    return pl.DataFrame(
        {name: pl.Series(name, [None] * rows, dtype=like[name].dtype) for name in like.columns}
    )


def _summary(
    result: ReplayResult, prompt_lengths: np.ndarray, label: str, config: dict
) -> EngineSummary:
    return EngineSummary(
        engine=result.engine,
        label=label,
        config=config,
        hit_tokens=result.total_hit_tokens,
        hit_rate=hit_rate(result.hit_tokens, prompt_lengths),
        mean_request_hit_rate=mean_request_hit_rate(result.hit_tokens, prompt_lengths),
        metrics=dict(result.metrics),
        counters={name: int(values.sum()) for name, values in result.counters.items()},
    )


def _prefix_summary(
    chosen: tuple[SharedPrefix, int],
    block_size: int,
    decoder: Tokenizer | None,
    redact: bool,
    tokenized: LogTable,
    padding_saves: dict[bytes, int],
) -> PrefixSummary:
    prefix, template = chosen
    return PrefixSummary(
        tokens=prefix.length,
        remainder=prefix.length % block_size,
        requests=prefix.requests,
        covered_tokens=prefix.covered_tokens,
        namespace=tokenized.namespace_labels[prefix.namespace],
        fingerprint=prefix.fingerprint(tokenized.namespace_labels[prefix.namespace]),
        padding=prefix.padding(block_size),
        padding_saves=padding_saves.get(prefix.tokens.tobytes()),
        template=template,
        recompute_saved_per_request=prefix.recompute_saved_per_request(block_size),
        snippet=None if redact else snippet(prefix.tokens, decoder),
    )


def _notes(tokenized: LogTable, hash_trace: bool, hash_block_size: int | None) -> list[str]:
    notes = []
    if tokenized.assumed_stop_finish:
        notes.append(
            f"{tokenized.assumed_stop_finish} requests have no finish_reason: replayed as 'stop'."
        )
    unknown = int((~tokenized.requests["output_known"]).sum())
    if unknown:
        notes.append(
            f"{unknown} requests have no answer text or tokens: their output tokens are unknown "
            "and never match a later prompt."
        )
    if hash_trace:
        notes.append(
            f"Hash-id trace: each id expanded to {hash_block_size or 'its block of'} synthetic "
            "tokens; prompts "
            "diverge at the first differing block."
        )
    return notes


def _loading_notes(answers_joined: int) -> list[str]:
    """What the reader joined."""
    notes = []
    if answers_joined:
        notes.append(f"{answers_joined} answer lines joined to their requests by request id.")
    return notes


def cache_notes(stats: CacheStats) -> list[str]:
    """What the token cache did: shown on the terminal, never in the JSON (which must be the
    same from a cold and a warm cache)."""
    notes = []
    if stats.damaged:
        notes.append(
            f"Token cache: damaged data found ({stats.damaged} entries or files), discarded; "
            "those texts were tokenized again."
        )
    if stats.error:
        notes.append(f"Token cache not used: {stats.error}.")
    elif stats.from_cache:
        notes.append(
            f"Token cache: {stats.from_cache} distinct texts read from disk, "
            f"{stats.tokenized} tokenized."
        )
    return notes


def _per_request(requests: pl.DataFrame, replays: Replays) -> pl.DataFrame:
    columns: dict[str, object] = {
        "request": np.arange(requests.height),
        "file": requests["file"],
        "line": requests["line"],
        "model": requests["model"],
        "prompt_tokens": requests["prompt_tokens"],
        "output_tokens": requests["output_tokens"],
        "vllm_hit": replays.vllm.hit_tokens,
        "sglang_hit": replays.sglang.hit_tokens,
        "ceiling_hit": replays.ideal.hit_tokens,
        "server_cached_tokens": requests["server_cached_tokens"],
        "server_prompt_tokens": requests["server_prompt_tokens"],
    }
    for result in (replays.vllm, replays.sglang):
        for name, values in result.counters.items():
            columns[f"{result.engine}_{name}"] = values
    return pl.DataFrame(columns)


def _with_fleet(table: pl.DataFrame, fleet_run: FleetRun | None) -> pl.DataFrame:
    """Each request's replica and its hits on one instance with the fleet's total capacity."""
    if fleet_run is None:
        return table
    return table.with_columns(
        pl.Series("replica", fleet_run.placement),
        pl.Series("single_vllm_hit", fleet_run.single.vllm.hit_tokens),
        pl.Series("single_sglang_hit", fleet_run.single.sglang.hit_tokens),
    )
