"""SGLang with requests in flight against SGLang 0.5.23's own ``Scheduler`` event loop
(``tests/golden/gen_sglang_scheduler_goldens.py``: the real scheduler on CPU with a stub model
runner, a closed loop of K clients, requests sampled as a real server's, ``ignore_eos`` off).

Without the overlap scheduler the concurrency model equals it on every request: 2 and 8 in
flight, page sizes 1 and 16, unbounded and tight pools (``PrefillAdder``'s ``new_token_ratio``
admission), long answers in pools tight enough that decode retracts, and chunked prefill. With the
overlap scheduler (stop finishes below their ``max_new_tokens``) it is exact at 1 in flight, where
a stop caches all N outputs. ``known_apart`` names the configurations it does not follow exactly
(the overlap scheduler with more than 1 in flight); the README gives figures."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_models._sglang_reference import ReferenceReplay
from cache_models.config import SglangConfig
from cache_models.sglang_radix import SglangRadixCache
from tests.test_sglang_settings_golden import settings_workload

FILES = sorted((Path(__file__).parent / "golden" / "sglang").glob("scheduler_*.json.gz"))


def known_apart(case: dict[str, Any]) -> bool:
    """The configurations the model does not follow exactly (see the README's Fidelity)."""
    return case["overlap_schedule"] and case["max_in_flight"] > 1


def config(case: dict[str, Any]) -> SglangConfig:
    return SglangConfig(
        page_size=case["page_size"],
        capacity_tokens=case["capacity_tokens"],
        max_in_flight=case["max_in_flight"],
        chunked_prefill_size=max(case["chunk"], 0),
        overlap_schedule=case["overlap_schedule"],
    )


def load(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_goldens_cover_requests_in_flight() -> None:
    cases = [c for path in FILES for c in load(path)["cases"]]
    exact = [c for c in cases if not known_apart(c)]
    assert len(FILES) >= 4 and len(exact) >= 20
    assert {c["max_in_flight"] for c in exact} >= {1, 2, 8}
    assert {c["page_size"] for c in exact} == {1, 16}
    assert any(c["capacity_tokens"] and c["max_in_flight"] == 8 for c in exact)
    assert any(c["chunk"] > 0 for c in exact)
    assert any(c["overlap_schedule"] for c in exact)


def test_tight_goldens_retract() -> None:
    """The long-answer goldens make SGLang's decode retract: the model must too."""
    retractions = 0
    for path in FILES:
        golden = load(path)
        workload = settings_workload(golden["requests"])
        for case in golden["cases"]:
            if case["capacity_tokens"] and case["max_in_flight"] > 2 and not known_apart(case):
                replay = ReferenceReplay(config(case))
                replay.run(workload)
                retractions += replay.retractions
    assert retractions > 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_concurrency_model_matches_sglang_scheduler(path: Path) -> None:
    golden = load(path)
    workload = settings_workload(golden["requests"])
    for case in golden["cases"]:
        if known_apart(case):
            continue
        result = SglangRadixCache(config(case)).replay(workload)
        np.testing.assert_array_equal(result.hit_tokens, case["hits"], err_msg=str(case))
        assert not result.counters["rejected"].any()
