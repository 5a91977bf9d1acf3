"""Write tests/golden/sglang/scheduler_*.json.gz: per-request hits from SGLang 0.5.23's own
``Scheduler`` loop with requests in flight (``tests/golden/sglang_scheduler/driver.py``: the real
scheduler on CPU with a stub model runner), a closed loop of K clients each sending its next
request when its previous one finished. One fresh process per configuration (SGLang builds its
process groups once per process). Run with the SGLang oracle's interpreter:

    .venv-oracle-sglang/bin/python tests/golden/gen_sglang_scheduler_goldens.py
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "golden" / "sglang_scheduler"))

from tests.golden.workloads import random_workload  # noqa: E402

OUT_DIR = ROOT / "tests" / "golden" / "sglang"
SEEDS = (0, 1)
N_REQUESTS = 60


def workload(seed: int) -> list[dict[str, Any]]:
    """``random_workload`` whose stop finishes end on a token the answer has nowhere else (the
    driver stops them with ``stop_token_ids``); the others finish on ``max_new_tokens``."""
    requests = random_workload(seed, N_REQUESTS)
    for q in requests:
        out = q["output_token_ids"]
        if q["finish_reason"] == "stop" and out[-1] in out[:-1]:
            q["finish_reason"] = "length"
    return requests


def configs(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    largest = max(len(q["prompt_token_ids"]) + len(q["output_token_ids"]) for q in requests)
    out = []
    for k in (2, 8):
        for ps in (1, 16):
            out.append({"max_in_flight": k, "page_size": ps, "capacity_tokens": None})
            tight = math.ceil(3 * largest / ps) * ps
            out.append({"max_in_flight": k, "page_size": ps, "capacity_tokens": tight})
    out.append({"max_in_flight": 4, "page_size": 1, "capacity_tokens": None, "chunk": 32})
    return [{"chunk": -1, "overlap_schedule": False} | c for c in out]


def job(task: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    import driver

    seed, config = task
    requests = workload(seed)
    rows = [
        {
            "prompt": q["prompt_token_ids"],
            "output": q["output_token_ids"],
            "finish_reason": q["finish_reason"],
            "cache_salt": q.get("cache_salt"),
        }
        for q in requests
    ]
    options = {
        "page_size": config["page_size"],
        "max_total_tokens": config["capacity_tokens"] or 1 << 16,
        "max_running_requests": config["max_in_flight"],
        "chunked_prefill_size": config["chunk"],
    }
    k = config["max_in_flight"]
    hits = driver.run(rows, options, config["overlap_schedule"], clients=k)
    return seed, {**config, "hits": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    tasks = [(seed, c) for seed in SEEDS for c in configs(workload(seed))]
    cases: dict[int, list[dict[str, Any]]] = {seed: [] for seed in SEEDS}
    with get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for seed, case in pool.imap_unordered(job, tasks):
            cases[seed].append(case)
            print(seed, {k: v for k, v in case.items() if k != "hits"}, flush=True)
    for seed in SEEDS:
        ordered = sorted(cases[seed], key=lambda c: json.dumps({**c, "hits": None}))
        payload = {"seed": seed, "requests": workload(seed), "cases": ordered}
        data = json.dumps(payload, separators=(",", ":")).encode()
        (OUT_DIR / f"scheduler_{seed:03d}.json.gz").write_bytes(gzip.compress(data, 9, mtime=0))


if __name__ == "__main__":
    main()
