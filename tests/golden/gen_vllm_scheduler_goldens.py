"""Write tests/golden/vllm/scheduler_*.json.gz: per-request hits from vLLM 0.33.0's own Scheduler.

The oracle's ``--engine scheduler`` (vLLM's real ``Scheduler.schedule`` / ``update_from_output``
loop with a fake model runner, all requests waiting from the start) replays long-prompt workloads
(``workloads.long_prompt_workload``) at vLLM 0.33's default token budgets
(``--max-num-batched-tokens``: 2048, the OpenAI server on most GPUs; 8192, the server on H100/H200;
16384, the server on B200 and the ``LLM`` class on H100; ``EngineArgs.get_batch_defaults``), with
``--long-prefill-token-threshold`` off (its default) and on, at 2 to 64 requests in flight, in an
unbounded cache and a tight one (preemptions). About 1 request in 8 asks for prompt logprobs, which
makes vLLM skip its prefix lookup (``SamplingParams.skip_reading_prefix_cache``). Run it with the
oracle's interpreter:

    .venv-oracle-vllm/bin/python tests/golden/gen_vllm_scheduler_goldens.py \
        --oracle /work/shared/oracles/vllm/oracle.py
"""

from __future__ import annotations

import argparse
import os
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "golden"
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

from tests.golden.gen_vllm_goldens import load_oracle, peak_blocks, write  # noqa: E402
from tests.golden.workloads import long_prompt_workload  # noqa: E402

OUT_DIR = REPO / "tests" / "golden" / "vllm"
SEEDS = range(6)
N_REQUESTS = 120
BLOCK_SIZE = 16
# (max_num_batched_tokens, long_prefill_token_threshold, max in flight)
GRID = (
    [(2048, 0, k) for k in (2, 8, 32, 64)]
    + [(8192, 0, k) for k in (4, 16, 64)]
    + [(16384, 0, k) for k in (16, 64)]
    + [(2048, 512, k) for k in (8, 64)]
    + [(8192, 1000, 32)]
)


def run_scheduler(
    oracle: Any,
    specs: list[dict[str, Any]],
    num_blocks: int,
    budget: int,
    threshold: int,
    in_flight: int,
) -> dict[str, Any]:
    flags = {
        "--engine": "scheduler",
        "--block-size": BLOCK_SIZE,
        "--num-blocks": num_blocks,
        "--concurrency": in_flight,
        "--max-num-batched-tokens": budget,
        "--long-prefill-token-threshold": threshold,
    }
    args = oracle.parse_args([str(v) for item in flags.items() for v in item])
    longest = max(len(s["prompt"]) + max(1, len(s["output"])) for s in specs)
    args.max_model_len = max(1024, -(-longest // 1024) * 1024)
    counted = {"queries": 0, "hits": 0}
    from vllm.v1.metrics.stats import PrefixCacheStats

    record = PrefixCacheStats.record

    def count(self: Any, num_tokens: int, num_hits: int, preempted: bool, **kw: Any) -> None:
        if not preempted:  # what vllm:prefix_cache_queries / _hits add up
            counted["queries"] += num_tokens
            counted["hits"] += num_hits
        record(self, num_tokens, num_hits, preempted, **kw)

    PrefixCacheStats.record = count  # type: ignore[method-assign]
    try:
        tracks, _, _ = oracle.run_scheduler(specs, args)
    finally:
        PrefixCacheStats.record = record  # type: ignore[method-assign]
    return {
        "hit": [t.hit for t in tracks],
        "rehit": [sum(t.rehits) for t in tracks],
        "preemptions": [t.req.num_preemptions for t in tracks],
        "queries": counted["queries"],
        "hits": counted["hits"],
    }


def with_prompt_logprobs(oracle: Any) -> None:
    """Make the oracle's requests ask for prompt logprobs where the spec says so (vLLM's
    ``SamplingParams`` then sets ``skip_reading_prefix_cache``)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    def make_request(track: Any, block_hasher: Any) -> Any:
        sp = SamplingParams(
            max_tokens=track.max_tokens,
            ignore_eos=True,
            prompt_logprobs=track.spec.get("prompt_logprobs"),
        )
        return Request(
            request_id=str(track.idx),
            prompt_token_ids=list(track.spec["prompt"]),
            sampling_params=sp,
            pooling_params=None,
            cache_salt=track.spec["salt"],
            block_hasher=block_hasher,
        )

    oracle._make_request = make_request


def generate(seed: int, oracle_path: str) -> str:
    oracle = load_oracle(oracle_path)
    with_prompt_logprobs(oracle)
    requests = long_prompt_workload(seed, N_REQUESTS)
    specs = [
        {
            "prompt": r["prompt_token_ids"],
            "output": r["output_token_ids"],
            "salt": None,
            "prompt_logprobs": r.get("prompt_logprobs"),
        }
        for r in requests
    ]
    peaks = [peak_blocks(s, BLOCK_SIZE) for s in specs]
    peak = max(peaks)
    configs = []
    for budget, threshold, in_flight in GRID:
        for capacity, num_blocks in (("unbounded", sum(peaks) + 1), ("tight", 2 * peak + 1)):
            result = run_scheduler(oracle, specs, num_blocks, budget, threshold, in_flight)
            configs.append(
                {
                    "block_size": BLOCK_SIZE,
                    "capacity": capacity,
                    "num_blocks": num_blocks,
                    "max_in_flight": in_flight,
                    "max_num_batched_tokens": budget,
                    "long_prefill_token_threshold": threshold,
                    **result,
                }
            )
    path = OUT_DIR / f"scheduler_{seed:03d}.json.gz"
    write(path, {"seed": seed, "requests": requests, "configs": configs})
    return f"{path.name}: {len(requests)} requests x {len(configs)} configurations"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oracle", default="/work/shared/oracles/vllm/oracle.py")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    args = parser.parse_args()
    with Pool(args.jobs) as pool:
        for line in pool.starmap(generate, [(s, args.oracle) for s in range(args.seeds)]):
            print(line, flush=True)


if __name__ == "__main__":
    main()
