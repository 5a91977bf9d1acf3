"""Short, truncated previews of prompt text: reports show a glimpse of a prompt, never all of it."""

from __future__ import annotations

import numpy as np

from analyzer.tokenizer import Tokenizer

HEAD_CHARS = 48
TAIL_CHARS = 20
PREVIEW_IDS = 8


def snippet(tokens: np.ndarray, decoder: Tokenizer | None) -> str:
    """Head and tail of the decoded text, newlines shown as ⏎; token ids when text is unknown."""
    if decoder is None:
        ids = ", ".join(str(int(t)) for t in tokens[:PREVIEW_IDS])
        more = ", …" if len(tokens) > PREVIEW_IDS else ""
        return f"[{ids}{more}]"
    text = decoder.decode(tokens).replace("\r", "").replace("\n", "⏎")
    if len(text) <= HEAD_CHARS + TAIL_CHARS + 3:
        return text
    return f"{text[:HEAD_CHARS]} … {text[-TAIL_CHARS:]}"
