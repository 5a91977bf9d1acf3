"""The terminal view of a Report."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from analyzer.gates import GateResult
from analyzer.report import EngineSummary, Report
from cli.render_diagnosis import render_diagnosis
from cli.render_fleet import fleet_table
from cli.render_inputs import models_table, server_table
from cli.render_measure import estimate_table, render_measurement

WIDE_CONSOLE = 120
"""Consoles at least this wide show each prefix's snippet in its table row."""


def render_report(report: Report, console: Console) -> None:
    console.print(_header(report))
    if report.skipped.count:
        console.print(_skipped(report))
    console.print(_engines(report))
    if report.fleet is not None:
        console.print(fleet_table(report.fleet))
    if report.models:
        console.print(models_table(report.models))
    if report.server_comparison is not None:
        console.print(server_table(report.server_comparison))
    if report.prefill_estimate is not None:
        console.print(estimate_table(report.prefill_estimate))
    if report.shared_prefixes:
        console.print(_prefixes(report, wide=console.width >= WIDE_CONSOLE))
    scope = report.diagnosis_scope
    if report.diagnosis is not None and scope is not None:
        render_diagnosis(report.diagnosis, scope, console)
    if report.recommendations:
        items = [Text(f"• {item.summary}") for item in report.recommendations]
        if scope is not None and not scope.whole_log:
            items.append(Text(f"Measured by replay {scope.description}.", style="dim"))
        console.print(
            Panel(Group(*items), title="Recommendations", title_align="left", border_style="green")
        )
    for note in report.notes + report.run_notes:
        console.print(Text(f"note: {note}", style="dim"))
    if report.measurement is not None:
        render_measurement(report.measurement, console)


def _header(report: Report) -> Text:
    text = Text()
    text.append("prefixcheck", style="bold")
    text.append(
        f"  {report.requests:,} requests, {report.prompt_tokens:,} prompt tokens, "
        f"{report.output_tokens:,} output tokens; {report.skipped.count:,} lines skipped\n"
    )
    text.append(f"  inputs: {', '.join(f'{p} ({f})' for p, f in report.inputs.items())}\n")
    text.append(f"  tokenizer: {report.tokenizer or 'none (token ids in the log)'}")
    if report.chat_template:
        text.append(f"; chat template: {report.chat_template}")
    text.append(f"; replay: {report.replay_mode}")
    return text


def _skipped(report: Report) -> Table:
    table = Table(title="Skipped lines", box=box.SIMPLE, title_justify="left")
    table.add_column("reason")
    table.add_column("lines", justify="right")
    for reason, count in report.skipped.reasons.items():
        table.add_row(reason, f"{count:,}")
    for example in report.skipped.examples:
        table.add_row(Text(f"e.g. {example}", style="dim"), "")
    return table


def _engines(report: Report) -> Table:
    table = Table(title="Prefix-cache hits", box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("engine")
    table.add_column("hit tokens", justify="right")
    table.add_column("token hit rate", justify="right")
    table.add_column("mean per request", justify="right")
    rows: list[EngineSummary] = [*report.engines.values(), report.ceiling]
    for summary in rows:
        style = "dim" if summary is report.ceiling else None
        table.add_row(
            summary.label,
            f"{summary.hit_tokens:,}",
            f"{summary.hit_rate:.1%}",
            f"{summary.mean_request_hit_rate:.1%}",
            style=style,
        )
    share = report.alignment_share
    table.caption = (
        f"Lost to block alignment (SGLang page-1 hits − vLLM hits): "
        f"{report.alignment_loss_tokens:,} tokens ({share:.1%} of prompt tokens)"
    )
    scope = report.diagnosis_scope
    if scope is not None and not scope.whole_log:
        table.caption += (
            f"\nOver the whole log: {report.requests:,} requests, {report.prompt_tokens:,} "
            f"prompt tokens (the diagnosis below covers its first {scope.requests:,})."
        )
    table.caption_justify = "left"
    return table


def _prefixes(report: Report, wide: bool) -> Table | Group:
    """The prefix table; on a narrow console the snippets go below it, one numbered line each."""
    block = report.block_size
    table = Table(title="Top shared prefixes", box=box.SIMPLE, title_justify="left")
    headers = ("tokens", f"% {block}", "requests", "covered", "pad")
    for header in headers if wide else ("#", *headers):
        table.add_column(header, justify="right", no_wrap=True)
    # Text columns shrink first (wrappable) but show one truncated line (the cells do not wrap).
    table.add_column("namespace", max_width=20)
    if wide:
        table.add_column("snippet")
    snippets = Table.grid(padding=(0, 1))
    snippets.add_column(justify="right")
    snippets.add_column()
    for number, prefix in enumerate(report.shared_prefixes, 1):
        text = _one_line(prefix.snippet if prefix.snippet is not None else "(redacted)")
        cells = [
            f"{prefix.tokens:,}",
            str(prefix.remainder),
            f"{prefix.requests:,}",
            f"{prefix.covered_tokens:,}",
            f"+{prefix.padding}" if prefix.padding else "0",
            _one_line(prefix.namespace or "-"),
        ]
        if wide:
            table.add_row(*cells, text)
        else:
            table.add_row(str(number), *cells)
            snippets.add_row(f"{number}", text)
    return table if wide else Group(table, snippets, Text())


def _one_line(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="ellipsis")


def render_gates(gates: list[GateResult], console: Console) -> None:
    for gate in gates:
        mark, style = ("PASS", "green") if gate.passed else ("FAIL", "bold red")
        console.print(Text.assemble((f"{mark} ", style), gate.message))
