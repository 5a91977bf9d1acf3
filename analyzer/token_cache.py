"""The tokenization cache: token ids on disk, keyed by tokenizer fingerprint and text hash, so a
second run over the same log skips tokenization.

Layout: ``<cache dir>/tokens/<fingerprint>/<run>.parquet``, one file per run that tokenized
something, columns ``key`` (16-byte BLAKE2b of the text and the special-tokens flag) and ``ids``
(the int32 ids, little-endian, as one binary value: far faster to write and read than a list
column). The cache dir follows each platform's convention: ``$XDG_CACHE_HOME/prefixcheck``
or ``~/.cache/prefixcheck`` on Linux, ``~/Library/Caches/prefixcheck`` on macOS,
``%LOCALAPPDATA%\\prefixcheck\\Cache`` on Windows; ``PREFIXCHECK_CACHE_DIR`` overrides it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analyzer.progress import NoProgress, Progress
from analyzer.tokenizer import Tokenizer

BATCH = 4096


def default_cache_dir() -> Path:
    """Where prefixcheck keeps its cache on this platform."""
    if override := os.environ.get("PREFIXCHECK_CACHE_DIR"):
        return Path(override)
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "prefixcheck" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "prefixcheck"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "prefixcheck"


def text_key(text: str, add_special_tokens: bool) -> bytes:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    digest.update(b"\x01" if add_special_tokens else b"\x00")
    return digest.digest()


@dataclass
class CacheStats:
    texts: int = 0  # texts asked for
    from_cache: int = 0  # distinct texts found on disk
    tokenized: int = 0  # distinct texts encoded in this run
    stored: bool = False  # the new ids were written
    error: str | None = None  # why the cache could not be read or written

    @classmethod
    def total(cls, parts: Sequence[CacheStats]) -> CacheStats:
        """The stats of several chunks' tokenization as one run's."""
        return cls(
            texts=sum(p.texts for p in parts),
            from_cache=sum(p.from_cache for p in parts),
            tokenized=sum(p.tokenized for p in parts),
            stored=any(p.stored for p in parts),
            error=next((p.error for p in parts if p.error), None),
        )


class TokenCache:
    """Token ids on disk for one tokenizer.

    The keys of every file are read once (a small column) into an index of where each text's ids
    are; a lookup then reads the ids of the few files that hold what it asks for, so a log read in
    many chunks costs about one pass over the cache, not one per chunk.
    """

    def __init__(self, root: Path, fingerprint: str) -> None:
        self.folder = root / "tokens" / fingerprint
        self._index: dict[bytes, tuple[int, int]] | None = None
        self._files: list[Path] = []

    def lookup(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        """The cached ids of the keys that are on disk."""
        index = self._load_index()
        by_file: dict[int, list[tuple[bytes, int]]] = defaultdict(list)
        for key in keys:
            if key in index:
                file, row = index[key]
                by_file[file].append((key, row))
        found: dict[bytes, np.ndarray] = {}
        for file, items in by_file.items():
            column = pl.read_parquet(self._files[file], columns=["ids"])["ids"]
            rows = column.gather([row for _, row in items]).to_list()
            for (key, _), ids in zip(items, rows, strict=True):
                found[key] = np.frombuffer(ids, dtype="<i4").astype(np.int32, copy=False)
        return found

    def _load_index(self) -> dict[bytes, tuple[int, int]]:
        """The index, brought up to date with the folder (files added or removed since)."""
        files = sorted(self.folder.glob("*.parquet")) if self.folder.is_dir() else []
        if self._index is None or not set(self._files) <= set(files):
            self._index, self._files = {}, []
        for path in files:
            if path not in self._files:
                self._add_file(path, pl.read_parquet(path, columns=["key"])["key"].to_list())
        return self._index

    def _add_file(self, path: Path, keys: Sequence[bytes]) -> None:
        if self._index is None:
            self._index = {}
        file = len(self._files)
        self._files.append(path)
        for row, key in enumerate(keys):
            self._index.setdefault(key, (file, row))

    def store(self, keys: Sequence[bytes], ids: Sequence[np.ndarray]) -> None:
        """Write one run's new ids (atomically: a partial file is never read)."""
        if not keys:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        frame = pl.DataFrame(
            {"key": list(keys), "ids": [row.astype("<i4").tobytes() for row in ids]},
            schema={"key": pl.Binary, "ids": pl.Binary},
        )
        name = uuid.uuid4().hex
        partial = self.folder / f".{name}.tmp"
        frame.write_parquet(partial, compression="lz4")  # zstd is several times slower here
        path = self.folder / f"{name}.parquet"
        partial.replace(path)
        if self._index is not None:
            self._add_file(path, keys)


def encode_texts(
    texts: Sequence[str],
    add_special: Sequence[bool],
    tokenizer: Tokenizer,
    *,
    cache_dir: Path | None,
    progress: Progress | None = None,
    stage: str = "tokenizing",
) -> tuple[list[np.ndarray], CacheStats]:
    """The ids of every text: equal texts are encoded once, cached ones not at all."""
    progress = progress or NoProgress()
    stats = CacheStats(texts=len(texts))
    keys = [text_key(text, special) for text, special in zip(texts, add_special, strict=True)]
    first: dict[bytes, int] = {}
    for position, key in enumerate(keys):
        first.setdefault(key, position)
    cache = _cache(cache_dir, tokenizer.fingerprint) if cache_dir is not None else None
    known: dict[bytes, np.ndarray] = {}
    if cache is not None:
        try:
            known = cache.lookup(list(first))
        except (OSError, pl.exceptions.PolarsError) as exc:
            stats.error = f"cannot read {cache.folder}: {exc}"
    stats.from_cache = len(known)
    missing = [key for key in first if key not in known]
    stats.tokenized = len(missing)
    progress.stage(stage, len(missing))
    for special in (False, True):
        chosen = [key for key in missing if add_special[first[key]] == special]
        for start in range(0, len(chosen), BATCH):
            batch = chosen[start : start + BATCH]
            encoded = tokenizer.encode_batch(
                [texts[first[key]] for key in batch], add_special_tokens=special
            )
            known.update(zip(batch, encoded, strict=True))
            progress.advance(len(batch))
    if cache is not None and missing and stats.error is None:
        try:
            cache.store(missing, [known[key] for key in missing])
            stats.stored = True
        except (OSError, pl.exceptions.PolarsError) as exc:
            stats.error = f"cannot write {cache.folder}: {exc}"
    return [known[key] for key in keys], stats


_OPEN: dict[tuple[Path, str], TokenCache] = {}


def _cache(root: Path, fingerprint: str) -> TokenCache:
    """One TokenCache (and index) per cache folder and tokenizer in a process."""
    key = (root, fingerprint)
    if key not in _OPEN:
        _OPEN[key] = TokenCache(root, fingerprint)
    return _OPEN[key]
