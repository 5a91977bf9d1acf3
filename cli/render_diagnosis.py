"""The terminal view of a diagnosis: losses by cause, dynamic content, bar charts of hit rate
against capacity and block size, and what-if replays."""

from __future__ import annotations

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from analyzer.diagnose.capacity import CapacityCurve
from analyzer.diagnose.losses import CATEGORIES
from analyzer.diagnose.model import Diagnosis
from analyzer.engines import ENGINE_LABELS
from analyzer.report import DiagnosisScope
from analyzer.units import binary_bytes

CURVE_ROWS = 10
WIDE_CONSOLE = 120  # consoles at least this wide show example values in the table
EIGHTHS = " ▏▎▍▌▋▊▉"
STYLES = {"vllm": "cyan", "sglang": "magenta"}


def render_diagnosis(
    diagnosis: Diagnosis,
    scope: DiagnosisScope,
    console: Console,
    *,
    kv_bytes_per_token: int | None = None,
    model: str | None = None,
) -> None:
    """The detail of the diagnosis, each table with its shares over ``scope`` (the sample when
    streamed), said beside it: dynamic values, the capacity curve (in tokens, and KV bytes on
    ``model``), block sizes, what-ifs. Its losses table goes with the verdict's evidence
    (``losses_table``)."""
    width = max(8, (console.width - 22) // 2 - 9)  # two engines, a label and a rate each
    if diagnosis.dynamic_content:
        wide = console.width >= WIDE_CONSOLE
        table, examples = _dynamic(diagnosis, wide)
        console.print(with_scope(table, scope))
        if examples is not None:
            console.print(examples)
    tables = []
    if any(curve.points for curve in diagnosis.capacity_curves.values()):
        bars = max(8, width - (5 if kv_bytes_per_token else 0))
        tables.append(_capacity_chart(diagnosis, scope, bars, kv_bytes_per_token, model))
    tables.append(_size_chart(diagnosis, scope, width))
    if diagnosis.what_if:
        tables.append(_what_if(diagnosis))
    for table in tables:
        console.print(with_scope(table, scope))


def losses_table(diagnosis: Diagnosis, scope: DiagnosisScope) -> Table:
    """Recomputed prompt tokens by cause, its shares over ``scope`` (said when a sample)."""
    return with_scope(_losses(diagnosis, scope), scope)


def with_scope(table: Table, scope: DiagnosisScope) -> Table:
    """The table with the scope of its figures in its caption when they cover a sample."""
    if not scope.whole_log:
        line = f"Measured {scope.description}."
        table.caption = f"{table.caption}\n{line}" if table.caption else line
        table.caption_justify = "left"
    return table


def bar(share: float, width: int, style: str) -> Text:
    """A horizontal bar of ``width`` cells for a share in [0, 1], in eighths of a cell, followed
    by the share."""
    eighths = round(max(0.0, min(1.0, share)) * width * 8)
    full, rest = divmod(eighths, 8)
    text = Text("█" * full + (EIGHTHS[rest] if rest else ""), style=style)
    text.append(" " * (width - full - (1 if rest else 0)) + f" {share:6.1%}")
    return text


def _losses(diagnosis: Diagnosis, scope: DiagnosisScope) -> Table:
    table = Table(title="Recomputed prompt tokens by cause", box=box.SIMPLE, title_justify="left")
    table.add_column("cause")
    for engine in diagnosis.losses:
        table.add_column(f"{ENGINE_LABELS[engine]} tokens", justify="right")
        table.add_column("share", justify="right")
    for name in CATEGORIES:
        cells = []
        for losses in diagnosis.losses.values():
            tokens = losses.tokens[name]
            cells += [f"{tokens:,}", f"{scope.share(tokens):.1%}" if scope.prompt_tokens else "-"]
        table.add_row(name.replace("_", " "), *cells)
    totals = []
    for losses in diagnosis.losses.values():
        total = sum(losses.tokens.values())
        totals += [f"{total:,}", f"{scope.share(total):.1%}" if scope.prompt_tokens else "-"]
    table.add_row(Text("recomputed (prompt − hit)", style="bold"), *totals, style="bold")
    table.caption = (
        "share: of prompt tokens. Causes add up to each engine's recomputed tokens "
        "(loss_definitions in the JSON)."
    )
    table.caption_justify = "left"
    return table


def _dynamic(diagnosis: Diagnosis, wide: bool) -> tuple[Table, Group | None]:
    """The sites; their example values in a column on a wide console, else below the table,
    one numbered line each (wrapped, never cut)."""
    table = Table(title="Dynamic content before shared text", box=box.SIMPLE, title_justify="left")
    headers = ("token", "kind", "requests", "value", "static after", "lost")
    for header in headers if wide else ("#", *headers):
        table.add_column(header, justify="right" if header != "kind" else "left", no_wrap=True)
    if wide:
        table.add_column("examples", overflow="fold")
    examples = Table.grid(padding=(0, 1))
    examples.add_column(justify="right")
    examples.add_column(overflow="fold")
    for number, site in enumerate(diagnosis.dynamic_content, 1):
        joined = Text("(redacted)" if site.examples is None else " | ".join(site.examples))
        cells = [
            str(site.position),
            site.kind,
            f"{site.requests:,}",
            f"{site.value_tokens}",
            f"{site.static_tokens_after:,}",
            f"{site.lost_tokens:,}",
        ]
        if wide:
            table.add_row(*cells, joined)
        else:
            table.add_row(str(number), *cells)
            examples.add_row(str(number), joined)
    table.caption = (
        "token: where the value starts; value: its longest length in tokens; static after: the "
        "shared tokens it keeps from being reused; lost: the dynamic content loss it causes."
    )
    table.caption_justify = "left"
    return table, None if wide else Group(examples, Text())


def _capacity_chart(
    diagnosis: Diagnosis,
    scope: DiagnosisScope,
    width: int,
    kv_bytes_per_token: int | None,
    model: str | None,
) -> Table:
    curves = diagnosis.capacity_curves
    table = Table(
        title="Token hit rate against KV capacity (LRU, one pass)",
        box=box.SIMPLE,
        title_justify="left",
    )
    table.add_column("capacity\n(tokens)", justify="right", no_wrap=True)
    if kv_bytes_per_token:
        table.add_column(f"KV on\n{model}", justify="right", no_wrap=True)
    for engine in curves:
        table.add_column(ENGINE_LABELS[engine])
    for capacity in _chart_capacities(curves):
        cells = []
        for engine, curve in curves.items():
            cells.append(bar(scope.share(_hits_at(curve, capacity)), width, STYLES[engine]))
        kv = [binary_bytes(capacity * kv_bytes_per_token)] if kv_bytes_per_token else []
        table.add_row(f"{capacity:,}", *kv, *cells)
    errors = [
        f"{ENGINE_LABELS[engine]} ±{error:.1%}"
        for engine, curve in curves.items()
        if (error := curve.max_abs_error(scope.prompt_tokens)) is not None
    ]
    checked = (
        f"The curve against full replays at a few capacities: {', '.join(errors)} of prompt "
        "tokens at most. "
        if errors
        else "The curve is not checked against full replays (--check-curves does). "
    )
    table.caption = (
        checked + "The Belady bound at the configured capacity is a row of the hits table."
    )
    table.caption_justify = "left"
    return table


def _chart_capacities(curves: dict[str, CapacityCurve]) -> list[int]:
    largest = max(curve.working_set_tokens for curve in curves.values())
    smallest = min(
        (p.capacity_tokens for c in curves.values() for p in c.points if p.model_hit_tokens),
        default=1,
    )
    grid = np.geomspace(max(1, smallest), max(2, largest), CURVE_ROWS)
    return sorted({int(round(value, -int(np.floor(np.log10(value))) + 1)) for value in grid})


def _hits_at(curve: CapacityCurve, capacity: int) -> int:
    """The curve's hits at a capacity: the last point at or below it."""
    below = [p.model_hit_tokens for p in curve.points if p.capacity_tokens <= capacity]
    return below[-1] if below else 0


def _size_chart(diagnosis: Diagnosis, scope: DiagnosisScope, width: int) -> Table:
    table = Table(
        title="Hit rate against block size (vLLM) and page size (SGLang)",
        box=box.SIMPLE,
        title_justify="left",
    )
    table.add_column("size", justify="right")
    sweep = diagnosis.size_sweep
    for engine in sweep:
        table.add_column(ENGINE_LABELS[engine])
    sizes = sorted({p.size for points in sweep.values() for p in points})
    for size in sizes:
        cells = []
        for engine, points in sweep.items():
            hit = next((p.hit_tokens for p in points if p.size == size), None)
            if hit is None or not scope.prompt_tokens:
                cells.append(Text("-"))
                continue
            cells.append(bar(scope.share(hit), width, STYLES[engine]))
        table.add_row(str(size), *cells)
    return table


def _what_if(diagnosis: Diagnosis) -> Table:
    table = Table(title="What if (replayed)", box=box.SIMPLE, title_justify="left")
    table.add_column("fix", overflow="fold")
    table.add_column("engine", no_wrap=True)
    table.add_column("hit rate\nbefore → after", justify="right", no_wrap=True)
    table.add_column("recomputed\ntokens saved", justify="right", no_wrap=True)
    for item in diagnosis.what_if:
        for engine, gain in item.measured.items():
            before = gain.hit_tokens_before / gain.prompt_tokens_before
            after = gain.hit_tokens_after / gain.prompt_tokens_after
            table.add_row(
                item.name,
                ENGINE_LABELS[engine],
                f"{before:.1%} → {after:.1%}",
                f"{gain.recomputed_tokens_saved:+,}",
            )
    return table
