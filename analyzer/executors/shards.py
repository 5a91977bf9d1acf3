"""Ingest shards: the inputs cut into pieces that workers read independently, and what reading
one piece gives (an Arrow table of its requests' token ids and metadata, plus what the local
reader needs to put the pieces back into the exact order, numbering and chunks of a local read).

A shard is a whole file, a byte range of a large uncompressed line file (cut on line
boundaries), or every file of the formats whose answers are joined by request id across files
(server logs, Batch files), which must be read together. Each shard runs the loaders, chat
rendering and tokenizer (with the token cache) of a local run. Its records are numbered by a
sequence number while they are tokenized, so that each row and skip maps back to its record.
Needs no Ray: Ray only runs ``ingest_shard`` on a worker.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import polars as pl
import zstandard

from analyzer import errors
from analyzer.errors import PrefixcheckError, Skip, StrictModeError
from analyzer.ingest import CHUNK_RECORDS, ChunkedIngest, IngestOptions, _estimated_tokens
from analyzer.loaders import (
    DETECTION_BYTES,
    DETECTION_TEXT_LINES,
    FORMATS,
    MAPPED,
    _chosen_format,
    _configured,
    _parse_items,
    _Peeked,
)
from analyzer.loaders.joins import Answer
from analyzer.loaders.sources import (
    COMPRESSED_SUFFIXES,
    STDIN,
    _lines,
    _one_json_value,
    base_suffix,
    expand_inputs,
)
from analyzer.progress import NoProgress
from analyzer.records import Record
from analyzer.token_cache import CacheStats
from cache_models.workload import Workload

if TYPE_CHECKING:
    import pyarrow as pa

# Formats whose lines answer requests on other lines (or files) by request id: read together.
JOINED_FORMATS = frozenset({"openai-batch", "vllm-log", "sglang-log"})
WHOLE_FILE_SUFFIXES = (".parquet", ".csv")  # read as a whole (rows, a header line)
EMPTY_PROMPT = "prompt has no tokens"  # the tokenizer's skip, after every rendering skip
_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):/+")


@dataclass(frozen=True)
class ShardSpec:
    """One piece of the inputs: ``files`` read whole (``start`` None), or bytes
    ``[start, end)`` of ``files[0]`` in ``format_name``."""

    index: int
    files: tuple[str, ...]
    start: int | None = None
    end: int | None = None
    format_name: str | None = None  # a range's (or a URI's) format, detected from its file's head

    @property
    def size(self) -> int:
        """The shard's bytes on disk (compressed files: their compressed size)."""
        if self.start is not None and self.end is not None:
            return self.end - self.start
        return sum(_size(name) for name in self.files)

    @property
    def label(self) -> str:
        """The shard as an error message names it."""
        if self.start is None:
            return ", ".join(self.files) if len(self.files) <= 3 else f"{len(self.files)} files"
        return f"{self.files[0]} bytes {self.start:,}-{self.end:,}"


@dataclass
class ShardMeta:
    """What a shard's reading found, besides its table (small; the driver holds every one)."""

    spec: ShardSpec
    lines: np.ndarray  # per record (sequence number): its line in the shard (ranges: from 1)
    held: np.ndarray  # per record: held until every file is read (it has a request id)
    estimated: np.ndarray  # per record: the chunker's token estimate
    row_of: np.ndarray  # per record: its row in the table, -1 when it was skipped
    token_skips: list[tuple[int, bool, Skip]]  # (record, after rendering?, skip), in order
    namespace_keys: list[tuple[str, ...]] = field(default_factory=list)  # by the table's ids
    loader_skips: list[Skip] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    answers_joined: int = 0
    range_lines: int = 0  # lines in a byte range (to number the next range's)
    unknown_tokens: int = 0  # unique negative output ids used, from -1 down
    tokenizer_used: bool = False
    from_text: bool = False
    token_cache: CacheStats = field(default_factory=CacheStats)
    strict_error: Skip | None = None  # the first bad line under --strict (shard numbering)
    prompt_tokens: int = 0
    seconds: float = 0.0
    worker: str = ""
    keys: list[str] = field(default_factory=list)  # pool keys (models) of the keyed tables
    key_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per table row
    key_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # its keyed row


# ---------------------------------------------------------------------------------------------
# Planning (on the driver)


def restore_uri(name: str) -> str:
    """A URI as typer's Path argument left it (``s3:/b/k``) with its ``//`` back."""
    match = _URI.match(name)
    if match and len(match.group(1)) > 1:  # not a Windows drive letter
        scheme, rest = match.group(1), name[match.end() :]
        return f"file:///{rest}" if scheme == "file" else f"{scheme}://{rest}"
    return name


def expand(paths: Sequence[str | Path]) -> list[str]:
    """Every input file in the local reader's order; object-store URIs (and their globs)
    through pyarrow.fs."""
    files: list[str] = []
    for item in map(str, paths):
        item = restore_uri(item)
        if item == STDIN:
            raise PrefixcheckError("--executor ray cannot read standard input: pass files")
        files.extend(_expand_uri(item) if _URI.match(item) else expand_inputs([item]))
    return files


def _filesystem(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # pyarrow's ArrowInvalid / ArrowNotImplementedError, OSError
        raise PrefixcheckError(f"{uri}: no filesystem for this URI ({exc})") from None


def _expand_uri(uri: str) -> list[str]:
    import pyarrow.fs as pafs

    scheme = uri[: uri.index(":")]
    fs, path = _filesystem(uri)
    if not any(char in path for char in "*?["):
        return [uri]
    base = path[: min(path.index(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    found = sorted(i.path for i in infos if i.type == pafs.FileType.File)
    matched = [p for p in found if fnmatch.fnmatchcase(p, path)]
    if not matched:
        raise PrefixcheckError(f"{uri}: no file matches this pattern")
    prefix = "file://" if scheme == "file" else f"{scheme}://"
    return [prefix + p.lstrip("/") if scheme != "file" else prefix + p for p in matched]


def plan_shards(
    paths: Sequence[str | Path], options: IngestOptions, split_bytes: int
) -> list[ShardSpec]:
    """The shards of the inputs in the local reader's order; a format unknown in a file's head
    fails here, as it does locally."""
    joined: list[str] = []
    pieces: list[tuple[tuple[str, ...], int | None, int | None, str | None]] = []
    for name in expand(paths):
        uri = bool(_URI.match(name))
        suffix = base_suffix(name)
        compressed = name.endswith(COMPRESSED_SUFFIXES)
        if suffix in WHOLE_FILE_SUFFIXES:
            if uri:
                raise PrefixcheckError(
                    f"{name}: Parquet and CSV inputs are read from a path every worker can "
                    "open, not a URI"
                )
            pieces.append(((name,), None, None, None))
            continue
        head = _head_lines(name)
        if suffix == ".json" and head and _one_json_value(head[:2]):
            if uri:
                raise PrefixcheckError(f"{name}: a JSON-array file is read from a path, not a URI")
            pieces.append(((name,), None, None, None))
            continue
        peeked = _Peeked(head, iter(()), objects=False)
        log_format = _chosen_format(name, peeked, options.format, options.fields)
        if log_format.name in JOINED_FORMATS:
            if uri:
                raise PrefixcheckError(f"{name}: {log_format.name} files are read from paths")
            joined.append(name)
            continue
        size = _size(name)
        if compressed or size <= split_bytes:
            pieces.append(((name,), 0 if uri else None, None, log_format.name if uri else None))
            continue
        starts = _line_starts(name, size, split_bytes)
        for start, end in zip(starts, [*starts[1:], size], strict=True):
            pieces.append(((name,), start, end, log_format.name))
    specs = [ShardSpec(i, *piece) for i, piece in enumerate(pieces)]
    if joined:  # requests before the answers that join them: read after, as locally
        specs.append(ShardSpec(len(specs), tuple(joined)))
    return specs


def _head_lines(name: str) -> list[tuple[int, Any]]:
    """The lines format detection reads (as ``loaders._peek`` bounds them)."""
    head: list[tuple[int, Any]] = []
    size = 0
    with open_input(name) as handle:
        for number, line in _lines(handle):
            head.append((number, line))
            size += len(line) if isinstance(line, bytes) else 0
            if len(head) >= DETECTION_TEXT_LINES or size >= DETECTION_BYTES:
                break
    return head


def _size(name: str) -> int:
    if not _URI.match(name):
        try:
            return os.path.getsize(name)
        except OSError as exc:
            raise PrefixcheckError(f"{name}: cannot read: {exc.strerror or exc}") from None
    fs, path = _filesystem(name)
    return int(fs.get_file_info(path).size)


def _line_starts(name: str, size: int, step: int) -> list[int]:
    """Range starts about ``step`` bytes apart, each at the start of a line."""
    starts = [0]
    with open_input(name, seekable=True) as handle:
        position = step
        while position < size:
            handle.seek(position - 1)
            found = -1
            while found < 0:
                block = handle.read(1 << 16)
                if not block:
                    return starts
                found = block.find(b"\n")
                position += len(block) if found < 0 else 0
            start = handle.tell() - len(block) + found + 1
            if start >= size:
                break
            starts.append(start)
            position = start + step
    return starts


@contextmanager
def open_input(name: str, *, seekable: bool = False) -> Iterator[IO[bytes]]:
    """The bytes of a file or URI (decompressed unless ``seekable``)."""
    if _URI.match(name):
        fs, path = _filesystem(name)
        try:
            raw: Any = fs.open_input_file(path)
        except OSError as exc:
            raise PrefixcheckError(f"{name}: cannot read: {exc}") from None
    else:
        try:
            raw = Path(name).open("rb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise PrefixcheckError(f"{name}: cannot read: {exc.strerror or exc}") from None
    with raw:
        if seekable or not name.endswith(COMPRESSED_SUFFIXES):
            yield raw if not _URI.match(name) else io.BufferedReader(_Readable(raw), 1 << 20)
        elif name.endswith(".gz"):
            yield gzip.GzipFile(fileobj=raw)  # type: ignore[arg-type]
        else:
            yield io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), 1 << 20)


class _Readable(io.RawIOBase):
    """A pyarrow file as a Python raw stream (so it can be buffered and iterated by line)."""

    def __init__(self, native: Any) -> None:
        self.native = native

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.native.seek(offset, whence)

    def tell(self) -> int:
        return self.native.tell()

    def readinto(self, buffer: Any) -> int:
        data = self.native.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


# ---------------------------------------------------------------------------------------------
# Reading one shard (on a worker)


class _LoaderStrict(Exception):
    def __init__(self, skip: Skip) -> None:
        self.skip = skip


class ShardReader(ChunkedIngest):
    """The local reader over one shard, numbering its records as they are read."""

    def __init__(self, spec: ShardSpec, options: IngestOptions) -> None:
        super().__init__(list(spec.files), options, NoProgress())
        self.spec = spec
        self.lines: list[int] = []
        self.held: list[bool] = []
        self.estimated: list[int] = []
        self.range_lines = 0

    def _read(self) -> Iterator[Record]:
        """The records ``chunks`` cuts: numbered here, so never as Columns."""
        return self.records()

    def records(self) -> Iterator[Record]:
        source = super().records() if self.spec.format_name is None else self._range_records()
        try:
            for record in source:
                self.lines.append(record.line)
                self.held.append(record.request_id is not None)
                self.estimated.append(_estimated_tokens(record))
                record.line = len(self.lines) - 1
                yield record
        except StrictModeError as exc:
            raise _LoaderStrict(exc.skip) from None

    def _range_records(self) -> Iterator[Record]:
        """``iter_records`` over a byte range, in its file's format (no answers in these)."""
        spec, options, loaded = self.spec, self.options, self.loaded
        name = spec.files[0]
        log_format = MAPPED if spec.format_name == MAPPED.name else FORMATS[spec.format_name or ""]
        loaded.formats[name] = log_format.name
        parse, batch = _configured(log_format, options.hash_block_size, options.fields)
        items = _Peeked([], self._lines(name), objects=False)
        held: list[Record] = []
        for item in _parse_items(name, items, log_format, parse, batch, options.fields):
            loaded.lines_read += 1
            if isinstance(item, Skip):
                if options.strict:
                    raise StrictModeError(item)
                loaded.skips.append(item)
                continue
            if isinstance(item, Answer):  # pragma: no cover (joined formats are not split)
                raise PrefixcheckError(f"{name}: an answer line in a split file")
            for record in item if isinstance(item, list) else [item]:
                if record.request_id is not None:
                    held.append(record)
                else:
                    yield record
        yield from held

    def _lines(self, name: str) -> Iterator[tuple[int, Any]]:
        """The range's lines numbered from 1, long lines bounded as the local reader bounds
        them."""
        spec = self.spec
        with open_input(name, seekable=spec.end is not None) as handle:
            if spec.end is not None:
                handle.seek(spec.start or 0)
                handle = io.BytesIO(handle.read(spec.end - (spec.start or 0)))
            for number, line in _lines(handle):
                self.range_lines = number
                yield number, line


def ingest_shard(spec: ShardSpec, options: IngestOptions) -> Iterator[Any]:
    """Read, render and tokenize one shard; yields its metadata, its requests' table (one row
    per request: the local reader's columns, ``seq`` its record, the lengths and cache columns
    of its workload, no token ids), its records (for the diagnosis of the leading sample), then
    per pool key (``meta.keys``) the Arrow table of that key's token ids
    (``keyed.keyed_tables``). A Ray generator task: each yield is an object of its own, so each
    replay actor fetches only its key's tables."""
    import socket
    import time

    from analyzer.executors.keyed import Keyed, keyed_tables
    from analyzer.pool import model_labels

    began = time.perf_counter()
    reader = ShardReader(spec, options)
    strict: Skip | None = None
    chunks = []
    try:
        with _every_skip_kept():  # the driver counts them into the local run's chunks
            for chunk in reader.chunks(CHUNK_RECORDS):
                chunks.append(chunk)
    except _LoaderStrict as exc:
        strict = exc.skip
    except StrictModeError as exc:
        strict = Skip(exc.skip.file, reader.lines[exc.skip.line], exc.skip.reason)
    lines = np.asarray(reader.lines, np.int64)
    logs = [c.tokenized for c in chunks if c.tokenized.workload.n_requests]
    table, seq, workload = _table(logs, lines)
    row_of = np.full(len(lines), -1, np.int64)
    row_of[seq] = np.arange(len(seq))
    keyed = (
        Keyed([], np.zeros(0, np.int64), np.zeros(0, np.int64), [])
        if workload is None
        else keyed_tables(workload, model_labels(pl.Series(table.column("model"))))
    )
    token_skips = [
        (s.line, s.reason == EMPTY_PROMPT, Skip(s.file, int(lines[s.line]), s.reason))
        for c in chunks
        for s in c.tokenized.skips
    ]
    records = [r for c in chunks for r in c.records]
    meta = ShardMeta(
        spec=spec,
        lines=lines,
        held=np.asarray(reader.held, bool),
        estimated=np.asarray(reader.estimated, np.int64),
        row_of=row_of,
        token_skips=token_skips,
        namespace_keys=list(reader.state.namespace_ids),
        loader_skips=list(reader.loaded.skips),
        formats=dict(reader.loaded.formats),
        answers_joined=reader.loaded.answers_joined,
        range_lines=reader.range_lines,
        unknown_tokens=-reader.state.next_unknown - 1,
        tokenizer_used=reader.tokenizer is not None,
        from_text=any(c.tokenized.from_text for c in chunks),
        token_cache=CacheStats.total([c.tokenized.token_cache for c in chunks]),
        strict_error=strict,
        prompt_tokens=sum(int(c.tokenized.workload.prompt_offsets[-1]) for c in chunks),
        seconds=time.perf_counter() - began,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        keys=keyed.keys,
        key_of=keyed.key_of,
        key_row=keyed.key_row,
    )
    yield meta
    yield table
    yield records
    for table in keyed.tables:  # not ``yield from`` a list: Ray's generator calls send()
        yield table


@contextmanager
def _every_skip_kept() -> Iterator[None]:
    """SkipLogs that keep every skip of this shard (a shard's lines bound them)."""
    saved = errors.SKIPS_KEPT, errors.REASON_KINDS_KEPT
    errors.SKIPS_KEPT = errors.REASON_KINDS_KEPT = sys.maxsize
    try:
        yield
    finally:
        errors.SKIPS_KEPT, errors.REASON_KINDS_KEPT = saved


# Workload's optional columns
CACHE_COLUMNS = ("priority", "skip_prefix_lookup", "hit_limit", "max_new_tokens")


def _table(logs: list, lines: np.ndarray) -> tuple[pa.Table, np.ndarray, Workload | None]:
    """The shard's requests as one table (no token ids: their lengths), their records, and
    their workload (None: no request)."""
    import pyarrow as pa

    from cache_models.workload import concat_workloads

    if not logs:
        return pa.table({}), np.zeros(0, np.int64), None
    requests = pl.concat([log.requests for log in logs], how="vertical_relaxed")
    workload = concat_workloads([log.workload for log in logs])
    seq = requests["line"].to_numpy().astype(np.int64)
    requests = requests.with_columns(pl.Series("line", lines[seq]), pl.Series("seq", seq))
    table = requests.to_arrow()
    table = table.append_column("prompt_length", pa.array(np.diff(workload.prompt_offsets)))
    table = table.append_column("output_length", pa.array(np.diff(workload.output_offsets)))
    table = table.append_column("stop_finish", pa.array(workload.stop_finish, pa.bool_()))
    table = table.append_column("namespace", pa.array(workload.namespace, pa.int32()))
    filled = {
        "priority": workload.priorities,
        "skip_prefix_lookup": workload.skips_lookup,
        "hit_limit": workload.hit_limits,
        "max_new_tokens": workload.max_new_tokens_given,
    }
    for name in CACHE_COLUMNS:
        given = np.concatenate(
            [
                np.full(log.workload.n_requests, getattr(log.workload, name) is not None)
                for log in logs
            ]
        )
        table = table.append_column(name, pa.array(filled[name]))
        table = table.append_column(f"has_{name}", pa.array(given, pa.bool_()))
    return table, seq, workload
