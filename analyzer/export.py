"""Per-request tables written by the file's extension: .jsonl, .csv or .parquet."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analyzer.errors import PrefixcheckError

WRITERS = {".jsonl": "write_ndjson", ".ndjson": "write_ndjson", ".csv": "write_csv"}


def write_table(frame: pl.DataFrame, path: Path) -> None:
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            frame.write_parquet(path)
        elif suffix in WRITERS:
            getattr(frame, WRITERS[suffix])(path)
        else:
            raise PrefixcheckError(f"{path}: unknown table format; use .jsonl, .csv or .parquet")
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot write: {exc.strerror or exc}") from None
