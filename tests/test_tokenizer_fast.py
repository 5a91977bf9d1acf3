"""The tiktoken fast path for byte-level BPE tokenizer.json files (same ids or off), tiktoken's
named encodings (local cache only), and tokenizer fingerprints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers import Tokenizer as BackendTokenizer

from analyzer.errors import PrefixcheckError
from analyzer.tokenizer import QWEN2_PATTERN, load_tokenizer
from analyzer.tokenizer_fast import merges_follow_ranks

CORPUS = [
    "The cache is warm, the cache is cold; 12345 tokens at 3.5 GB/s.",
    "naïve café 東京 🙂 — don't WON'T it's\n\n\tindented\r\n  spaces   ",
    "def f(x):\n    return {'a': [1, 2, 3]}",
] * 30
TEXTS = [
    "Hello world, the cache is warm!",
    "  multiple   spaces\n\nand newlines\t\ttabs",
    "ünïcödé and 東京タワー and emoji 🚀🚀",
    "<|eot_id|> a special token in the middle <|begin_of_text|>",
    "",
]


def byte_level_folder(folder: Path, *, qwen_split: bool, lstrip_special: bool = False) -> Path:
    folder.mkdir()
    backend = BackendTokenizer(models.BPE())
    if qwen_split:  # Qwen2 / Llama 3 style: one Split regex, then ByteLevel without its regex
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(
                    pattern=Regex(QWEN2_PATTERN), behavior="isolated", invert=False
                ),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:  # GPT-2 style
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    if lstrip_special:
        backend.add_special_tokens([AddedToken("<|tool|>", lstrip=True, special=True)])
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>"}))
    return folder


@pytest.mark.parametrize("qwen_split", [True, False])
def test_fast_path_gives_the_same_ids(tmp_path: Path, qwen_split: bool) -> None:
    folder = byte_level_folder(tmp_path / "m", qwen_split=qwen_split)
    fast = load_tokenizer(str(folder))
    exact = load_tokenizer(str(folder), fast=False)
    assert fast.fast is not None
    for special in (False, True):
        got = fast.encode_batch(TEXTS, add_special_tokens=special)
        want = exact.encode_batch(TEXTS, add_special_tokens=special)
        assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert fast.fast is not None, fast.fast_note
    assert fast.description.endswith("(fast path: tiktoken, merges checked against the vocabulary)")
    assert fast.fingerprint != exact.fingerprint  # the token cache keeps them apart
    assert "fast path off (--no-fast-tokenizer)" in exact.description
    bos = fast.token_id("<|begin_of_text|>")
    assert fast.encode_batch(["x"], add_special_tokens=True)[0][0] == bos


def test_fast_path_is_off_for_added_tokens_tiktoken_cannot_match(tmp_path: Path) -> None:
    folder = byte_level_folder(tmp_path / "m", qwen_split=True, lstrip_special=True)
    tokenizer = load_tokenizer(str(folder))
    texts = ["call   <|tool|> now", *TEXTS]
    got = tokenizer.encode_batch(texts, add_special_tokens=False)
    want = load_tokenizer(str(folder), fast=False).encode_batch(texts, add_special_tokens=False)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert tokenizer.fast is None
    assert "fast path off: added tokens that strip spaces" in tokenizer.description
    assert "call" not in tokenizer.description  # decided from the file, no prompt text in it


def _rewritten(folder: Path, change: Callable[[dict], None]) -> Path:
    config = json.loads((folder / "tokenizer.json").read_text())
    change(config["model"])
    (folder / "tokenizer.json").write_text(json.dumps(config))
    return folder


def _swap_two_merged_ids(model: dict) -> None:
    """Ids that no longer follow the merge order: the first and last merged tokens swap ids."""
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
    first, last = ("".join(merges[0]), "".join(merges[-1]))
    vocab = model["vocab"]
    vocab[first], vocab[last] = vocab[last], vocab[first]


def test_fast_path_is_off_when_ids_do_not_follow_the_merges(tmp_path: Path) -> None:
    folder = _rewritten(byte_level_folder(tmp_path / "m", qwen_split=True), _swap_two_merged_ids)
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.fast is None
    assert "ids that do not follow the merge order" in tokenizer.description
    exact = load_tokenizer(str(folder), fast=False)
    texts = [*CORPUS[:3], *TEXTS]
    assert [g.tolist() for g in tokenizer.encode_batch(texts, add_special_tokens=False)] == [
        w.tolist() for w in exact.encode_batch(texts, add_special_tokens=False)
    ]


def _every_split(model: dict) -> None:
    """transformers' layout for tiktoken models (Llama 3): every split of every token, by rank."""
    vocab = model["vocab"]
    merges = []
    for token, _ in sorted(vocab.items(), key=lambda item: item[1]):
        splits = [(token[:i], token[i:]) for i in range(1, len(token))]
        splits = [(a, b) for a, b in splits if a in vocab and b in vocab]
        merges += sorted(splits, key=lambda split: (vocab[split[0]], vocab[split[1]]))
    model["merges"] = [f"{a} {b}" for a, b in merges]


def test_fast_path_takes_every_split_merges_and_matches_tokenizers(tmp_path: Path) -> None:
    folder = _rewritten(byte_level_folder(tmp_path / "m", qwen_split=True), _every_split)
    fast, exact = load_tokenizer(str(folder)), load_tokenizer(str(folder), fast=False)
    assert fast.fast is not None, fast.fast_note
    texts = [*CORPUS[:3], *TEXTS, "cache cached caches the thecache"]
    assert [g.tolist() for g in fast.encode_batch(texts, add_special_tokens=True)] == [
        w.tolist() for w in exact.encode_batch(texts, add_special_tokens=True)
    ]


def test_a_merge_tiktoken_would_not_make_turns_the_fast_path_off() -> None:
    ranks = {bytes([b]): b for b in range(256)}
    ranks |= {b"ab": 256, b"bc": 257, b"abc": 258}
    # "abc" from "a" + "bc": tiktoken's rule reaches "ab" + "c" first
    assert merges_follow_ranks([(b"a", b"b"), (b"b", b"c"), (b"a", b"bc")], ranks) == (
        "a merge that tiktoken's rule does not reach"
    )
    assert merges_follow_ranks([(b"a", b"b"), (b"b", b"c"), (b"ab", b"c")], ranks) == ""


def test_non_byte_level_tokenizers_take_the_exact_path(tmp_path: Path) -> None:
    folder = tmp_path / "wordpiece"
    folder.mkdir()
    backend = BackendTokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(
        CORPUS, trainer=trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"])
    )
    backend.save(str(folder / "tokenizer.json"))
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.fast is None
    assert len(tokenizer.encode_batch(["the cache"], add_special_tokens=False)[0]) >= 2


def test_tiktoken_encoding_offline_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(
        PrefixcheckError, match=r"tiktoken:cl100k_base: its vocabulary file is not in"
    ):
        load_tokenizer("tiktoken:cl100k_base")
    with pytest.raises(PrefixcheckError, match="unknown encoding"):
        load_tokenizer("tiktoken:nope")


def test_fingerprints_follow_what_decides_the_ids(tmp_path: Path) -> None:
    first = byte_level_folder(tmp_path / "a", qwen_split=True)
    second = byte_level_folder(tmp_path / "b", qwen_split=False)
    assert load_tokenizer(str(first)).fingerprint == load_tokenizer(str(first)).fingerprint
    assert load_tokenizer(str(first)).fingerprint != load_tokenizer(str(second)).fingerprint
    assert load_tokenizer(None).fingerprint != load_tokenizer(str(first)).fingerprint
    config = first / "tokenizer_config.json"
    before = load_tokenizer(str(first)).fingerprint
    config.write_text(json.dumps({"bos_token": "<|begin_of_text|>", "add_bos_token": True}))
    assert load_tokenizer(str(first)).fingerprint != before
