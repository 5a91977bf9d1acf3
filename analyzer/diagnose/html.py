"""A self-contained HTML report (``--html``): tables and inline SVG charts from the report's JSON
form, with no script and no external resource, so it opens offline."""

from __future__ import annotations

from html import escape
from typing import Any

from analyzer.diagnose.charts import Series, bar_chart, line_chart, stacked_bars

LABELS = {"vllm": "vLLM", "sglang": "SGLang"}
ENGINE_COLORS = {"vllm": "#1f77b4", "sglang": "#d62728"}
STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 980px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
td.text { font-family: monospace; max-width: 420px; overflow: hidden; white-space: nowrap;
  text-overflow: ellipsis; }
.note { color: #666; font-size: 0.85em; } li { margin: 0.4em 0; }
"""


def html_report(report: dict[str, Any]) -> str:
    """The whole report as one HTML page."""
    prompt = report["prompt_tokens"]
    sections = [
        f"<h1>prefixcheck</h1><p>{report['requests']:,} requests, {prompt:,} prompt tokens, "
        f"{report['output_tokens']:,} output tokens; {report['skipped']['count']:,} lines "
        f"skipped. Inputs: {escape(', '.join(report['inputs']))}. Tokenizer: "
        f"{escape(str(report.get('tokenizer') or 'none (token ids in the log)'))}.</p>",
        _engines(report),
    ]
    scope = _scope_note(report)
    if report.get("losses"):
        sections.append(_losses(report) + scope)
    if report.get("shared_prefixes"):
        sections.append(_prefixes(report))
    if report.get("dynamic_content"):
        sections.append(_dynamic(report) + scope)
    if report.get("capacity_curve"):
        sections.append(_capacity(report) + scope)
    if report.get("block_size_sweep"):
        sections.append(_sizes(report) + scope)
    if report.get("recommendations"):
        sections.append(_recommendations(report) + scope)
    if report.get("what_if"):
        sections.append(_what_if(report) + scope)
    notes = "".join(f"<p class='note'>note: {escape(n)}</p>" for n in report.get("notes", []))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>prefixcheck report</title><style>{STYLE}</style></head><body>"
        + "".join(sections)
        + notes
        + "</body></html>\n"
    )


def _scope_note(report: dict[str, Any]) -> str:
    """The line beside each diagnosis section saying which requests its shares are over, when
    they are a sample of the log."""
    scope = report.get("diagnosis_scope")
    if not scope or scope["whole_log"]:
        return ""
    return f"<p class='note'>Measured {escape(scope['description'])}.</p>"


def _table(headers: list[str], rows: list[list[str]], text_columns: tuple[int, ...] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='text'>{cell}</td>" if i in text_columns else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _engines(report: dict[str, Any]) -> str:
    rows = [
        [
            escape(s["label"]),
            f"{s['hit_tokens']:,}",
            f"{s['hit_rate']:.1%}",
            f"{s['mean_request_hit_rate']:.1%}",
        ]
        for s in [*report["engines"].values(), report["ceiling"]]
    ]
    bounds = report.get("upper_bounds") or {}
    belady = bounds.get("belady")
    extra = ""
    if belady:
        extra = (
            "<p class='note'>Belady bound at the configured capacity: "
            + ", ".join(f"{LABELS[e]} {b['hit_rate']:.1%}" for e, b in belady.items())
            + f". {escape(bounds.get('belady_definition', ''))}</p>"
        )
    scope = report.get("diagnosis_scope")
    if scope and not scope["whole_log"]:
        extra += (
            f"<p class='note'>Over the whole log: {report['requests']:,} requests, "
            f"{report['prompt_tokens']:,} prompt tokens (the diagnosis below covers its first "
            f"{scope['requests']:,}).</p>"
        )
    return (
        "<h2>Prefix-cache hits</h2>"
        + _table(["engine", "hit tokens", "token hit rate", "mean per request"], rows)
        + extra
    )


def _losses(report: dict[str, Any]) -> str:
    losses = report["losses"]
    kinds = list(next(iter(losses.values())))
    rows = [
        [kind.replace("_", " ")]
        + [f"{losses[e][kind]['tokens']:,} ({losses[e][kind]['share']:.1%})" for e in losses]
        for kind in kinds
    ]
    hit_rate = report["diagnosis_scope"]["hit_rate"]  # the losses' own requests
    bars = {
        LABELS[e]: [("hit", hit_rate[e])]
        + [(kind.replace("_", " "), losses[e][kind]["share"]) for kind in kinds]
        for e in losses
    }
    definitions = "".join(
        f"<li><b>{escape(k.replace('_', ' '))}</b>: {escape(v)}</li>"
        for k, v in report.get("loss_definitions", {}).items()
    )
    return (
        "<h2>Recomputed prompt tokens by cause</h2>"
        + stacked_bars(bars)
        + _table(["cause", *(LABELS[e] for e in losses)], rows)
        + f"<ul class='note'>{definitions}</ul>"
    )


def _prefixes(report: dict[str, Any]) -> str:
    block = report.get("block_size", 16)
    rows = [
        [
            f"{p['tokens']:,}",
            str(p["remainder"]),
            f"{p['requests']:,}",
            f"{p['tokens'] * p['requests']:,}",
            str(p["padding"]),
            escape(p.get("namespace") or "-"),
            escape(p.get("snippet") or "(redacted)"),
        ]
        for p in report["shared_prefixes"]
    ]
    headers = ["tokens", f"% {block}", "requests", "tokens covered", "pad", "namespace", "snippet"]
    return "<h2>Shared prefixes (templates)</h2>" + _table(headers, rows, (6,))


def _dynamic(report: dict[str, Any]) -> str:
    rows = [
        [
            str(d["position"]),
            escape(d["kind"]),
            f"{d['requests']:,}",
            str(d["value_tokens"]),
            f"{d['static_tokens_after']:,}",
            f"{d['lost_tokens']:,}",
            escape(" | ".join(d["examples"]) if d["examples"] is not None else "(redacted)"),
        ]
        for d in report["dynamic_content"]
    ]
    headers = ["token", "kind", "requests", "value tokens", "static after", "lost", "examples"]
    return "<h2>Dynamic content before shared text</h2>" + _table(headers, rows, (6,))


def _capacity(report: dict[str, Any]) -> str:
    curves = report["capacity_curve"]
    first_hit = min(
        (p["capacity_tokens"] for c in curves.values() for p in c["points"] if p["model_hit_rate"]),
        default=1,
    )
    widest = max((p["capacity_tokens"] for c in curves.values() for p in c["points"]), default=1)
    series = []
    for engine, curve in curves.items():
        points = [
            (p["capacity_tokens"], p["model_hit_rate"])
            for p in curve["points"]
            if p["capacity_tokens"] >= first_hit / 2
        ]
        if points:  # flat beyond the working set, to the widest curve's end
            points.append((widest, points[-1][1]))
        color = ENGINE_COLORS[engine]
        checks = curve["checks"]
        series.append(
            Series(
                f"{LABELS[engine]} LRU",
                points,
                [(p["capacity_tokens"], p["replay_hit_rate"]) for p in checks],
                "replay",
                color=color,
            )
        )
        series.append(
            Series(
                f"{LABELS[engine]} Belady bound",
                [(p["capacity_tokens"], p["belady_hit_rate"]) for p in checks],
                dashed=True,
                color=color,
            )
        )
    configured = report["engines"]["vllm"]["config"].get("capacity_tokens")
    chart = line_chart(series, "KV capacity (tokens, log scale)", "token hit rate", configured)
    rows = [
        [
            LABELS[engine],
            "not checked" if curve["max_abs_error"] is None else f"{curve['max_abs_error']:.2%}",
            f"{curve['working_set_tokens']:,}",
        ]
        + [f"{v:,}" for v in curve["capacity_needed"].values()]
        for engine, curve in curves.items()
    ]
    shares = list(next(iter(curves.values()))["capacity_needed"])
    headers = ["engine", "curve error", "working set", *(f"{s} of max" for s in shares)]
    return (
        "<h2>Hit rate against KV capacity</h2>"
        + chart
        + "<p class='note'>Lines: the one-pass LRU model; circles: full replays; dashed: the "
        "Belady bound; dotted vertical: the configured capacity. "
        + escape(report.get("capacity_curve_model", ""))
        + "</p>"
        + _table(headers, rows)
    )


def _sizes(report: dict[str, Any]) -> str:
    sweep = report["block_size_sweep"]
    sizes = sorted({p["size"] for points in sweep.values() for p in points})
    groups = {
        f"{LABELS[e]} ({'block' if e == 'vllm' else 'page'})": [
            next((p["hit_rate"] for p in points if p["size"] == s), None) for s in sizes
        ]
        for e, points in sweep.items()
    }
    return "<h2>Hit rate against block / page size</h2>" + bar_chart(
        [str(s) for s in sizes], groups, "token hit rate"
    )


def _gain_cells(measured: dict[str, Any]) -> str:
    return "; ".join(
        f"{LABELS[e]} {g['hit_rate_before']:.1%} → {g['hit_rate_after']:.1%} "
        f"({g['recomputed_tokens_saved']:+,} tokens)"
        for e, g in measured.items()
    )


def _recommendations(report: dict[str, Any]) -> str:
    items = "".join(
        f"<li><b>{escape(r['kind'])}</b>: {escape(r['summary'])}</li>"
        for r in report["recommendations"]
    )
    return f"<h2>Recommendations (measured by replay)</h2><ul>{items}</ul>"


def _what_if(report: dict[str, Any]) -> str:
    rows = [[escape(w["name"]), escape(_gain_cells(w["measured"]))] for w in report["what_if"]]
    return "<h2>What if (replayed)</h2>" + _table(["fix", "effect"], rows, (1,))
