"""Write tests/golden/sglang/settings_*.json.gz: SGLang 0.5.23's own hits under the server settings
that change them beyond the grid of ``gen_sglang_goldens.py``.

- ``--radix-eviction-policy priority`` with a per-request ``priority`` (stored in the tree:
  ``UnifiedRadixCache`` inserts with ``req.priority or 0``, the prompt split with priority + 1);
- ``--disable-overlap-schedule``: a stop finish then inserts all outputs but the last, like a
  ``max_new_tokens`` finish (no extra decode step in flight);
- ``tlru`` with ``--radix-eviction-policy-config '{"threshold": T, "next_prompt_estimate": Q}'``
  and ``slru`` with ``'{"protected_threshold": P}'``;
- requests with ``return_logprob`` and ``logprob_start_len`` (the match is capped there:
  ``Req._compute_max_prefix_len``) and with an ``extra_key`` namespace;
- the default ``--chunked-prefill-size`` for each GPU memory tier (2048, 4096, 8192, 16384;
  ``arg_groups/memory_hook.py``) on prompts of hundreds to thousands of tokens.

It drives the oracle's ``Oracle`` in-process, as ``gen_sglang_goldens.py`` does, handing the
policy config to ``CacheInitParams`` and the logprob fields to ``Req``, which the oracle's command
line does not expose. Run it with the oracle's interpreter from the repository root:

    .venv-oracle-sglang/bin/python tests/golden/gen_sglang_settings_goldens.py
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import random
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.golden.gen_sglang_goldens import (  # noqa: E402
    ORACLE_DIR,
    ORACLE_UNBOUNDED,
    tight_capacity,
)
from tests.golden.workloads import long_prompt_workload, random_workload  # noqa: E402

OUT_DIR = ROOT / "tests" / "golden" / "sglang"
SHORT_SEEDS = range(10)
LONG_SEEDS = range(3)
DEFAULT_CHUNKS = (2048, 4096, 8192, 16384)


def with_request_fields(requests: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Give the requests priorities, some an ``extra_key`` and some a logprob start."""
    rng = random.Random(1000 + seed)
    for q in requests:
        q["priority"] = rng.choice([0, 0, 1, 2, 5, -1])
        if rng.random() < 0.1:
            q["extra_key"] = rng.choice(["adapter-a", "adapter-b"])
        if rng.random() < 0.12:
            q["return_logprob"] = True
            q["logprob_start_len"] = rng.randrange(0, len(q["prompt_token_ids"]) + 1)
    return requests


def short_configs(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ps in (1, 4, 16):
        base = {"page_size": ps, "capacity_tokens": tight_capacity(requests, ps)}
        out.append({**base, "eviction_policy": "priority"})
        out.append({**base, "eviction_policy": "lru", "overlap_schedule": False})
        out.append({**base, "eviction_policy": "lru"})
        for threshold, estimate in ((64, 16), (128, 0), (40, 20)):
            out.append(
                {**base, "eviction_policy": "tlru"}
                | {"tlru_threshold": threshold, "tlru_next_prompt_estimate": estimate}
            )
    for protected in (1, 3, 5):
        base = {"page_size": 1, "capacity_tokens": tight_capacity(requests, 1)}
        out.append({**base, "eviction_policy": "slru", "slru_protected_threshold": protected})
    out.append({"page_size": 1, "capacity_tokens": None, "eviction_policy": "priority"})
    out.append(
        {"page_size": 16, "capacity_tokens": None, "eviction_policy": "lru"}
        | {"overlap_schedule": False}
    )
    return [{"chunked_prefill_size": 0} | c for c in out]


def long_configs(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for chunk in DEFAULT_CHUNKS:
        for ps in (1, 16):
            cap = tight_capacity(requests, ps)
            out.append(
                {"page_size": ps, "capacity_tokens": cap, "eviction_policy": "lru"}
                | {"chunked_prefill_size": chunk}
            )
        out.append(
            {"page_size": 1, "capacity_tokens": None, "eviction_policy": "lru"}
            | {"chunked_prefill_size": chunk, "overlap_schedule": False}
        )
    return out


_PATCHED: dict[str, Any] = {}


def install_patches() -> dict[str, Any]:
    """Route the config's policy parameters to ``CacheInitParams`` and the request's logprob
    fields to ``Req`` (once per process); returns the dict the patched classes read."""
    if _PATCHED:
        return _PATCHED
    from sglang.srt.managers import schedule_batch
    from sglang.srt.mem_cache import cache_init_params

    state = _PATCHED
    state.update(policy_config=None, request={})
    params_cls = cache_init_params.CacheInitParams
    req_cls = schedule_batch.Req

    def make_params(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("eviction_policy_config", state["policy_config"])
        return params_cls(*args, **kwargs)

    class LogprobReq(req_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            q = state["request"]
            kwargs["return_logprob"] = bool(q.get("return_logprob"))
            super().__init__(*args, **kwargs)
            if q.get("return_logprob"):  # Scheduler.handle_generate_request
                self.logprob_start_len = q["logprob_start_len"]
            else:
                self.logprob_start_len = -1

    cache_init_params.CacheInitParams = make_params
    schedule_batch.Req = LogprobReq
    return state


def policy_config(config: dict[str, Any]) -> dict[str, int] | None:
    if config["eviction_policy"] == "tlru":
        return {
            "threshold": config["tlru_threshold"],
            "next_prompt_estimate": config["tlru_next_prompt_estimate"],
        }
    if config["eviction_policy"] == "slru" and "slru_protected_threshold" in config:
        return {"protected_threshold": config["slru_protected_threshold"]}
    return None


def run_oracle(
    config: dict[str, Any], requests: list[dict[str, Any]], state: dict[str, Any]
) -> dict[str, list[int]]:
    import oracle  # the oracle venv's module, on sys.path in the worker

    cap = config["capacity_tokens"]
    state["policy_config"] = policy_config(config)
    args = argparse.Namespace(
        page_size=config["page_size"],
        capacity_tokens=ORACLE_UNBOUNDED if cap is None else cap,
        impl="unified",
        eviction_policy=config["eviction_policy"],
        output_insert="all_but_last",
        chunked_prefill_size=config["chunked_prefill_size"],
        disable_radix_cache=False,
        max_context_len=20000,
        verbose=True,
        waiting_prefix_refresh="on",
    )
    engine = oracle.Oracle(args)
    overlap = config.get("overlap_schedule", True)
    hits, evictable = [], []
    with contextlib.redirect_stdout(io.StringIO()):
        for q in requests:
            stop = q["finish_reason"] == "stop"
            engine.args.output_insert = "all" if stop and overlap else "all_but_last"
            rec = {"prompt": q["prompt_token_ids"], "output": q["output_token_ids"]}
            for field in ("cache_salt", "extra_key", "priority"):
                if q.get(field) is not None:
                    rec[field] = q[field]
            state["request"] = q
            res = engine.run_one(rec)
            hits.append(res["hit"])
            evictable.append(res["evictable"])
    return {"hits": hits, "evictable": evictable}


def generate(kind: str, seed: int) -> str:
    sys.path.insert(0, str(ORACLE_DIR))
    import oracle  # noqa: F401  (installs the oracle's stubs before sglang is imported)

    state = install_patches()
    if kind == "short":
        requests = with_request_fields(random_workload(seed, 100), seed)
        configs = short_configs(requests)
    else:
        requests = long_prompt_workload(seed, 50, scale=3)
        for q in requests:
            q.pop("prompt_logprobs", None)
        configs = long_configs(requests)
    cases = [{**c, **run_oracle(c, requests, state)} for c in configs]
    path = OUT_DIR / f"settings_{kind}_{seed:03d}.json.gz"
    payload = {"seed": seed, "requests": requests, "cases": cases}
    path.write_bytes(gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), 9, mtime=0))
    return f"{path.name}: {len(cases)} configurations x {len(requests)} requests"


def _generate(job: tuple[str, int]) -> str:
    return generate(*job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    jobs = [("short", s) for s in SHORT_SEEDS] + [("long", s) for s in LONG_SEEDS]
    with Pool(args.jobs) as pool:
        for line in pool.imap_unordered(_generate, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
