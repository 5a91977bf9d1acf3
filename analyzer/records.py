"""One request as read from a log, before chat rendering and tokenization."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

Message = dict[str, Any]


@dataclass(frozen=True)
class HashBlocks:
    """A hash-id trace's request before expansion: its ids (the prompt's, then any
    ``output_hash_ids``), ``block_size`` tokens each, which spell ``known_length`` tokens: the
    prompt's ``prompt_length``, and the answer's when the line has output ids."""

    ids: np.ndarray  # int64
    block_size: int
    prompt_length: int
    known_length: int


@dataclass(slots=True)
class Record:
    """A request: exactly one of ``messages``, ``prompt``, ``prompt_token_ids`` or
    ``hash_blocks`` (a hash-id trace's line, expanded into tokens when it is tokenized) is set.

    ``output_text`` / ``output_token_ids`` hold the answer when the log has it (multi-turn caching
    depends on the answer's tokens); otherwise ``output_length`` may give its size alone. An
    answer that is a message with ``tool_calls`` is ``output_message``: its tokens are what the
    chat template renders for that assistant turn.
    ``server_cached_tokens`` is the serving engine's own count of prompt tokens served from its
    cache, when the log has it (compared with the replay), and ``server_prompt_tokens`` its count
    of the prompt's tokens (ours equal it when we tokenize as the server did); ``request_id``
    joins answers logged apart from their request (vLLM's ``Generated response`` lines, Batch
    API output files). ``routing`` holds the fleet's dotted routing fields of the line
    (``--session-field``, ``--replica-field``), by path.
    """

    file: str
    line: int
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | np.ndarray | None = None
    hash_blocks: HashBlocks | None = None
    output_text: str | None = None
    output_token_ids: list[int] | np.ndarray | None = None
    output_message: Message | None = None
    output_length: int | None = None
    finish_reason: str | None = None
    cache_salt: str | None = None
    extra_key: str | None = None  # SGLang's request extra_key: its own cache namespace
    priority: int | None = None  # SGLang's request priority (stored in the radix tree)
    prompt_logprobs: bool | None = None  # vLLM prompt_logprobs set: no prefix lookup
    logprob_start_len: int | None = None  # SGLang return_logprob's start: caps the match
    max_new_tokens: int | None = None  # the request's output limit (max_tokens, max_new_tokens)
    lora: str | None = None
    model: str | None = None
    arrival_s: float | None = None
    tenant: str | None = None
    server_cached_tokens: int | None = None
    server_prompt_tokens: int | None = None
    request_id: str | None = None
    routing: dict[str, str | None] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # None: as the engine does for a chat / a prompt


@dataclass(frozen=True)
class TokenLines:
    """Consecutive plain pre-tokenized lines of one file as columns: what their Records hold
    (``loaders.token_ids.plain_lines``, the compiled reader), without an object per line.
    ``records()`` gives those Records; ``workload.build_lines_workload`` reads the columns."""

    file: str
    lines: np.ndarray  # int64: each line's number
    prompt_ids: np.ndarray  # int32, flat
    prompt_offsets: np.ndarray  # int64, one more than lines
    output_ids: np.ndarray  # int32, flat; an empty answer is none given
    output_offsets: np.ndarray
    finish_reason: list[str | None]
    cache_salt: list[str | None]  # as a Record holds them: an empty salt or LoRA is None
    lora: list[str | None]
    model: list[str | None]

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)

    def estimated_tokens(self) -> np.ndarray:
        """Each line's prompt tokens (``ingest._estimated_tokens``: no claimed answer length)."""
        return self.prompt_lengths

    def slice(self, start: int, stop: int) -> TokenLines:
        """Lines ``start`` to ``stop`` (their ids are views)."""
        p, o = self.prompt_offsets, self.output_offsets
        return TokenLines(
            self.file,
            self.lines[start:stop],
            self.prompt_ids[p[start] : p[stop]],
            p[start : stop + 1] - p[start],
            self.output_ids[o[start] : o[stop]],
            o[start : stop + 1] - o[start],
            self.finish_reason[start:stop],
            self.cache_salt[start:stop],
            self.lora[start:stop],
            self.model[start:stop],
        )

    def records(self, with_ids: bool = True) -> list[Record]:
        """The lines' Records (``with_ids`` False: without their ids, as a Record is once the
        workload holds them)."""
        p, o = self.prompt_offsets.tolist(), self.output_offsets.tolist()
        out = []
        for i, line in enumerate(self.lines.tolist()):
            answer = with_ids and o[i + 1] > o[i]
            out.append(
                Record(
                    file=self.file,
                    line=line,
                    prompt_token_ids=self.prompt_ids[p[i] : p[i + 1]] if with_ids else None,
                    output_token_ids=self.output_ids[o[i] : o[i + 1]] if answer else None,
                    finish_reason=self.finish_reason[i],
                    cache_salt=self.cache_salt[i],
                    lora=self.lora[i],
                    model=self.model[i],
                )
            )
        return out


@dataclass(frozen=True)
class HashLines:
    """Consecutive plain Mooncake hash-id lines of one file as columns (``loaders.hash_trace.
    plain_lines``): what their Records hold, without an object per line."""

    file: str
    lines: np.ndarray  # int64: each line's number
    ids: np.ndarray  # int64, flat: each line's prompt ids, then its answer's
    id_offsets: np.ndarray  # int64, one more than lines
    block_size: int
    prompt_length: np.ndarray  # int64
    known_length: np.ndarray  # int64: tokens the ids spell
    output_length: np.ndarray  # int64; -1: none given
    arrival_s: np.ndarray  # float64 seconds; NaN: none given

    def __len__(self) -> int:
        return len(self.lines)

    def estimated_tokens(self) -> np.ndarray:
        """Each line's prompt and claimed answer tokens (``ingest._estimated_tokens``)."""
        return self.prompt_length + np.maximum(self.output_length, 0)

    def slice(self, start: int, stop: int) -> HashLines:
        """Lines ``start`` to ``stop`` (their ids are views)."""
        o = self.id_offsets
        return HashLines(
            self.file,
            self.lines[start:stop],
            self.ids[o[start] : o[stop]],
            o[start : stop + 1] - o[start],
            self.block_size,
            self.prompt_length[start:stop],
            self.known_length[start:stop],
            self.output_length[start:stop],
            self.arrival_s[start:stop],
        )

    def records(self, with_ids: bool = True) -> list[Record]:
        """The lines' Records (their ids are a trace's few per block: kept either way)."""
        o = self.id_offsets.tolist()
        arrivals = [None if math.isnan(a) else a for a in self.arrival_s.tolist()]
        outputs = [None if n < 0 else n for n in self.output_length.tolist()]
        return [
            Record(
                file=self.file,
                line=line,
                hash_blocks=HashBlocks(self.ids[o[i] : o[i + 1]], self.block_size, prompt, known),
                output_length=outputs[i],
                arrival_s=arrivals[i],
            )
            for i, (line, prompt, known) in enumerate(
                zip(
                    self.lines.tolist(),
                    self.prompt_length.tolist(),
                    self.known_length.tolist(),
                    strict=True,
                )
            )
        ]


Columns = TokenLines | HashLines  # lines read as columns


class RecordList(Sequence[Record]):
    """Records held as lists and as Columns (whose Records are made as they are read, a
    TokenLines' without ids): a log's requests without an object per plain line."""

    def __init__(self, parts: Sequence[Sequence[Record] | Columns]) -> None:
        self.parts = [part for part in parts if len(part)]
        self._starts = np.cumsum([0, *(len(part) for part in self.parts)])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __iter__(self) -> Iterator[Record]:
        for part in self.parts:
            yield from part.records(with_ids=False) if isinstance(part, Columns) else part

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            return list(self)[index]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        part = self.parts[k]
        at = index - int(self._starts[k])
        if isinstance(part, Columns):
            return part.slice(at, at + 1).records(with_ids=False)[0]
        return part[at]


def any_messages(records: Sequence[Record]) -> bool:
    """Whether any request is a chat, without making a RecordList's Records (Columns never
    are)."""
    if isinstance(records, RecordList):
        return any(
            r.messages for part in records.parts if not isinstance(part, Columns) for r in part
        )
    return any(r.messages for r in records)
