"""The two engines: the names the report keys them by, and the names people read."""

from __future__ import annotations

ENGINES = ("vllm", "sglang")
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang"}
