"""The fast path: a byte-level BPE ``tokenizer.json`` (GPT-2 style: Qwen, Llama 3, DeepSeek, ...)
converted to a tiktoken encoding, which encodes the same text several times faster.

Only what converts exactly is converted, decided from the file itself (never from a sample of
texts): a BPE model with byte-level pre-tokenization by one regex (a ``Split`` + ``ByteLevel``,
or ``ByteLevel`` with its own regex), no normalizer but NFC, no byte fallback, no dropout, added
tokens matched as tiktoken matches special tokens (no ``lstrip``/``rstrip``/``single_word``, none
a prefix of another), and merges that tiktoken's rule reproduces.

tiktoken (``src/lib.rs``, ``byte_pair_merge``) merges the adjacent pair whose concatenation has
the lowest rank, leftmost first, and takes a whole pre-tokenized piece that is a token as it is;
``tokenizers`` (``models/bpe/word.rs``, ``merge_all``) merges the pair that comes first in the
merge list. The two agree on merges that are derived from the ranks the way transformers'
``TikTokenConverter`` derives them (the conversion tiktoken models ship to the hub with), in one
of its two layouts:

- one merge per token, in rank order, each token's merge being the two parts that tiktoken's
  rule reaches on that token's bytes with the lower ranks alone (trained BPE: DeepSeek, Qwen);
- every split of every token into two tokens, by the token's rank, then by the parts' ranks
  (``extract_vocab_merges_from_model``: Llama 3). Both rules then merge the same pairs in the
  same order of ranks; they could only differ where two splits of one token meet around a shared
  middle (``xy|z`` beside ``x|yz``), which transformers' conversion assumes BPE never reaches.

Anything else (ids that do not follow the merge order, a merge that tiktoken's rule does not
reach) runs through ``tokenizers``.
"""

from __future__ import annotations

import itertools
import re
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

# The text of the runs whose ids a tokenizer remembers (with their ids: about as many bytes).
RUN_MEMO_CHARS = 1 << 22
# The pre-tokenizer regex of ByteLevel(use_regex=True) (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass
class FastEncoding:
    """A tiktoken encoding plus what ``tokenizers`` adds around it (NFC, BOS/EOS)."""

    encoding: Any
    nfc: bool
    prefix: list[int]  # ids the post-processor puts first with add_special_tokens
    suffix: list[int]
    runs: RunMemo = field(default_factory=lambda: RunMemo(), repr=False, compare=False)

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        if self.nfc:
            texts = [unicodedata.normalize("NFC", text) for text in texts]
        rows = encode_segmented(self.encoding, texts, self.runs)
        if add_special_tokens and (self.prefix or self.suffix):
            prefix, suffix = np.array(self.prefix, np.int32), np.array(self.suffix, np.int32)
            rows = [np.concatenate([prefix, row, suffix]) for row in rows]
        return rows


def encode_segmented(
    encoding: Any, texts: list[str], memo: RunMemo | None = None
) -> list[np.ndarray]:
    """``encoding.encode`` of every text (special tokens allowed), as int32 arrays, each
    distinct run of text between special tokens encoded once, and not again in a later batch
    while ``memo`` remembers it: tiktoken itself cuts a text at its special tokens and encodes
    each run apart (``CoreBPE::encode_native``), so the ids are the same, and chat prompts
    repeat their system prompt and earlier turns run for run. Cut as tiktoken cuts only when no
    special token is a prefix of another (then the leftmost match is the only one); otherwise
    each text is encoded whole. A text's ids are its runs' arrays joined, not a list of Python
    ints."""
    splitter = _special_splitter(encoding)
    if splitter is None or not texts:
        return [np.array(row, np.int32) for row in encode_all(encoding, texts)]
    memo = memo if memo is not None else RunMemo()
    pieces = [splitter.split(text) for text in texts]  # runs at even places, specials at odd
    ids: dict[str, np.ndarray | None] = {}  # the batch's runs: from the memo, or None
    for parts in pieces:
        for run in parts[::2]:
            if run not in ids:
                ids[run] = memo.get(run)
    fresh = [run for run, known in ids.items() if known is None]
    for run, row in zip(fresh, encode_runs(encoding, fresh), strict=True):
        ids[run] = np.array(row, np.int32)
    memo.keep(fresh, ids)
    single = encoding.encode_single_token
    for token in encoding.special_tokens_set:  # no run is a special token: it would be cut
        ids[token] = np.array([single(token)], np.int32)
    arrays = [ids[part] for parts in pieces for part in parts]
    ends = np.cumsum(np.fromiter(map(len, arrays), np.int64, len(arrays)))
    texts_ends = ends[np.cumsum([len(parts) for parts in pieces]) - 1].tolist()
    flat = np.concatenate(arrays)  # the texts' rows are views of the batch's one array
    return [flat[start:end] for start, end in zip([0, *texts_ends[:-1]], texts_ends, strict=True)]


class RunMemo:
    """The ids of the runs (text between special tokens) encoded so far: a log's later turns
    repeat their earlier turns run for run, across chunks. Bounded: the oldest runs go first
    once their text passes ``max_chars`` characters."""

    def __init__(self, max_chars: int = RUN_MEMO_CHARS) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._ids: OrderedDict[str, np.ndarray] = OrderedDict()  # in the order encoded
        self._lock = threading.Lock()

    def get(self, run: str) -> np.ndarray | None:
        return self._ids.get(run)

    def keep(self, runs: list[str], ids: dict[str, np.ndarray | None]) -> None:
        """Remember ``runs`` (each encoded in ``ids``), forgetting the oldest past the bound."""
        with self._lock:
            for run in runs:
                if len(run) <= self.max_chars and run not in self._ids:
                    self._ids[run] = ids[run]  # type: ignore[assignment]
                    self.chars += len(run)
            while self.chars > self.max_chars:  # popitem: a plain dict's first key is O(n)
                oldest, _ = self._ids.popitem(last=False)
                self.chars -= len(oldest)

    def __len__(self) -> int:
        return len(self._ids)

    def __getstate__(self) -> dict[str, int]:  # a pickled tokenizer starts with an empty memo
        return {"max_chars": self.max_chars}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["max_chars"])  # type: ignore[misc]


@cache
def _special_splitter(encoding: Any) -> re.Pattern[str] | None:
    """A pattern that splits text at the encoding's special tokens (kept, as groups), or None
    when tiktoken's own cut could differ (a special token that is a prefix of another)."""
    tokens = sorted(encoding.special_tokens_set)
    if not tokens or any(a != b and b.startswith(a) for a in tokens for b in tokens):
        return None
    return re.compile("(" + "|".join(re.escape(token) for token in tokens) + ")")


def encode_all(encoding: Any, texts: list[str]) -> list[list[int]]:
    """``encoding.encode`` of every text (special tokens allowed), on the calling thread.
    tiktoken releases the GIL while it encodes, but its threads contend: on the chat log's runs
    (18M characters, 2 cores), two threads took the same wall time as one and 70% more CPU."""
    encode = encoding.encode
    return [encode(text, allowed_special="all") for text in texts]


def encode_runs(encoding: Any, runs: list[str]) -> list[list[int]]:
    """``encode_all`` of runs that hold no special token (cut at them): tiktoken's
    ``encode_ordinary``, the same ids, without the search for special tokens that ``encode``
    makes first (a fifth of its time on chat text)."""
    encode = encoding.encode_ordinary
    return [encode(run) for run in runs]


def fast_encoding(config: dict[str, Any], backend: Any) -> tuple[FastEncoding | None, str]:
    """The tiktoken twin of a ``tokenizer.json`` (parsed), or None when it does not convert
    exactly; and why (a note for the report, with no text of any prompt in it)."""
    try:
        found = _conversion(config)
    except Exception as exc:  # a tokenizer.json of an unexpected shape: the exact path
        return None, f"fast path off: unexpected tokenizer.json ({type(exc).__name__})"
    if isinstance(found, str):
        return None, f"fast path off: {found}"
    import tiktoken

    ranks, specials, pattern, nfc = found
    try:
        encoding = tiktoken.Encoding(
            "tokenizer.json (fast path)",
            pat_str=pattern,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
    except Exception:
        return None, "fast path off: tiktoken does not take its pre-tokenizer regex"
    prefix, suffix = _post_processor_ids(backend)
    encoding_ = FastEncoding(encoding=encoding, nfc=nfc, prefix=prefix, suffix=suffix)
    return encoding_, "fast path: tiktoken, merges checked against the vocabulary"


Conversion = tuple[dict[bytes, int], dict[str, int], str, bool]


def _conversion(config: dict[str, Any]) -> Conversion | str:
    """tiktoken's ranks, special tokens, regex and NFC flag, or why they would differ."""
    model = config.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("dropout"):
        return "not a byte-level BPE without byte fallback or dropout"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "subword prefixes or suffixes"
    nfc = _normalizer_is_nfc(config.get("normalizer"))
    pattern = _pattern(config.get("pre_tokenizer"))
    if nfc is None or pattern is None:
        return "a normalizer or pre-tokenizer that tiktoken does not reproduce"
    added = [token for token in config.get("added_tokens") or [] if isinstance(token, dict)]
    specials = {token["content"]: token["id"] for token in added}
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
        return "added tokens that strip spaces or match single words"
    contents = sorted(specials)
    if any(b.startswith(a) for a, b in itertools.pairwise(contents)):
        return "an added token that is a prefix of another (tiktoken matches the first listed)"
    if nfc and any(unicodedata.normalize("NFC", text) != text for text in contents):
        return "an added token that NFC changes"
    byte_of = unicode_to_byte()
    special_ids = set(specials.values())
    as_bytes: dict[str, bytes] = {}
    ranks: dict[bytes, int] = {}
    for token, rank in model["vocab"].items():
        if rank in special_ids:
            continue
        if not all(char in byte_of for char in token):
            return "a vocabulary token that is not byte-level text"
        as_bytes[token] = data = bytes(byte_of[char] for char in token)
        ranks[data] = rank
    if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        return "a vocabulary without every byte, or with two tokens of one id"
    merges = []
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left not in as_bytes or right not in as_bytes:
            return "a merge of tokens outside the vocabulary"
        merges.append((as_bytes[left], as_bytes[right]))
    why = merges_follow_ranks(merges, ranks)
    return why if why else (ranks, specials, pattern, nfc)


def merges_follow_ranks(merges: list[tuple[bytes, bytes]], ranks: dict[bytes, int]) -> str:
    """Empty when tiktoken's rule on ``ranks`` gives what ``merges`` give in ``tokenizers``
    (see the module docstring), else why not."""
    results = [left + right for left, right in merges]
    if any(result not in ranks for result in results):
        return "a merge whose result is not in the vocabulary"
    result_ranks = [ranks[result] for result in results]
    if any(a > b for a, b in itertools.pairwise(result_ranks)):
        return "ids that do not follow the merge order"
    made = set(results)
    if any(len(token) > 1 and token not in made for token in ranks):
        return "a token that no merge makes"
    if len(made) == len(results):  # one merge per token: tiktoken's rule must reach each one
        for (left, right), result, rank in zip(merges, results, result_ranks, strict=True):
            if len(result) > 2 and _parts_below(result, ranks, rank) != [left, right]:
                return "a merge that tiktoken's rule does not reach"
        return ""
    expected = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        splits = [
            (token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        splits.sort(key=lambda split: (ranks[split[0]], ranks[split[1]]))
        expected.extend(splits)
    if expected != merges:
        return "merges that are neither one per token nor every split of each token"
    return ""


def _parts_below(piece: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """tiktoken's merging of ``piece`` with the tokens ranked below ``max_rank`` only."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, where = max_rank, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], max_rank)
            if rank < best:
                best, where = rank, i
        if where < 0:
            break
        parts[where : where + 2] = [parts[where] + parts[where + 1]]
    return parts


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
