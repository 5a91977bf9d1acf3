"""Load -> render -> tokenize: the requests of some logs as the token ids the server saw, read
whole or chunk by chunk (a log of billions of tokens never has to be in memory at once)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzer.chat import ChatRenderer, chat_renderer
from analyzer.errors import PrefixcheckError, SkipLog
from analyzer.loaders import LoadResult, iter_records
from analyzer.loaders.mapped import FieldMap
from analyzer.progress import Progress
from analyzer.records import Columns, HashLines, Record, RecordList, TokenLines
from analyzer.report import SkipSummary
from analyzer.token_cache import CacheStats
from analyzer.tokenizer import Tokenizer, load_tokenizer
from analyzer.workload import (
    ChunkState,
    TokenizedLog,
    build_lines_workload,
    build_run_workload,
    build_workload,
    hash_trace_of,
)
from cache_models.hash_runs import trace_runs
from cache_models.runs import RunWorkload, concat_runs
from cache_models.workload import concat_workloads

CHUNK_RECORDS = 2000  # at most this many requests tokenized (and replayed) at a time
CHUNK_TOKENS = 4_000_000  # and about this many prompt tokens (estimated before tokenizing)
CHARS_PER_TOKEN = 3  # a low guess for text, so that chunks of text stay small enough
PROGRESS_EVERY = 500  # requests read between two progress reports


@dataclass(frozen=True)
class IngestOptions:
    format: str = "auto"
    tokenizer: str | None = None
    strict: bool = False
    hash_block_size: int | None = None  # None: each trace format's own (Mooncake 512, Bailian 16)
    fields: FieldMap | None = None  # --prompt-field, --time-field, ...
    chat_template: str | None = None  # --chat-template: a built-in, a named template or a file
    chat_template_kwargs: dict[str, Any] | None = None
    rendering: str = "vllm"  # --render-as: the server whose request preparation is reproduced
    cache_dir: Path | None = None  # the token cache; None: no cache
    fast_tokenizer: bool = True  # the tiktoken fast path for byte-level BPE tokenizer.json
    # A hash-id trace is taken as runs of tokens, unexpanded, cut for SGLang prefill chunks of
    # this size (0: none) when the replay reads runs (``analyzer.pipeline.replays_runs``);
    # None: expanded into tokens.
    hash_runs: int | None = None


@dataclass(frozen=True)
class Ingested:
    loaded: LoadResult
    tokenized: TokenizedLog
    tokenizer: Tokenizer | None  # None when the log holds token ids only
    renderer: ChatRenderer


@dataclass(frozen=True)
class Chunk:
    """Some consecutive requests: as read, and tokenized."""

    records: Sequence[Record]  # a RecordList where the lines were read as Columns
    tokenized: TokenizedLog


@dataclass
class ChunkedIngest:
    """Reads logs chunk by chunk; the tokenizer is loaded when the first text needs it."""

    paths: Sequence[Path]
    options: IngestOptions
    progress: Progress
    loaded: LoadResult = field(default_factory=LoadResult)
    state: ChunkState = field(default_factory=ChunkState)
    tokenizer: Tokenizer | None = None
    renderer: ChatRenderer | None = None
    _requests: int = 0  # requests read and processed so far

    def records(self) -> Iterator[Record]:
        """The requests of the inputs, as they are read (the loaders' order)."""
        for item in self.items(columns=False):
            assert isinstance(item, Record)
            yield item

    def items(self, columns: bool = True) -> Iterator[Record | Columns]:
        """``records()``, with plain pre-tokenized and Mooncake lines as Columns (``columns``)."""
        return iter_records(
            self.paths,
            self.options.format,
            self.loaded,
            strict=self.options.strict,
            hash_block_size=self.options.hash_block_size,
            fields=self.options.fields,
            columns=columns,
        )

    def _read(self) -> Iterator[Record | Columns]:
        """What ``chunks`` cuts (a shard's reader cuts its own records)."""
        return self.items()

    def chunks(self, chunk_records: int = CHUNK_RECORDS) -> Iterator[Chunk]:
        records = self._read()
        chunk = self.options.hash_runs
        if chunk is not None:
            first = next(records, None)
            records = chain([] if first is None else [first], records)
            size = None if first is None else _block_size(first)
            if size is not None and chunk % size == 0:
                read = list(records)  # its ids: a few bytes per block
                if {_block_size(item) for item in read} == {size}:
                    yield from self._run_chunks(read, chunk_records, chunk)
                    return
                records = iter(read)  # mixed formats or block sizes: all of it as tokens
        meter = self.loaded.meter
        done, requests = 0, 0  # bytes and requests of the chunks processed so far
        pending = _Pending(records)
        while taken := _take(pending, chunk_records, self._reading(done, requests)):
            read = meter.position()
            requests += _count(taken)
            if self.tokenizer is None and (
                self.options.tokenizer
                or any(
                    isinstance(r, Record) and (r.messages is not None or r.prompt is not None)
                    for r in taken
                )
            ):
                self.tokenizer = load_tokenizer(
                    self.options.tokenizer, fast=self.options.fast_tokenizer
                )
                self.renderer = None
            if all(isinstance(item, TokenLines) for item in taken):  # no Record: their columns
                lines: list[TokenLines] = taken  # type: ignore[assignment]
                tokenized = build_lines_workload(
                    lines,
                    self.state,
                    routing_fields=self.options.fields.routing if self.options.fields else (),
                )
                done = read
                self.report("reading", requests)
                gc.freeze()
                yield Chunk(RecordList(lines), tokenized)
                continue
            batch = _as_records(taken)
            chunk_progress = _ChunkProgress(self.progress, meter.total, done, read, requests)
            tokenized = build_workload(
                batch,
                self.tokenizer or load_tokenizer(None),
                self._renderer(),
                strict=self.options.strict,
                progress=chunk_progress,
                cache_dir=self.options.cache_dir,
                chunk_state=self.state,
                routing_fields=self.options.fields.routing if self.options.fields else (),
            )
            if not any(r.messages for r in batch):
                for record in batch:  # the workload holds the ids now; only chats are re-rendered
                    record.prompt_token_ids = record.output_token_ids = None
            done = read
            self.report("reading", requests)
            # A chunk's records and rows live until the report, or until the replay streams
            # past them (freed then as ever): frozen, the collector's full passes skip them.
            gc.freeze()
            yield Chunk(batch, tokenized)

    def _run_chunks(
        self, read: list[Record | Columns], chunk_records: int, chunk: int
    ) -> Iterator[Chunk]:
        """A hash-id trace as runs: every line read first (the runs of an id are cut where any
        request holding it needs a boundary, SGLang's prefill chunks of ``chunk`` tokens
        included), then chunks of runs. A chunk size that is not a multiple of the trace's
        block takes the tokens (its cuts could land at any offset of a block)."""
        self.report("reading", _count(read))
        trace = hash_trace_of(read)
        # The whole trace as runs, then a view per chunk (its unknown ids are those of chunk
        # by chunk passes: numbered in request order).
        _, runs, self.state.next_unknown = trace_runs(trace, chunk, self.state.next_unknown)
        requests, start = 0, 0
        batches = _Pending(iter(read))
        while batch := _take(batches, chunk_records):
            stop = start + _count(batch)
            tokenized = build_run_workload(
                batch,
                trace.select(slice(start, stop)),
                runs.rows(start, stop),
                chunk_state=self.state,
                routing_fields=self.options.fields.routing if self.options.fields else (),
            )
            start = stop
            requests += _count(batch)
            self.report("reading", requests)
            yield Chunk(_record_list(batch), tokenized)

    def report(self, step: str, requests: int | None = None) -> None:
        """Tell the progress sink that the chunks so far are at ``step`` (replaying...)."""
        if requests is not None:
            self._requests = requests
        meter = self.loaded.meter
        self.progress.input(step, meter.position(), meter.total, self._requests)

    def _reading(self, done: int, requests: int) -> Callable[[int], None]:
        def reading(taken: int) -> None:
            self.progress.input("reading", done, self.loaded.meter.total, requests + taken)

        return reading

    def _renderer(self) -> ChatRenderer:
        if self.renderer is None:
            special = (self.tokenizer or load_tokenizer(None)).special
            self.renderer = chat_renderer(
                self.tokenizer.chat_template if self.tokenizer else None,
                special,
                choice=self.options.chat_template,
                default_kwargs=self.options.chat_template_kwargs,
                rendering=self.options.rendering,
            )
        return self.renderer

    def finished(self, chunks: Sequence[Chunk]) -> Ingested:
        """The chunks read so far as one log; errors when nothing could be read."""
        if not chunks or not any(c.tokenized.workload.n_requests for c in chunks):
            summary = SkipSummary.of(sum((c.tokenized.skips for c in chunks), self.loaded.skips))
            if not self.loaded.skips and chunks:
                first = chunks[0].tokenized.skips[0] if chunks[0].tokenized.skips else None
                raise PrefixcheckError(
                    "no requests left after tokenization" + (f" (e.g. {first})" if first else "")
                )
            detail = f": {summary.examples[0]}" if summary.examples else ""
            raise PrefixcheckError(
                f"no requests in the input ({summary.count} lines skipped{detail})"
            )
        self.loaded.records = RecordList([part for c in chunks for part in _parts(c.records)])
        return Ingested(self.loaded, merge(chunks, self.state), self.tokenizer, self._renderer())


class _Pending:
    """The items still to be cut into chunks: the rest of Columns cut in two comes first."""

    def __init__(self, items: Iterator[Record | Columns]) -> None:
        self.items = items
        self.held: Record | Columns | None = None

    def next(self) -> Record | Columns | None:
        item, self.held = self.held, None
        return item if item is not None else next(self.items, None)


def _take(
    items: _Pending | Iterator[Record],
    limit: int,
    reading: Callable[[int], None] | None = None,
) -> list[Record | Columns]:
    """The next requests, up to ``limit`` of them or about CHUNK_TOKENS prompt tokens (the
    lines of Columns counted one by one, as Records); ``reading(count)`` is told at the first
    request and every PROGRESS_EVERY requests after."""
    pending = items if isinstance(items, _Pending) else _Pending(items)
    batch: list[Record | Columns] = []
    count = tokens = 0
    while count < limit and (item := pending.next()) is not None:
        if isinstance(item, Columns):
            # the lines up to the limit, and up to the first that reaches CHUNK_TOKENS
            reached = tokens + np.cumsum(item.estimated_tokens()[: limit - count])
            stop = min(len(reached), int(np.searchsorted(reached, CHUNK_TOKENS)) + 1)
            if stop < len(item):
                pending.held = item.slice(stop, len(item))
                item = item.slice(0, stop)
            shown = (count + PROGRESS_EVERY - 1) // PROGRESS_EVERY * PROGRESS_EVERY + 1
            count, tokens = count + len(item), int(reached[stop - 1])
            batch.append(item)
            if reading is not None and shown <= count:
                reading(count)
        else:
            batch.append(item)
            count += 1
            tokens += _estimated_tokens(item)
            if reading is not None and count % PROGRESS_EVERY == 1:
                reading(count)
        if tokens >= CHUNK_TOKENS:
            break
    return batch


def _as_records(items: Iterable[Record | Columns]) -> list[Record]:
    """The items' Records, Columns read into theirs."""
    return [
        record
        for item in items
        for record in (item.records() if isinstance(item, Columns) else (item,))
    ]


def _record_list(items: Sequence[Record | Columns]) -> Sequence[Record]:
    """A chunk's items as its records: a list, or a RecordList where some are Columns."""
    if not any(isinstance(item, Columns) for item in items):
        return list(items)  # type: ignore[arg-type]
    parts: list[Sequence[Record] | Columns] = []
    for item in items:
        if isinstance(item, Columns):
            parts.append(item)
        elif parts and isinstance(parts[-1], list):
            parts[-1].append(item)
        else:
            parts.append([item])
    return RecordList(parts)


def _parts(records: Sequence[Record]) -> Sequence[Sequence[Record] | Columns]:
    """A chunk's records as RecordList parts."""
    return records.parts if isinstance(records, RecordList) else [records]


def _count(items: Sequence[Record | Columns]) -> int:
    """Requests among ``items``."""
    return sum(len(item) if isinstance(item, Columns) else 1 for item in items)


def _block_size(item: Record | Columns) -> int | None:
    """The block of a hash-id trace's request, None for any other."""
    if isinstance(item, HashLines):
        return item.block_size
    if isinstance(item, Record) and item.hash_blocks is not None:
        return item.hash_blocks.block_size
    return None


@dataclass
class _ChunkProgress:
    """The stages of one chunk (tokenizing prompts, answers) as overall progress: the chunk's
    bytes, ``start`` to ``end``, fill in as its current stage advances (never backwards)."""

    sink: Progress
    total: int | None
    start: int
    end: int
    requests: int
    _step: str = "tokenizing"
    _units: int | None = None
    _done: int = 0
    _shown: int = 0

    def stage(self, name: str, total: int | None) -> None:
        self._step, self._units, self._done = name, total, 0
        self._show()

    def advance(self, units: int) -> None:
        self._done += units
        self._show()

    def input(self, step: str, done_bytes: int, total_bytes: int | None, requests: int) -> None:
        self.sink.input(step, done_bytes, total_bytes, requests)

    def _show(self) -> None:
        share = min(1.0, self._done / self._units) if self._units else 0.0
        self._shown = max(self._shown, self.start + int(share * (self.end - self.start)))
        self.sink.input(self._step, self._shown, self.total, self.requests)


def _estimated_tokens(record: Record) -> int:
    """Prompt and answer tokens, guessed before tokenizing (a claimed output length is
    allocated as that many unknown tokens, so it counts too)."""
    output = record.output_length or 0
    if record.hash_blocks is not None:
        return record.hash_blocks.prompt_length + output
    if record.prompt_token_ids is not None:
        return len(record.prompt_token_ids) + output
    if record.prompt is not None:
        return len(record.prompt) // CHARS_PER_TOKEN + output
    content = sum(len(str(message.get("content") or "")) for message in record.messages or [])
    return content // CHARS_PER_TOKEN + output


def ingest(paths: list[Path], options: IngestOptions, progress: Progress) -> Ingested:
    """The whole log in memory."""
    reader = ChunkedIngest(paths, options, progress)
    return reader.finished(list(reader.chunks()))


def merge(chunks: Sequence[Chunk], state: ChunkState) -> TokenizedLog:
    """Consecutive chunks as one tokenized log."""
    logs = [c.tokenized for c in chunks]
    workloads = [log.workload for log in logs]
    return TokenizedLog(
        workload=concat_runs(workloads)  # type: ignore[arg-type]
        if isinstance(workloads[0], RunWorkload)
        else concat_workloads(workloads),
        requests=pl.concat([log.requests for log in logs], how="vertical_relaxed"),
        skips=sum((log.skips for log in logs), SkipLog()),
        namespace_labels=state.labels(),
        from_text=any(log.from_text for log in logs),
        assumed_stop_finish=sum(log.assumed_stop_finish for log in logs),
        token_cache=CacheStats.total([log.token_cache for log in logs]),
    )
