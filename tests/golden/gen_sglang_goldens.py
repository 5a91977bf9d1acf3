"""Generate the SGLang golden files: per-request hits from SGLang 0.5.23's own code (the oracle).

Run with the oracle's interpreter, from the repository root (about 12 minutes on two idle cores):

    /work/oracle_envs/sglang/bin/python tests/golden/gen_sglang_goldens.py

It drives ``oracle.Oracle`` in-process so that each request's finish reason picks its output
insert (a stop inserts all N outputs, a length finish N-1). One gzipped JSON file per workload seed
under ``tests/golden/sglang/`` holds the requests and, per configuration, the oracle's hit and the
tree's size (evictable tokens) after each request.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.golden.workloads import random_workload  # noqa: E402

ORACLE_DIR = Path(os.environ.get("SGLANG_ORACLE_DIR", "/work/shared/oracles/sglang"))
OUT_DIR = ROOT / "tests" / "golden" / "sglang"
PAGE_SIZES = (1, 4, 16, 64)
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
# A small chunk per page size; 10 with page size 4 puts chunk ends in the middle of pages.
CHUNK = {1: 8, 4: 10, 16: 16, 64: 64}
ORACLE_UNBOUNDED = 1 << 20


def tight_capacity(requests: list[dict[str, Any]], page_size: int) -> int:
    """A pool a fifth larger than the largest request (whole pages): all fit, most evict.

    With page size 64 most prompts of these workloads are shorter than a page and cache nothing,
    so there the pool is the largest request's and fewer requests find anything to evict.
    """
    pages = max(
        math.ceil((len(q["prompt_token_ids"]) + len(q["output_token_ids"])) / page_size)
        for q in requests
    )
    return (pages + pages // 5) * page_size


def configs(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for ps in PAGE_SIZES:
        for chunk in (0, CHUNK[ps]):
            base = {"page_size": ps, "chunked_prefill_size": chunk, "waiting_prefix_refresh": True}
            out.append({**base, "capacity_tokens": None, "eviction_policy": "lru"})
            tight = tight_capacity(requests, ps)
            for policy in POLICIES:
                out.append({**base, "capacity_tokens": tight, "eviction_policy": policy})
            out.append(
                {**base, "capacity_tokens": tight, "eviction_policy": "lru"}
                | {"waiting_prefix_refresh": False}
            )
    return out


def run_oracle(config: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, list[int]]:
    import oracle  # the oracle venv's module, on sys.path in the worker

    cap = config["capacity_tokens"]
    args = argparse.Namespace(
        page_size=config["page_size"],
        capacity_tokens=ORACLE_UNBOUNDED if cap is None else cap,
        impl="unified",
        eviction_policy=config["eviction_policy"],
        output_insert="all_but_last",
        chunked_prefill_size=config["chunked_prefill_size"],
        disable_radix_cache=False,
        max_context_len=4096,
        verbose=True,
        waiting_prefix_refresh="on" if config["waiting_prefix_refresh"] else "off",
    )
    engine = oracle.Oracle(args)
    hits, evictable = [], []
    with contextlib.redirect_stdout(io.StringIO()):
        for q in requests:
            engine.args.output_insert = "all" if q["finish_reason"] == "stop" else "all_but_last"
            rec = {"prompt": q["prompt_token_ids"], "output": q["output_token_ids"]}
            if q.get("cache_salt"):
                rec["cache_salt"] = q["cache_salt"]
            res = engine.run_one(rec)
            hits.append(res["hit"])
            evictable.append(res["evictable"])
    return {"hits": hits, "evictable": evictable}


def generate(seed: int, n_requests: int) -> str:
    sys.path.insert(0, str(ORACLE_DIR))
    requests = random_workload(seed, n_requests)
    cases = [{**c, **run_oracle(c, requests)} for c in configs(requests)]
    path = OUT_DIR / f"seed_{seed:03d}.json.gz"
    payload = {"seed": seed, "requests": requests, "cases": cases}
    with gzip.open(path, "wt") as f:
        json.dump(payload, f, separators=(",", ":"))
    return f"{path.name}: {len(cases)} configurations x {len(requests)} requests"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with Pool(args.jobs) as pool:
        jobs = [(seed, args.requests) for seed in range(args.seeds)]
        for line in pool.imap_unordered(_generate, jobs):
            print(line, flush=True)


def _generate(job: tuple[int, int]) -> str:
    return generate(*job)


if __name__ == "__main__":
    main()
