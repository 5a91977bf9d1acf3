"""``prefixcheck compare BASE.json HEAD.json``: what a change did to caching."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from analyzer.compare import Comparison, compare_reports, load_report
from analyzer.errors import PrefixcheckError
from cli.common import EXIT_GATE_FAILED, fail, to_stdout, write_text


def compare_command(
    base: Annotated[Path, typer.Argument(help="Report of the base (e.g. main).")],
    head: Annotated[Path, typer.Argument(help="Report of the change.")],
    max_drop: Annotated[
        float | None,
        typer.Option(
            min=0.0, max=1.0, help="Exit 1 when a token hit rate falls by more (0.02 = 2 points)."
        ),
    ] = None,
    engine: Annotated[str, typer.Option(help="vllm, sglang or both.")] = "both",
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the diff as JSON.")
    ] = None,
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write the diff as Markdown.")
    ] = None,
) -> None:
    """Compare two `analyze --json` reports: hit rates, losses, and templates that changed."""
    console, errors = Console(stderr=to_stdout(json_path, markdown_path)), Console(stderr=True)
    try:
        comparison = compare_reports(load_report(base), load_report(head), engine)
        if json_path is not None:
            write_text(json_path, json.dumps(comparison.to_dict(), indent=2) + "\n")
        if markdown_path is not None:
            write_text(markdown_path, comparison_markdown(comparison))
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    for warning in comparison.warnings:
        errors.print(f"prefixcheck: note: {warning}", highlight=False, soft_wrap=True)
    console.print(_table(comparison))
    if comparison.templates:
        console.print(_templates(comparison))
    if max_drop is not None:
        dropped = [c for c in comparison.engines if c.drop > max_drop]
        for change in dropped:
            errors.print(
                f"prefixcheck: {change.label} token hit rate fell {change.drop:.2%} "
                f"({change.base_hit_rate:.2%} -> {change.head_hit_rate:.2%}), over --max-drop "
                f"{max_drop:.2%}",
                highlight=False,
                soft_wrap=True,
            )
        if dropped:
            raise typer.Exit(EXIT_GATE_FAILED)


def _table(comparison: Comparison) -> Table:
    table = Table(title="Token hit rate", box=box.SIMPLE_HEAVY, title_justify="left")
    for header in ("engine", "base", "head", "change"):
        table.add_column(header, justify="left" if header == "engine" else "right")
    for change in comparison.engines:
        style = "red" if change.drop > 0 else "green" if change.drop < 0 else None
        table.add_row(
            change.label,
            f"{change.base_hit_rate:.2%}",
            f"{change.head_hit_rate:.2%}",
            f"{0.0 - change.drop:+.2%}",  # 0.0 - 0.0 is +0.0, where -0.0 would print "-0.00%"
            style=style,
        )
    for engine, kinds in comparison.losses.items():
        for kind, (before, after) in kinds.items():
            if before != after:
                table.add_row(
                    f"  {engine} {kind} loss", f"{before:,}", f"{after:,}", f"{after - before:+,}"
                )
    return table


def _templates(comparison: Comparison) -> Table:
    block = comparison.block_size
    table = Table(title="Templates that changed", box=box.SIMPLE, title_justify="left")
    for header in ("", "tokens", f"% {block}", "requests", "snippet"):
        table.add_column(header, no_wrap=header != "snippet", overflow="ellipsis")
    for t in comparison.templates:
        table.add_row(
            t.status,
            _arrow(t.base_tokens, t.head_tokens),
            _arrow(t.base_remainder, t.head_remainder),
            _arrow(t.base_requests, t.head_requests),
            t.snippet or "",
        )
    return table


def _arrow(before: int | None, after: int | None) -> str:
    if before == after:
        return f"{after}"
    return f"{'-' if before is None else before} → {'-' if after is None else after}"


def comparison_markdown(comparison: Comparison) -> str:
    lines = [
        "## prefixcheck compare",
        "",
        *(f"> {warning}\n" for warning in comparison.warnings),
        "| engine | base | head | change |",
        "| --- | ---: | ---: | ---: |",
    ]
    for c in comparison.engines:
        lines.append(
            f"| {c.label} | {c.base_hit_rate:.2%} | {c.head_hit_rate:.2%} | {0.0 - c.drop:+.2%} |"
        )
    if comparison.templates:
        block = comparison.block_size
        lines += ["", f"| template | tokens | % {block} | requests |", "| --- | --- | --- | --- |"]
        for t in comparison.templates:
            snippet = (t.snippet or t.fingerprint).replace("|", "\\|")
            lines.append(
                f"| {t.status}: `{snippet}` | {_arrow(t.base_tokens, t.head_tokens)} "
                f"| {_arrow(t.base_remainder, t.head_remainder)} "
                f"| {_arrow(t.base_requests, t.head_requests)} |"
            )
    return "\n".join(lines) + "\n"
