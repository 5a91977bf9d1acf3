"""Write tests/golden/vllm/: per-request prefix-cache hits computed by vLLM 0.33.0's own code.

Every seeded workload of ``tests/golden/workloads.py`` is replayed through the oracle's manager
engine (vLLM's KVCacheManager, BlockPool and hashing, driven in lock-step) for each block size,
capacity (unbounded; medium; tight: evictions on most requests, yet every request fits) and
number of requests in flight. Run it with the oracle's interpreter, which has vLLM installed:

    /work/oracle_envs/vllm/bin/python tests/golden/gen_vllm_goldens.py \
        --oracle /work/shared/oracles/vllm/oracle.py
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
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
    golden = {"seed": seed, "requests": requests, "configs": configs}
    path = OUT_DIR / f"workload_{seed:03d}.json.gz"
    data = json.dumps(golden, separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return f"{path.name}: {len(requests)} requests x {len(configs)} configurations"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oracle", default="/work/shared/oracles/vllm/oracle.py")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with Pool(args.jobs) as pool:
        for line in pool.starmap(generate, [(seed, args.oracle) for seed in SEEDS]):
            print(line, flush=True)


if __name__ == "__main__":
    main()
