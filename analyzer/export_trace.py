"""A tokenized workload as a hash-id trace in Mooncake's schema, one request a line:
``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``, for replay tools
(vLLM's ``bench serve --dataset-name timed_trace``, NVIDIA Dynamo, AIPerf).

Block ids chain like vLLM's block hashes: a block's id depends on its tokens and on every block
before it (and, for the first block, on the request's namespace: cache salt, LoRA, model), so two
requests share an id exactly where they share the whole prefix up to that block. The last,
partial block gets an id too, as in Mooncake's traces. Ids are small integers numbered in order
of first appearance.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import IO

import numpy as np

from analyzer.errors import PrefixcheckError
from analyzer.workload import TokenizedLog


def hash_ids(
    tokens: np.ndarray, block_size: int, salt: bytes, table: dict[bytes, int]
) -> list[int]:
    """The chained block ids of one prompt; ``table`` numbers digests across the whole trace."""
    ids = []
    parent = salt
    data = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    step = 4 * block_size
    for start in range(0, len(data), step):
        parent = hashlib.blake2b(parent + data[start : start + step], digest_size=16).digest()
        ids.append(table.setdefault(parent, len(table)))
    return ids


def write_trace(tokenized: TokenizedLog, block_size: int, out: IO[str]) -> int:
    """Write the requests in arrival order; returns the number written."""
    workload = tokenized.workload
    labels = tokenized.namespace_labels
    order = (
        np.arange(workload.n_requests)
        if workload.arrival_s is None
        else np.argsort(workload.arrival_s, kind="stable")
    )
    start = float(workload.arrival_s[order[0]]) if workload.arrival_s is not None else 0.0
    table: dict[bytes, int] = {}
    outputs = workload.output_lengths
    for i in order:
        prompt = workload.prompt(int(i))
        salt = labels[int(workload.namespace[i])].encode()
        timestamp = (
            0 if workload.arrival_s is None else round((workload.arrival_s[i] - start) * 1000)
        )
        line = {
            "timestamp": int(timestamp),
            "input_length": len(prompt),
            "output_length": int(outputs[i]),
            "hash_ids": hash_ids(prompt, block_size, salt, table),
        }
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    return len(order)


def export_trace(tokenized: TokenizedLog, block_size: int, path: Path) -> int:
    try:
        with path.open("w", encoding="utf-8") as out:
            return write_trace(tokenized, block_size, out)
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot write: {exc.strerror or exc}") from None
