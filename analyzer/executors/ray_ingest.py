"""The read step on a Ray cluster: shards read by Ray tasks, put back together on the driver as
exactly the chunks a local read yields (same requests in the same order, same line numbers,
skips, namespaces and chunk boundaries), so every later step is the local one.

A local read numbers records in file order and holds those with a request id until every file
is read; it cuts chunks of ``chunk_records`` records or about ``CHUNK_TOKENS`` estimated tokens.
Each shard reports, per record, its line, whether it is held, its estimate and its row; the
driver lays the shards' records out in that order and cuts the same chunks from the shards'
request tables (no token ids). Each shard's token ids are in tables keyed by pool
(``keyed``): the chunks of the diagnosed sample are built with their ids on the driver (the
diagnosis reads them); every later chunk is a ``KeyedWorkload`` naming the tables and rows of
its requests, which the replay actors fetch themselves. A shard's request table is fetched when
its first chunk is cut and dropped after its last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzer.errors import PrefixcheckError, Skip, SkipLog, StrictModeError
from analyzer.executors.keyed import KeyedWorkload
from analyzer.executors.shards import (
    CACHE_COLUMNS,
    ShardMeta,
    ShardSpec,
    _size,
    expand,
    plan_shards,
)
from analyzer.ingest import CHUNK_RECORDS, CHUNK_TOKENS, Chunk, ChunkedIngest, IngestOptions
from analyzer.progress import Progress
from analyzer.records import Record
from analyzer.token_cache import CacheStats
from analyzer.tokenizer import load_tokenizer
from analyzer.workload import TokenizedLog, build_workload
from cache_models.workload import Workload, offsets_of

REPLAY_STEP = "replaying on Ray"  # the input bar's step once the shards are read
WORKLOAD_COLUMNS = (  # the request table's columns that are the workload's, not the log's
    "seq",
    "prompt_length",
    "output_length",
    "stop_finish",
    "namespace",
    *CACHE_COLUMNS,
    *(f"has_{name}" for name in CACHE_COLUMNS),
)


@dataclass(frozen=True)
class ShardRefs:
    """Where a shard's outputs are in the object store: its request table, its records, and
    per pool key (``ShardMeta.keys``) its token table."""

    table: Any
    records: Any
    tokens: tuple[Any, ...]


@dataclass
class _Shard:
    """A shard's request table as the driver uses it (fetched once, dropped after its last
    record)."""

    requests: pl.DataFrame
    columns: dict[str, np.ndarray]  # per row: the workload's columns but the token ids
    given: dict[str, np.ndarray]  # per row: whether its chunk in the shard had each column
    records: list[Record] | None
    tokens: tuple[Any, ...]  # the keyed token tables' refs
    unknown_base: int


class RayIngest(ChunkedIngest):
    """Reads the inputs with Ray tasks and yields the local reader's chunks."""

    def __init__(
        self,
        paths: Sequence[Path],
        options: IngestOptions,
        progress: Progress,
        *,
        submit: Callable[[ShardSpec, IngestOptions], Any],
        gather: Callable[
            [list[Any], Sequence[ShardSpec], Progress], list[tuple[ShardMeta, ShardRefs]]
        ],
        fetch: Callable[[Any], Any],
        split_bytes: int,
        records_budget: int | None,
    ) -> None:
        super().__init__(list(paths), options, progress)
        self.submit, self.gather, self.fetch = submit, gather, fetch
        self.split_bytes = split_bytes
        self.records_budget = records_budget  # prompt tokens whose records the diagnosis reads
        self.metas: list[ShardMeta] = []
        self.tasks_seconds = 0.0
        self.driver_tokens = 0  # token ids fetched to the driver (the diagnosed sample's)

    def report(self, step: str, requests: int | None = None) -> None:
        """Nothing: each chunk put the input bar where it is as it was cut (the driver reads no
        bytes itself, so the local reader's meter would put it back to zero)."""

    def chunks(self, chunk_records: int = CHUNK_RECORDS) -> Iterator[Chunk]:
        began = time.perf_counter()
        specs = plan_shards(self.paths, self.options, self.split_bytes)
        gathered = self.gather([self.submit(s, self.options) for s in specs], specs, self.progress)
        self.metas = metas = [meta for meta, _ in gathered]
        refs: list[ShardRefs | None] = [shard for _, shard in gathered]
        self.tasks_seconds = time.perf_counter() - began  # until every shard was read
        first_strict = next((m.strict_error for m in metas if m.strict_error), None)
        offsets = _line_offsets(metas)
        if first_strict is not None:
            meta = next(m for m in metas if m.strict_error)
            shifted = _shifted(first_strict, offsets[meta.spec.index])
            raise StrictModeError(shifted)
        files = expand(self.paths)
        self._loaded_from(metas, offsets, files)
        total_bytes = sum(_size(name) for name in files)
        shard_of, seq = _record_order(metas)
        estimated = np.concatenate([m.estimated for m in metas]) if metas else np.zeros(0)
        estimated = (
            estimated[_positions(metas, shard_of, seq)] if len(seq) else np.zeros(0, np.int64)
        )
        remaining = np.bincount(shard_of, minlength=len(metas)) if len(seq) else []
        unknown_base = np.cumsum([0] + [m.unknown_tokens for m in metas])
        cache: dict[int, _Shard] = {}
        stats_given: set[int] = set()
        read_tokens = 0
        start = 0
        while start < len(seq):
            stop = _chunk_end(estimated, start, chunk_records)
            want_records = self.records_budget is None or read_tokens < self.records_budget
            if not want_records:  # past the diagnosed sample: its records are not needed
                for held in cache.values():
                    held.records = None
                refs = [r if r is None else replace(r, records=None) for r in refs]
            shards = shard_of[start:stop]
            for s in np.unique(shards):
                if s not in cache:
                    shard_refs = refs[s]
                    assert shard_refs is not None
                    cache[s] = self._fetched(shard_refs, metas[s], offsets[s], unknown_base[s])
            tokenized, records = self._chunk(
                shards, seq[start:stop], cache, metas, offsets, stats_given, want_records
            )
            for s, count in zip(*np.unique(shards, return_counts=True), strict=True):
                remaining[s] -= count
                if remaining[s] == 0:  # the shard is done: keep only what the report names
                    del cache[s]
                    refs[s] = None
                    metas[s] = _released(metas[s])
            read_tokens += int(tokenized.workload.prompt_offsets[-1])
            start = stop
            done_bytes = total_bytes * stop // len(seq) if total_bytes else 0
            self.progress.input(REPLAY_STEP, done_bytes, total_bytes, stop)
            yield Chunk(records, tokenized)

    def _loaded_from(self, metas: list[ShardMeta], offsets: list[int], files: list[str]) -> None:
        """The local reader's LoadResult: skips, formats in file order, joins, tokenizer."""
        formats: dict[str, str] = {}
        for meta in metas:
            formats.update(meta.formats)
            self.loaded.skips.extend(
                _shifted(skip, offsets[meta.spec.index]) for skip in meta.loader_skips
            )
            self.loaded.answers_joined += meta.answers_joined
        self.loaded.formats = {name: formats[name] for name in files if name in formats}
        if any(m.tokenizer_used for m in metas) or self.options.tokenizer:
            self.tokenizer = load_tokenizer(
                self.options.tokenizer, fast=self.options.fast_tokenizer
            )
            self.renderer = None

    def _fetched(self, refs: ShardRefs, meta: ShardMeta, offset: int, unknown_base: int) -> _Shard:
        table = self.fetch(refs.table)
        given: dict[str, np.ndarray] = {}
        columns: dict[str, np.ndarray] = {}
        if table.num_columns == 0:
            requests = pl.DataFrame()
        else:
            given = {name: _numpy(table, f"has_{name}", np.bool_) for name in CACHE_COLUMNS}
            columns = {
                "prompt_length": _numpy(table, "prompt_length", np.int64),
                "output_length": _numpy(table, "output_length", np.int64),
                "namespace": _numpy(table, "namespace", np.int32),
                "stop_finish": _numpy(table, "stop_finish", np.bool_),
                **{
                    name: _numpy(table, name, dtype)
                    for name, dtype in zip(
                        CACHE_COLUMNS, (np.int64, np.bool_, np.int64, np.int64), strict=True
                    )
                },
            }
            requests = pl.from_arrow(table.drop_columns(list(WORKLOAD_COLUMNS)))
            assert isinstance(requests, pl.DataFrame)
            if offset:
                requests = requests.with_columns(pl.col("line") + offset)
        records = None
        if refs.records is not None:  # within the diagnosed sample
            records = self.fetch(refs.records)
            for record, line in zip(records, meta.lines, strict=True):
                record.line = int(line) + offset
        return _Shard(requests, columns, given, records, refs.tokens, unknown_base)

    def _chunk(
        self,
        shards: np.ndarray,
        seqs: np.ndarray,
        cache: dict[int, _Shard],
        metas: list[ShardMeta],
        offsets: list[int],
        stats_given: set[int],
        want_records: bool,
    ) -> tuple[TokenizedLog, list[Record]]:
        """One chunk's tokenized log as ``build_workload`` gives it for these records."""
        frames: list[pl.DataFrame] = []
        parts: list[tuple[int, np.ndarray]] = []  # (shard, its kept rows)
        keys: list[tuple[str, ...]] = []
        given = dict.fromkeys(CACHE_COLUMNS, False)
        rendering: list[Skip] = []
        empty: list[Skip] = []
        records: list[Record] = []
        for s, seq in _runs(shards, seqs):
            meta, shard = metas[s], cache[s]
            rows = meta.row_of[seq]
            kept = rows[rows >= 0]
            if len(kept):
                frames.append(shard.requests[kept])
                parts.append((s, kept))
                names = meta.namespace_keys
                keys.extend(names[i] for i in shard.columns["namespace"][kept])
                for name in CACHE_COLUMNS:
                    given[name] = given[name] or bool(shard.given[name][kept].any())
            if len(kept) < len(rows):
                skipped = {int(q) for q in seq[rows < 0]}
                for at, after, skip in meta.token_skips:
                    if at in skipped:
                        (empty if after else rendering).append(_shifted(skip, offsets[s]))
            if want_records and shard.records is not None:
                records.extend(shard.records[int(q)] for q in seq)
        touched = {int(s) for s in np.unique(shards)}
        stats = CacheStats.total([metas[s].token_cache for s in sorted(touched - stats_given)])
        stats_given |= touched
        skips = SkipLog(rendering + empty)
        if not frames:
            log = build_workload([], load_tokenizer(None), self._renderer(), chunk_state=self.state)
            return replace(log, skips=skips, token_cache=stats), records
        requests = pl.concat(frames, how="vertical_relaxed")
        self.state.models.update(requests["model"].fill_null("").to_list())
        ids = self.state.namespace_ids
        arrivals = requests["arrival_s"]
        workload: Workload | KeyedWorkload = _keyed_workload(
            parts,
            cache,
            metas,
            namespace=np.array([ids.setdefault(k, len(ids)) for k in keys], np.int32),
            arrival_s=None if arrivals.null_count() else arrivals.to_numpy().astype(np.float64),
            given=given,
        )
        if want_records:  # the diagnosed sample: its token ids on the driver
            workload = workload.materialize(self.fetch)
            self.driver_tokens += len(workload.prompt_tokens) + len(workload.output_tokens)
        log = TokenizedLog(
            workload=workload,
            requests=requests,
            skips=skips,
            namespace_labels=self.state.labels(),
            from_text=any(metas[s].from_text for s in touched),
            assumed_stop_finish=requests["finish_reason"].null_count(),
            token_cache=stats,
        )
        return log, records


def _released(meta: ShardMeta) -> ShardMeta:
    """A read shard's metadata without its per-record arrays (the driver's memory follows the
    shards being cut, not the log)."""
    empty = np.zeros(0, np.int64)
    return replace(
        meta,
        lines=empty,
        held=empty.astype(bool),
        estimated=empty,
        row_of=empty,
        key_of=empty,
        key_row=empty,
        token_skips=[],
        loader_skips=[],
        namespace_keys=[],
    )


def _numpy(table: Any, name: str, dtype: Any) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)


def _keyed_workload(
    parts: list[tuple[int, np.ndarray]],
    cache: dict[int, _Shard],
    metas: list[ShardMeta],
    namespace: np.ndarray,
    arrival_s: np.ndarray | None,
    given: dict[str, bool],
) -> KeyedWorkload:
    """A chunk's requests (``parts``: runs of a shard's rows, in order) as a workload whose
    token ids stay in their shards' keyed tables."""
    tables: list[Any] = []
    bases: list[int] = []
    sources, rows = [], []
    columns: dict[str, list[np.ndarray]] = {}
    first_table: dict[int, int] = {}
    for s, kept in parts:
        shard, meta = cache[s], metas[s]
        if s not in first_table:
            first_table[s] = len(tables)
            tables.extend(shard.tokens)
            bases.extend([shard.unknown_base] * len(shard.tokens))
        sources.append(first_table[s] + meta.key_of[kept])
        rows.append(meta.key_row[kept])
        for name, values in shard.columns.items():
            columns.setdefault(name, []).append(values[kept])
    joined = {name: np.concatenate(values) for name, values in columns.items()}
    return KeyedWorkload(
        tables=tuple(tables),
        unknown_base=tuple(bases),
        source=np.concatenate(sources),
        row=np.concatenate(rows),
        prompt_offsets=offsets_of(joined["prompt_length"]),
        output_offsets=offsets_of(joined["output_length"]),
        namespace=namespace,
        stop_finish=joined["stop_finish"],
        arrival_s=arrival_s,
        **{name: joined[name] if given[name] else None for name in CACHE_COLUMNS},
    )


def _line_offsets(metas: list[ShardMeta]) -> list[int]:
    """Per shard: the lines of its file before it (byte ranges after the first)."""
    offsets, seen = [], {}
    for meta in metas:
        spec = meta.spec
        if spec.start is None or spec.end is None:
            offsets.append(0)
            continue
        offsets.append(seen.get(spec.files[0], 0))
        seen[spec.files[0]] = offsets[-1] + meta.range_lines
    return offsets


def _shifted(skip: Skip, offset: int) -> Skip:
    return skip if not offset else Skip(skip.file, skip.line + offset, skip.reason)


def _record_order(metas: list[ShardMeta]) -> tuple[np.ndarray, np.ndarray]:
    """(shard, record) of every record in the local reader's order: in file order, those with
    a request id after all the others."""
    parts = [
        (np.full(int(mask.sum()), m.spec.index, np.int64), np.flatnonzero(mask))
        for held in (False, True)
        for m in metas
        for mask in [m.held == held]
    ]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _positions(metas: list[ShardMeta], shard_of: np.ndarray, seq: np.ndarray) -> np.ndarray:
    starts = np.cumsum([0] + [len(m.estimated) for m in metas])
    return starts[shard_of] + seq


def _chunk_end(estimated: np.ndarray, start: int, limit: int) -> int:
    """Where ``ingest._take`` ends the chunk that starts at ``start``."""
    window = np.cumsum(estimated[start : start + limit])
    full = np.flatnonzero(window >= CHUNK_TOKENS)
    return start + (int(full[0]) + 1 if len(full) else len(window))


def _runs(shards: np.ndarray, seqs: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Consecutive records of the same shard."""
    cuts = np.flatnonzero(np.diff(shards)) + 1
    for begin, end in zip([0, *cuts], [*cuts, len(shards)], strict=True):
        yield int(shards[begin]), seqs[begin:end]


def failure(spec: ShardSpec, exc: BaseException) -> PrefixcheckError:
    """A task's error as the run's: the reader's own message when it raised one, else the lost
    worker or task, naming the shard."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, PrefixcheckError):
        return PrefixcheckError(str(cause))
    if isinstance(exc, PrefixcheckError) and not type(exc).__module__.startswith("ray"):
        return exc
    detail = str(cause or exc).strip().splitlines()
    reason = detail[-1] if detail else type(exc).__name__
    return PrefixcheckError(
        f"ray: ingest shard {spec.index} ({spec.label}) failed: {type(exc).__name__}: {reason}; "
        "no report written"
    )
