"""The ``prefixcheck`` command line. Thin: parse flags, show progress, render the report."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.errors import PrefixcheckError
from analyzer.executors import make_executor
from analyzer.export import write_table
from analyzer.gates import evaluate_gates
from analyzer.kernels import watch_compilation
from analyzer.measure import MeasureOptions, measurer
from analyzer.measure.presets import DEFAULT_ESTIMATE_PRESET
from analyzer.pipeline import AnalyzeOptions, analyze
from analyzer.report import report_schema
from cli.common import EXIT_GATE_FAILED, Command, fail, write_text
from cli.compare import compare_command
from cli.config import default_map, find_config
from cli.export_trace import export_trace_command
from cli.flags import (
    CacheFlags,
    DiagnoseFlags,
    ExecutorFlags,
    GateFlags,
    OutputFlags,
    ReadFlags,
    SchedulerFlags,
    flag_groups,
)
from cli.fleet_flags import FleetFlags
from cli.inputs import Files
from cli.lint import lint_command
from cli.measure import logits_mismatch, measure_command
from cli.outputs import junit_xml, markdown, publish_to_github
from cli.progress import RichProgress
from cli.render import render_gates, render_report
from cli.render_html import html_report

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Replay LLM prompt logs through vLLM's and SGLang's prefix caches and explain the hits.",
    # Plain help, as vllm serve and sglang's launch_server print theirs: it wraps long flag names
    # onto their own line instead of cutting them at 80 columns, as rich's panels do.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version  # here: its import costs a run 25 ms

        print(f"prefixcheck {version('prefixcheck')}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            help="Settings file (default: ./prefixcheck.toml or [tool.prefixcheck] in "
            "./pyproject.toml); flags override it.",
        ),
    ] = None,
) -> None:
    """prefixcheck: prefix-cache hit rates of your prompt logs, as the engines count them."""
    assert isinstance(ctx.command, typer.core.TyperGroup)
    try:
        path = config or find_config(Path.cwd())
        if path is None:
            return
        ctx.default_map = default_map(path, ctx.command.commands)
    except PrefixcheckError as exc:
        fail(Console(stderr=True), str(exc))


app.command("compare", cls=Command)(compare_command)


@app.command("schema", cls=Command)
def schema_command() -> None:
    """Print the JSON Schema of `analyze --json` reports."""
    print(json.dumps(report_schema(), indent=2))


app.command("lint", cls=Command)(lint_command)
app.command("measure", cls=Command)(measure_command)
app.command("export-trace", cls=Command)(export_trace_command)


@app.command("analyze", cls=Command)
@flag_groups
def analyze_command(
    files: Files,
    read: ReadFlags,
    cache: CacheFlags,
    scheduler: SchedulerFlags,
    diagnose: DiagnoseFlags,
    outputs: OutputFlags,
    gates: GateFlags,
    run_on: ExecutorFlags,
    fleet: FleetFlags,
    quiet: Annotated[bool, typer.Option(help="No terminal report.")] = False,
    measure: Annotated[
        bool, typer.Option(help="Also time sampled prefills (gpu extra; see `measure`).")
    ] = False,
) -> None:
    """Replay a prompt log through both engines' prefix caches and report the hits."""
    console = Console()
    errors = Console(stderr=True)
    quiet = quiet or outputs.to_stdout  # standard output holds the JSON (or Markdown...) alone
    try:
        options = AnalyzeOptions(
            ingest=read.ingest,
            settings=cache.settings(scheduler, diagnose.model_preset),
            top_prefixes=diagnose.top,
            redact=diagnose.redact,
            what_if=diagnose.specs,
            model_preset=diagnose.model_preset or DEFAULT_ESTIMATE_PRESET,
            sample_tokens=diagnose.diagnose_tokens,
            diagnose=diagnose.diagnosis,
            check_curves=diagnose.check_curves,
            fleet=fleet.options,
            fleet_what_if=diagnose.fleet_what_if,
        )
        if not diagnose.diagnosis and any(limit.kind != "alignment" for limit in gates.limits):
            raise PrefixcheckError("--max-loss needs the diagnosis (but alignment=...)")
        measure_with = (
            measurer(MeasureOptions(model_preset=diagnose.model_preset)) if measure else None
        )
        with (
            RichProgress(
                errors, enabled=errors.is_terminal and not quiet, announce=not quiet
            ) as progress,
            watch_compilation(progress.compiling, progress.compiled),
        ):
            result = analyze(files, options, progress, make_executor(run_on.options))
            if measure_with is not None:
                measured = measure_with(result, progress)
                result = replace(result, report=replace(result.report, measurement=measured))
        report = result.report
        checked = evaluate_gates(
            report.json, fail_under=gates.rate, max_losses=gates.limits, engine=gates.engine
        )
        if outputs.json_path is not None:
            write_text(outputs.json_path, json.dumps(report.json, indent=2) + "\n")
        if outputs.markdown_path is not None:
            write_text(outputs.markdown_path, markdown(report, checked))
        if outputs.html_path is not None:
            write_text(outputs.html_path, html_report(report, checked))
        if outputs.junit_path is not None:
            write_text(outputs.junit_path, junit_xml(report, checked))
        if outputs.per_request is not None:
            write_table(result.per_request, outputs.per_request)
        annotations = publish_to_github(report, checked)
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    if not quiet:
        render_report(result.report, console)
        render_gates(checked, console)
    for line in annotations:  # on stderr when stdout holds a report (the runner reads both)
        print(line, file=sys.stderr if outputs.to_stdout else sys.stdout)
    failed = [gate for gate in checked if not gate.passed]
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
