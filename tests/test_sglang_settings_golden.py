"""SGLang 0.5.23's own hits under the server settings beyond the base grid
(``tests/golden/gen_sglang_settings_goldens.py``): ``--radix-eviction-policy priority`` with
per-request priorities, ``--disable-overlap-schedule``, ``tlru`` and ``slru`` with their
``--radix-eviction-policy-config``, ``return_logprob`` with ``logprob_start_len``, ``extra_key``
namespaces, and each GPU tier's default ``--chunked-prefill-size`` on long prompts. Every
request's hit and the tree's size after it must equal the oracle's, in both engines."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_models.config import SglangConfig
from cache_models.sglang_radix import SglangRadixCache
from cache_models.workload import Workload

FILES = sorted((Path(__file__).parent / "golden" / "sglang").glob("settings_*.json.gz"))
CONFIG_FIELDS = (
    "page_size",
    "capacity_tokens",
    "eviction_policy",
    "chunked_prefill_size",
    "overlap_schedule",
    "slru_protected_threshold",
    "tlru_threshold",
    "tlru_next_prompt_estimate",
)


def settings_workload(requests: list[dict[str, Any]]) -> Workload:
    """Salts and extra keys become namespaces; priority and logprob start as the loaders read
    them."""
    spaces: dict[tuple[str | None, str | None], int] = {(None, None): 0}
    workload = Workload.from_lists(
        [q["prompt_token_ids"] for q in requests],
        [q["output_token_ids"] for q in requests],
        namespace=[
            spaces.setdefault((q.get("cache_salt"), q.get("extra_key")), len(spaces))
            for q in requests
        ],
        stop_finish=[q.get("finish_reason") == "stop" for q in requests],
    )
    limits = [q["logprob_start_len"] if q.get("return_logprob") else -1 for q in requests]
    return dataclasses.replace(
        workload,
        priority=np.array([q.get("priority") or 0 for q in requests], np.int64),
        hit_limit=np.array(limits, np.int64),
    )


def load(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def disagreements(path: Path, engine: str) -> list[str]:
    golden = load(path)
    workload = settings_workload(golden["requests"])
    out = []
    for case in golden["cases"]:
        config = SglangConfig(**{name: case[name] for name in CONFIG_FIELDS if name in case})
        result = SglangRadixCache(config, implementation=engine).replay(workload)  # type: ignore[arg-type]
        c = result.counters
        tree = np.cumsum(c["inserted_tokens"] - c["evicted_tokens"]).tolist()
        hits = result.hit_tokens.tolist()
        if hits != case["hits"] or tree != case["evictable"]:
            i = next(
                k
                for k in range(len(hits))
                if hits[k] != case["hits"][k] or tree[k] != case["evictable"][k]
            )
            out.append(
                f"{path.name} {config}: request {i} hit {hits[i]} (sglang {case['hits'][i]}), "
                f"tree {tree[i]} (sglang {case['evictable'][i]})"
            )
    return out


def test_goldens_cover_the_settings() -> None:
    cases = [c for path in FILES for c in load(path)["cases"]]
    assert {"priority", "tlru", "slru"} <= {c["eviction_policy"] for c in cases}
    assert any(c.get("overlap_schedule") is False for c in cases)
    assert {2048, 4096, 8192, 16384} <= {c["chunked_prefill_size"] for c in cases}
    requests = [q for path in FILES for q in load(path)["requests"]]
    assert any(q.get("return_logprob") for q in requests)
    assert any(q.get("extra_key") for q in requests)
    assert len({q.get("priority") for q in requests}) > 3


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_matches_sglang(path: Path, engine: str) -> None:
    assert disagreements(path, engine) == []
