"""Routing keys (``--session-field``): a dotted field read with each request's line, its tenant,
or the hash of its prompt's first block. Shared by the fleet replay and its advice."""

from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.errors import PrefixcheckError
from analyzer.workload import routing_column
from cache_models.workload import Workload

FIRST_BLOCK = "first-block"  # --session-field: the hash of the prompt's first block
TENANT = "tenant"  # --session-field: the user / prompt_cache_key the loaders read


def field_values(requests: pl.DataFrame, path: str) -> list[str | None]:
    """Each request's value of a routing field, as read with its line (None where it has none)."""
    column = routing_column(path)
    if column not in requests.columns:
        raise PrefixcheckError(f"the routing field {path!r} was not read with the log")
    return requests[column].to_list()


def session_keys(
    requests: pl.DataFrame, workload: Workload, field: str | None, block_size: int
) -> tuple[list[str | None], int]:
    """Each request's routing key and how many requests had none (routed by their text)."""
    n = workload.n_requests
    if field is None:
        return [None] * n, n
    if field == FIRST_BLOCK:
        return first_block_keys(workload, block_size), 0
    values = requests[TENANT].to_list() if field == TENANT else field_values(requests, field)
    keys = [None if v is None or v == "" else str(v) for v in values]
    return keys, sum(k is None for k in keys)


# Two ASCII hex digits per byte value, as one uint16 laid out in memory as the digits read.
HEX_PAIRS = np.frombuffer(
    bytes.fromhex("".join(f"{b:02x}".encode().hex() for b in range(256))), "<u2"
)
KEY_ROWS = 1 << 16  # requests whose first blocks are hex-encoded at a time (bounded memory)


def first_block_keys(workload: Workload, block_size: int) -> list[str]:
    """Each request's ``namespace:hex`` of its first ``block_size`` prompt tokens (the int32
    bytes of ``bytes.hex``), from the flat token array and offsets, ``KEY_ROWS`` at a time."""
    columns = np.arange(block_size)
    tokens, starts = workload.prompt_tokens, workload.prompt_offsets[:-1]
    lengths = np.minimum(workload.prompt_lengths, block_size)
    parts = []
    for first in range(0, workload.n_requests, KEY_ROWS):
        rows = slice(first, first + KEY_ROWS)
        inside = columns[None, :] < lengths[rows, None]
        heads = tokens[np.where(inside, starts[rows, None] + columns[None, :], 0)]
        raw = np.ascontiguousarray(heads, np.int32).view(np.uint8)
        digits = HEX_PAIRS[raw].reshape(len(heads), block_size, 4)
        digits[~inside] = 0  # past the prompt: no digits (a fixed-width string's end)
        parts.append(digits.reshape(len(heads), 4 * block_size).view(f"S{8 * block_size}").ravel())
    text = pl.Series(np.concatenate(parts) if parts else np.array([], "S1")).cast(pl.String)
    namespace = pl.Series(workload.namespace).cast(pl.String)
    return pl.select(pl.concat_str([namespace, pl.lit(":"), text])).to_series().to_list()
