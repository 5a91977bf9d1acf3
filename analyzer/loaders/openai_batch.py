"""OpenAI Batch API files. Input lines ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions", "body": {...}}`` are requests; output lines ``{"id", "custom_id",
"response": {"status_code", "request_id", "body": {...chat.completion...}}, "error"}`` are their
answers, joined by ``custom_id`` (pass both files)."""

from __future__ import annotations

from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import dict_field, optional_str, required_str
from analyzer.loaders.joins import Answer
from analyzer.loaders.openai_chat import completion_fields, request_record
from analyzer.records import Record

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


def matches(obj: dict[str, Any]) -> bool:
    return "custom_id" in obj and ("body" in obj or "response" in obj or "error" in obj)


def parse(obj: dict[str, Any], file: str, line: int) -> Record | Answer:
    custom_id = required_str(obj, "custom_id")
    if "body" not in obj:
        return _answer(obj, custom_id, file, line)
    url = optional_str(obj, "url")
    if url not in ENDPOINTS:
        raise BadLine(f"batch request to {url!r} (only {', '.join(ENDPOINTS)} have prompts)")
    body = dict_field(obj, "body")
    if url == "/v1/completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadLine("batch completions body needs a non-empty string 'prompt'")
        record = Record(file=file, line=line, prompt=prompt, model=optional_str(body, "model"))
    else:
        record = request_record(body, file, line)
    record.request_id = custom_id
    return record


def _answer(obj: dict[str, Any], custom_id: str, file: str, line: int) -> Answer:
    response = dict_field(obj, "response")
    if obj.get("error") or response.get("status_code") not in (None, 200):
        raise BadLine(f"batch request {custom_id!r} failed: no answer to join")
    completion = completion_fields(dict_field(response, "body"))
    return Answer(
        request_id=custom_id,
        file=file,
        line=line,
        output_text=completion.answer,
        output_length=completion.output_length,
        finish_reason=completion.finish_reason,
        server_cached_tokens=completion.cached_tokens,
        server_prompt_tokens=completion.prompt_tokens,
    )
