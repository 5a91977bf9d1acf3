"""Log loaders: detect each file's format and turn its lines into Records or reasoned Skips."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, islice
from typing import Any

from analyzer.errors import BadLine, PrefixcheckError, Skip, SkipLog, StrictModeError
from analyzer.loaders import (
    anthropic,
    conversations,
    hash_trace,
    helicone,
    langfuse,
    litellm,
    mapped,
    openai_batch,
    openai_chat,
    plain_prompt,
    server_logs,
    token_ids,
)
from analyzer.loaders.guard import MAX_JSON_DEPTH, checked, too_deep, unexpected
from analyzer.loaders.joins import Answer, join_answers
from analyzer.loaders.jsonl import json_object
from analyzer.loaders.mapped import FieldMap
from analyzer.loaders.sources import (
    MAX_LINE_BYTES,
    LongLine,
    ReadMeter,
    expand_inputs,
    read_items,
)
from analyzer.records import Columns, Record

Parsed = Record | list[Record] | Answer
Parser = Callable[[Any, str, int], Parsed]
BatchReader = Callable[[str, Sequence[tuple[int, Any]]], list[Record | None] | Columns]


@dataclass(frozen=True)
class LogFormat:
    """A log format: how to recognise one of its lines and how to parse it.

    JSON formats see each line as a dict; text formats (server logs) see the line as a string.
    ``accepts`` tells whether a line of a file already known to be in this format is one of
    its lines (by default ``matches``); a line that is not, but is another format's, is a
    mixed-format error. ``batch``, where set, reads a batch of raw JSON lines first: the Record
    of each line exactly as ``parse`` reads it, or None for ``parse`` to read it (and say why);
    or, when it takes every line, their Columns (the same Records as columns).
    """

    name: str
    description: str
    matches: Callable[[Any], bool]
    parse: Parser
    text: bool = False
    accepts: Callable[[Any], bool] | None = None
    batch: BatchReader | None = None

    def owns(self, item: Any) -> bool:
        return (self.accepts or self.matches)(item)


FORMATS: dict[str, LogFormat] = {
    f.name: f
    for f in (
        LogFormat(
            "bailian-trace",
            "Alibaba Bailian hash-id traces (chat_id, parent_chat_id, 16-token blocks)",
            hash_trace.matches_bailian,
            partial(hash_trace.parse, block_size=hash_trace.BAILIAN_BLOCK_SIZE),
            batch=partial(
                hash_trace.plain_records, block_size=hash_trace.BAILIAN_BLOCK_SIZE, bailian=True
            ),
        ),
        LogFormat(
            "hash-trace",
            "hash-id traces (Mooncake)",
            hash_trace.matches,
            hash_trace.parse,
            batch=hash_trace.plain_lines,
        ),
        LogFormat(
            "tokens",
            "pre-tokenized prompt_token_ids",
            token_ids.matches,
            token_ids.parse,
            batch=token_ids.plain_lines,
        ),
        LogFormat(
            "openai-batch",
            "OpenAI Batch API input and output JSONL",
            openai_batch.matches,
            openai_batch.parse,
        ),
        LogFormat(
            "litellm",
            "LiteLLM StandardLoggingPayload",
            litellm.matches,
            litellm.parse,
        ),
        LogFormat(
            "langfuse",
            "Langfuse observation exports",
            langfuse.matches,
            langfuse.parse,
        ),
        LogFormat("helicone", "Helicone request exports", helicone.matches, helicone.parse),
        LogFormat(
            "anthropic",
            "Anthropic Messages requests (system, content blocks, cache_control)",
            anthropic.matches,
            anthropic.parse,
            accepts=anthropic.accepts,
        ),
        LogFormat(
            "openai",
            "OpenAI chat-completions requests (with their responses)",
            openai_chat.matches,
            openai_chat.parse,
        ),
        LogFormat(
            "sharegpt",
            "ShareGPT conversations (one request per assistant turn)",
            conversations.matches_sharegpt,
            conversations.parse_sharegpt,
        ),
        LogFormat(
            "lmsys",
            "LMSYS-Chat conversations (one request per assistant turn)",
            conversations.matches_lmsys,
            conversations.parse_lmsys,
        ),
        LogFormat(
            "prompt", 'plain {"prompt": ...} lines', plain_prompt.matches, plain_prompt.parse
        ),
        LogFormat(
            "vllm-log",
            "vLLM server logs (--enable-log-requests)",
            server_logs.matches_vllm,
            server_logs.parse_vllm,
            text=True,
            accepts=server_logs.is_text,
        ),
        LogFormat(
            "sglang-log",
            "SGLang server logs (--log-requests)",
            server_logs.matches_sglang,
            server_logs.parse_sglang,
            text=True,
            accepts=server_logs.is_text,
        ),
    )
}
MAPPED = LogFormat("mapped", "any JSON, read through --*-field paths", mapped.matches, mapped.parse)
DETECTION_LINES = 50  # JSON objects looked at to detect a format
DETECTION_TEXT_LINES = 5000  # server logs: lines looked at for the first request line
DETECTION_BYTES = 32 << 20  # and at most this many bytes of them


@dataclass
class LoadResult:
    """Everything read: the requests in input order, the skipped lines (counted, a bounded
    sample kept), each file's format."""

    records: Sequence[Record] = field(default_factory=list)  # a RecordList once chunks are read
    skips: SkipLog = field(default_factory=SkipLog)
    formats: dict[str, str] = field(default_factory=dict)
    lines_read: int = 0
    answers_joined: int = 0
    meter: ReadMeter = field(default_factory=ReadMeter)  # bytes of the input read so far


def format_names() -> list[str]:
    return ["auto", *FORMATS]


def detect_format(path: Any) -> LogFormat:
    """The format of the first objects (or request lines) in the file that a loader recognises."""
    name = str(path)
    return _detect(name, _peek(name))


def load_logs(
    paths: Sequence[Any],
    format_name: str = "auto",
    *,
    strict: bool = False,
    hash_block_size: int | None = None,
    fields: FieldMap | None = None,
) -> LoadResult:
    """Read every file; a bad line becomes a Skip (or, with ``strict``, a StrictModeError)."""
    result = LoadResult()
    result.records = list(
        iter_records(
            paths,
            format_name,
            result,
            strict=strict,
            hash_block_size=hash_block_size,
            fields=fields,
            hold_answerable=False,
        )
    )
    return result


def iter_records(
    paths: Sequence[Any],
    format_name: str,
    result: LoadResult,
    *,
    strict: bool = False,
    hash_block_size: int | None = None,
    fields: FieldMap | None = None,
    hold_answerable: bool = True,
    columns: bool = False,
) -> Iterator[Record | Columns]:
    """The requests of every file, as they are read; skips, formats and counts go to ``result``.

    A request that a later line may still answer (one with a request id: server logs, Batch
    files) gets its answer when every file has been read. With ``hold_answerable`` such requests
    are held back until then, so that a consumer never sees a request before its answer; without
    it they are yielded at once and filled in afterwards (the consumer must keep them).
    With ``columns`` a batch of plain pre-tokenized or Mooncake lines comes as one Columns
    (TokenLines, HashLines: their lines hold no request id), otherwise as its Records.
    """
    if format_name != "auto" and format_name not in FORMATS and format_name != MAPPED.name:
        raise PrefixcheckError(
            f"unknown --format {format_name!r}; choose {', '.join(format_names())}"
        )
    answers: list[Answer] = []
    answerable: list[Record] = []
    names = expand_inputs(paths)
    result.meter.expect(names)
    for name in names:
        items = _peek(name, result.meter)
        log_format = _chosen_format(name, items, format_name, fields)
        result.formats[name] = log_format.name
        parse, batch = _configured(log_format, hash_block_size, fields)
        for item in _parse_items(name, items, log_format, parse, batch, fields, columns):
            if isinstance(item, Columns):
                result.lines_read += len(item)
                yield item
                continue
            result.lines_read += 1
            if isinstance(item, Skip):
                if strict:
                    raise StrictModeError(item)
                result.skips.append(item)
            elif isinstance(item, Answer):
                answers.append(item)
            else:
                for record in item if isinstance(item, list) else [item]:
                    if record.request_id is not None:
                        answerable.append(record)
                        if hold_answerable:
                            continue
                    yield record
    orphans = join_answers(answerable, answers)
    if orphans and strict:
        raise StrictModeError(orphans[0])
    result.skips.extend(orphans)
    result.answers_joined = len(answers) - len(orphans)
    if hold_answerable:
        yield from answerable


def _chosen_format(
    name: str, items: _Peeked, format_name: str, fields: FieldMap | None
) -> LogFormat:
    if format_name == MAPPED.name or (format_name == "auto" and fields and fields.has_request()):
        if not (fields and fields.has_request()):
            raise PrefixcheckError("--format mapped needs --prompt-field or --messages-field")
        return MAPPED
    return _detect(name, items) if format_name == "auto" else FORMATS[format_name]


def _configured(
    log_format: LogFormat, hash_block_size: int | None, fields: FieldMap | None
) -> tuple[Parser, BatchReader | None]:
    """The format's line parser and batch reader, with the flags that configure them."""
    batch = log_format.batch
    if log_format.name in ("hash-trace", "bailian-trace") and hash_block_size is not None:
        if batch is not None:
            batch = partial(batch, block_size=hash_block_size)
        return partial(log_format.parse, block_size=hash_block_size), batch
    if log_format is MAPPED:
        assert fields is not None
        return partial(mapped.parse, fields=fields), None
    return log_format.parse, batch


@dataclass
class _Peeked:
    """The first items of a file (read once, so standard input works) and the rest."""

    head: list[tuple[int, Any]]
    rest: Iterator[tuple[int, Any]]
    objects: bool  # items are already objects (Parquet rows, JSON-array items)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return chain(self.head, self.rest)


def _peek(name: str, meter: ReadMeter | None = None) -> _Peeked:
    """The first items of a source, opened once; at most DETECTION_BYTES of raw lines."""
    objects, items = read_items(name, meter)
    if objects:
        return _Peeked(list(islice(items, DETECTION_LINES)), items, objects=True)
    head: list[tuple[int, Any]] = []
    size = 0
    for number, line in items:
        head.append((number, line))
        size += len(line) if isinstance(line, bytes) else 0
        if len(head) >= DETECTION_TEXT_LINES or size >= DETECTION_BYTES:
            break
    return _Peeked(head, items, objects=False)


def _detect(name: str, items: _Peeked) -> LogFormat:
    seen_keys: list[str] = []
    objects = 0
    unreadable: Skip | None = None  # the first line that could not be read, for the error
    for line, item in items.head:
        value = item if items.objects else _decode(item, name, line)
        if isinstance(value, Skip):
            unreadable = unreadable or value
            continue
        if isinstance(value, dict):
            objects += 1
            if objects > DETECTION_LINES:
                break
            seen_keys = seen_keys or sorted(value)[:8]
        found = _format_of(value)
        if found is not None:
            return found
    if not seen_keys and not items.head:
        raise PrefixcheckError(f"{name}: empty input")
    if not seen_keys:
        why = f"; {unreadable}" if unreadable is not None else ""
        raise PrefixcheckError(
            f"{name}: no JSON object and no vLLM/SGLang request line in the first "
            f"{len(items.head)} lines{why}; choose a format with --format ({', '.join(FORMATS)})"
        )
    raise PrefixcheckError(
        f"{name}: unknown log format (keys {seen_keys}); choose one with --format "
        f"({', '.join(FORMATS)}) or map the fields with --prompt-field / --messages-field"
    )


def _format_of(value: Any) -> LogFormat | None:
    """The first format that recognises one line (a dict, or a text line)."""
    for log_format in FORMATS.values():
        if log_format.text == isinstance(value, str) and log_format.matches(value):
            return log_format
    return None


def _decode(raw: bytes | LongLine, name: str, line: int) -> dict[str, Any] | str | Skip:
    """A JSON object when the line looks like one, else the line as text (server logs' lines
    may start with ``[``, a timestamp)."""
    if isinstance(raw, LongLine):
        return _too_long(raw, name, line)
    if raw.lstrip()[:1] == b"{" or not raw.strip():
        return json_object(raw, name, line)
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        return Skip(name, line, "not UTF-8 text")


def _parse_items(
    name: str,
    items: _Peeked,
    log_format: LogFormat,
    parse: Parser,
    batch: BatchReader | None,
    fields: FieldMap | None,
    columns: bool = False,
) -> Iterator[Parsed | Skip | Columns]:
    """Each line parsed, or its Skip: the one place where a line's errors, anticipated
    (BadLine) or not (any other exception, a bug or an input no one foresaw), become a reasoned
    skip naming file and line. Errors of the whole input (PrefixcheckError) still stop the run.
    JSON lines of a format with a batch reader (pre-tokenized, hash-id traces) go through it
    first (``columns``: the Columns it reads kept as they come)."""
    if batch is not None and fields is None and not items.objects:
        yield from _parse_batched(name, items, log_format, parse, batch, columns)
        return
    for line, item in items:
        yield _parse_item(name, line, item, items.objects, log_format, parse, fields)


# JSON lines decoded at a time by a batch reader: ingest.CHUNK_RECORDS, so that a chunk of
# plain lines is one batch's Columns, its workload their arrays (no copy).
LINES_PER_BATCH = 2000


def _parse_batched(
    name: str,
    items: _Peeked,
    log_format: LogFormat,
    parse: Parser,
    batch: BatchReader,
    columns: bool,
) -> Iterator[Parsed | Skip | Columns]:
    """Each line read by the batch reader, or, where that does not take it, by ``_parse_item``
    (the same Record either way, and the same skip); lines it takes as Columns come as those
    with ``columns``, else as their Records."""
    lines = iter(items)
    while chunk := list(islice(lines, LINES_PER_BATCH)):
        read = batch(name, chunk)
        if isinstance(read, Columns):
            if columns:
                yield read
                continue
            read = list(read.records())
        for (line, item), record in zip(chunk, read, strict=True):
            if record is None:
                yield _parse_item(name, line, item, False, log_format, parse, None)
            else:
                yield record


def _parse_item(
    name: str,
    line: int,
    item: Any,
    objects: bool,
    log_format: LogFormat,
    parse: Parser,
    fields: FieldMap | None,
) -> Parsed | Skip:
    """One line parsed, or its Skip."""
    try:
        value = _item_value(item, name, line, log_format, objects)
        if isinstance(value, Skip):
            return value
        if not log_format.owns(value):
            _raise_if_mixed(value, log_format)
        parsed = parse(value, name, line)
        if fields is not None and isinstance(value, dict):
            mapped.apply_overrides(parsed, value, fields)
        return checked(parsed)
    except BadLine as exc:
        return Skip(name, line, exc.reason)
    except PrefixcheckError:
        raise
    except Exception as exc:
        return Skip(name, line, unexpected(exc))


def _item_value(
    item: Any, name: str, line: int, log_format: LogFormat, objects: bool
) -> dict[str, Any] | str | Skip:
    if objects:
        if not isinstance(item, dict):
            return Skip(name, line, "expected a JSON object")
        return Skip(name, line, _DEEP) if too_deep(item) else item
    if isinstance(item, LongLine):
        return _too_long(item, name, line)
    if log_format.text:
        try:
            return item.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            return Skip(name, line, "not UTF-8 text")
    return json_object(item, name, line)


_DEEP = f"JSON nested too deeply (over {MAX_JSON_DEPTH} levels)"


def _too_long(line: LongLine, name: str, number: int) -> Skip:
    return Skip(
        name,
        number,
        f"line of {line.size:,} bytes, over the maximum {MAX_LINE_BYTES >> 20} MiB (not read)",
    )


def _raise_if_mixed(value: Any, log_format: LogFormat) -> None:
    other = _format_of(value)
    if other is not None and other is not log_format:
        raise BadLine(
            f"a {other.name!r} line in a {log_format.name!r} file (mixed formats: split the "
            "file, or choose one with --format)"
        )
