"""Replay the SGLang golden files: every request's hit must equal SGLang 0.5.23's own.

The files come from ``tests/golden/gen_sglang_goldens.py`` (run with the oracle's interpreter).
Besides the hit, each case stores the tree's size after every request, which the model's
``inserted_tokens`` and ``evicted_tokens`` counters must add up to.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_models.config import SglangConfig
from cache_models.sglang_radix import SglangRadixCache
from cache_models.workload import Workload

GOLDEN_DIR = Path(__file__).parent / "golden" / "sglang"
FILES = sorted(GOLDEN_DIR.glob("seed_*.json.gz"))
CONFIG_FIELDS = (
    "page_size",
    "capacity_tokens",
    "eviction_policy",
    "chunked_prefill_size",
    "waiting_prefix_refresh",
)


def tokens_workload(requests: list[dict[str, Any]]) -> Workload:
    """A Workload from ``--format tokens`` records (salts become namespaces)."""
    salts: dict[str | None, int] = {None: 0}
    return Workload.from_lists(
        [q["prompt_token_ids"] for q in requests],
        [q["output_token_ids"] for q in requests],
        namespace=[salts.setdefault(q.get("cache_salt"), len(salts)) for q in requests],
        stop_finish=[q.get("finish_reason") == "stop" for q in requests],
    )


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def disagreements(path: Path, engine: str) -> list[str]:
    """One line per configuration whose hits or tree sizes differ from the oracle's."""
    golden = load(path)
    workload = tokens_workload(golden["requests"])
    out = []
    for case in golden["cases"]:
        config = SglangConfig(**{name: case[name] for name in CONFIG_FIELDS})
        result = SglangRadixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]
        c = result.counters
        tree_size = np.cumsum(c["inserted_tokens"] - c["evicted_tokens"]).tolist()
        hits = result.hit_tokens.tolist()
        if c["rejected"].any():  # SGLang served every golden request
            out.append(f"{path.name} {config}: rejected {np.flatnonzero(c['rejected']).tolist()}")
        elif hits != case["hits"] or tree_size != case["evictable"]:
            i = next(
                k
                for k in range(len(hits))
                if hits[k] != case["hits"][k] or tree_size[k] != case["evictable"][k]
            )
            out.append(
                f"{path.name} {config}: request {i} hit {hits[i]} (sglang {case['hits'][i]}), "
                f"tree {tree_size[i]} (sglang {case['evictable'][i]})"
            )
    return out


def test_goldens_cover_the_grid() -> None:
    assert len(FILES) >= 30
    cases = [case for path in FILES for case in load(path)["cases"]]
    assert {c["page_size"] for c in cases} == {1, 4, 16, 64}
    assert {c["eviction_policy"] for c in cases} == {
        "lru",
        "lfu",
        "fifo",
        "mru",
        "filo",
        "priority",
        "slru",
    }
    assert any(c["capacity_tokens"] is None for c in cases)
    assert any(c["chunked_prefill_size"] for c in cases)
    assert not any(h is None for c in cases for h in c["hits"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_fast_engine_agrees_with_sglang(path: Path) -> None:
    assert disagreements(path, "fast") == []


@pytest.mark.parametrize("path", FILES[::20], ids=lambda p: p.name)
def test_reference_agrees_with_sglang(path: Path) -> None:
    assert disagreements(path, "reference") == []
