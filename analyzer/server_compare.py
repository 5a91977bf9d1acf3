"""Our replay next to the server's own numbers: where the log carries the engine's cached-token
count per request (``usage.prompt_tokens_details.cached_tokens``, Anthropic's
``cache_read_input_tokens``, SGLang's ``cached_tokens``), totals and per-request agreement.

Where the log also has the server's prompt-token count (``usage.prompt_tokens``, Anthropic's
input plus cache tokens, SGLang's ``prompt_tokens``), it is checked against ours: a difference
means the server tokenized (or templated) the request otherwise, and then no replay can match it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from analyzer.replay import Replays


@dataclass(frozen=True)
class EngineAgreement:
    hit_tokens: int  # our replay's hits on the requests the server reported
    exact: float  # share of those requests where ours equals the server's count
    within_block: float  # share where the two differ by less than one block
    mean_abs_difference: float  # tokens per request


@dataclass(frozen=True)
class PromptCountCheck:
    """Our prompt-token counts against the server's, on the requests whose log has both."""

    requests: int
    server_prompt_tokens: int
    our_prompt_tokens: int
    equal: float  # share of those requests where the two counts are equal


@dataclass(frozen=True)
class ServerComparison:
    requests: int  # requests whose log line has the server's count
    prompt_tokens: int  # ours, on those requests
    server_cached_tokens: int
    # The server's cached tokens over its own prompt-token counts where logged, ours elsewhere.
    server_hit_rate: float
    engines: dict[str, EngineAgreement]
    prompt_counts: PromptCountCheck | None = None  # None: the log has no server prompt counts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_with_server(
    requests: pl.DataFrame, replays: Replays, block_size: int
) -> ServerComparison | None:
    """None when no request carries the server's count."""
    server = requests["server_cached_tokens"]
    known = server.is_not_null().to_numpy()
    if not known.any():
        return None
    theirs = server.to_numpy()[known].astype(np.int64)
    lengths = requests["prompt_tokens"].to_numpy()[known].astype(np.int64)
    engines = {}
    for result in (replays.vllm, replays.sglang):
        ours = result.hit_tokens[known].astype(np.int64)
        difference = np.abs(ours - theirs)
        engines[result.engine] = EngineAgreement(
            hit_tokens=int(ours.sum()),
            exact=float(np.mean(difference == 0)),
            within_block=float(np.mean(difference < block_size)),
            mean_abs_difference=float(difference.mean()),
        )
    reported = requests.filter(pl.col("server_cached_tokens").is_not_null())
    denominator = int(
        reported.select(
            pl.coalesce("server_prompt_tokens", "prompt_tokens").cast(pl.Int64).sum()
        ).item()
    )
    return ServerComparison(
        requests=int(known.sum()),
        prompt_tokens=int(lengths.sum()),
        server_cached_tokens=int(theirs.sum()),
        server_hit_rate=int(theirs.sum()) / denominator if denominator else 0.0,
        engines=engines,
        prompt_counts=_prompt_counts(reported),
    )


def _prompt_counts(reported: pl.DataFrame) -> PromptCountCheck | None:
    both = reported.filter(pl.col("server_prompt_tokens").is_not_null())
    if both.is_empty():
        return None
    theirs, ours = both["server_prompt_tokens"], both["prompt_tokens"].cast(pl.Int64)
    return PromptCountCheck(
        requests=both.height,
        server_prompt_tokens=int(theirs.sum()),
        our_prompt_tokens=int(ours.sum()),
        equal=float((theirs == ours).mean() or 0.0),
    )


def tokenization_note(comparison: ServerComparison | None) -> list[str]:
    """A warning when the server's prompt-token counts are not ours: it tokenized otherwise."""
    counts = comparison.prompt_counts if comparison is not None else None
    if counts is None or counts.equal == 1.0:
        return []
    return [
        f"The server's prompt-token counts differ from ours on {1 - counts.equal:.0%} of the "
        f"{counts.requests:,} requests that log them ({counts.server_prompt_tokens:,} tokens "
        f"against our {counts.our_prompt_tokens:,}): the server tokenized or templated them "
        "otherwise, so no replay can match its cached counts exactly. Pass the served model's "
        "tokenizer and chat template (--tokenizer, --chat-template)."
    ]
