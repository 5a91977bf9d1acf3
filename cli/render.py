"""The terminal view of a Report."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from analyzer.engines import ENGINE_LABELS
from analyzer.gates import GateResult
from analyzer.report import EngineSummary, PrefixSummary, Report
from analyzer.verdict import Verdict
from cli.render_diagnosis import losses_table, render_diagnosis
from cli.render_fleet import fleet_table
from cli.render_inputs import models_table, server_table
from cli.render_measure import estimate_table, render_measurement

WIDE_CONSOLE = 120
"""Consoles at least this wide show each prefix's snippet in its table row."""


def render_report(report: Report, console: Console) -> None:
    """The verdict first (hit rates, the biggest avoidable cause, the best measured fix), then
    what it rests on: the hits, the input's skips, the server's own counts, the causes, the
    fixes, then the detail (templates, dynamic values, curves, estimate, notes)."""
    console.print(_header(report))
    console.print(_verdict(Verdict.of(report.to_dict())))
    console.print(_engines(report))
    if report.skipped.count:
        console.print(_skipped(report))
    if report.fleet is not None:
        console.print(fleet_table(report.fleet))
    if report.models:
        console.print(models_table(report.models))
    if report.server_comparison is not None:
        console.print(server_table(report.server_comparison))
    scope = report.diagnosis_scope
    if report.diagnosis is not None and scope is not None:
        console.print(losses_table(report.diagnosis, scope))
    if report.recommendations:
        console.print(_recommendations(report))
    if report.shared_prefixes:
        console.print(_prefixes(report, wide=console.width >= WIDE_CONSOLE))
    if report.diagnosis is not None and scope is not None:
        kv = report.prefill_estimate
        render_diagnosis(
            report.diagnosis,
            scope,
            console,
            kv_bytes_per_token=kv.kv_bytes_per_token if kv else None,
            model=kv.model if kv else None,
        )
    if report.prefill_estimate is not None:
        console.print(estimate_table(report.prefill_estimate))
    for note in report.notes + report.run_notes:
        console.print(Text(f"note: {note}", style="dim"))
    if report.measurement is not None:
        render_measurement(report.measurement, console)


def _verdict(verdict: Verdict) -> Panel:
    lines = [
        Text.assemble(("hits  ", "bold"), verdict.hit_rates),
        Text.assemble(("cause ", "bold"), verdict.biggest_cause),
        Text.assemble(("fix   ", "bold"), verdict.best_fix),
    ]
    if verdict.best_fix_why:
        lines.append(Text(f"      why: {verdict.best_fix_why}", style="dim"))
    return Panel(Group(*lines), title="Verdict", title_align="left", border_style="blue")


def _recommendations(report: Report) -> Panel:
    """Each fix with its measured effect and, dimmed, why it works; the largest saving first."""
    items: list[Text] = []
    for number, item in enumerate(report.recommendations, 1):
        items.append(Text(f"{number}. {item.summary}"))
        if item.why:
            items.append(Text(f"   why: {item.why}", style="dim"))
    scope = report.diagnosis_scope
    if scope is not None and not scope.whole_log:
        items.append(Text(f"Measured by replay {scope.description}.", style="dim"))
    return Panel(
        Group(*items),
        title="Recommendations (measured by replay; largest saving first)",
        title_align="left",
        border_style="green",
    )


def _header(report: Report) -> Text:
    text = Text()
    text.append("prefixcheck", style="bold")
    text.append(
        f" · {report.requests:,} requests · {report.prompt_tokens:,} prompt tokens · "
        f"{report.output_tokens:,} output tokens · {report.skipped.count:,} lines skipped\n"
    )
    text.append(f"inputs: {', '.join(f'{p} ({f})' for p, f in report.inputs.items())}\n")
    text.append(f"tokenizer: {report.tokenizer or 'none (token ids in the log)'}\n")
    if report.chat_template:
        text.append(f"chat template: {report.chat_template}\n")
    text.append(f"replay: {report.replay_mode}")
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
    belady = report.diagnosis.belady if report.diagnosis is not None else None
    scope = report.diagnosis_scope
    sampled = scope is not None and not scope.whole_log
    for engine, hits in (belady or {}).items():
        shown = scope.share(hits) if scope is not None else hits / max(1, report.prompt_tokens)
        table.add_row(
            f"Belady bound, {ENGINE_LABELS.get(engine, engine)}" + (" (sample)" if sampled else ""),
            f"{hits:,}",
            f"{shown:.1%}",
            "-",
            style="dim",
        )
    share = report.alignment_share
    bound = (
        " Belady bound: the most hits any eviction policy could get at this capacity, knowing "
        "the future."
        if belady
        else ""
    )
    table.caption = (
        f"Token hit rate: hit tokens / prompt tokens. Lost to block alignment (SGLang page-1 "
        f"hits − vLLM hits): {report.alignment_loss_tokens:,} tokens ({share:.1%} of prompt "
        f"tokens).{bound}"
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
    """One row per template (its leading prefix; its other variants counted), the snippets in a
    column on a wide console, else below the table, one numbered line each, wrapped, never cut."""
    block = report.block_size
    table = Table(title="Top shared prefixes, by template", box=box.SIMPLE, title_justify="left")
    headers = ("tokens", f"% {block}", "requests", "covered", "pad", "variants")
    for header in headers if wide else ("#", *headers):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("namespace", overflow="fold")
    if wide:
        table.add_column("snippet", overflow="fold")
    snippets = Table.grid(padding=(0, 1))
    snippets.add_column(justify="right")
    snippets.add_column(overflow="fold")
    groups: dict[int, list[PrefixSummary]] = {}
    for prefix in report.shared_prefixes:
        groups.setdefault(prefix.template, []).append(prefix)
    for number, (lead, *variants) in enumerate(groups.values(), 1):
        text = Text(lead.snippet if lead.snippet is not None else "(redacted)")
        namespaces = sorted({p.namespace or "-" for p in (lead, *variants)})
        cells = [
            f"{lead.tokens:,}",
            str(lead.remainder),
            f"{lead.requests:,}",
            f"{lead.covered_tokens:,}",
            _padding(lead),
            str(len(variants)),
            ", ".join(namespaces),
        ]
        if wide:
            table.add_row(*cells, text)
        else:
            table.add_row(str(number), *cells)
            snippets.add_row(f"{number}", text)
    table.caption = (
        f"% {block}: tokens past the prefix's last full {block}-token block, which vLLM "
        f"recomputes for every request. pad: tokens that would align it, shown where the replay "
        "measured a saving (padding_saves). variants: the template's other prefixes in the JSON "
        "(longer versions, other namespaces)."
    )
    table.caption_justify = "left"
    return table if wide else Group(table, snippets, Text())


def _padding(prefix: PrefixSummary) -> str:
    if not prefix.padding:
        return "0"
    if prefix.padding_saves is None or prefix.padding_saves <= 0:
        return "-"  # not measured, or it costs more than it saves: not advice
    return f"+{prefix.padding}"


def _one_line(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="ellipsis")


def render_gates(gates: list[GateResult], console: Console) -> None:
    for gate in gates:
        mark, style = ("PASS", "green") if gate.passed else ("FAIL", "bold red")
        console.print(Text.assemble((f"{mark} ", style), gate.message))
