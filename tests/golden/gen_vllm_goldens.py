"""Write tests/golden/vllm/: per-request prefix-cache hits computed by vLLM 0.33.0's own code.

Every seeded workload of ``tests/golden/workloads.py`` is replayed through the oracle's manager
engine (vLLM's KVCacheManager, BlockPool and hashing, driven in lock-step) for each block size,
capacity (unbounded; medium; tight: evictions on most requests, yet every request fits) and
number of requests in flight. Small random workloads over a harsher grid (block sizes 1 to 16, a
cache barely larger than the largest request, up to 6 in flight, so many preemptions) go to
``edge_cases.json.gz``. Run it with the oracle's interpreter, which has vLLM installed:

    /work/oracle_envs/vllm/bin/python tests/golden/gen_vllm_goldens.py \
        --oracle /work/shared/oracles/vllm/oracle.py
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import random
import sys
from multiprocessing import Pool
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "golden"
# This folder holds a ``vllm/`` of golden files, which must not shadow the vllm package.
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

from tests.golden.workloads import random_workload  # noqa: E402

OUT_DIR = REPO / "tests" / "golden" / "vllm"
SEEDS = range(36)
BLOCK_SIZES = (4, 16, 32)
IN_FLIGHT = (1, 2, 4)
EDGE_CASES = 600


def n_requests(seed: int) -> int:
    return 60 + 20 * (seed % 4)


def peak_blocks(spec: dict[str, Any], block_size: int) -> int:
    """Blocks a request holds at its peak: prompt plus all outputs but the last."""
    tokens = len(spec["prompt"]) + max(1, len(spec["output"])) - 1
    return -(-tokens // block_size)


def capacities(specs: list[dict[str, Any]], block_size: int) -> dict[str, int]:
    """vLLM num_gpu_blocks (the null block included) for each capacity of the grid."""
    peaks = [peak_blocks(s, block_size) for s in specs]
    return {
        "unbounded": sum(peaks) + 1,  # more than could ever be held: nothing is evicted
        "medium": 4 * max(peaks) + 1,
        "tight": 3 * max(peaks) // 2 + 1,
    }


def load_oracle(path: str) -> ModuleType:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("vllm_apc_oracle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_oracle(
    oracle: ModuleType,
    specs: list[dict[str, Any]],
    block_size: int,
    num_blocks: int,
    in_flight: int,
) -> dict[str, Any]:
    flags = {"--block-size": block_size, "--num-blocks": num_blocks, "--concurrency": in_flight}
    args = oracle.parse_args([str(v) for item in flags.items() for v in item])
    longest = max(len(s["prompt"]) + max(1, len(s["output"])) for s in specs)
    args.max_model_len = max(1024, -(-longest // 1024) * 1024)
    tracks, totals, _ = oracle.run_manager(specs, args)
    return {
        "hit": [t.hit for t in tracks],
        "rehit": [sum(t.rehits) for t in tracks],
        "preemptions": [t.req.num_preemptions for t in tracks],
        "queries": totals["queries"],
        "hits": totals["hits"],
    }


def generate(seed: int, oracle_path: str) -> str:
    oracle = load_oracle(oracle_path)
    requests = random_workload(seed, n_requests(seed))
    specs = [
        {
            "prompt": r["prompt_token_ids"],
            "output": r["output_token_ids"],
            "salt": r.get("cache_salt") or None,
        }
        for r in requests
    ]
    configs = []
    for block_size in BLOCK_SIZES:
        for capacity, num_blocks in capacities(specs, block_size).items():
            for in_flight in IN_FLIGHT:
                result = run_oracle(oracle, specs, block_size, num_blocks, in_flight)
                configs.append(
                    {
                        "block_size": block_size,
                        "capacity": capacity,
                        "num_blocks": num_blocks,
                        "max_in_flight": in_flight,
                        **result,
                    }
                )
    path = OUT_DIR / f"workload_{seed:03d}.json.gz"
    write(path, {"seed": seed, "requests": requests, "configs": configs})
    return f"{path.name}: {len(requests)} requests x {len(configs)} configurations"


def edge_case(seed: int) -> tuple[list[dict[str, Any]], int, int, int]:
    """A small workload over a 7-token vocabulary: requests, block size, num_blocks, in flight."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 3, 4, 8, 16])

    def tokens(n: int) -> list[int]:
        return [rng.randint(0, 6) for _ in range(n)]

    prefixes = [tokens(rng.randint(0, 4 * block_size)) for _ in range(rng.randint(1, 4))]
    requests: list[dict[str, Any]] = []
    for _ in range(rng.randint(2, 25)):
        prompt = list(rng.choice(prefixes))
        if requests and rng.random() < 0.3:  # a re-send, often with the earlier answer
            old = rng.choice(requests)
            prompt = old["prompt_token_ids"] + (
                old["output_token_ids"] if rng.random() < 0.6 else []
            )
        prompt += tokens(rng.randint(0 if prompt else 1, 2 * block_size))
        n_out = rng.choice([1, 1, 2, 3, rng.randint(1, 4 * block_size)])
        request = {"prompt_token_ids": prompt, "output_token_ids": tokens(n_out)}
        salt = rng.choice([None, None, None, "s1", "s2"])
        if salt:
            request["cache_salt"] = salt
        requests.append(request)
    peak = max(
        -(-(len(r["prompt_token_ids"]) + len(r["output_token_ids"]) - 1) // block_size)
        for r in requests
    )
    num_blocks = rng.choice([peak + 1, peak + 2, peak + 3, 2 * peak + 1, 3 * peak, 10 * peak])
    return requests, block_size, num_blocks, rng.choice([1, 1, 2, 3, 4, 6])


def generate_edge_cases(first: int, count: int, oracle_path: str) -> list[dict[str, Any]]:
    oracle = load_oracle(oracle_path)
    cases = []
    for seed in range(first, first + count):
        requests, block_size, num_blocks, in_flight = edge_case(seed)
        specs = [
            {
                "prompt": r["prompt_token_ids"],
                "output": r["output_token_ids"],
                "salt": r.get("cache_salt"),
            }
            for r in requests
        ]
        result = run_oracle(oracle, specs, block_size, num_blocks, in_flight)
        config = {
            "block_size": block_size,
            "capacity": "bounded",
            "num_blocks": num_blocks,
            "max_in_flight": in_flight,
        }
        cases.append({"seed": seed, "requests": requests, "configs": [{**config, **result}]})
    return cases


def write(path: Path, golden: Any) -> None:
    data = json.dumps(golden, separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oracle", default="/work/shared/oracles/vllm/oracle.py")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with Pool(args.jobs) as pool:
        for line in pool.starmap(generate, [(seed, args.oracle) for seed in SEEDS]):
            print(line, flush=True)
        chunk = EDGE_CASES // args.jobs + 1
        parts = [
            (first, min(chunk, EDGE_CASES - first), args.oracle)
            for first in range(0, EDGE_CASES, chunk)
        ]
        cases = [case for part in pool.starmap(generate_edge_cases, parts) for case in part]
    write(OUT_DIR / "edge_cases.json.gz", cases)
    print(f"edge_cases.json.gz: {len(cases)} workloads", flush=True)


if __name__ == "__main__":
    main()
