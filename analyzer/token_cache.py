"""The tokenization cache: token ids on disk, so a second run over the same log skips
tokenization. It must never serve ids that a fresh tokenization would not give.

Layout: ``<cache dir>/tokens/v2/<namespace>/<run>.parquet``, one file per run that tokenized
something. The namespace is a hash of everything that decides the ids besides the text: the
tokenizer's files and implementation (tiktoken, the tiktoken fast path or ``tokenizers``), the
chat template and ``--chat-template-kwargs`` (for rendered prompts), and the versions of
prefixcheck, ``tokenizers`` and ``tiktoken``. Columns: ``key`` (16-byte BLAKE2b of the text and
the special-tokens flag), ``ids`` (the int32 ids, little-endian, as one binary value: far faster
to write and read than a list column) and ``check`` (an 8-byte BLAKE2b of key and ids).

A file is written to a hidden temporary name and renamed into place (a reader never sees a
partial file; a failed write removes it and is reported). An entry whose checksum fails, or a
file that does not read as this layout, is discarded (the file deleted), its texts tokenized
again, and the run says so.

The cache dir follows each platform's convention: ``$XDG_CACHE_HOME/prefixcheck``
or ``~/.cache/prefixcheck`` on Linux, ``~/Library/Caches/prefixcheck`` on macOS,
``%LOCALAPPDATA%\\prefixcheck\\Cache`` on Windows; ``PREFIXCHECK_CACHE_DIR`` overrides it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
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
    damaged: int = 0  # entries (or files) found damaged, discarded and recomputed
    error: str | None = None  # why the cache could not be read or written

    @classmethod
    def total(cls, parts: Sequence[CacheStats]) -> CacheStats:
        """The stats of several chunks' tokenization as one run's."""
        return cls(
            texts=sum(p.texts for p in parts),
            from_cache=sum(p.from_cache for p in parts),
            tokenized=sum(p.tokenized for p in parts),
            stored=any(p.stored for p in parts),
            damaged=sum(p.damaged for p in parts),
            error=next((p.error for p in parts if p.error), None),
        )


LAYOUT = "v2"
COLUMNS = {"key": pl.Binary, "ids": pl.Binary, "check": pl.Binary}
STALE_TEMP_S = 3600  # a temporary file this old belongs to a run that died: removed
KEPT_FILE_BYTES = 256 << 20  # files read by lookups kept decoded, the most recent first


def checksum(key: bytes, ids: bytes) -> bytes:
    digest = hashlib.blake2b(key, digest_size=8)
    digest.update(ids)
    return digest.digest()


def namespace(fingerprint: str, context: str = "") -> str:
    """The cache folder's name: the tokenizer's fingerprint (files and implementation), what
    else decides the ids (``context``: the chat template and its kwargs), and the versions of
    the code that computes them."""
    digest = hashlib.sha256(json.dumps([fingerprint, context, _versions()]).encode())
    return digest.hexdigest()[:32]


@cache
def _versions() -> list[str]:
    import importlib.metadata  # here: its import costs a run without the cache 25 ms

    found = []
    for package in ("prefixcheck", "tokenizers", "tiktoken"):
        try:
            found.append(f"{package}=={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package}==?")
    return found


class TokenCache:
    """Token ids on disk for one namespace (tokenizer, template, versions).

    The keys of every file are read once (a small column) into an index of where each text's ids
    are; a lookup then reads the ids of the few files that hold what it asks for, and keeps them
    (``KEPT_FILE_BYTES``) for the lookups of later chunks, so a log read in many chunks costs
    about one pass over the cache, not one per chunk. Every entry read is checked against its
    checksum.
    """

    def __init__(self, root: Path, name: str) -> None:
        self.folder = root / "tokens" / LAYOUT / name
        self._index: dict[bytes, tuple[int, int]] | None = None
        self._files: list[Path | None] = []  # None: discarded
        self._kept: OrderedDict[int, pl.DataFrame] = OrderedDict()  # files read, newest last
        self.damaged = 0  # damaged entries or files found since the last look

    def lookup(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        """The cached ids of the keys that are on disk and intact."""
        index = self._load_index()
        by_file: dict[int, list[tuple[bytes, int]]] = defaultdict(list)
        for key in keys:
            if key in index:
                file, row = index[key]
                by_file[file].append((key, row))
        found: dict[bytes, np.ndarray] = {}
        for file, items in by_file.items():
            path = self._files[file]
            assert path is not None
            try:
                frame = self._read_ids(file, path)
                rows = [row for _, row in items]
                blobs = frame["ids"].gather(rows).to_list()
                checks = frame["check"].gather(rows).to_list()
            except Exception:
                self._discard(file, len(items))
                continue
            bad = sum(
                not isinstance(ids, bytes) or len(ids) % 4 or checksum(key, ids) != check
                for (key, _), ids, check in zip(items, blobs, checks, strict=True)
            )
            if bad:
                self._discard(file, bad)
                continue
            for (key, _), ids in zip(items, blobs, strict=True):
                found[key] = np.frombuffer(ids, dtype="<i4").astype(np.int32, copy=False)
        return found

    def _read_ids(self, file: int, path: Path) -> pl.DataFrame:
        """A file's ids and checks, kept for the lookups of later chunks (shared texts, a system
        prompt above all, sit in the files that first stored them: a chunk's lookup reads
        several): up to KEPT_FILE_BYTES of files, the least recently read dropped first."""
        frame = self._kept.pop(file, None)
        if frame is None:
            frame = pl.read_parquet(path, columns=["ids", "check"])
        self._kept[file] = frame
        kept = sum(f.estimated_size() for f in self._kept.values())
        while kept > KEPT_FILE_BYTES and len(self._kept) > 1:
            kept -= self._kept.popitem(last=False)[1].estimated_size()
        return frame

    def _discard(self, file: int, entries: int) -> None:
        """A damaged file: deleted, its entries forgotten (their texts are tokenized again)."""
        path = self._files[file]
        self.damaged += entries
        self._files[file] = None
        self._kept.pop(file, None)
        if self._index is not None:
            self._index = {k: v for k, v in self._index.items() if v[0] != file}
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()

    def _load_index(self) -> dict[bytes, tuple[int, int]]:
        """The index, brought up to date with the folder (files added or removed since)."""
        files = sorted(self.folder.glob("*.parquet")) if self.folder.is_dir() else []
        known = {path for path in self._files if path is not None}
        if self._index is None or not known <= set(files):
            self._index, self._files = {}, []
            self._kept.clear()
            known = set()
            self._remove_stale_temporaries()
        for path in files:
            if path not in known:
                self._add_file(path, self._read_keys(path))
        return self._index

    def _read_keys(self, path: Path) -> list[bytes]:
        try:
            frame = pl.read_parquet(path, columns=["key"])
            if dict(pl.read_parquet_schema(path)) != COLUMNS:
                raise ValueError("not this cache's layout")
            keys = frame["key"].to_list()
        except Exception:
            self.damaged += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return []
        return [key for key in keys if isinstance(key, bytes)]

    def _remove_stale_temporaries(self) -> None:
        if not self.folder.is_dir():
            return
        now = time.time()
        for path in self.folder.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > STALE_TEMP_S:
                    path.unlink()

    def _add_file(self, path: Path, keys: Sequence[bytes]) -> None:
        if self._index is None:
            self._index = {}
        file = len(self._files)
        self._files.append(path)
        for row, key in enumerate(keys):
            self._index.setdefault(key, (file, row))

    def store(self, keys: Sequence[bytes], ids: Sequence[np.ndarray]) -> None:
        """Write one run's new ids, atomically: to a temporary name, then renamed. On any
        failure (a full disk) the temporary file is removed and the error raised."""
        if not keys:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        blobs = [row.astype("<i4").tobytes() for row in ids]
        frame = pl.DataFrame(
            {
                "key": list(keys),
                "ids": blobs,
                "check": [checksum(key, blob) for key, blob in zip(keys, blobs, strict=True)],
            },
            schema=COLUMNS,
        )
        name = uuid.uuid4().hex
        partial = self.folder / f".{name}.tmp"
        path = self.folder / f"{name}.parquet"
        try:
            frame.write_parquet(partial, compression="lz4")  # zstd is several times slower here
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
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
    context: str = "",
) -> tuple[list[np.ndarray], CacheStats]:
    """The ids of every text: equal texts are encoded once, cached ones not at all.

    ``context`` names what else made the texts (the chat template): part of the cache's key.
    """
    progress = progress or NoProgress()
    stats = CacheStats(texts=len(texts))
    keys = [text_key(text, special) for text, special in zip(texts, add_special, strict=True)]
    first: dict[bytes, int] = {}
    for position, key in enumerate(keys):
        first.setdefault(key, position)
    known: dict[bytes, np.ndarray] = {}
    if cache_dir is not None:
        known, read = cached_ids(list(first), tokenizer, cache_dir, context)
        stats.error, stats.damaged = read.error, read.damaged
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
    if cache_dir is not None and missing and stats.error is None:
        wrote = store_ids(missing, [known[key] for key in missing], tokenizer, cache_dir, context)
        stats.stored, stats.error = wrote.stored, wrote.error
    return [known[key] for key in keys], stats


def cached_ids(
    keys: Sequence[bytes], tokenizer: Tokenizer, cache_dir: Path, context: str = ""
) -> tuple[dict[bytes, np.ndarray], CacheStats]:
    """The ids on disk for ``keys`` (``text_key``s, or ``ChatRenderer.request_key``s) in the
    namespace of ``tokenizer`` and ``context``; a cache that cannot be read reads as empty."""
    stats = CacheStats()
    if not keys:
        return {}, stats
    cache = _cache(cache_dir, namespace(tokenizer.fingerprint, context))
    try:
        found = cache.lookup(keys)
    except Exception as exc:  # the cache is an optimisation: any failure reads as a miss
        stats.error = f"cannot read {cache.folder}: {exc}"
        found = {}
    stats.damaged, cache.damaged = cache.damaged, 0
    return found, stats


def store_ids(
    keys: Sequence[bytes],
    ids: Sequence[np.ndarray],
    tokenizer: Tokenizer,
    cache_dir: Path,
    context: str = "",
) -> CacheStats:
    """Write the ids of ``keys`` (one file); a failure is reported, never raised."""
    stats = CacheStats()
    if not keys:
        return stats
    cache = _cache(cache_dir, namespace(tokenizer.fingerprint, context))
    try:
        cache.store(keys, ids)
        stats.stored = True
    except Exception as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        stats.error = f"cannot write {cache.folder}: {reason}"
    return stats


_OPEN: dict[tuple[Path, str], TokenCache] = {}


def _cache(root: Path, name: str) -> TokenCache:
    """One TokenCache (and index) per cache folder and namespace in a process."""
    key = (root, name)
    if key not in _OPEN:
        _OPEN[key] = TokenCache(root, name)
    return _OPEN[key]
