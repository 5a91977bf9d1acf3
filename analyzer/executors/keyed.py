"""Token shards keyed by pool: each ingest task writes the token ids of its requests as one
Arrow table per pool key (the model whose server replays them), and a chunk of the log past
the diagnosed sample travels to the replay as a ``KeyedWorkload``: every column of a
``Workload`` but the token ids, and per request the keyed table and row that hold them. The
driver routes and cuts such chunks from small per-request columns; the replay actor of a pool
fetches its own tables from the object store and builds the ``Workload`` it replays, so the
token ids never pass through the driver. Needs no Ray (``fetch`` is ``ray.get`` on a worker).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cache_models.workload import Workload, gather, offsets_of

if TYPE_CHECKING:
    import pyarrow as pa

OPTIONAL = ("priority", "skip_prefix_lookup", "hit_limit", "max_new_tokens")


@dataclass(frozen=True)
class Keyed:
    """A shard's requests split by pool key: the keys in order of first appearance, per
    request its key's index and its row in that key's table, and per key an Arrow table of its
    requests' token ids (``prompt_ids`` and ``output_ids``, int32 lists) in the shard's order."""

    keys: list[str]
    key_of: np.ndarray  # int64 per request
    key_row: np.ndarray  # int64 per request
    tables: list[pa.Table]


def keyed_tables(workload: Workload, labels: np.ndarray) -> Keyed:
    """The token tables of a shard's requests, one per distinct ``labels`` value (its model)."""
    import pyarrow as pa

    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    key_of = rank[inverse.ravel()].astype(np.int64)
    key_row = np.zeros(len(labels), np.int64)
    tables = []
    for k in range(len(order)):
        at = np.flatnonzero(key_of == k)
        key_row[at] = np.arange(len(at))
        part = workload.select(at)
        tables.append(
            pa.table(
                {
                    "prompt_ids": _list_array(part.prompt_offsets, part.prompt_tokens),
                    "output_ids": _list_array(part.output_offsets, part.output_tokens),
                }
            )
        )
    keys = [str(labels[first[k]]) for k in order]
    return Keyed(keys, key_of, key_row, tables)


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    import pyarrow as pa

    return pa.LargeListArray.from_arrays(
        pa.array(offsets, pa.int64()), pa.array(values, pa.int32())
    )


@dataclass(frozen=True)
class KeyedWorkload:
    """Requests whose token ids are in keyed shard tables: request i's are row ``row[i]`` of
    ``tables[source[i]]`` (an object ref), its unknown output ids shifted by
    ``unknown_base[source[i]]``; every other column is the ``Workload``'s."""

    tables: tuple[Any, ...]
    unknown_base: tuple[int, ...]
    source: np.ndarray  # int64 per request
    row: np.ndarray  # int64 per request
    prompt_offsets: np.ndarray
    output_offsets: np.ndarray
    namespace: np.ndarray
    stop_finish: np.ndarray
    arrival_s: np.ndarray | None = None
    priority: np.ndarray | None = None
    skip_prefix_lookup: np.ndarray | None = None
    hit_limit: np.ndarray | None = None
    max_new_tokens: np.ndarray | None = None

    @property
    def n_requests(self) -> int:
        return len(self.prompt_offsets) - 1

    @property
    def prompt_token_count(self) -> int:
        return int(self.prompt_offsets[-1])

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)

    def select(self, indices: np.ndarray) -> KeyedWorkload:
        """The requests at ``indices``, in that order, naming only the tables they use."""
        indices = np.asarray(indices, np.int64)
        used, source = np.unique(self.source[indices], return_inverse=True)
        return KeyedWorkload(
            tables=tuple(self.tables[int(s)] for s in used),
            unknown_base=tuple(self.unknown_base[int(s)] for s in used),
            source=source.ravel().astype(np.int64),
            row=self.row[indices],
            prompt_offsets=offsets_of(np.diff(self.prompt_offsets)[indices]),
            output_offsets=offsets_of(np.diff(self.output_offsets)[indices]),
            namespace=self.namespace[indices],
            stop_finish=self.stop_finish[indices],
            **{
                name: None if getattr(self, name) is None else getattr(self, name)[indices]
                for name in ("arrival_s", *OPTIONAL)
            },
        )

    def materialize(self, fetch: Callable[[list[Any]], Sequence[pa.Table]]) -> Workload:
        """The ``Workload`` of these requests, its token ids read from the tables (``fetch``
        gets them: ``ray.get`` on a worker)."""
        tables = fetch(list(self.tables)) if self.tables else []
        prompts: list[tuple[np.ndarray, np.ndarray]] = []
        outputs: list[tuple[np.ndarray, np.ndarray]] = []
        order: list[np.ndarray] = []
        for s, table in enumerate(tables):
            at = np.flatnonzero(self.source == s)
            rows = self.row[at]
            prompts.append(_gathered(table.column("prompt_ids"), rows, 0))
            outputs.append(_gathered(table.column("output_ids"), rows, self.unknown_base[s]))
            order.append(at)
        prompt_tokens = _placed(prompts, order, self.prompt_offsets)
        output_tokens = _placed(outputs, order, self.output_offsets)
        return Workload(
            prompt_tokens=prompt_tokens,
            prompt_offsets=self.prompt_offsets,
            output_tokens=output_tokens,
            output_offsets=self.output_offsets,
            namespace=self.namespace,
            stop_finish=self.stop_finish,
            arrival_s=self.arrival_s,
            **{name: getattr(self, name) for name in OPTIONAL},
        )


def _gathered(column: Any, rows: np.ndarray, unknown_base: int) -> tuple[np.ndarray, np.ndarray]:
    """The token runs of ``rows`` of a list column (flat ids + offsets), unknown ids shifted
    past earlier shards' (``unknown_base``)."""
    array = column.combine_chunks()
    values = array.values.to_numpy(zero_copy_only=False)
    tokens, offsets = gather(values, array.offsets.to_numpy(), rows)
    tokens = tokens.astype(np.int32, copy=False)
    if unknown_base:
        tokens = np.where(tokens < 0, tokens - unknown_base, tokens).astype(np.int32)
    return tokens, offsets


def _placed(
    parts: list[tuple[np.ndarray, np.ndarray]], order: list[np.ndarray], offsets: np.ndarray
) -> np.ndarray:
    """The flat ids of every request in order, from each table's gathered runs (each run's
    length checked against the request's)."""
    flat = np.empty(int(offsets[-1]), np.int32)
    for (tokens, runs), at in zip(parts, order, strict=True):
        lengths = np.diff(runs)
        if not np.array_equal(lengths, offsets[at + 1] - offsets[at]):
            raise ValueError("a keyed shard's token runs do not match its requests' lengths")
        starts = np.repeat(offsets[at] - runs[:-1], lengths)
        flat[np.arange(len(tokens)) + starts] = tokens
    return flat
