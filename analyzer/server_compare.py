"""Our replay next to the server's own numbers: where the log carries the engine's cached-token
count per request (``usage.prompt_tokens_details.cached_tokens``, Anthropic's
``cache_read_input_tokens``, SGLang's ``cached_tokens``), totals and per-request agreement."""

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
class ServerComparison:
    requests: int  # requests whose log line has the server's count
    prompt_tokens: int
    server_cached_tokens: int
    server_hit_rate: float
    engines: dict[str, EngineAgreement]

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
    lengths = requests["prompt_tokens"].to_numpy()[known]
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
    total = int(lengths.sum())
    return ServerComparison(
        requests=int(known.sum()),
        prompt_tokens=total,
        server_cached_tokens=int(theirs.sum()),
        server_hit_rate=int(theirs.sum()) / total if total else 0.0,
        engines=engines,
    )
