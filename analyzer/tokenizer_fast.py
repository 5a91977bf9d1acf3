"""The fast path: a byte-level BPE ``tokenizer.json`` (GPT-2 style: Qwen, Llama 3, DeepSeek, ...)
converted to a tiktoken encoding, which encodes the same text several times faster.

Only what converts exactly is converted: a BPE model with byte-level pre-tokenization by one
regex (a ``Split`` + ``ByteLevel``, or ``ByteLevel`` with its own regex), no normalizer but NFC,
no byte fallback, no dropout. tiktoken merges the pair whose merged token has the lowest id,
``tokenizers`` the pair that comes first in the merge list; the two agree when ids follow the
merge order, which the caller checks on a sample before it trusts the result.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

ENCODE_THREADS = max(1, min(8, os.cpu_count() or 1))
# The pre-tokenizer regex of ByteLevel(use_regex=True) (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass
class FastEncoding:
    """A tiktoken encoding plus what ``tokenizers`` adds around it (NFC, BOS/EOS)."""

    encoding: Any
    nfc: bool
    prefix: list[int]  # ids the post-processor puts first with add_special_tokens
    suffix: list[int]

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        if self.nfc:
            texts = [unicodedata.normalize("NFC", text) for text in texts]
        rows = self.encoding.encode_batch(texts, num_threads=ENCODE_THREADS, allowed_special="all")
        if add_special_tokens and (self.prefix or self.suffix):
            rows = [self.prefix + row + self.suffix for row in rows]
        return [np.asarray(row, dtype=np.int32) for row in rows]


def fast_encoding(config: dict[str, Any], backend: Any) -> FastEncoding | None:
    """The tiktoken twin of a ``tokenizer.json`` (parsed), or None when it does not convert."""
    model = config.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("dropout"):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    nfc = _normalizer_is_nfc(config.get("normalizer"))
    pattern = _pattern(config.get("pre_tokenizer"))
    if nfc is None or pattern is None:
        return None
    byte_of = unicode_to_byte()
    try:
        ranks = {bytes(byte_of[c] for c in token): rank for token, rank in model["vocab"].items()}
    except (KeyError, TypeError, AttributeError):
        return None  # a token that is not byte-level text
    specials = {
        token["content"]: token["id"]
        for token in config.get("added_tokens") or []
        if isinstance(token, dict)
    }
    ranks = {token: rank for token, rank in ranks.items() if rank not in specials.values()}
    if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        return None
    import tiktoken

    try:
        encoding = tiktoken.Encoding(
            "tokenizer.json (fast path)",
            pat_str=pattern,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
    except Exception:
        return None
    prefix, suffix = _post_processor_ids(backend)
    return FastEncoding(encoding=encoding, nfc=nfc, prefix=prefix, suffix=suffix)


def _normalizer_is_nfc(normalizer: Any) -> bool | None:
    """False for none, True for NFC, None for anything that tiktoken cannot reproduce."""
    if normalizer is None:
        return False
    if normalizer.get("type") == "NFC":
        return True
    if normalizer.get("type") == "Sequence" and not normalizer.get("normalizers"):
        return False
    return None


def _pattern(pre_tokenizer: Any) -> str | None:
    """The single regex that splits the text before byte-level BPE, or None."""
    if not isinstance(pre_tokenizer, dict):
        return None
    if pre_tokenizer.get("type") == "ByteLevel":
        return GPT2_PATTERN if pre_tokenizer.get("use_regex", True) else None
    if pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    regex = (split.get("pattern") or {}).get("Regex")
    if (
        split.get("type") != "Split"
        or regex is None
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex", True)
        or byte_level.get("add_prefix_space")
    ):
        return None
    return regex


def _post_processor_ids(backend: Any) -> tuple[list[int], list[int]]:
    """The ids ``tokenizers`` adds before and after the text with ``add_special_tokens``."""
    bare = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    return [], []


@cache
def unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}
