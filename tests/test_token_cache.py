"""The token cache: a second run reads the ids from disk (the same ids), keyed by tokenizer and
text; equal texts are tokenized once; an unusable cache folder is reported, never fatal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyzer.token_cache import TokenCache, default_cache_dir, encode_texts, text_key
from analyzer.tokenizer import load_tokenizer

TEXTS = ["The cache is warm.", "The cache is cold.", "The cache is warm.", ""]


class CountingTokenizer:
    """The default tokenizer, counting the texts it is asked to encode."""

    def __init__(self) -> None:
        self.inner = load_tokenizer(None)
        self.fingerprint = self.inner.fingerprint
        self.encoded = 0

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        self.encoded += len(texts)
        return self.inner.encode_batch(texts, add_special_tokens=add_special_tokens)


def test_second_run_reads_the_cache(tmp_path: Path) -> None:
    tokenizer = CountingTokenizer()
    specials = [False] * len(TEXTS)
    first, stats = encode_texts(TEXTS, specials, tokenizer, cache_dir=tmp_path)  # type: ignore[arg-type]
    assert (stats.from_cache, stats.tokenized, stats.stored, tokenizer.encoded) == (0, 3, True, 3)
    second, stats = encode_texts(TEXTS, specials, tokenizer, cache_dir=tmp_path)  # type: ignore[arg-type]
    assert (stats.from_cache, stats.tokenized, tokenizer.encoded) == (3, 0, 3)
    assert [a.tolist() for a in first] == [b.tolist() for b in second]
    assert second[3].tolist() == [] and second[0].dtype == np.int32
    files = list((tmp_path / "tokens" / tokenizer.fingerprint).glob("*.parquet"))
    assert len(files) == 1


def test_keys_separate_texts_specials_and_tokenizers(tmp_path: Path) -> None:
    assert text_key("a", True) != text_key("a", False) != text_key("b", False)
    cache = TokenCache(tmp_path, "one")
    cache.store([text_key("a", False)], [np.array([1, 2], np.int32)])
    assert TokenCache(tmp_path, "two").lookup([text_key("a", False)]) == {}
    assert cache.lookup([text_key("a", False)])[text_key("a", False)].tolist() == [1, 2]


def test_no_cache_dir_means_no_files(tmp_path: Path) -> None:
    tokenizer = CountingTokenizer()
    _, stats = encode_texts(["x", "x"], [True, True], tokenizer, cache_dir=None)  # type: ignore[arg-type]
    assert (stats.tokenized, stats.stored, tokenizer.encoded) == (1, False, 1)


def test_unusable_cache_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    ids, stats = encode_texts(["x"], [False], load_tokenizer(None), cache_dir=blocker)
    assert (
        ids[0].tolist()
        == load_tokenizer(None).encode_batch(["x"], add_special_tokens=False)[0].tolist()
    )
    assert stats.error is not None and "cannot write" in stats.error


def test_cache_dir_follows_platform_conventions(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PREFIXCHECK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("sys.platform", "linux")
    assert default_cache_dir() == tmp_path / "prefixcheck"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "prefixcheck"
    monkeypatch.setenv("PREFIXCHECK_CACHE_DIR", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x"
