"""One request as read from a log, before chat rendering and tokenization."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
