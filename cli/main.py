"""The ``prefixcheck`` command line. Thin: parse flags, show progress, render the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.errors import PrefixcheckError
from analyzer.export import write_table
from analyzer.pipeline import AnalyzeOptions, analyze
from analyzer.replay import ReplaySettings
from cache_models.config import SGLANG_EVICTION_POLICIES
from cli.progress import RichProgress
from cli.render import render_report

EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Replay LLM prompt logs through vLLM's and SGLang's prefix caches and explain the hits.",
)


@app.callback()
def _root() -> None:
    """prefixcheck: prefix-cache hit rates of your prompt logs, as the engines count them."""


@app.command("analyze")
def analyze_command(
    files: Annotated[list[Path], typer.Argument(help="Log files (JSONL).", show_default=False)],
    log_format: Annotated[
        str,
        typer.Option("--format", help="auto, openai, prompt, tokens or hash-trace."),
    ] = "auto",
    tokenizer: Annotated[
        str | None,
        typer.Option(help="tokenizer.json, a model folder, or a hub name (default: qwen2.5)."),
    ] = None,
    block_size: Annotated[int, typer.Option(min=1, help="vLLM --block-size.")] = 16,
    page_size: Annotated[int, typer.Option(min=1, help="SGLang --page-size.")] = 1,
    capacity_tokens: Annotated[
        int | None, typer.Option(min=1, help="Usable KV capacity in tokens (default: unbounded).")
    ] = None,
    eviction_policy: Annotated[
        str, typer.Option(help=f"SGLang policy: {', '.join(SGLANG_EVICTION_POLICIES)}.")
    ] = "lru",
    hash_block_size: Annotated[
        int, typer.Option(min=1, help="Tokens per hash id in hash-id traces.")
    ] = 512,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON.")
    ] = None,
    per_request: Annotated[
        Path | None, typer.Option(help="Write per-request hits (.jsonl, .csv or .parquet).")
    ] = None,
    fail_under: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Exit 1 when an engine's token hit rate is below."),
    ] = None,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad line (exit 2).")] = False,
    top: Annotated[int, typer.Option(min=0, help="Shared prefixes to show.")] = 10,
    redact: Annotated[bool, typer.Option(help="Show no prompt text in reports.")] = False,
    quiet: Annotated[bool, typer.Option(help="No terminal report.")] = False,
) -> None:
    """Replay a prompt log through both engines' prefix caches and report the hits."""
    console = Console()
    errors = Console(stderr=True)
    if eviction_policy not in SGLANG_EVICTION_POLICIES:
        _fail(errors, f"unknown --eviction-policy {eviction_policy!r}")
    options = AnalyzeOptions(
        format=log_format,
        tokenizer=tokenizer,
        settings=ReplaySettings(
            block_size=block_size,
            page_size=page_size,
            capacity_tokens=capacity_tokens,
            eviction_policy=eviction_policy,
        ),
        strict=strict,
        hash_block_size=hash_block_size,
        top_prefixes=top,
        redact=redact,
    )
    try:
        with RichProgress(errors, enabled=errors.is_terminal and not quiet) as progress:
            result = analyze(files, options, progress)
        if json_path is not None:
            _write_text(json_path, json.dumps(result.report.to_dict(), indent=2) + "\n")
        if per_request is not None:
            write_table(result.per_request, per_request)
    except PrefixcheckError as exc:
        _fail(errors, str(exc))
    if not quiet:
        render_report(result.report, console)
    if fail_under is not None:
        failing = [
            f"{summary.label} {summary.hit_rate:.2%}"
            for summary in result.report.engines.values()
            if summary.hit_rate < fail_under
        ]
        if failing:
            errors.print(
                f"prefixcheck: hit rate below --fail-under {fail_under:.2%}: {', '.join(failing)}",
                highlight=False,
            )
            raise typer.Exit(EXIT_GATE_FAILED)


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _fail(errors: Console, message: str) -> None:
    errors.print(f"prefixcheck: error: {message}", highlight=False, markup=False)
    raise typer.Exit(EXIT_BAD_INPUT)


def main() -> None:
    """Console-script entry point: Ctrl-C ends the run with a short message, no traceback."""
    try:
        app()
    except KeyboardInterrupt:
        print("prefixcheck: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
