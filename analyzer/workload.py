"""From Records to the columnar Workload: render chats, tokenize in batches, lay tokens out flat."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzer.chat import ChatRenderer
from analyzer.errors import BadLine, PrefixcheckError, Skip, SkipLog, StrictModeError
from analyzer.loaders.guard import check_unicode, unexpected
from analyzer.loaders.hash_trace import expanded
from analyzer.progress import NoProgress, Progress
from analyzer.records import HashLines, Record, TokenLines
from analyzer.sandbox import render_watch
from analyzer.token_cache import CacheStats, cached_ids, encode_texts, store_ids
from analyzer.tokenizer import Tokenizer
from cache_models.hash_runs import HashTrace
from cache_models.runs import RunWorkload
from cache_models.workload import Workload, joined_offsets, offsets_of

# Finish reasons that mean the request hit max_tokens; anything else ended on a stop token.
LENGTH_FINISH_REASONS = frozenset({"length", "max_tokens", "model_length"})


@dataclass
class ChunkState:
    """What the chunks of one streamed log share so that they read as one log: namespace ids
    (keyed by model too, as the models are not known in advance) and unknown-token ids."""

    namespace_ids: dict[tuple[str, str, str, str], int] = field(
        default_factory=lambda: {("", "", "", ""): 0}
    )
    models: set[str] = field(default_factory=set)
    next_unknown: int = -1

    def labels(self) -> list[str]:
        return _namespace_labels(self.namespace_ids, several_models=len(self.models) > 1)


@dataclass(kw_only=True)
class LogTable:
    """One metadata row per request (input order), and what reading the log found."""

    requests: pl.DataFrame
    skips: SkipLog
    namespace_labels: list[str]  # by namespace id; "" is the default namespace
    from_text: bool
    assumed_stop_finish: int
    token_cache: CacheStats = field(default_factory=CacheStats)


@dataclass(kw_only=True)
class TokenizedLog(LogTable):
    """The table plus the requests' tokens: the columnar workload (same order)."""

    workload: Workload


def routing_column(path: str) -> str:
    """The requests frame's column of a routing field (``--session-field``, ``--replica-field``)."""
    return f"routing:{path}"


def build_workload(
    records: Sequence[Record],
    tokenizer: Tokenizer,
    renderer: ChatRenderer,
    *,
    strict: bool = False,
    progress: Progress | None = None,
    cache_dir: Path | None = None,
    chunk_state: ChunkState | None = None,
    routing_fields: Sequence[str] = (),
) -> TokenizedLog:
    """Tokenize every record exactly as the server would; records that fail become Skips.

    Each of ``routing_fields`` (the fleet's dotted fields) becomes a string column of the
    requests frame, named by ``routing_column``.

    Token ids are read from and written to the token cache under ``cache_dir`` (None: no cache).
    ``chunk_state`` makes this one chunk of a longer log (None: the records are the whole log).
    """
    progress = progress or NoProgress()
    _expand_hash_blocks(records)
    skips = SkipLog()
    kept: list[Record] = []
    texts: list[str] = []
    text_index: list[int] = []
    specials: list[bool] = []
    request_keys = _request_keys(records, renderer, cache_dir is not None)
    known, request_stats = (
        cached_ids([k for k in request_keys if k], tokenizer, cache_dir, renderer.fingerprint)
        if cache_dir is not None
        else ({}, CacheStats())
    )
    from_cache: dict[int, np.ndarray] = {}  # kept index: its prompt's ids, not rendered
    rendered_keys: list[tuple[int, bytes]] = []  # kept index: its request key, to store
    with render_watch():  # one timer for the chunk's renders
        for record, request_key in zip(records, request_keys, strict=True):
            if request_key is not None and request_key in known:
                from_cache[len(kept)] = known[request_key]
                kept.append(record)
                continue
            try:  # the one place where a request's rendering errors become its skip
                text, add_special = _prompt_text(record, renderer)
                if text is not None:
                    check_unicode("rendered prompt", text)
                if record.output_message is not None and text is not None:
                    record.output_text = _answer_text(record, text, renderer)
                    if record.output_text is not None:
                        check_unicode("answer text", record.output_text)
            except BadLine as exc:
                skip = Skip(record.file, record.line, exc.reason)
            except PrefixcheckError:
                raise
            except Exception as exc:
                skip = Skip(record.file, record.line, unexpected(exc))
            else:
                skip = None
            if skip is not None:
                if strict:
                    raise StrictModeError(skip) from None
                skips.append(skip)
                continue
            if text is not None:
                if request_key is not None:
                    rendered_keys.append((len(kept), request_key))
                text_index.append(len(kept))
                texts.append(text)
                specials.append(add_special)
            kept.append(record)

    prompts: list[np.ndarray | None] = [
        None if r.prompt_token_ids is None else np.asarray(r.prompt_token_ids, np.int32)
        for r in kept
    ]
    encoded, cache_stats = encode_texts(
        texts,
        specials,
        tokenizer,
        cache_dir=cache_dir,
        progress=progress,
        stage="tokenizing prompts",
        context=renderer.fingerprint,
    )
    for i, ids in zip(text_index, encoded, strict=True):
        prompts[i] = ids
    for i, ids in from_cache.items():
        prompts[i] = ids
    if cache_dir is not None and rendered_keys and cache_stats.error is None:
        stored = store_ids(
            [key for _, key in rendered_keys],
            [prompts[i] for i, _ in rendered_keys],
            tokenizer,
            cache_dir,
            renderer.fingerprint,
        )
        request_stats = CacheStats.total([request_stats, stored])
    request_stats.from_cache = len(from_cache)

    state = chunk_state or ChunkState()
    outputs, answer_cache = _output_tokens(kept, tokenizer, progress, cache_dir, state)
    final: list[int] = []
    for i, prompt in enumerate(prompts):
        if prompt is None or len(prompt) == 0:
            skip = Skip(kept[i].file, kept[i].line, "prompt has no tokens")
            if strict:
                raise StrictModeError(skip)
            skips.append(skip)
        else:
            final.append(i)
    kept = [kept[i] for i in final]
    prompt_arrays = [prompts[i] for i in final]
    output_arrays = [outputs[i][0] for i in final]
    namespace, namespace_labels = _namespaces(kept, chunk_state)
    workload = replace(
        Workload.from_arrays(
            prompt_arrays,
            output_arrays,
            namespace=namespace,
            stop_finish=[_is_stop(r.finish_reason) for r in kept],
            arrival_s=_arrivals(kept),
        ),
        **_cache_columns(kept),
    )
    requests = _requests_frame(
        kept,
        workload.prompt_lengths,
        workload.output_lengths,
        [outputs[i][1] for i in final],
        routing_fields,
    )
    return TokenizedLog(
        workload=workload,
        requests=requests,
        skips=skips,
        namespace_labels=namespace_labels,
        from_text=bool(texts) or bool(from_cache),
        assumed_stop_finish=sum(r.finish_reason is None for r in kept),
        token_cache=CacheStats.total([cache_stats, answer_cache, request_stats]),
    )


def build_lines_workload(
    pieces: Sequence[TokenLines], chunk_state: ChunkState, routing_fields: Sequence[str] = ()
) -> TokenizedLog:
    """``build_workload`` of the pieces' Records, from their columns: the same workload, rows,
    namespaces and unknown answer ids (a line without answer ids gets one unknown token), with
    no object per line. Plain lines have no time, priority or other cache field."""
    prompts = _joined_ids([piece.prompt_ids for piece in pieces])
    answers = _joined_ids([piece.output_ids for piece in pieces])
    prompt_lengths = np.concatenate([piece.prompt_lengths for piece in pieces])
    answer_lengths = np.concatenate([np.diff(piece.output_offsets) for piece in pieces])
    known = answer_lengths > 0
    output_lengths = np.where(known, answer_lengths, 1)
    outputs = np.empty(int(output_lengths.sum()), np.int32)
    given = np.repeat(known, output_lengths)
    outputs[given] = answers
    unknown = len(known) - int(known.sum())
    first = chunk_state.next_unknown
    outputs[~given] = np.arange(first, first - unknown, -1, dtype=np.int32)
    chunk_state.next_unknown = first - unknown
    column = {
        name: [value for piece in pieces for value in getattr(piece, name)]
        for name in ("model", "cache_salt", "lora", "finish_reason")
    }
    n = len(known)
    workload = Workload(
        prompt_tokens=prompts,
        prompt_offsets=offsets_of(prompt_lengths),
        output_tokens=outputs,
        output_offsets=offsets_of(output_lengths),
        namespace=_line_namespaces(column, chunk_state),
        stop_finish=_per_value(column["finish_reason"], _is_stop, bool),
    )
    nulls = [None] * n
    requests = _frame(
        {
            **_where_read(pieces),
            **column,
            "arrival_s": nulls,
            "tenant": nulls,
            "server_cached_tokens": nulls,
            "server_prompt_tokens": nulls,
        },
        workload.prompt_lengths,
        workload.output_lengths,
        known,
        {path: nulls for path in routing_fields},
    )
    return TokenizedLog(
        workload=workload,
        requests=requests,
        skips=SkipLog(),
        namespace_labels=chunk_state.labels(),
        from_text=False,
        assumed_stop_finish=column["finish_reason"].count(None),
    )


def _line_namespaces(column: dict[str, list], chunk_state: ChunkState) -> np.ndarray:
    """``_namespaces`` of lines read as columns (no extra key)."""
    models = column["model"]
    chunk_state.models.update(model or "" for model in set(models))
    keys = zip(models, column["cache_salt"], column["lora"], [None] * len(models), strict=True)
    return _namespace_ids(list(keys), chunk_state.namespace_ids)


NamespaceKey = tuple[str | None, str | None, str | None, str | None]


def _namespace_ids(
    keys: list[NamespaceKey], ids: dict[tuple[str, str, str, str], int]
) -> np.ndarray:
    """The id of each (model, cache_salt, LoRA, extra_key) in ``ids`` (None is ""), a new one
    numbered in order of first appearance."""

    def namespace(key: NamespaceKey) -> int:
        model, salt, lora, extra = key
        return ids.setdefault((model or "", salt or "", lora or "", extra or ""), len(ids))

    return _per_value(keys, namespace, np.int32)


def _per_value(values: list, of: Callable[[Any], Any], dtype: type) -> np.ndarray:
    """``of(value)`` of each value, computed once per distinct value (a log repeats its few
    models, salts and finish reasons), in their order of first appearance."""
    if values and values.count(values[0]) == len(values):  # one value, the common case
        return np.full(len(values), of(values[0]), dtype)
    seen: dict[Any, Any] = {}
    return np.array([seen[v] if v in seen else seen.setdefault(v, of(v)) for v in values], dtype)


def _joined_ids(parts: list[np.ndarray]) -> np.ndarray:
    """The parts' ids as one array: the part itself when there is one (a chunk that is one
    batch of lines), not a copy."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def build_run_workload(
    items: Sequence[Record | HashLines],
    trace: HashTrace,
    runs: RunWorkload,
    *,
    chunk_state: ChunkState,
    routing_fields: Sequence[str] = (),
) -> TokenizedLog:
    """Records (or HashLines) of a hash-id trace (``trace`` holds their ids as columns, ``runs``
    their runs: ``cache_models.hash_runs.run_workload``) with the same requests, rows and
    namespaces as ``build_workload`` gives them, the tokens left unexpanded."""
    if all(isinstance(item, HashLines) for item in items):
        lines: Sequence[HashLines] = items  # type: ignore[assignment]
        n = sum(len(piece) for piece in lines)
        chunk_state.models.add("")  # no line has a model, salt, LoRA or extra key:
        namespace = np.zeros(n, np.int32)  # the default namespace, id 0
        namespace_labels = chunk_state.labels()
        stop_finish = np.ones(n, bool)  # no finish reason: a stop
        arrival = _flat([piece.arrival_s for piece in lines]).astype(np.float64)
        arrival_s = arrival if n and not np.isnan(arrival).any() else None
        nulls = [None] * n
        columns = {name: nulls for name in RECORD_COLUMNS} | {
            **_where_read(lines),
            "arrival_s": pl.Series(arrival).fill_nan(None),  # NaN: no time
        }
        routing = {path: nulls for path in routing_fields}
        assumed_stop = n
    else:
        records = [r for item in items for r in _item_records(item)]
        namespace, namespace_labels = _namespaces(records, chunk_state)
        stop_finish = np.array([_is_stop(r.finish_reason) for r in records], bool)
        arrival_s = _arrivals(records)
        columns = {name: [getattr(r, name) for r in records] for name in RECORD_COLUMNS}
        routing = {path: [(r.routing or {}).get(path) for r in records] for path in routing_fields}
        assumed_stop = sum(r.finish_reason is None for r in records)
    workload = replace(
        runs,
        runs=replace(runs.runs, namespace=namespace, stop_finish=stop_finish, arrival_s=arrival_s),
    )
    return TokenizedLog(
        workload=workload,  # type: ignore[arg-type]  # a RunWorkload: replayed, never indexed
        requests=_frame(
            columns,
            trace.prompt_lengths,
            trace.output_lengths,
            trace.known_lengths > trace.prompt_lengths,
            routing,
        ),
        skips=SkipLog(),
        namespace_labels=namespace_labels,
        from_text=False,
        assumed_stop_finish=assumed_stop,
    )


def hash_trace_of(items: Sequence[Record | HashLines]) -> HashTrace:
    """The ids and lengths of hash-trace records (or HashLines) of one block size as columns
    (namespace, finish and arrival are set per chunk by ``build_run_workload``)."""
    parts: list[HashLines] = []
    records: list[Record] = []
    for item in [*items, None]:  # consecutive records as one part
        if isinstance(item, Record):
            records.append(item)
            continue
        if records:
            parts.append(_as_lines(records))
            records = []
        if item is not None:
            parts.append(item)
    if len({part.block_size for part in parts}) > 1:
        raise ValueError("runs need hash-trace records of one block size")
    n = sum(len(part) for part in parts)
    return HashTrace(
        ids=_flat([part.ids for part in parts]),
        id_offsets=joined_offsets([part.id_offsets for part in parts]),
        block_size=parts[0].block_size if parts else 1,
        prompt_lengths=_flat([part.prompt_length for part in parts]),
        output_lengths=np.maximum(1, _flat([part.output_length for part in parts])),
        known_lengths=_flat([part.known_length for part in parts]),
        namespace=np.zeros(n, np.int32),
        stop_finish=np.ones(n, bool),
    )


def _as_lines(records: Sequence[Record]) -> HashLines:
    """Hash-trace records as the columns ``hash_trace_of`` reads (of one block size; their
    file, lines and times, which it does not read, left blank)."""
    blocks = [r.hash_blocks for r in records if r.hash_blocks is not None]
    if len(blocks) != len(records) or len({b.block_size for b in blocks}) > 1:
        raise ValueError("runs need hash-trace records of one block size")
    return HashLines(
        file="",
        lines=np.zeros(len(records), np.int64),
        ids=_flat([b.ids for b in blocks]),
        id_offsets=offsets_of(np.array([len(b.ids) for b in blocks], np.int64)),
        block_size=blocks[0].block_size,
        prompt_length=np.array([b.prompt_length for b in blocks], np.int64),
        known_length=np.array([b.known_length for b in blocks], np.int64),
        output_length=np.array([r.output_length or 0 for r in records], np.int64),
        arrival_s=np.zeros(len(records)),
    )


def _where_read(pieces: Sequence[TokenLines | HashLines]) -> dict[str, Sequence]:
    """The request frame's ``file`` and ``line`` columns of lines read as columns."""
    files: list[str] = []
    for piece in pieces:
        files += [piece.file] * len(piece)
    return {"file": files, "line": _flat([piece.lines for piece in pieces])}


def _flat(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _item_records(item: Record | HashLines) -> list[Record]:
    return item.records() if isinstance(item, HashLines) else [item]


def _expand_hash_blocks(records: Sequence[Record]) -> None:
    """Hash-trace records get their synthetic tokens (``hash_trace.expanded``)."""
    for record in records:
        if record.hash_blocks is not None and record.prompt_token_ids is None:
            record.prompt_token_ids, record.output_token_ids = expanded(record.hash_blocks)


def _requests_frame(
    kept: Sequence[Record],
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    output_known: Sequence[bool],
    routing_fields: Sequence[str],
) -> pl.DataFrame:
    """The metadata row of each request (input order)."""
    return _frame(
        {name: [getattr(r, name) for r in kept] for name in RECORD_COLUMNS},
        prompt_tokens,
        output_tokens,
        output_known,
        {path: [(r.routing or {}).get(path) for r in kept] for path in routing_fields},
    )


RECORD_COLUMNS = (
    "file",
    "line",
    "model",
    "cache_salt",
    "lora",
    "finish_reason",
    "arrival_s",
    "tenant",
    "server_cached_tokens",
    "server_prompt_tokens",
)


def _frame(
    columns: dict[str, Sequence],
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    output_known: Sequence[bool] | np.ndarray,
    routing: dict[str, Sequence[str | None]],
) -> pl.DataFrame:
    """The requests frame of the records' ``RECORD_COLUMNS``, their lengths and ``routing``
    (each routing field's values, by path)."""
    return pl.DataFrame(
        dict(columns)
        | {
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "output_known": np.asarray(output_known, bool),
        }
        | {
            routing_column(path): pl.Series(values, dtype=pl.String)
            for path, values in routing.items()
        },
        schema_overrides={
            "arrival_s": pl.Float64,
            "model": pl.String,
            "lora": pl.String,
            "tenant": pl.String,
            "server_cached_tokens": pl.Int64,
            "server_prompt_tokens": pl.Int64,
        },
    )


def _request_keys(
    records: Sequence[Record], renderer: ChatRenderer, cached: bool
) -> list[bytes | None]:
    """The token cache's key of each chat request's prompt, taken before rendering (so that a
    cached prompt is neither rendered nor tokenized); None where the prompt is not a chat, the
    answer is rendered with it (tool calls), or there is no cache."""
    if not cached:
        return [None] * len(records)
    return [
        renderer.request_key(
            r.messages,
            r.tools,
            r.arrival_s,
            r.chat_template_kwargs,
            r.add_generation_prompt,
            bool(r.add_special_tokens),
        )
        if r.messages is not None and r.output_message is None
        else None
        for r in records
    ]


def _prompt_text(record: Record, renderer: ChatRenderer) -> tuple[str | None, bool]:
    """The text to tokenize and whether the tokenizer adds its special tokens (BOS).

    vLLM tokenizes a rendered chat without special tokens (the template holds them) and a
    completions prompt with them, and so does SGLang; a log that says which (a server log's
    rendered chat prompt) overrides this.
    """
    if record.messages is not None:
        text = renderer.render(
            record.messages,
            record.tools,
            record.arrival_s,
            kwargs=record.chat_template_kwargs,
            add_generation_prompt=record.add_generation_prompt,
        )
        return text, bool(record.add_special_tokens)
    if record.prompt is not None:
        return record.prompt, record.add_special_tokens is not False
    return None, False


def _answer_text(record: Record, prompt: str, renderer: ChatRenderer) -> str | None:
    """An answer that calls tools: what the template renders for that assistant turn (the chat
    with the answer appended, past the prompt), up to the end-of-turn token, which the answer's
    stop finish adds back. None when the template cannot render the answer."""
    assert record.messages is not None and record.output_message is not None
    try:
        full = renderer.render(
            [*record.messages, record.output_message],
            record.tools,
            record.arrival_s,
            kwargs=record.chat_template_kwargs,
            add_generation_prompt=False,
        )
    except BadLine:
        return None
    answer = full[_shared_prefix(prompt, full) :]
    eos = renderer.special.eos_token
    if eos and eos in answer:
        answer = answer[: answer.rindex(eos)]
    return answer or None


def _shared_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (a binary search over C-level comparisons)."""
    if b.startswith(a):
        return len(a)
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _output_tokens(
    records: Sequence[Record],
    tokenizer: Tokenizer,
    progress: Progress,
    cache_dir: Path | None,
    state: ChunkState,
) -> tuple[list[tuple[np.ndarray, bool]], CacheStats]:
    """Each request's generated tokens and whether they are known (and the token cache's
    stats of the answers' texts).

    Known answer text is tokenized and, for a stop finish, followed by the end-of-turn token the
    model sampled. A known length without text, or nothing at all (the engine samples at least one
    token), gives unique negative ids that never match anything.
    """
    stop_token = (
        tokenizer.token_id(tokenizer.special.eos_token or "")
        if tokenizer.special.eos_token
        else None
    )
    texts = [(i, r.output_text) for i, r in enumerate(records) if r.output_text is not None]
    ids, stats = encode_texts(
        [text for _, text in texts],
        [False] * len(texts),
        tokenizer,
        cache_dir=cache_dir,
        progress=progress,
        stage="tokenizing answers",
    )
    encoded = {i: row for (i, _), row in zip(texts, ids, strict=True)}
    stop_row = None if stop_token is None else np.array([stop_token], np.int32)

    next_unknown = state.next_unknown
    result: list[tuple[np.ndarray, bool]] = []
    for i, record in enumerate(records):
        tokens: np.ndarray | None = None
        if record.output_token_ids is not None:
            tokens = np.asarray(record.output_token_ids, np.int32)
        elif i in encoded:
            tokens = encoded[i]
            if stop_row is not None and _is_stop(record.finish_reason):
                tokens = np.concatenate((tokens, stop_row))
        if tokens is not None and len(tokens):
            result.append((tokens, True))
            continue
        count = max(1, record.output_length or 1)
        result.append((np.arange(next_unknown, next_unknown - count, -1, dtype=np.int32), False))
        next_unknown -= count
    state.next_unknown = next_unknown
    return result, stats


def _is_stop(finish_reason: str | None) -> bool:
    return finish_reason not in LENGTH_FINISH_REASONS


def _namespaces(
    records: Sequence[Record], chunk_state: ChunkState | None
) -> tuple[np.ndarray, list[str]]:
    """One id per distinct (model, cache_salt, LoRA, extra_key), and its label; none is
    namespace 0 ("").

    The model counts when the log holds several: each model is served by its own engine, whose
    cache no other model's request can hit. A chunk of a longer log always keys by model (its
    ids must hold for chunks still to come); its labels name models only once several were seen.
    """
    if chunk_state is None:
        include_model = len({r.model for r in records}) > 1
        ids: dict[tuple[str, str, str, str], int] = {("", "", "", ""): 0}
    else:
        include_model = True
        ids = chunk_state.namespace_ids
        chunk_state.models.update(r.model or "" for r in records)
    namespace = _namespace_ids(
        [(r.model if include_model else None, r.cache_salt, r.lora, r.extra_key) for r in records],
        ids,
    )
    if chunk_state is not None:
        return namespace, chunk_state.labels()
    return namespace, _namespace_labels(ids, several_models=include_model)


def _namespace_labels(
    ids: dict[tuple[str, str, str, str], int], *, several_models: bool
) -> list[str]:
    return [
        ", ".join(
            part
            for part in (
                several_models and model and f"model={model}",
                salt and f"cache_salt={salt}",
                lora and f"lora={lora}",
                extra_key and f"extra_key={extra_key}",
            )
            if part
        )
        for model, salt, lora, extra_key in ids
    ]


def _cache_columns(records: Sequence[Record]) -> dict[str, np.ndarray | None]:
    """The Workload columns of the request fields that change what the caches read (priority,
    vLLM's prompt-logprob skip, SGLang's logprob start, the output limit SGLang's scheduler
    reserves); None where no request has one."""
    priority = [r.priority for r in records]
    skip = [bool(r.prompt_logprobs) for r in records]
    limit = [r.logprob_start_len for r in records]
    max_new = [r.max_new_tokens for r in records]
    return {
        "priority": None
        if all(p is None for p in priority)
        else np.array([p or 0 for p in priority], np.int64),
        "skip_prefix_lookup": np.array(skip, np.bool_) if any(skip) else None,
        "hit_limit": None
        if all(x is None for x in limit)
        else np.array([-1 if x is None else x for x in limit], np.int64),
        "max_new_tokens": None
        if all(x is None for x in max_new)
        else np.array([-1 if x is None else x for x in max_new], np.int64),
    }


def _arrivals(records: Sequence[Record]) -> np.ndarray | None:
    if not records or any(r.arrival_s is None for r in records):
        return None
    return np.array([r.arrival_s for r in records], np.float64)
