"""The analyze pipeline: load -> render -> tokenize -> workload -> replay -> diagnose -> report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzer.diagnose import diagnose_log
from analyzer.diagnose.parts import PartsSource
from analyzer.errors import PrefixcheckError
from analyzer.ingest import IngestOptions, ingest
from analyzer.loaders.mapped import FieldMap
from analyzer.measure.estimate import prefill_estimate
from analyzer.measure.presets import DEFAULT_ESTIMATE_PRESET, preset
from analyzer.per_model import model_labels, model_summaries, replay_by_model
from analyzer.prefixes import TEMPLATE_MIN_TOKENS, SharedPrefix, shared_prefixes
from analyzer.progress import NoProgress, Progress
from analyzer.replay import (
    Replays,
    ReplaySettings,
    arrival_order,
    hit_rate,
    in_input_order,
    mean_request_hit_rate,
)
from analyzer.report import (
    EngineSummary,
    PrefixSummary,
    Report,
    SkipSummary,
)
from analyzer.server_compare import compare_with_server
from analyzer.snippets import snippet
from analyzer.tokenizer import Tokenizer
from analyzer.workload import TokenizedLog
from cache_models.result import ReplayResult


@dataclass(frozen=True)
class AnalyzeOptions:
    format: str = "auto"
    tokenizer: str | None = None
    settings: ReplaySettings = field(default_factory=ReplaySettings)
    strict: bool = False
    hash_block_size: int | None = None  # None: each trace format's own (Mooncake 512, Bailian 16)
    top_prefixes: int = 10
    redact: bool = False
    what_if: tuple[str, ...] = ()  # --what-if: named fixes to replay
    model_preset: str = DEFAULT_ESTIMATE_PRESET  # the model shape of the prefill estimate
    fields: FieldMap | None = None  # --prompt-field, --time-field, ...
    chat_template: str | None = None  # --chat-template: a built-in, a named template or a file
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None  # the token cache; None: no cache
    fast_tokenizer: bool = True  # the tiktoken fast path for byte-level BPE tokenizer.json

    @property
    def ingest(self) -> IngestOptions:
        return IngestOptions(
            format=self.format,
            tokenizer=self.tokenizer,
            strict=self.strict,
            hash_block_size=self.hash_block_size,
            fields=self.fields,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
            cache_dir=self.cache_dir,
            fast_tokenizer=self.fast_tokenizer,
        )


@dataclass(frozen=True)
class Analysis:
    """The report, the per-request table, and what they were computed from (input order)."""

    report: Report
    per_request: pl.DataFrame
    tokenized: TokenizedLog
    replays: Replays


def analyze(
    paths: list[Path], options: AnalyzeOptions, progress: Progress | None = None
) -> Analysis:
    progress = progress or NoProgress()
    shape = preset(options.model_preset)
    ingested = ingest(paths, options.ingest, progress)
    loaded, tokenized, tokenizer = ingested.loaded, ingested.tokenized, ingested.tokenizer
    renderer = ingested.renderer
    workload = tokenized.workload
    models = model_labels(tokenized.requests["model"])
    if options.settings.time_model is not None and workload.arrival_s is None:
        raise PrefixcheckError(
            "--replay-in-time needs an arrival time on every request (a timestamp field, or "
            "--time-field)"
        )
    order = arrival_order(workload)
    if order is None:
        replays = replay_by_model(workload, models, options.settings, progress)
    else:
        replays = in_input_order(
            replay_by_model(workload.select(order), models[order], options.settings, progress),
            order,
        )

    hash_trace = bool({"hash-trace", "bailian-trace"} & set(loaded.formats.values()))
    decoder = tokenizer if tokenizer is not None and not hash_trace else None
    diagnosed = diagnose_log(
        workload,
        replays,
        order,
        tokenized.requests,
        options.settings,
        decoder,
        options.redact,
        options.what_if,
        PartsSource(loaded.records, tokenizer, renderer, options.cache_dir) if tokenizer else None,
        progress,
    )
    prefixes = [  # templates, not the shared heads of varying values
        prefix
        for prefix in shared_prefixes(
            replays.trie, top=2 * options.top_prefixes + 10, min_extension=TEMPLATE_MIN_TOKENS
        )
        if not diagnosed.values.ends_inside(prefix.tokens)
    ][: options.top_prefixes]
    block_size = options.settings.block_size
    report = Report(
        inputs=loaded.formats,
        tokenizer=tokenizer.description if tokenizer else None,
        chat_template=renderer.name if any(r.messages for r in loaded.records) else None,
        replay_mode=options.settings.mode,
        requests=workload.n_requests,
        prompt_tokens=int(workload.prompt_lengths.sum()),
        output_tokens=int(workload.output_lengths.sum()),
        skipped=SkipSummary.of(loaded.skips + tokenized.skips),
        engines={
            "vllm": _summary(
                replays.vllm,
                workload.prompt_lengths,
                f"vLLM (block {block_size})",
                asdict(options.settings.vllm()),
            ),
            "sglang": _summary(
                replays.sglang,
                workload.prompt_lengths,
                f"SGLang (page {options.settings.page_size}, {options.settings.eviction_policy})",
                asdict(options.settings.sglang()),
            ),
        },
        ceiling=_summary(
            replays.ideal,
            workload.prompt_lengths,
            "ceiling (unbounded, token-exact)",
            {"capacity_tokens": None, "granularity": 1},
        ),
        alignment_loss_tokens=replays.sglang_page1.total_hit_tokens - replays.vllm.total_hit_tokens,
        block_size=block_size,
        models=model_summaries(models, workload.prompt_lengths, replays),
        server_comparison=compare_with_server(tokenized.requests, replays, block_size),
        shared_prefixes=[
            _prefix_summary(prefix, block_size, decoder, options.redact, tokenized)
            for prefix in prefixes
        ],
        recommendations=diagnosed.diagnosis.recommendations,
        diagnosis=diagnosed.diagnosis,
        notes=_notes(tokenized, hash_trace, options.hash_block_size)
        + _loading_notes(loaded.answers_joined, tokenized)
        + (
            ["Requests replayed in timestamp order (the log is not sorted by arrival)."]
            if order is not None
            else []
        ),
        prefill_estimate=prefill_estimate(
            shape,
            workload.prompt_lengths,
            {"vllm": replays.vllm.hit_tokens, "sglang": replays.sglang.hit_tokens},
            distinct_tokens=int(replays.trie.length.sum()),
            capacity_tokens=options.settings.capacity_tokens,
        ),
    )
    return Analysis(
        report=report,
        per_request=_per_request(tokenized, replays).hstack(pl.DataFrame(diagnosed.per_request)),
        tokenized=tokenized,
        replays=replays,
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
    prefix: SharedPrefix,
    block_size: int,
    decoder: Tokenizer | None,
    redact: bool,
    tokenized: TokenizedLog,
) -> PrefixSummary:
    return PrefixSummary(
        tokens=prefix.length,
        remainder=prefix.length % block_size,
        requests=prefix.requests,
        covered_tokens=prefix.covered_tokens,
        namespace=tokenized.namespace_labels[prefix.namespace],
        fingerprint=prefix.fingerprint(tokenized.namespace_labels[prefix.namespace]),
        padding=prefix.padding(block_size),
        recompute_saved_per_request=prefix.recompute_saved_per_request(block_size),
        snippet=None if redact else snippet(prefix.tokens, decoder),
    )


def _notes(tokenized: TokenizedLog, hash_trace: bool, hash_block_size: int | None) -> list[str]:
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


def _loading_notes(answers_joined: int, tokenized: TokenizedLog) -> list[str]:
    """What the reader joined and what the token cache saved."""
    notes = []
    if answers_joined:
        notes.append(f"{answers_joined} answer lines joined to their requests by request id.")
    cache = tokenized.token_cache
    if cache.error:
        notes.append(f"Token cache not used: {cache.error}.")
    elif cache.from_cache:
        notes.append(
            f"Token cache: {cache.from_cache} distinct prompts read from disk, "
            f"{cache.tokenized} tokenized."
        )
    return notes


def _per_request(tokenized: TokenizedLog, replays: Replays) -> pl.DataFrame:
    columns: dict[str, object] = {
        "request": np.arange(tokenized.workload.n_requests),
        "file": tokenized.requests["file"],
        "line": tokenized.requests["line"],
        "model": tokenized.requests["model"],
        "prompt_tokens": tokenized.requests["prompt_tokens"],
        "output_tokens": tokenized.requests["output_tokens"],
        "vllm_hit": replays.vllm.hit_tokens,
        "sglang_hit": replays.sglang.hit_tokens,
        "ceiling_hit": replays.ideal.hit_tokens,
        "server_cached_tokens": tokenized.requests["server_cached_tokens"],
    }
    for result in (replays.vllm, replays.sglang):
        for name, values in result.counters.items():
            columns[f"{result.engine}_{name}"] = values
    return pl.DataFrame(columns)
