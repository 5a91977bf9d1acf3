"""One request as read from a log, before chat rendering and tokenization."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Message = dict[str, Any]


@dataclass
class Record:
    """A request: exactly one of ``messages``, ``prompt`` or ``prompt_token_ids`` is set.

    ``output_text`` / ``output_token_ids`` hold the answer when the log has it (multi-turn caching
    depends on the answer's tokens); otherwise ``output_length`` may give its size alone.
    """

    file: str
    line: int
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | np.ndarray | None = None
    output_text: str | None = None
    output_token_ids: list[int] | None = None
    output_length: int | None = None
    finish_reason: str | None = None
    cache_salt: str | None = None
    lora: str | None = None
    model: str | None = None
    arrival_s: float | None = None
