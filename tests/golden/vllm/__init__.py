"""Golden cases computed by vLLM 0.33.0's own KVCacheManager (``tests/golden/gen_vllm_goldens.py``),
and the loader that turns their requests into a Workload."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from cache_models.workload import Workload

GOLDEN_DIR = Path(__file__).parent


def to_workload(requests: list[dict[str, Any]]) -> Workload:
    """Requests in the ``--format tokens`` schema; each distinct non-empty salt is a namespace."""
    salts: dict[str | None, int] = {None: 0}
    namespace = [salts.setdefault(r.get("cache_salt") or None, len(salts)) for r in requests]
    workload = Workload.from_lists(
        [r["prompt_token_ids"] for r in requests],
        [r["output_token_ids"] for r in requests],
        namespace,
    )
    skip = [r.get("prompt_logprobs") is not None for r in requests]
    return dataclasses.replace(workload, skip_prefix_lookup=np.array(skip) if any(skip) else None)


def _load(path: Path) -> Any:
    return json.loads(gzip.decompress(path.read_bytes()))


def load_golden_files() -> list[dict[str, Any]]:
    """Every seeded workload with its configurations and the oracle's per-request results."""
    return [_load(path) for path in sorted(GOLDEN_DIR.glob("workload_*.json.gz"))]


def load_edge_cases() -> list[dict[str, Any]]:
    """Small workloads on a harsh grid (tiny caches, block sizes 1 to 16, preemptions), each with
    one configuration and the oracle's results."""
    return _load(GOLDEN_DIR / "edge_cases.json.gz")


def load_scheduler_goldens() -> list[dict[str, Any]]:
    """Long-prompt workloads replayed by vLLM's own Scheduler at its default token budgets
    (``tests/golden/gen_vllm_scheduler_goldens.py``)."""
    return [_load(path) for path in sorted(GOLDEN_DIR.glob("scheduler_*.json.gz"))]
