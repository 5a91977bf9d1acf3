"""Input sources: files, folders, globs and ``-`` (standard input); ``.gz`` and ``.zst`` are read
through their decompressors, ``.parquet``, ``.csv`` and JSON-array files row by row."""

from __future__ import annotations

import contextlib
import csv
import glob
import gzip
import io
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import zstandard

from analyzer.errors import PrefixcheckError

STDIN = "-"
LOG_SUFFIXES = (".jsonl", ".ndjson", ".json", ".log", ".txt", ".parquet", ".csv")
COMPRESSED_SUFFIXES = (".gz", ".zst")
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
    """Every file named: a folder gives its log files (sorted, recursively), a glob its matches."""
    files: list[str] = []
    for item in map(str, inputs):
        if item == STDIN:
            files.append(STDIN)
        elif Path(item).is_dir():
            found = sorted(
                str(p) for p in Path(item).rglob("*") if p.is_file() and _is_log_file(p.name)
            )
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


@contextlib.contextmanager
def open_binary(name: str) -> Iterator[IO[bytes]]:
    """The decompressed bytes of a file (or of standard input)."""
    if name == STDIN:
        yield sys.stdin.buffer
        return
    try:
        raw = Path(name).open("rb")  # noqa: SIM115 (closed below, after the error check)
    except OSError as exc:
        raise PrefixcheckError(f"{name}: cannot read: {exc.strerror or exc}") from None
    with raw:
        if name.endswith(".gz"):
            yield gzip.GzipFile(fileobj=raw)
        elif name.endswith(".zst"):
            yield io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), 1 << 20)
        else:
            yield raw


def iter_raw_lines(name: str) -> Iterator[tuple[int, bytes]]:
    """``(line_number, bytes)`` for every line, numbered from 1."""
    with open_binary(name) as handle:
        try:
            yield from enumerate(handle, 1)
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            raise PrefixcheckError(f"{name}: cannot decompress: {exc}") from None


def iter_rows(name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a Parquet file as dicts, numbered from 1, JSON-text fields decoded."""
    import polars as pl

    try:
        with open_binary(name) as handle:
            frame = pl.read_parquet(handle)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise PrefixcheckError(f"{name}: not a readable Parquet file ({exc})") from None
    for number, row in enumerate(frame.iter_rows(named=True), 1):
        yield number, decode_json_text(row)


def iter_csv_rows(name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a CSV export with a header line (Helicone's, Langfuse's), numbered by their
    line in the file: empty cells are None, whole numbers ints, JSON-text fields decoded."""
    with open_binary(name) as handle:
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


def iter_json_array(name: str, first: bytes) -> Iterator[tuple[int, Any]]:
    """The items of a file that holds one JSON array (ShareGPT datasets, UI exports), or one
    object whose ``data`` is the array (a saved API response: Langfuse's, Helicone's). A comma
    before the closing bracket (Helicone's JSON export writes one) is accepted."""
    with open_binary(name) as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
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
