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
from analyzer.replay import ReplaySettings
from cache_models.config import SGLANG_EVICTION_POLICIES
from cli.common import EXIT_GATE_FAILED, fail, write_text
from cli.inputs import (
    Cache,
    ChatTemplate,
    ChatTemplateKwargs,
    FastTokenizer,
    Files,
    Format,
    HashBlockSize,
    MessagesField,
    PromptField,
    RenderAs,
    SaltField,
    TenantField,
    TimeField,
    TokenizerSpec,
    ingest_options,
)
from cli.progress import RichProgress
from cli.render_measure import render_measurement


def measure_command(
    files: Files,
    log_format: Format = "auto",
    tokenizer: TokenizerSpec = None,
    block_size: Annotated[int, typer.Option(min=1, help="vLLM --block-size.")] = 16,
    page_size: Annotated[int, typer.Option(min=1, help="SGLang --page-size.")] = 1,
    capacity_tokens: Annotated[
        int | None, typer.Option(min=1, help="Usable KV capacity in tokens (default: unbounded).")
    ] = None,
    eviction_policy: Annotated[
        str, typer.Option(help=f"SGLang policy: {', '.join(SGLANG_EVICTION_POLICIES)}.")
    ] = "lru",
    hash_block_size: HashBlockSize = None,
    prompt_field: PromptField = None,
    messages_field: MessagesField = None,
    time_field: TimeField = None,
    tenant_field: TenantField = None,
    salt_field: SaltField = None,
    chat_template: ChatTemplate = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    render_as: RenderAs = "vllm",
    cache: Cache = True,
    fast_tokenizer: FastTokenizer = True,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad line (exit 2).")] = False,
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
    console, errors = Console(), Console(stderr=True)
    if eviction_policy not in SGLANG_EVICTION_POLICIES:
        fail(errors, f"unknown --eviction-policy {eviction_policy!r}")
    try:
        reading = ingest_options(
            log_format=log_format,
            tokenizer=tokenizer,
            strict=strict,
            hash_block_size=hash_block_size,
            prompt_field=prompt_field,
            messages_field=messages_field,
            time_field=time_field,
            tenant_field=tenant_field,
            salt_field=salt_field,
            chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs,
            render_as=render_as,
            cache=cache,
            fast_tokenizer=fast_tokenizer,
        )
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    options = AnalyzeOptions(
        ingest=reading,
        settings=ReplaySettings(
            block_size=block_size,
            page_size=page_size,
            capacity_tokens=capacity_tokens,
            eviction_policy=eviction_policy,
        ),
        model_preset=model_preset or DEFAULT_ESTIMATE_PRESET,
    )
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
