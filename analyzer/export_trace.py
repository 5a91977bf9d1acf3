"""A tokenized workload as a hash-id trace in Mooncake's schema, one request a line:
``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``, for replay tools
(vLLM's ``bench serve --dataset-name timed_trace``, NVIDIA Dynamo, AIPerf), plus
``output_hash_ids`` where the answer's tokens are known.

Block ids chain like vLLM's block hashes: a block's id depends on its tokens and on every block
before it (and, for the first block, on the request's namespace: cache salt, LoRA, model), so two
requests share an id exactly where they share the whole prefix up to that block. Ids are small
integers numbered in order of first appearance.

The blocks are those of the request's prompt followed by its answer, as the engines cache them
(an engine caches the answer's blocks too, and the next turn's prompt repeats them): ``hash_ids``
are the blocks that hold prompt tokens, ``output_hash_ids`` the rest. The last prompt block is
then the block of prompt and answer tokens that the next turn shares (the prompt is its first
``input_length`` tokens, which is how every replay tool cuts the last block), and the answer's
blocks are the ids that the next turn's ``hash_ids`` repeat. Tools that read only the Mooncake
keys ignore ``output_hash_ids``; ``prefixcheck analyze`` expands them into the answer's tokens,
so a later turn hits the answer it repeats, as on the log.
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
    """Write the requests in arrival order; returns the number written. A request whose answer
    tokens are unknown has only its prompt's blocks."""
    workload = tokenized.workload
    labels = tokenized.namespace_labels
    order = (
        np.arange(workload.n_requests)
        if workload.arrival_s is None
        else np.argsort(workload.arrival_s, kind="stable")
    )
    start = float(workload.arrival_s[order[0]]) if workload.arrival_s is not None else 0.0
    table: dict[bytes, int] = {}
    known = tokenized.requests["output_known"].to_numpy()
    lengths = tokenized.requests["output_tokens"].to_numpy()
    for i in order:
        prompt = workload.prompt(int(i))
        answer = workload.output(int(i)) if known[i] else prompt[:0]
        salt = labels[int(workload.namespace[i])].encode()
        timestamp = (
            0 if workload.arrival_s is None else round((workload.arrival_s[i] - start) * 1000)
        )
        ids = hash_ids(np.concatenate([prompt, answer]), block_size, salt, table)
        prompt_blocks = -(-len(prompt) // block_size)
        line: dict[str, object] = {
            "timestamp": int(timestamp),
            "input_length": len(prompt),
            "output_length": int(lengths[i]),
            "hash_ids": ids[:prompt_blocks],
        }
        if len(answer):
            line["output_hash_ids"] = ids[prompt_blocks:]
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    return len(order)


def export_trace(tokenized: TokenizedLog, block_size: int, path: Path) -> int:
    try:
        with path.open("w", encoding="utf-8") as out:
            return write_trace(tokenized, block_size, out)
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot write: {exc.strerror or exc}") from None
