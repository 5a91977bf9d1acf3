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
import random
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
N_LONG = 40
STOP_SLACK = 8


def workload(seed: int) -> list[dict[str, Any]]:
    """``random_workload`` whose stop finishes end on a token the answer has nowhere else (the
    driver stops them with ``stop_token_ids``); the others finish on ``max_new_tokens``."""
    requests = random_workload(seed, N_REQUESTS)
    for q in requests:
        out = q["output_token_ids"]
        if q["finish_reason"] == "stop" and out[-1] in out[:-1]:
            q["finish_reason"] = "length"
    return requests


def long_answer_workload(seed: int) -> list[dict[str, Any]]:
    """``workload`` with answers 40 to 120 tokens long, so that requests decode long enough
    for admission's ``new_token_ratio`` estimate to fall short and decode to retract."""
    rng = random.Random(1000 + seed)
    requests = random_workload(seed, N_LONG)
    for q in requests:
        out = q["output_token_ids"]
        out += [rng.randrange(1, 50) for _ in range(rng.randrange(40, 121) - len(out))]
        if q["finish_reason"] == "stop" and out[-1] in out[:-1]:
            q["finish_reason"] = "length"
    return requests


def long_answer_configs(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    largest = max(len(q["prompt_token_ids"]) + len(q["output_token_ids"]) for q in requests)
    return [
        {"chunk": -1, "overlap_schedule": False, "max_in_flight": 8, "page_size": ps}
        | {"capacity_tokens": math.ceil(factor * largest / ps) * ps}
        for ps in (1, 16)
        for factor in (1.5, 2)
    ]


def overlap_configs(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The overlap scheduler (SGLang's default), unbounded and bounded pools; stop finishes get
    ``max_new_tokens`` = their length + ``STOP_SLACK`` (a request that stops on EOS before its
    limit). Four more configurations give them ``max_new_tokens`` = their length (slack 0): a
    stop on the limit's last token, where ``_reqs_finishing_inflight`` skips the in-flight
    decode step and the stop caches N-1 outputs."""
    largest = max(len(q["prompt_token_ids"]) + len(q["output_token_ids"]) for q in requests)
    base = {"chunk": -1, "overlap_schedule": True, "capacity_tokens": None}
    out = [base | {"max_in_flight": k, "page_size": ps} for k in (1, 2, 8) for ps in (1, 16)]
    bounded = base | {"max_in_flight": 8, "page_size": 1, "capacity_tokens": 3 * largest}
    out.append(bounded)
    at_limit = [base | {"max_in_flight": k, "page_size": ps} for k, ps in ((1, 1), (8, 1), (8, 16))]
    return [c | {"stop_max_new_slack": STOP_SLACK} for c in out] + [
        c | {"stop_max_new_slack": 0} for c in [*at_limit, bounded]
    ]


WORKLOADS = {
    "": (workload, None),
    "long_": (long_answer_workload, long_answer_configs),
    "overlap_": (workload, overlap_configs),
}


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


Task = tuple[str, int, dict[str, Any]]


def job(task: Task) -> tuple[str, int, dict[str, Any]]:
    import driver

    name, seed, config = task
    requests = WORKLOADS[name][0](seed)
    rows = [
        {
            "prompt": q["prompt_token_ids"],
            "output": q["output_token_ids"],
            "finish_reason": q["finish_reason"],
            "cache_salt": q.get("cache_salt"),
        }
        | (
            {"max_new_tokens": len(q["output_token_ids"]) + config["stop_max_new_slack"]}
            if "stop_max_new_slack" in config and q["finish_reason"] == "stop"
            else {}
        )
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
    return name, seed, {**config, "hits": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=["base", "long", "overlap"], help="only these files")
    args = parser.parse_args()
    names = [n for n in WORKLOADS if args.only in (None, n.rstrip("_") or "base")]
    tasks: list[Task] = []
    for name in names:
        make, make_configs = WORKLOADS[name]
        for seed in SEEDS:
            tasks += [(name, seed, c) for c in (make_configs or configs)(make(seed))]
    cases: dict[tuple[str, int], list[dict[str, Any]]] = {(n, s): [] for n in names for s in SEEDS}
    with get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for name, seed, case in pool.imap_unordered(job, tasks):
            cases[name, seed].append(case)
            print(name, seed, {k: v for k, v in case.items() if k != "hits"}, flush=True)
    for (name, seed), found in cases.items():
        ordered = sorted(found, key=lambda c: json.dumps({**c, "hits": None}))
        payload = {"seed": seed, "requests": WORKLOADS[name][0](seed), "cases": ordered}
        data = json.dumps(payload, separators=(",", ":")).encode()
        path = OUT_DIR / f"scheduler_{name}{seed:03d}.json.gz"
        path.write_bytes(gzip.compress(data, 9, mtime=0))


if __name__ == "__main__":
    main()
