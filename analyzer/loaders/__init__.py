"""Log loaders: detect each file's format and turn its lines into Records or reasoned Skips."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from analyzer.errors import BadLine, PrefixcheckError, Skip, StrictModeError
from analyzer.loaders import hash_trace, openai_chat, plain_prompt, token_ids
from analyzer.loaders.jsonl import iter_json_lines
from analyzer.records import Record

Parser = Callable[[dict[str, Any], str, int], Record]


@dataclass(frozen=True)
class LogFormat:
    name: str
    description: str
    matches: Callable[[dict[str, Any]], bool]
    parse: Parser


FORMATS: dict[str, LogFormat] = {
    f.name: f
    for f in (
        LogFormat("hash-trace", "hash-id traces (Mooncake)", hash_trace.matches, hash_trace.parse),
        LogFormat("tokens", "pre-tokenized prompt_token_ids", token_ids.matches, token_ids.parse),
        LogFormat(
            "openai", "OpenAI chat-completions requests", openai_chat.matches, openai_chat.parse
        ),
        LogFormat(
            "prompt", 'plain {"prompt": ...} lines', plain_prompt.matches, plain_prompt.parse
        ),
    )
}
DETECTION_LINES = 50


@dataclass
class LoadResult:
    """Everything read: the requests in input order, the skipped lines, each file's format."""

    records: list[Record] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    lines_read: int = 0


def detect_format(path: Path) -> LogFormat:
    """The format of the first JSON objects in the file that any loader recognises."""
    seen_keys: list[str] = []
    for index, (_, obj) in enumerate(iter_json_lines(path)):
        if index >= DETECTION_LINES:
            break
        if isinstance(obj, Skip):
            continue
        for log_format in FORMATS.values():
            if log_format.matches(obj):
                return log_format
        seen_keys = sorted(obj)[:8]
    if not seen_keys:
        raise PrefixcheckError(f"{path}: no JSON object in the first {DETECTION_LINES} lines")
    raise PrefixcheckError(
        f"{path}: unknown log format (keys {seen_keys}); choose one with --format "
        f"({', '.join(FORMATS)})"
    )


def load_logs(
    paths: Sequence[Path],
    format_name: str = "auto",
    *,
    strict: bool = False,
    hash_block_size: int = hash_trace.DEFAULT_BLOCK_SIZE,
) -> LoadResult:
    """Read every file; a bad line becomes a Skip (or, with ``strict``, a StrictModeError)."""
    if format_name != "auto" and format_name not in FORMATS:
        raise PrefixcheckError(
            f"unknown --format {format_name!r}; choose auto, {', '.join(FORMATS)}"
        )
    result = LoadResult()
    for path in paths:
        log_format = detect_format(path) if format_name == "auto" else FORMATS[format_name]
        result.formats[str(path)] = log_format.name
        parse = log_format.parse
        if log_format.name == "hash-trace":
            parse = partial(hash_trace.parse, block_size=hash_block_size)
        for item in _parse_file(path, parse):
            result.lines_read += 1
            if isinstance(item, Skip):
                if strict:
                    raise StrictModeError(item)
                result.skips.append(item)
            else:
                result.records.append(item)
    return result


def _parse_file(path: Path, parse: Parser) -> Iterator[Record | Skip]:
    for line_number, obj in iter_json_lines(path):
        if isinstance(obj, Skip):
            yield obj
            continue
        try:
            yield parse(obj, str(path), line_number)
        except BadLine as exc:
            yield Skip(str(path), line_number, exc.reason)
