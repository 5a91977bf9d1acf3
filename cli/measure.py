"""``prefixcheck measure LOG...``: time real prefills with and without the cached prefix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.errors import PrefixcheckError
from analyzer.measure import MeasureOptions, measurer
from analyzer.measure.presets import DEFAULT_ESTIMATE_PRESET, PRESETS
from analyzer.measure.result import Measurement
from analyzer.pipeline import AnalyzeOptions, analyze
from cli.common import EXIT_GATE_FAILED, fail, to_stdout, write_text
from cli.flags import CacheFlags, ReadFlags, flag_groups, writable
from cli.inputs import Files
from cli.progress import RichProgress
from cli.render_measure import render_measurement


@flag_groups
def measure_command(
    files: Files,
    read: ReadFlags,
    cache: CacheFlags,
    model_preset: Annotated[
        str | None,
        typer.Option(
            help=f"Model shape, random weights: {', '.join(PRESETS)} "
            "(default: llama-3.1-8b on CUDA, tiny on CPU)."
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="A local Hugging Face folder (config.json, *.safetensors) to load."),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(min=1, help="Build only the first N decoder layers.")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    dtype: Annotated[
        str | None, typer.Option(help="bf16, fp16 or fp32 (default: bf16 on CUDA, fp32 on CPU).")
    ] = None,
    sample: Annotated[
        int, typer.Option(min=1, help="Requests to measure (stratified by length and hit).")
    ] = 64,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs of each prefill.")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs before them.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the sample and the random weights.")] = 0,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the measurements as JSON.")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No terminal report.")] = False,
) -> None:
    """Time prefills of sampled requests with and without each engine's cached prefix."""
    console, errors = Console(stderr=to_stdout(json_path)), Console(stderr=True)
    try:
        writable(json_path, "--json")
        options = AnalyzeOptions(
            ingest=read.ingest,
            settings=cache.settings(model_preset=model_preset),
            model_preset=model_preset or DEFAULT_ESTIMATE_PRESET,
        )
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    measure_options = MeasureOptions(
        model_preset=model_preset,
        model_path=model,
        layers=layers,
        device=device,
        dtype=dtype,
        sample=sample,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
    )
    try:
        measure = measurer(measure_options)
        with RichProgress(errors, enabled=errors.is_terminal and not quiet) as progress:
            measurement = measure(analyze(files, options, progress), progress)
        if json_path is not None:
            write_text(json_path, json.dumps(measurement.to_dict(), indent=2) + "\n")
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    if not quiet:
        render_measurement(measurement, console)
    if logits_mismatch(measurement, errors):
        raise typer.Exit(EXIT_GATE_FAILED)


def logits_mismatch(measurement: Measurement, errors: Console) -> bool:
    """Whether a cached-prefix prefill's logits differ from the full prefill's (said on stderr)."""
    mismatches = measurement.mismatches
    if mismatches:
        errors.print(
            f"prefixcheck: error: cached-prefix logits differ from the full prefill's for "
            f"{len(mismatches)} prefill(s), e.g. {mismatches[0]}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    return bool(mismatches)
