"""SGLang with requests in flight against SGLang 0.5.23's own ``Scheduler`` event loop
(``tests/golden/gen_sglang_scheduler_goldens.py``: the real scheduler on CPU with a stub model
runner, a closed loop of K clients, requests sampled as a real server's, ``ignore_eos`` off).

Without the overlap scheduler the concurrency model equals it on every request: 2 and 8 in
flight, page sizes 1 and 16, unbounded and tight pools (``PrefillAdder``'s ``new_token_ratio``
admission), long answers in pools tight enough that decode retracts, and chunked prefill. With the
overlap scheduler (stop finishes below their ``max_new_tokens``) it is exact at 1, 2 and 8 in
flight, page sizes 1 and 16, unbounded and bounded pools, where each batch's results are processed
one iteration late (``event_loop_overlap``). The model reads each request's ``max_new_tokens`` as
the driver gave it (``Workload.max_new_tokens``): in a bounded pool ``PrefillAdder``'s budget
reserves it, and a stop on its limit's last token caches N-1 outputs (the ``stop_max_new_slack``
0 cases: ``_reqs_finishing_inflight`` skips its in-flight step)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_models._sglang_reference import ReferenceReplay
from cache_models.config import SglangConfig
from cache_models.sglang_radix import SglangRadixCache
from cache_models.workload import Workload
from tests.test_sglang_settings_golden import settings_workload

FILES = sorted((Path(__file__).parent / "golden" / "sglang").glob("scheduler_*.json.gz"))


def case_workload(requests: list[dict[str, Any]], case: dict[str, Any]) -> Workload:
    """The golden's requests with the ``max_new_tokens`` its driver gave them: a stop finish's
    length + ``stop_max_new_slack`` where the case sets one, else the answer's length (absent)."""
    workload = settings_workload(requests)
    slack = case.get("stop_max_new_slack")
    if slack is None:
        return workload
    limits = [
        len(q["output_token_ids"]) + slack if q["finish_reason"] == "stop" else -1 for q in requests
    ]
    return dataclasses.replace(workload, max_new_tokens=np.array(limits, np.int64))


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
    exact = [c for path in FILES for c in load(path)["cases"]]
    assert len(FILES) >= 4 and len(exact) >= 20
    assert {c["max_in_flight"] for c in exact} >= {1, 2, 8}
    assert {c["page_size"] for c in exact} == {1, 16}
    assert any(c["capacity_tokens"] and c["max_in_flight"] == 8 for c in exact)
    assert any(c["chunk"] > 0 for c in exact)
    assert {c["max_in_flight"] for c in exact if c["overlap_schedule"]} >= {1, 2, 8}
    assert any(c["overlap_schedule"] and c["capacity_tokens"] for c in exact)
    at_limit = [c for c in exact if c.get("stop_max_new_slack") == 0]
    assert {c["max_in_flight"] for c in at_limit} >= {1, 8} and any(
        c["capacity_tokens"] for c in at_limit
    )


def test_tight_goldens_retract() -> None:
    """The long-answer goldens make SGLang's decode retract: the model must too."""
    retractions = 0
    for path in FILES:
        golden = load(path)
        for case in golden["cases"]:
            if case["capacity_tokens"] and case["max_in_flight"] > 2:
                replay = ReferenceReplay(config(case))
                replay.run(case_workload(golden["requests"], case))
                retractions += replay.retractions
    assert retractions > 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_concurrency_model_matches_sglang_scheduler(path: Path) -> None:
    golden = load(path)
    for case in golden["cases"]:
        workload = case_workload(golden["requests"], case)
        result = SglangRadixCache(config(case)).replay(workload)
        np.testing.assert_array_equal(result.hit_tokens, case["hits"], err_msg=str(case))
        assert not result.counters["rejected"].any()
