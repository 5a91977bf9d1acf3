"""The ``prefixcheck`` command line. Thin: parse flags, show progress, render the report."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.diagnose.html import html_report
from analyzer.errors import PrefixcheckError
from analyzer.export import write_table
from analyzer.gates import LossLimit, evaluate_gates
from analyzer.measure import MeasureOptions, measurer
from analyzer.measure.presets import DEFAULT_ESTIMATE_PRESET, PRESETS
from analyzer.pipeline import DEFAULT_SAMPLE_TOKENS, AnalyzeOptions, analyze
from analyzer.replay import ReplaySettings
from analyzer.report import report_schema
from cache_models.config import SGLANG_EVICTION_POLICIES, TimeModel
from cli.common import EXIT_GATE_FAILED, EXIT_INTERRUPTED, fail, write_text
from cli.compare import compare_command
from cli.config import default_map, find_config
from cli.export_trace import export_trace_command
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
from cli.lint import lint_command
from cli.measure import logits_mismatch, measure_command
from cli.outputs import junit_xml, markdown, publish_to_github
from cli.progress import RichProgress
from cli.render import render_gates, render_report

# Requests in flight in an arrival-time replay unless --concurrency says otherwise (vLLM's
# default max_num_seqs).
DEFAULT_TIMED_CONCURRENCY = 256

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Replay LLM prompt logs through vLLM's and SGLang's prefix caches and explain the hits.",
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            help="Settings file (default: ./prefixcheck.toml or [tool.prefixcheck] in "
            "./pyproject.toml); flags override it.",
        ),
    ] = None,
) -> None:
    """prefixcheck: prefix-cache hit rates of your prompt logs, as the engines count them."""
    path = config or find_config(Path.cwd())
    if path is None:
        return
    assert isinstance(ctx.command, typer.core.TyperGroup)
    try:
        ctx.default_map = default_map(path, ctx.command.commands)
    except PrefixcheckError as exc:
        fail(Console(stderr=True), str(exc))


app.command("compare")(compare_command)


@app.command("schema")
def schema_command() -> None:
    """Print the JSON Schema of `analyze --json` reports."""
    print(json.dumps(report_schema(), indent=2))


app.command("lint")(lint_command)
app.command("measure")(measure_command)
app.command("export-trace")(export_trace_command)


@app.command("analyze")
def analyze_command(
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
    chunked_prefill_size: Annotated[
        int,
        typer.Option(min=0, help="SGLang --chunked-prefill-size (0: off); changes eviction units."),
    ] = 0,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Requests in flight: vLLM's lock-step scheduling (default 1, sequential; "
            f"{DEFAULT_TIMED_CONCURRENCY} with --replay-in-time).",
        ),
    ] = None,
    replay_in_time: Annotated[
        bool,
        typer.Option(
            help="Replay at the log's timestamps: running requests hold their KV for a modelled "
            "prefill + decode time."
        ),
    ] = False,
    prefill_tokens_per_s: Annotated[
        float, typer.Option(min=1.0, help="Time model: uncached prompt tokens per second.")
    ] = TimeModel.prefill_tokens_per_s,
    decode_tokens_per_s: Annotated[
        float, typer.Option(min=0.001, help="Time model: output tokens per second per request.")
    ] = TimeModel.decode_tokens_per_s,
    diagnose_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Logs with more prompt tokens are streamed (memory follows the caches, not the "
            "log) and diagnosed on their first N tokens.",
        ),
    ] = DEFAULT_SAMPLE_TOKENS,
    diagnosis: Annotated[
        bool,
        typer.Option(
            help="Diagnose the recomputed tokens (causes, curves, bounds, recommendations); "
            "--no-diagnosis reports hit rates, the ceiling and shared prefixes only."
        ),
    ] = True,
    check_curves: Annotated[
        bool,
        typer.Option(
            help="Check the capacity curves against full LRU replays (and Belady) at three "
            "capacities."
        ),
    ] = False,
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
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON.")
    ] = None,
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write a Markdown summary (PR comments).")
    ] = None,
    junit_path: Annotated[
        Path | None, typer.Option("--junit", help="Write JUnit XML, one test case per gate.")
    ] = None,
    per_request: Annotated[
        Path | None, typer.Option(help="Write per-request hits (.jsonl, .csv or .parquet).")
    ] = None,
    fail_under: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Gate: exit 1 when a token hit rate is below RATE."),
    ] = None,
    max_loss: Annotated[
        list[str] | None,
        typer.Option(help="Gate: KIND=TOKENS or KIND=PERCENT% (e.g. alignment=5%); repeatable."),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="Engines the gates check: vllm, sglang or both.")
    ] = "both",
    strict: Annotated[bool, typer.Option(help="Stop at the first bad line (exit 2).")] = False,
    top: Annotated[int, typer.Option(min=0, help="Shared prefixes to show.")] = 10,
    redact: Annotated[bool, typer.Option(help="Show no prompt text in reports.")] = False,
    quiet: Annotated[bool, typer.Option(help="No terminal report.")] = False,
    model_preset: Annotated[
        str | None,
        typer.Option(
            help=f"Model shape of the prefill estimate: {', '.join(PRESETS)} "
            f"(default {DEFAULT_ESTIMATE_PRESET}; with --measure, tiny on CPU)."
        ),
    ] = None,
    measure: Annotated[
        bool, typer.Option(help="Also time sampled prefills (gpu extra; see `measure`).")
    ] = False,
    what_if: Annotated[
        list[str] | None,
        typer.Option(
            "--what-if",
            help="Replay a fix: pad-prefixes, move-dynamic, reorder-parts, no-salt, "
            "block-size=N, page-size=N, capacity=N, eviction-policy=P; join with + to "
            "combine; repeatable.",
        ),
    ] = None,
    html_path: Annotated[
        Path | None, typer.Option("--html", help="Write a self-contained HTML report (charts).")
    ] = None,
) -> None:
    """Replay a prompt log through both engines' prefix caches and report the hits."""
    console = Console()
    errors = Console(stderr=True)
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
            chunked_prefill_size=chunked_prefill_size,
            max_in_flight=concurrency or (DEFAULT_TIMED_CONCURRENCY if replay_in_time else 1),
            time_model=TimeModel(prefill_tokens_per_s, decode_tokens_per_s)
            if replay_in_time
            else None,
        ),
        top_prefixes=top,
        redact=redact,
        what_if=tuple(what_if or ()),
        model_preset=model_preset or DEFAULT_ESTIMATE_PRESET,
        sample_tokens=diagnose_tokens,
        diagnose=diagnosis,
        check_curves=check_curves,
    )
    needs_losses = [text for text in max_loss or [] if not text.startswith("alignment=")]
    if not diagnosis and (needs_losses or what_if or check_curves):
        fail(errors, "--max-loss (but alignment), --what-if and --check-curves need the diagnosis")
    try:
        limits = [LossLimit.parse(text) for text in max_loss or []]
        measure_with = measurer(MeasureOptions(model_preset=model_preset)) if measure else None
        with RichProgress(errors, enabled=errors.is_terminal and not quiet) as progress:
            result = analyze(files, options, progress)
            if measure_with is not None:
                measured = measure_with(result, progress)
                result = replace(result, report=replace(result.report, measurement=measured))
        report = result.report.to_dict()
        gates = evaluate_gates(report, fail_under=fail_under, max_losses=limits, engine=engine)
        if json_path is not None:
            write_text(json_path, json.dumps(report, indent=2) + "\n")
        if markdown_path is not None:
            write_text(markdown_path, markdown(report, gates))
        if html_path is not None:
            write_text(html_path, html_report(report))
        if junit_path is not None:
            write_text(junit_path, junit_xml(report, gates))
        if per_request is not None:
            write_table(result.per_request, per_request)
        annotations = publish_to_github(report, gates)
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    if not quiet:
        render_report(result.report, console)
        render_gates(gates, console)
    for line in annotations:
        print(line)
    failed = [gate for gate in gates if not gate.passed]
    for gate in failed:
        errors.print(
            f"prefixcheck: gate failed: {gate.message}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    measurement = result.report.measurement
    if failed or (measurement is not None and logits_mismatch(measurement, errors)):
        raise typer.Exit(EXIT_GATE_FAILED)


class _Interrupted(BaseException):
    """Ctrl-C, raised past click (which would turn a KeyboardInterrupt into "Aborted!")."""


def _interrupt(signum: int, frame: object) -> None:
    raise _Interrupted


def main() -> None:
    """Console-script entry point: Ctrl-C ends the run with a short message, no traceback."""
    signal.signal(signal.SIGINT, _interrupt)
    try:
        app()
    except (KeyboardInterrupt, _Interrupted):
        print("prefixcheck: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
