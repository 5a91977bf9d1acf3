"""Input sources: files, folders, globs, named pipes and ``-`` (standard input); ``.gz`` and
``.zst`` are read through their decompressors, ``.parquet``, ``.csv`` and JSON-array files row by
row.

Every source is opened once (a pipe cannot be read twice); lines are read with a bound on their
size, and a truncated compressed file is an error, not a shorter log."""

from __future__ import annotations

import contextlib
import csv
import glob
import gzip
import io
import json
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, Any

import zstandard

from analyzer.errors import PrefixcheckError

STDIN = "-"
LOG_SUFFIXES = (".jsonl", ".ndjson", ".json", ".log", ".txt", ".parquet", ".csv")
COMPRESSED_SUFFIXES = (".gz", ".zst")
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, which some Windows tools write first
READ_BUFFER_BYTES = 1 << 20  # a file's read buffer
MAX_LINE_BYTES = 64 << 20  # a longer line is a counted skip, never read into memory whole
MAX_JSON_ARRAY_BYTES = 1 << 30  # a .json array file is parsed whole, so its size is bounded
# Fields that exports (Parquet, CSV-born JSON) often hold as JSON text instead of nested values.
JSON_TEXT_FIELDS = frozenset(
    {
        "messages",
        "tools",
        "request",
        "response",
        "body",
        "input",
        "output",
        "conversations",
        "conversation",
        "hash_ids",
        "prompt_token_ids",
        "output_token_ids",
        "request_body",
        "response_body",
        "metadata",
        "usage",
        "usageDetails",
        "model_parameters",
        "modelParameters",
    }
)


def expand_inputs(inputs: Sequence[str | Path]) -> list[str]:
    """Every file named: a folder gives its log files (sorted, recursively), a glob its matches.

    A folder that cannot be listed (permissions) is an error naming it, never a silent gap.
    """
    files: list[str] = []
    for item in map(str, inputs):
        if item == STDIN:
            files.append(STDIN)
        elif Path(item).is_dir():
            found = sorted(_log_files_under(item))
            if not found:
                raise PrefixcheckError(f"{item}: no log files in this folder")
            files.extend(found)
        elif any(char in item for char in "*?[") and not Path(item).exists():
            matched = sorted(p for p in glob.glob(item, recursive=True) if Path(p).is_file())
            if not matched:
                raise PrefixcheckError(f"{item}: no file matches this pattern")
            files.extend(matched)
        else:
            files.append(item)
    return files


def _log_files_under(folder: str) -> Iterator[str]:
    """The log files below ``folder``, following links to folders once each (no cycles)."""
    seen: set[tuple[int, int]] = set()

    def unreadable(exc: OSError) -> None:
        where = exc.filename or folder
        raise PrefixcheckError(f"{where}: cannot read this folder: {exc.strerror or exc}")

    for top, dirs, names in os.walk(folder, onerror=unreadable, followlinks=True):
        info = os.stat(top)
        if (info.st_dev, info.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        for name in names:
            path = os.path.join(top, name)
            if _is_log_file(name) and os.path.isfile(path):
                yield path


def _is_log_file(name: str) -> bool:
    base = name
    for suffix in COMPRESSED_SUFFIXES:
        base = base.removesuffix(suffix)
    return base.endswith(LOG_SUFFIXES)


def base_suffix(name: str) -> str:
    """The suffix that names the content: ``.parquet`` for ``x.parquet``, ``.jsonl`` for
    ``x.jsonl.gz``."""
    for suffix in COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            return Path(name.removesuffix(suffix)).suffix.lower()
    return Path(name).suffix.lower()


@dataclass
class ReadMeter:
    """How far the readers are through the input files, in bytes as stored (compressed bytes
    for ``.gz`` / ``.zst``): the measure of the progress bar and its time left."""

    total: int | None = None  # the files' sizes; None when one is standard input or a pipe
    _done: dict[str, int] = field(default_factory=dict)  # files read to the end
    _open: dict[str, IO[bytes]] = field(default_factory=dict)

    def expect(self, names: Sequence[str]) -> None:
        """The files about to be read (their sizes make the total)."""
        try:
            regular = all(n != STDIN and stat.S_ISREG(os.stat(n).st_mode) for n in names)
            self.total = sum(os.path.getsize(n) for n in names) if regular else None
        except OSError:
            self.total = None  # a file that cannot be read fails with its name when opened

    def position(self) -> int:
        position = sum(self._done.values())
        for name, handle in self._open.items():
            if name not in self._done:
                with contextlib.suppress(OSError, ValueError):
                    position += handle.tell()
        return position if self.total is None else min(position, self.total)

    def opened(self, name: str, raw: IO[bytes]) -> None:
        self._open[name] = raw

    def closed(self, name: str, raw: IO[bytes]) -> None:
        if self._open.get(name) is not raw:  # a detection pass over a file read again
            return
        with contextlib.suppress(OSError, ValueError):
            self._done[name] = os.fstat(raw.fileno()).st_size
        del self._open[name]


@contextlib.contextmanager
def open_binary(name: str, meter: ReadMeter | None = None) -> Iterator[IO[bytes]]:
    """The decompressed bytes of a file, a named pipe or standard input, opened once.

    Devices and sockets are refused (``/dev/zero`` never ends); a truncated or corrupt ``.gz``
    or ``.zst`` raises a PrefixcheckError naming the file when its end is read.
    """
    if name == STDIN:
        yield sys.stdin.buffer
        return
    try:
        kind = os.stat(name).st_mode
        if not (stat.S_ISREG(kind) or stat.S_ISFIFO(kind)):
            raise PrefixcheckError(f"{name}: not a regular file or a named pipe")
        # Closed below, after the error check. A large buffer: a read a MiB, not one of 8 KiB
        # for every other line of a log.
        raw = Path(name).open("rb", buffering=READ_BUFFER_BYTES)  # noqa: SIM115
    except OSError as exc:
        raise PrefixcheckError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if meter is not None:
        meter.opened(name, raw)
    with raw:
        try:
            if name.endswith(".gz"):
                yield gzip.GzipFile(fileobj=raw)
            elif name.endswith(".zst"):
                yield io.BufferedReader(_ZstdReader(raw, name), 1 << 20)
            else:
                yield raw
        finally:
            if meter is not None:
                meter.closed(name, raw)


class _ZstdReader(io.RawIOBase):
    """A zstd stream, frame after frame; input that ends inside a frame is an error (the
    ``zstandard`` stream reader returns what it has and stops, silently)."""

    def __init__(self, raw: IO[bytes], name: str) -> None:
        self._raw = raw
        self._name = name
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._started = False  # the current frame has had input
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if self._started and not self._frame.eof:
                    raise PrefixcheckError(
                        f"{self._name}: truncated zstd data (the file ends inside a frame)"
                    )
                return 0
            self._pending = self._feed(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _feed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            if self._frame.eof:
                self._frame = zstandard.ZstdDecompressor().decompressobj()
            self._started = True
            try:
                out.append(self._frame.decompress(chunk))
            except zstandard.ZstdError as exc:
                raise PrefixcheckError(f"{self._name}: corrupt zstd data ({exc})") from None
            chunk = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)


@dataclass(frozen=True)
class LongLine:
    """A line longer than MAX_LINE_BYTES: its bytes are not kept, only its size."""

    size: int


def read_items(name: str, meter: ReadMeter | None = None) -> tuple[bool, Iterator[tuple[int, Any]]]:
    """Open a source once and give its items numbered from 1, and whether they are objects
    (a JSON-array file's items, Parquet rows) rather than raw lines (bytes, or a LongLine)."""
    if base_suffix(name) == ".parquet":
        return True, iter_rows(name, meter)
    if base_suffix(name) == ".csv":
        return True, iter_csv_rows(name, meter)
    items = _items(name, meter)
    objects = next(items)
    assert isinstance(objects, bool)
    return objects, items  # type: ignore[return-value]


def _items(name: str, meter: ReadMeter | None = None) -> Iterator[Any]:
    with open_binary(name, meter) as handle:
        try:
            if base_suffix(name) != ".json":
                yield False
                yield from _lines(handle)
                return
            lead = handle.peek(1 << 16)[:4096] if hasattr(handle, "peek") else b""
            if lead.removeprefix(BOM).lstrip()[:1] == b"[":
                yield True
                yield from _json_value(name, handle.read(MAX_JSON_ARRAY_BYTES + 1))
                return
            lines = _lines(handle)
            head = list(islice(lines, 2))
            if _one_json_value(head):
                start = b"".join(line for _, line in head if isinstance(line, bytes))
                yield True
                yield from _json_value(name, start + handle.read(MAX_JSON_ARRAY_BYTES + 1))
                return
            yield False
            yield from head
            yield from lines
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            raise PrefixcheckError(f"{name}: cannot decompress: {exc}") from None


def _one_json_value(head: list[tuple[int, Any]]) -> bool:
    """Whether a .json file is one JSON value (an array, or an API response ``{"data": [...]}``
    printed over many lines or on one) rather than JSON lines, from its first two lines."""
    if not head or not isinstance(head[0][1], bytes):
        return False
    first = head[0][1].removeprefix(BOM).strip()
    if first[:1] == b"[" or first == b"{":  # an array, or an object printed over several lines
        return True
    if first[:1] != b"{" or len(head) > 1:
        return False
    try:
        value = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and isinstance(value.get("data"), list)


def _lines(handle: IO[bytes]) -> Iterator[tuple[int, bytes | LongLine]]:
    """Each line with its number; a UTF-8 byte-order mark before the first is dropped."""
    number = 0
    while line := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if number == 1:
            line = line.removeprefix(BOM)
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield number, line
            continue
        size = len(line)
        while not line.endswith(b"\n") and (line := handle.readline(1 << 20)):
            size += len(line)
        yield number, LongLine(size)


def iter_rows(name: str, meter: ReadMeter | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a Parquet file as dicts, numbered from 1, JSON-text fields decoded."""
    import polars as pl

    try:
        with open_binary(name, meter) as handle:
            frame = pl.read_parquet(handle)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise PrefixcheckError(f"{name}: not a readable Parquet file ({exc})") from None
    for number, row in enumerate(frame.iter_rows(named=True), 1):
        yield number, decode_json_text(row)


def iter_csv_rows(
    name: str, meter: ReadMeter | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a CSV export with a header line (Helicone's, Langfuse's), numbered by their
    line in the file: empty cells are None, whole numbers ints, JSON-text fields decoded."""
    with open_binary(name, meter) as handle:
        text = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")
        reader = csv.DictReader(text)
        try:
            start = 2
            for row in reader:
                cells = {key: _csv_value(value) for key, value in row.items() if key is not None}
                yield start, decode_json_text(cells)
                start = reader.line_num + 1
        except (csv.Error, UnicodeDecodeError) as exc:
            raise PrefixcheckError(f"{name}:{reader.line_num}: not readable CSV ({exc})") from None


def _csv_value(value: str | None) -> Any:
    if value is None or value == "":
        return None
    if value.isdigit():
        return int(value)
    return value


def _json_value(name: str, raw: bytes) -> Iterator[tuple[int, Any]]:
    """The items of a source that holds one JSON array (ShareGPT datasets, UI exports), or one
    object whose ``data`` is the array (a saved API response: Langfuse's, Helicone's), read
    whole: at most MAX_JSON_ARRAY_BYTES. A comma before the closing bracket (Helicone's JSON
    export writes one) is accepted."""
    if len(raw) > MAX_JSON_ARRAY_BYTES:
        raise PrefixcheckError(
            f"{name}: a JSON value over {MAX_JSON_ARRAY_BYTES >> 20} MiB; write it as JSON "
            "Lines (one object per line), which is read line by line"
        )
    first = raw.removeprefix(BOM).lstrip()[:1]
    try:
        text = raw.decode("utf-8-sig")
        del raw
        try:
            items = json.loads(text)
        except ValueError:
            trimmed = _TRAILING_COMMA.sub("]", text)
            if trimmed == text:
                raise
            items = json.loads(trimmed)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PrefixcheckError(
            f"{name}: starts with {first[:1]!r} but is not JSON ({exc})"
        ) from None
    except RecursionError:
        raise PrefixcheckError(f"{name}: JSON nested too deeply to read") from None
    if isinstance(items, dict) and isinstance(items.get("data"), list):
        items = items["data"]
    if not isinstance(items, list):
        raise PrefixcheckError(f"{name}: expected a JSON array of objects")
    yield from enumerate(items, 1)


_TRAILING_COMMA = re.compile(r",\s*\]\s*$")


def decode_json_text(row: dict[str, Any]) -> dict[str, Any]:
    """Decode the fields that exports store as JSON text; anything else is left as it is."""
    for key in JSON_TEXT_FIELDS.intersection(row):
        value = row[key]
        if isinstance(value, str) and value[:1] in ("[", "{"):
            with contextlib.suppress(ValueError):
                row[key] = json.loads(value)
    return row
