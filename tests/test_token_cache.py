"""The token cache: a second run reads the ids from disk (the same ids), keyed by tokenizer and
text; equal texts are tokenized once; an unusable cache folder is reported, never fatal; a
damaged cache (flipped bits, truncation, wrong shapes) is discarded and recomputed, never
served; a failed write (a full disk) leaves no file behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyzer import token_cache
from analyzer.token_cache import (
    LAYOUT,
    TokenCache,
    default_cache_dir,
    encode_texts,
    namespace,
    text_key,
)
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
    files = list((tmp_path / "tokens" / LAYOUT / namespace(tokenizer.fingerprint)).glob("*"))
    assert len(files) == 1 and files[0].suffix == ".parquet"


def test_lookups_keep_the_files_they_read_up_to_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file a lookup read is not read again by the next chunk's lookup (a shared system
    prompt lives in the file that first stored it), unless the kept files passed the budget."""
    cache = TokenCache(tmp_path, "t")
    stored = {bytes([i]) * 16: np.arange(i, i + 50, dtype=np.int32) for i in range(1, 7)}
    keys = list(stored)
    for part in (keys[:3], keys[3:]):  # two files
        cache.store(part, [stored[k] for k in part])
    reads: list[Path] = []
    real = token_cache.pl.read_parquet

    def counted(path: Path, *args: object, **kwargs: object) -> object:
        if kwargs.get("columns") == ["ids", "check"]:
            reads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(token_cache.pl, "read_parquet", counted)
    for _ in range(3):
        found = cache.lookup(keys)
        assert {k: v.tolist() for k, v in found.items()} == {
            k: v.tolist() for k, v in stored.items()
        }
    assert len(reads) == 2  # each file once
    monkeypatch.setattr(token_cache, "KEPT_FILE_BYTES", 1)  # one file kept at most
    reads.clear()
    for _ in range(2):
        assert len(cache.lookup(keys)) == len(keys)
    assert len(reads) == 3  # the other file each time, the newest once kept


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


def _warm(tmp_path: Path, texts: list[str]) -> tuple[list[list[int]], Path]:
    tokenizer = load_tokenizer(None)
    ids, _ = encode_texts(texts, [False] * len(texts), tokenizer, cache_dir=tmp_path)
    (file,) = (tmp_path / "tokens" / LAYOUT / namespace(tokenizer.fingerprint)).glob("*.parquet")
    return [row.tolist() for row in ids], file


def _fresh_read(tmp_path: Path, texts: list[str]):  # type: ignore[no-untyped-def]
    import analyzer.token_cache as token_cache

    token_cache._OPEN.clear()  # a new run: no index in memory
    return encode_texts(texts, [False] * len(texts), load_tokenizer(None), cache_dir=tmp_path)


LONG_TEXTS = [f"request {i}: " + "the cache is warm and the ids are right " * 20 for i in range(40)]


def _rewrite(file: Path, change) -> None:  # type: ignore[no-untyped-def]
    import polars as pl

    frame = pl.read_parquet(file)
    change(frame).write_parquet(file)


@pytest.mark.parametrize(
    "damage",
    [
        "flip ids",  # a bit flipped in one entry's ids: its checksum fails
        "odd length",  # an entry of 4k+1 bytes (crashed every later run before)
        "truncate file",  # half a file
        "garbage file",  # not Parquet at all
        "wrong columns",  # Parquet of another shape
        "flip file bytes",  # bits flipped anywhere in the file
    ],
)
def test_damaged_cache_is_discarded_and_recomputed(tmp_path: Path, damage: str) -> None:
    import polars as pl

    want, file = _warm(tmp_path, LONG_TEXTS)
    if damage == "flip ids":

        def flip(frame: pl.DataFrame) -> pl.DataFrame:
            blobs = frame["ids"].to_list()
            blobs[3] = bytes([blobs[3][0] ^ 0x01]) + blobs[3][1:]
            return frame.with_columns(pl.Series("ids", blobs, pl.Binary))

        _rewrite(file, flip)
    elif damage == "odd length":
        _rewrite(
            file,
            lambda f: f.with_columns(
                pl.Series("ids", [b + b"x" for b in f["ids"].to_list()], pl.Binary)
            ),
        )
    elif damage == "truncate file":
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    elif damage == "garbage file":
        file.write_bytes(b"not parquet" * 100)
    elif damage == "wrong columns":
        pl.DataFrame({"key": [1, 2], "ids": ["a", "b"]}).write_parquet(file)
    else:
        data = bytearray(file.read_bytes())
        for position in range(64, len(data) - 64, max(1, len(data) // 50)):
            data[position] ^= 0x10
        file.write_bytes(bytes(data))
    got, stats = _fresh_read(tmp_path, LONG_TEXTS)
    assert [row.tolist() for row in got] == want  # never the damaged ids
    assert stats.damaged >= 1 and stats.error is None
    assert stats.from_cache + stats.tokenized == len(LONG_TEXTS)
    again, stats = _fresh_read(tmp_path, LONG_TEXTS)  # the recomputed ids were stored
    assert [row.tolist() for row in again] == want
    assert (stats.damaged, stats.from_cache) == (0, len(LONG_TEXTS))


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("x")])
def test_failed_write_is_reported_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    import polars as pl

    def write_half(self: pl.DataFrame, path: Path, **kwargs: object) -> None:
        Path(path).write_bytes(b"PAR1 partial")  # what a full disk leaves behind
        raise error

    monkeypatch.setattr(pl.DataFrame, "write_parquet", write_half)
    got, stats = _fresh_read(tmp_path, LONG_TEXTS)
    assert len(got) == len(LONG_TEXTS) and not stats.stored
    assert stats.error is not None and "cannot write" in stats.error
    if isinstance(error, OSError):
        assert "No space left on device" in stats.error
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_fast_and_exact_tokenizers_never_share_entries(tmp_path: Path) -> None:
    from tests.test_tokenizer_fast import byte_level_folder

    folder = byte_level_folder(tmp_path / "m", qwen_split=True)
    fast, exact = load_tokenizer(str(folder)), load_tokenizer(str(folder), fast=False)
    assert fast.fast is not None and exact.fast is None
    assert namespace(fast.fingerprint) != namespace(exact.fingerprint)
    assert namespace(fast.fingerprint, "template a") != namespace(fast.fingerprint, "template b")


def _chat_records() -> list:
    from analyzer.records import Record

    system = {"role": "system", "content": "You are terse."}
    return [
        Record("log", i, messages=[system, {"role": "user", "content": f"question {i % 3}"}])
        for i in range(6)
    ] + [Record("log", 6, messages=[{"role": "user", "content": "\ud800"}])]  # a skip


def test_cached_chat_prompts_are_neither_rendered_nor_tokenized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second run over the same chats reads each prompt's ids by its request key: the same
    ids and skips as rendering and tokenizing, with only the request that failed rendered."""
    from analyzer.chat import ChatRenderer, chat_renderer
    from analyzer.workload import build_workload

    tokenizer = load_tokenizer(None)
    renderer = chat_renderer(None, tokenizer.special)
    fresh = build_workload(_chat_records(), tokenizer, renderer, cache_dir=None)
    first = build_workload(_chat_records(), tokenizer, renderer, cache_dir=tmp_path)
    rendered: list[object] = []
    render = ChatRenderer.render

    def counted(self: ChatRenderer, messages: list, *args: object, **kwargs: object) -> str:
        rendered.append(messages)
        return render(self, messages, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(ChatRenderer, "render", counted)
        second = build_workload(_chat_records(), tokenizer, renderer, cache_dir=tmp_path)
    assert rendered == [_chat_records()[-1].messages]  # the skip alone: it was never cached
    for run in (first, second):
        np.testing.assert_array_equal(run.workload.prompt_tokens, fresh.workload.prompt_tokens)
        np.testing.assert_array_equal(run.workload.prompt_offsets, fresh.workload.prompt_offsets)
        assert [(s.line, s.reason) for s in run.skips] == [(s.line, s.reason) for s in fresh.skips]
    assert len(fresh.skips) == 1 and fresh.workload.n_requests == 6
    assert second.token_cache.from_cache == 6 and second.from_text


def test_request_keys_hold_the_time_only_for_templates_that_read_it() -> None:
    from analyzer.chat import ChatRenderer
    from analyzer.tokenizer import SpecialTokens

    messages = [{"role": "user", "content": "hi"}]
    plain = ChatRenderer("{{ messages[0].content }}", SpecialTokens())
    dated = ChatRenderer("{{ strftime_now('%d') }}{{ messages[0].content }}", SpecialTokens())
    for renderer, differ in ((plain, False), (dated, True)):
        keys = {renderer.request_key(messages, None, t, None, True, False) for t in (1.0, 2e5)}
        assert len(keys) == (2 if differ else 1)
    key = plain.request_key(messages, None, None, None, True, False)
    assert key != plain.request_key(messages, None, None, None, False, False)
    assert key != plain.request_key(messages, None, None, None, True, True)
    assert key != plain.request_key(
        [{"role": "user", "content": "hi", "x": 1.0}], None, None, None, True, False
    )
    assert plain.request_key([{"x": 1}], None, None, None, True, False) != plain.request_key(
        [{"x": 1.0}], None, None, None, True, False
    )


WRITER = """
import sys
from pathlib import Path
from analyzer.token_cache import encode_texts
from analyzer.tokenizer import load_tokenizer
cache, seed = Path(sys.argv[1]), int(sys.argv[2])
tokenizer = load_tokenizer(None)
for round in range(6):  # a store per round, interleaved with the other writer's
    texts = [f"shared text {i} of round {round}" for i in range(150)]
    texts += [f"writer {seed} text {i} of round {round}" for i in range(150)]
    encode_texts(texts, [i % 2 == 0 for i in range(len(texts))], tokenizer, cache_dir=cache)
"""


def test_two_runs_filling_one_cache_at_once_leave_it_right(tmp_path: Path) -> None:
    """Two processes tokenizing overlapping texts into one cache at the same time: every entry
    a later run reads is the text's own ids, and nothing reads as damaged."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(seed)], cwd=root)
        for seed in (1, 2)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    tokenizer = load_tokenizer(None)
    texts = [
        text
        for round in range(6)
        for text in (
            *(f"shared text {i} of round {round}" for i in range(150)),
            *(f"writer {seed} text {i} of round {round}" for seed in (1, 2) for i in range(150)),
        )
    ]
    specials = [int(t.split(" text ")[1].split(" ")[0]) % 2 == 0 for t in texts]  # as written
    cached, stats = encode_texts(texts, specials, tokenizer, cache_dir=tmp_path)
    assert stats.tokenized == 0 and stats.from_cache == len(set(texts)) and not stats.damaged
    fresh, _ = encode_texts(texts, specials, tokenizer, cache_dir=None)
    assert [a.tolist() for a in cached] == [b.tolist() for b in fresh]
