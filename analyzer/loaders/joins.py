"""Answers logged apart from their requests (vLLM's ``Generated response`` lines, OpenAI Batch
output files), joined to the request with the same id once every file is read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.errors import Skip
from analyzer.records import Record


@dataclass(frozen=True)
class Answer:
    """What a log says about the answer to request ``request_id``."""

    request_id: str
    file: str
    line: int
    output_text: str | None = None
    output_token_ids: list[int] | None = None
    output_length: int | None = None
    finish_reason: str | None = None
    server_cached_tokens: int | None = None
    server_prompt_tokens: int | None = None
    lora: str | None = None  # vLLM >= 0.11 logs the LoRA on a line apart from the prompt
    prompt_logprobs: bool | None = None  # ... and its SamplingParams (prompt_logprobs set)
    max_new_tokens: int | None = None  # ... and max_tokens
    orphan_reason: str | None = None  # why a line without its request is skipped, if not generic


def join_answers(records: Sequence[Record], answers: Sequence[Answer]) -> list[Skip]:
    """Fill each record's answer fields from its Answer; an answer without a request is a Skip."""
    by_id = {record.request_id: record for record in records if record.request_id is not None}
    orphans = []
    for answer in answers:
        record = by_id.get(answer.request_id)
        if record is None:
            orphans.append(
                Skip(
                    answer.file,
                    answer.line,
                    answer.orphan_reason
                    or f"answer to request {answer.request_id!r}, which no request line has "
                    "(pass the file with the requests too)",
                )
            )
            continue
        for name in (
            "output_text",
            "output_token_ids",
            "output_length",
            "finish_reason",
            "server_cached_tokens",
            "server_prompt_tokens",
            "lora",
            "prompt_logprobs",
            "max_new_tokens",
        ):
            value = getattr(answer, name)
            if value is not None and getattr(record, name) is None:
                setattr(record, name, value)
    return orphans
