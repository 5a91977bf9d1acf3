"""Load -> render -> tokenize: the requests of some logs as the token ids the server saw."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.chat import ChatRenderer, chat_renderer
from analyzer.errors import PrefixcheckError
from analyzer.loaders import LoadResult, load_logs
from analyzer.loaders.mapped import FieldMap
from analyzer.progress import Progress
from analyzer.report import SkipSummary
from analyzer.tokenizer import Tokenizer, load_tokenizer
from analyzer.workload import TokenizedLog, build_workload


@dataclass(frozen=True)
class IngestOptions:
    format: str = "auto"
    tokenizer: str | None = None
    strict: bool = False
    hash_block_size: int | None = None
    fields: FieldMap | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_dir: Path | None = None
    fast_tokenizer: bool = True


@dataclass(frozen=True)
class Ingested:
    loaded: LoadResult
    tokenized: TokenizedLog
    tokenizer: Tokenizer | None  # None when the log holds token ids only
    renderer: ChatRenderer


def ingest(paths: list[Path], options: IngestOptions, progress: Progress) -> Ingested:
    loaded = load_logs(
        paths,
        options.format,
        strict=options.strict,
        hash_block_size=options.hash_block_size,
        fields=options.fields,
        progress=progress,
    )
    if not loaded.records:
        summary = SkipSummary.of(loaded.skips)
        detail = f": {summary.examples[0]}" if summary.examples else ""
        raise PrefixcheckError(f"no requests in the input ({summary.count} lines skipped{detail})")
    needs_text = any(r.messages is not None or r.prompt is not None for r in loaded.records)
    tokenizer = (
        load_tokenizer(options.tokenizer, fast=options.fast_tokenizer)
        if needs_text or options.tokenizer
        else None
    )
    renderer = chat_renderer(
        tokenizer.chat_template if tokenizer else None,
        tokenizer.special if tokenizer else load_tokenizer(None).special,
        choice=options.chat_template,
        default_kwargs=options.chat_template_kwargs,
    )
    tokenized = build_workload(
        loaded.records,
        tokenizer or load_tokenizer(None),
        renderer,
        strict=options.strict,
        progress=progress,
        cache_dir=options.cache_dir,
    )
    if tokenized.workload.n_requests == 0:
        first = tokenized.skips[0] if tokenized.skips else None
        raise PrefixcheckError(
            "no requests left after tokenization" + (f" (e.g. {first})" if first else "")
        )
    return Ingested(loaded, tokenized, tokenizer, renderer)
