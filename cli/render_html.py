"""A self-contained HTML report (``--html``): tables and inline SVG charts from the report's JSON
form, with no script and no external resource, so it opens offline."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from analyzer.diagnose.charts import Series, bar_chart, line_chart, stacked_bars
from analyzer.engines import ENGINE_LABELS
from analyzer.gates import GateResult
from analyzer.report import Report
from analyzer.units import binary_bytes
from analyzer.verdict import Verdict
from cli.outputs import as_json

ENGINE_COLORS = {"vllm": "#1f77b4", "sglang": "#d62728"}
# The hit and each cause of recomputation in a colour of its own (hits green, losses warm or grey).
CAUSE_COLORS = {
    "hit": "#2ca02c",
    "never seen": "#7f7f7f",
    "last token": "#c7c7c7",
    "dynamic content": "#ff7f0e",
    "salts": "#9467bd",
    "alignment": "#8c564b",
    "concurrency": "#e377c2",
    "eviction": "#d62728",
    "routing": "#17becf",
}
STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
td.text { font-family: monospace; max-width: 520px; white-space: pre-wrap;
  overflow-wrap: anywhere; }
.note { color: #666; font-size: 0.85em; } li { margin: 0.4em 0; }
.why { color: #666; font-size: 0.9em; display: block; }
.verdict { border: 2px solid #1f77b4; border-radius: 6px; padding: 0.6em 1em; }
.verdict p { margin: 0.3em 0; } .pass { color: #2ca02c; } .fail { color: #d62728; }
"""


def html_report(report: Report | dict[str, Any], gates: Sequence[GateResult] = ()) -> str:
    """The whole report as one HTML page: everything the terminal shows, verdict first."""
    report = as_json(report)
    prompt = report["prompt_tokens"]
    sections = [
        f"<h1>prefixcheck</h1><p>{report['requests']:,} requests, {prompt:,} prompt tokens, "
        f"{report['output_tokens']:,} output tokens; {report['skipped']['count']:,} lines "
        f"skipped. Inputs: {escape(', '.join(report['inputs']))}. Tokenizer: "
        f"{escape(str(report.get('tokenizer') or 'none (token ids in the log)'))}. Chat "
        f"template: {escape(str(report.get('chat_template') or '-'))}. Replay: "
        f"{escape(str(report.get('replay_mode')))}.</p>",
        _verdict(report, gates),
        _engines(report),
    ]
    scope = _scope_note(report)
    if report["skipped"]["count"]:
        sections.append(_skipped(report))
    if report.get("models"):
        sections.append(_models(report))
    if report.get("server_comparison"):
        sections.append(_server(report))
    if report.get("losses"):
        sections.append(_losses(report) + scope)
    if report.get("recommendations"):
        sections.append(_recommendations(report) + scope)
    if report.get("shared_prefixes"):
        sections.append(_prefixes(report))
    if report.get("dynamic_content"):
        sections.append(_dynamic(report) + scope)
    if report.get("capacity_curve"):
        sections.append(_capacity(report) + scope)
    if report.get("block_size_sweep"):
        sections.append(_sizes(report) + scope)
    if report.get("what_if"):
        sections.append(_what_if(report) + scope)
    if report.get("prefill_estimate"):
        sections.append(_estimate(report))
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
    head = "".join(
        f"<th class='text'>{escape(h)}</th>" if i in text_columns else f"<th>{escape(h)}</th>"
        for i, h in enumerate(headers)
    )
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
    belady = bounds.get("belady") or {}
    rows += [
        [f"Belady bound, {ENGINE_LABELS[e]}", f"{b['hit_tokens']:,}", f"{b['hit_rate']:.1%}", "-"]
        for e, b in belady.items()
    ]
    alignment = report["alignment_loss"]
    extra = (
        "<p class='note'>Token hit rate: hit tokens / prompt tokens. Lost to block alignment "
        f"(SGLang page-1 hits − vLLM hits): {alignment['tokens']:,} tokens "
        f"({alignment['share_of_prompt_tokens']:.1%} of prompt tokens)."
        + (f" Belady bound: {escape(bounds.get('belady_definition', ''))}." if belady else "")
        + "</p>"
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


def _verdict(report: dict[str, Any], gates: Sequence[GateResult]) -> str:
    verdict = Verdict.of(report)
    why = (
        f"<span class='why'>why: {escape(verdict.best_fix_why)}</span>"
        if verdict.best_fix_why
        else ""
    )
    checks = "".join(
        f"<p class='{'pass' if g.passed else 'fail'}'><b>{'PASS' if g.passed else 'FAIL'}</b> "
        f"{escape(g.message)}</p>"
        for g in gates
    )
    return (
        "<div class='verdict'><h2 style='margin-top:0.3em'>Verdict</h2>"
        f"<p><b>hits</b> {escape(verdict.hit_rates)}</p>"
        f"<p><b>cause</b> {escape(verdict.biggest_cause)}</p>"
        f"<p><b>fix</b> {escape(verdict.best_fix)}{why}</p>"
        f"{checks}</div>"
    )


def _skipped(report: dict[str, Any]) -> str:
    skipped = report["skipped"]
    rows = [[escape(reason), f"{count:,}"] for reason, count in skipped["reasons"].items()]
    examples = "".join(f"<li>{escape(e)}</li>" for e in skipped["examples"])
    return (
        f"<h2>Skipped lines ({skipped['count']:,})</h2>"
        + _table(["reason", "lines"], rows)
        + (f"<ul class='note'>{examples}</ul>" if examples else "")
    )


def _models(report: dict[str, Any]) -> str:
    rows = [
        [escape(name), f"{m['requests']:,}", f"{m['prompt_tokens']:,}"]
        + [f"{m['engines'][e]['hit_rate']:.1%}" for e in ("vllm", "sglang")]
        for name, m in report["models"].items()
    ]
    headers = ["model", "requests", "prompt tokens", "vLLM hit rate", "SGLang hit rate"]
    return "<h2>Per model (each on its own caches)</h2>" + _table(headers, rows)


def _server(report: dict[str, Any]) -> str:
    comparison = report["server_comparison"]
    rows = [
        [
            "server (logged)",
            f"{comparison['server_cached_tokens']:,}",
            f"{comparison['server_hit_rate']:.1%}",
            "",
            "",
            "",
        ]
    ]
    prompt = comparison["prompt_tokens"] or 1
    for engine, agreement in comparison["engines"].items():
        rows.append(
            [
                f"{ENGINE_LABELS.get(engine, engine)} replay",
                f"{agreement['hit_tokens']:,}",
                f"{agreement['hit_tokens'] / prompt:.1%}",
                f"{agreement['exact']:.0%}",
                f"{agreement['within_block']:.0%}",
                f"{agreement['mean_abs_difference']:,.1f}",
            ]
        )
    headers = ["", "cached tokens", "hit rate", "same count", "within a block", "mean |diff|"]
    return (
        f"<h2>Replay vs the server's cached tokens ({comparison['requests']:,} requests)</h2>"
        + _table(headers, rows)
    )


def _estimate(report: dict[str, Any]) -> str:
    estimate = report["prefill_estimate"]
    rows = [
        [
            ENGINE_LABELS.get(engine, engine),
            f"{item['prefill_flops_saved'] / 1e15:,.3g} PFLOP",
            f"{item['prefill_flops_saved_share']:.1%}",
            f"{item['gpu_seconds_saved_at_assumed_tflops']:,.1f}",
            binary_bytes(item["hit_kv_bytes"]),
        ]
        for engine, item in estimate["engines"].items()
    ]
    headers = ["engine", "prefill FLOPs saved", "share", "GPU-s saved*", "KV read from cache"]
    capacity = estimate.get("capacity_kv_bytes")
    return (
        f"<h2>Prefill estimate ({escape(estimate['model'])} shape)</h2>"
        + _table(headers, rows)
        + "<p class='note'>"
        f"Whole log without a cache: {estimate['prefill_flops'] / 1e15:,.3g} PFLOP. KV: "
        f"{binary_bytes(estimate['kv_bytes_per_token'])} per token, "
        f"{binary_bytes(estimate['distinct_tokens_kv_bytes'])} for every distinct cached token"
        + (f"; the configured capacity holds {binary_bytes(capacity)}" if capacity else "")
        + f". * at an assumed {estimate['assumed_tflops']:.0f} TFLOP/s; "
        "<code>prefixcheck measure</code> measures it.</p>"
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
        ENGINE_LABELS[e]: [("hit", hit_rate[e])]
        + [(kind.replace("_", " "), losses[e][kind]["share"]) for kind in kinds]
        for e in losses
    }
    definitions = "".join(
        f"<li><b>{escape(k.replace('_', ' '))}</b>: {escape(v)}</li>"
        for k, v in report.get("loss_definitions", {}).items()
    )
    return (
        "<h2>Recomputed prompt tokens by cause</h2>"
        + stacked_bars(bars, CAUSE_COLORS)
        + _table(["cause", *(ENGINE_LABELS[e] for e in losses)], rows)
        + f"<ul class='note'>{definitions}</ul>"
    )


def _prefixes(report: dict[str, Any]) -> str:
    """One row per template (its leading prefix), its variants counted; pad only where the
    replay measured a saving."""
    block = report.get("block_size", 16)
    groups: dict[int, list[dict[str, Any]]] = {}
    for prefix in report["shared_prefixes"]:
        groups.setdefault(prefix.get("template", len(groups)), []).append(prefix)
    rows = []
    for lead, *variants in groups.values():
        saves = lead.get("padding_saves")
        pad = "0" if not lead["padding"] else f"+{lead['padding']}" if (saves or 0) > 0 else "-"
        namespaces = sorted({p.get("namespace") or "-" for p in (lead, *variants)})
        rows.append(
            [
                f"{lead['tokens']:,}",
                str(lead["remainder"]),
                f"{lead['requests']:,}",
                f"{lead['tokens'] * lead['requests']:,}",
                pad,
                str(len(variants)),
                escape(", ".join(namespaces)),
                escape(lead.get("snippet") or "(redacted)"),
            ]
        )
    headers = [
        "tokens",
        f"% {block}",
        "requests",
        "tokens covered",
        "pad",
        "variants",
        "namespace",
        "snippet",
    ]
    return (
        "<h2>Top shared prefixes, by template</h2>"
        + _table(headers, rows, (6, 7))
        + f"<p class='note'>% {block}: tokens past the prefix's last full {block}-token block, "
        "which vLLM recomputes for every request. pad: tokens that would align it, shown where "
        "the replay measured a saving. variants: the template's other prefixes (longer "
        "versions, other namespaces) in the JSON.</p>"
    )


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
    return "<h2>Dynamic content before shared text</h2>" + _table(headers, rows, (1, 6))


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
                f"{ENGINE_LABELS[engine]} LRU",
                points,
                [(p["capacity_tokens"], p["replay_hit_rate"]) for p in checks],
                "replay",
                color=color,
            )
        )
        series.append(
            Series(
                f"{ENGINE_LABELS[engine]} Belady bound",
                [(p["capacity_tokens"], p["belady_hit_rate"]) for p in checks],
                dashed=True,
                color=color,
            )
        )
    configured = report["engines"]["vllm"]["config"].get("capacity_tokens")
    chart = line_chart(series, "KV capacity (tokens, log scale)", "token hit rate", configured)
    rows = [
        [
            ENGINE_LABELS[engine],
            "not checked" if curve["max_abs_error"] is None else f"{curve['max_abs_error']:.2%}",
            f"{curve['working_set_tokens']:,}",
        ]
        + [f"{v:,}" for v in curve["capacity_needed"].values()]
        for engine, curve in curves.items()
    ]
    shares = list(next(iter(curves.values()))["capacity_needed"])
    headers = [
        "engine",
        "curve error",
        "working set (tokens)",
        *(f"{s} of max (tokens)" for s in shares),
    ]
    return (
        "<h2>Token hit rate against KV capacity (tokens)</h2>"
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
        f"{ENGINE_LABELS[e]} ({'block' if e == 'vllm' else 'page'})": [
            next((p["hit_rate"] for p in points if p["size"] == s), None) for s in sizes
        ]
        for e, points in sweep.items()
    }
    return "<h2>Hit rate against block / page size</h2>" + bar_chart(
        [str(s) for s in sizes], groups, "token hit rate"
    )


def _gain_cells(measured: dict[str, Any]) -> str:
    return "; ".join(
        f"{ENGINE_LABELS[e]} {g['hit_rate_before']:.1%} → {g['hit_rate_after']:.1%} "
        f"({g['recomputed_tokens_saved']:+,} tokens)"
        for e, g in measured.items()
    )


def _recommendations(report: dict[str, Any]) -> str:
    items = "".join(
        f"<li><b>{escape(r['kind'])}</b>: {escape(r['summary'])}"
        + (f"<span class='why'>why: {escape(r['why'])}</span>" if r.get("why") else "")
        + "</li>"
        for r in report["recommendations"]
    )
    return f"<h2>Recommendations (measured by replay; largest saving first)</h2><ol>{items}</ol>"


def _what_if(report: dict[str, Any]) -> str:
    rows = [[escape(w["name"]), escape(_gain_cells(w["measured"]))] for w in report["what_if"]]
    return "<h2>What if (replayed)</h2>" + _table(["fix", "effect"], rows, (1,))
