"""Prefill time with and without the cached prefix on a GPU (prints the measured table, never
asserts).

    .venv/bin/python tests/bench/bench_gpu_prefill.py [LOG] [--sample 200] [--model-preset NAME]

Defaults: ``examples/chat_logs.jsonl``, the Llama-3.1-8B shape with seeded random weights, bf16 on
CUDA, 200 requests sampled by prompt length and hit, 3 timed repeats after 1 warm-up: a few
minutes at most on one H100/H200. On a machine without a GPU, ``--device cpu --model-preset tiny``
checks that the script runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from analyzer.errors import PrefixcheckError  # noqa: E402
from analyzer.measure import MeasureOptions, measurer  # noqa: E402
from analyzer.pipeline import AnalyzeOptions, analyze  # noqa: E402
from analyzer.progress import NoProgress  # noqa: E402
from cli.render_measure import render_measurement  # noqa: E402

BUDGET_S = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?", type=Path, default=ROOT / "examples" / "chat_logs.jsonl")
    parser.add_argument("--model-preset", default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    console = Console(width=160)
    started = time.perf_counter()
    try:
        measure = measurer(
            MeasureOptions(
                model_preset=args.model_preset,
                layers=args.layers,
                device=args.device,
                dtype=args.dtype,
                sample=args.sample,
                repeats=args.repeats,
                warmup=args.warmup,
            )
        )
        analysis = analyze([args.log], AnalyzeOptions(model_preset="llama-3.1-8b"))
        analyzed = time.perf_counter()
        measurement = measure(analysis, NoProgress())
    except PrefixcheckError as exc:
        sys.exit(f"bench_gpu_prefill: {exc}")
    finished = time.perf_counter()
    render_measurement(measurement, console)
    if measurement.mismatches:
        console.print(
            f"logits mismatches: {len(measurement.mismatches)}, e.g. {measurement.mismatches[0]}"
        )
    total = finished - started
    console.print(
        f"wall time: {total:.1f} s (analysis {analyzed - started:.1f} s, model and prefills "
        f"{finished - analyzed:.1f} s)"
        + (f"; over the {BUDGET_S} s budget" if total > BUDGET_S else "")
    )


if __name__ == "__main__":
    main()
