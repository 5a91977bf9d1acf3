"""Tokenizers: the offline Qwen2.5 default gives Qwen2.5's ids; tokenizer.json files and model
folders load with their special tokens and chat template."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from analyzer.errors import PrefixcheckError
from analyzer.tokenizer import load_tokenizer


def test_default_is_qwen25() -> None:
    tokenizer = load_tokenizer(None)
    assert "qwen2.5" in tokenizer.name
    # Reference ids from Qwen/Qwen2.5-7B-Instruct's tokenizer.json.
    hello, chat = tokenizer.encode_batch(
        ["Hello world", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"],
        add_special_tokens=True,
    )
    assert hello.tolist() == [9707, 1879]
    assert chat.tolist() == [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]
    assert tokenizer.token_id("<|im_end|>") == 151645
    assert tokenizer.token_id("<tool_call>") == 151657
    assert tokenizer.special.eos_token == "<|im_end|>"


def test_default_normalizes_to_nfc_and_round_trips() -> None:
    tokenizer = load_tokenizer("qwen2.5")
    composed, decomposed = tokenizer.encode_batch(["café", "cafe\u0301"], add_special_tokens=False)
    assert composed.tolist() == decomposed.tolist()
    assert tokenizer.decode(composed) == "café"


def make_model_folder(folder: Path, config: dict) -> Path:
    folder.mkdir()
    backend = BackendTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>", "<|user|>", "<|bot|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(["hello world, the cache is warm"] * 50, trainer=trainer)
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_decoding_without_the_encoder_is_tiktokens_decoding() -> None:
    """Before the encoder is built, decode joins each id's bytes from the ranks file: the same
    text as tiktoken's decode, for added tokens, ids cut inside a character, and ids past the
    vocabulary (dropped by both)."""
    lazy, built = load_tokenizer(None), load_tokenizer(None)
    text = "<|im_start|>system\nSé bref 世界 🙂\t<tool_call>{}</tool_call><|im_end|>"
    (ids,) = built.encode_batch([text], add_special_tokens=False)
    rng = np.random.default_rng(3)
    samples = [ids, ids[:-4], ids[3:], np.r_[ids, 151700, -1]]
    samples += [rng.integers(0, 151670, 30) for _ in range(20)]
    wanted = [built.decode(sample) for sample in samples]  # builds the encoder
    assert "_encoding" in vars(built)
    assert [lazy.decode(sample) for sample in samples] == wanted
    assert "_encoding" not in vars(lazy)
    assert wanted[0] == text


def test_model_folder_with_config(tmp_path: Path) -> None:
    folder = make_model_folder(
        tmp_path / "model",
        {
            "bos_token": {"content": "<s>", "special": True},
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
            "{% endfor %}",
        },
    )
    tokenizer = load_tokenizer(str(folder))
    assert (tokenizer.special.bos_token, tokenizer.special.eos_token) == ("<s>", "</s>")
    assert tokenizer.chat_template is not None
    (ids,) = tokenizer.encode_batch(["<s><|user|>hello world"], add_special_tokens=False)
    assert ids[:2].tolist() == [tokenizer.token_id("<s>"), tokenizer.token_id("<|user|>")]
    assert tokenizer.decode(ids) == "<s><|user|>hello world"


def test_tokenizer_json_file(tmp_path: Path) -> None:
    folder = make_model_folder(tmp_path / "m", {})
    tokenizer = load_tokenizer(str(folder / "tokenizer.json"))
    (ids,) = tokenizer.encode_batch(["the cache"], add_special_tokens=False)
    assert tokenizer.decode(ids) == "the cache"
    assert tokenizer.chat_template is None


def test_named_chat_templates(tmp_path: Path) -> None:
    folder = make_model_folder(
        tmp_path / "m",
        {
            "chat_template": [
                {"name": "default", "template": "A"},
                {"name": "tool_use", "template": "B"},
            ]
        },
    )
    assert load_tokenizer(str(folder)).chat_template == {"default": "A", "tool_use": "B"}


def test_folder_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(PrefixcheckError, match=r"no tokenizer\.json"):
        load_tokenizer(str(tmp_path))


def test_missing_path_is_not_sent_to_the_hub(tmp_path: Path) -> None:
    with pytest.raises(PrefixcheckError, match="no such tokenizer file or folder"):
        load_tokenizer(str(tmp_path / "nope" / "tokenizer.json"))


@pytest.mark.parametrize(
    ("offline", "endpoint", "reason"),
    [(True, "https://huggingface.co", "HF_HUB_OFFLINE is set"), (False, "http://127.0.0.1:9", "")],
)
def test_hub_name_offline_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, offline: bool, endpoint: str, reason: str
) -> None:
    """No minute of huggingface_hub retries: offline, or with the hub unreachable, a hub name that
    is not in the local hub cache fails in a moment, saying why and what to pass instead."""
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(PrefixcheckError, match="nor in the hub cache") as error:
        load_tokenizer("prefixcheck-tests/no-such-model")
    assert time.perf_counter() - start < 5
    message = str(error.value)
    assert (reason or "127.0.0.1:9 cannot be reached") in message
    assert "tokenizer.json" in message


def test_runs_remembered_across_batches_give_each_texts_own_ids() -> None:
    """Batches that repeat earlier batches' runs (read from the tokenizer's memo, some of them
    forgotten past its bound) give every text the ids of encoding it alone, in order; the memo
    keeps at most its bound of characters."""
    from analyzer.tokenizer_fast import RunMemo, encode_all, encode_segmented

    encoding = load_tokenizer(None)._encoding
    turns = ["hello <|im_end|> world " * 40, "é" * 7, "x y z", "1234567890" * 9, ""]
    batches = [turns[:2], ["", "a", *turns], [t + "<|im_end|>" + t for t in turns], turns[::-1]]
    memo = RunMemo(max_chars=64)
    for batch in batches:
        rows = encode_segmented(encoding, batch, memo)
        assert [row.tolist() for row in rows] == encode_all(encoding, batch)
        assert 0 < memo.chars <= 64 and len(memo) > 0
    assert memo.get("1234567890" * 9) is None  # longer than the bound: never kept
    assert encode_segmented(encoding, [], memo) == []
    assert len(pickle.loads(pickle.dumps(memo))) == 0  # a pickled memo starts empty
    unbounded = RunMemo()
    encode_segmented(encoding, batches[1], unbounded)
    assert unbounded.get("1234567890" * 9) is not None and unbounded.chars > 64


def test_runs_between_special_tokens_are_encoded_once_with_the_same_ids() -> None:
    """A batch encoded run by run (each distinct text between special tokens once) gives the
    ids of encoding each text whole, special tokens adjacent, first, last or broken."""
    from analyzer.tokenizer_fast import _special_splitter, encode_all, encode_segmented

    encoding = load_tokenizer(None)._encoding
    system = "<|im_start|>system\nYou are terse.<|im_end|>\n"
    texts = [
        system + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        system + "<|im_start|>user\nhi again<|im_end|><|im_end|>",
        "<|im_end|>",
        "",
        "no special at all, but <| and |> and <|im_end",
        "<|im_end|>\u0338 a broken special: '>' and U+0338 compose under NFC",
        system * 3,
    ]
    rows = encode_segmented(encoding, texts)
    assert all(row.dtype == np.int32 for row in rows)
    assert [row.tolist() for row in rows] == encode_all(encoding, texts)

    class Overlapping:  # one special token a prefix of another: tiktoken's cut could differ
        special_tokens_set = frozenset({"<a>", "<a>b"})

    assert _special_splitter(Overlapping()) is None
    assert _special_splitter(encoding) is not None
