"""Routing keys read from the log (``--session-field``): a dotted field of each request's own line,
its tenant, or the hash of its prompt's first block. Shared by the fleet replay and its advice."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from analyzer.loaders.fields import dotted
from analyzer.loaders.sources import iter_raw_lines
from cache_models.workload import Workload

FIRST_BLOCK = "first-block"  # --session-field: the hash of the prompt's first block
TENANT = "tenant"  # --session-field: the user / prompt_cache_key the loaders read


def field_values(requests: pl.DataFrame, path: str) -> list[Any]:
    """The value at a dotted path in each request's own log line (None where it has none)."""
    wanted: dict[str, set[int]] = {}
    for file, line in zip(requests["file"], requests["line"], strict=True):
        wanted.setdefault(file, set()).add(int(line))
    found: dict[tuple[str, int], Any] = {}
    for file, lines in wanted.items():
        for number, raw in iter_raw_lines(file):
            if number in lines:
                try:
                    found[(file, number)] = dotted(json.loads(raw), path)
                except ValueError:
                    found[(file, number)] = None
    return [found.get((f, int(n))) for f, n in zip(requests["file"], requests["line"], strict=True)]


def session_keys(
    requests: pl.DataFrame, workload: Workload, field: str | None, block_size: int
) -> tuple[list[str | None], int]:
    """Each request's routing key and how many requests had none (routed by their text)."""
    n = workload.n_requests
    if field is None:
        return [None] * n, n
    if field == FIRST_BLOCK:
        keys = []
        for i in range(n):
            head = workload.prompt(i)[:block_size]
            keys.append(f"{int(workload.namespace[i])}:{head.tobytes().hex()}")
        return keys, 0
    values = requests[TENANT].to_list() if field == TENANT else field_values(requests, field)
    keys = [None if v is None or v == "" else str(v) for v in values]
    return keys, sum(k is None for k in keys)
