"""The terminal view of the prefill estimate and of a measurement."""

from __future__ import annotations

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from analyzer.engines import ENGINE_LABELS
from analyzer.measure.estimate import PrefillEstimate
from analyzer.measure.result import Measurement


def estimate_table(estimate: PrefillEstimate) -> Table:
    table = Table(
        title=f"Prefill estimate ({estimate.model} shape, {estimate.params / 1e9:.1f}B params)",
        box=box.SIMPLE,
        title_justify="left",
    )
    for header in ("engine", "prefill FLOPs saved", "share", "GPU-s saved*", "KV read from cache"):
        table.add_column(header, justify="left" if header == "engine" else "right")
    for engine, item in estimate.engines.items():
        table.add_row(
            ENGINE_LABELS.get(engine, engine),
            _si(item.prefill_flops_saved, "FLOP"),
            f"{item.prefill_flops_saved_share:.1%}",
            f"{item.gpu_seconds_saved_at_assumed_tflops:,.1f}",
            _bytes(item.hit_kv_bytes),
        )
    capacity = (
        f"; --capacity-tokens holds {_bytes(estimate.capacity_kv_bytes)}"
        if estimate.capacity_kv_bytes is not None
        else ""
    )
    table.caption = (
        f"Whole log without a cache: {_si(estimate.prefill_flops, 'FLOP')} "
        f"({_si(estimate.linear_flops_per_token, 'FLOP')} per token + attention). "
        f"KV: {_bytes(estimate.kv_bytes_per_token)} per token, "
        f"{_bytes(estimate.distinct_tokens_kv_bytes)} for every distinct cached token{capacity}.\n"
        f"* at an assumed {estimate.assumed_tflops:.0f} TFLOP/s; `prefixcheck measure` measures it."
    )
    table.caption_justify = "left"
    return table


def render_measurement(measurement: Measurement, console: Console) -> None:
    """Header, the per-request table, the fit, the extrapolation, then skips."""
    console.print(_header(measurement))
    console.print(_requests(measurement))
    console.print(_extrapolation(measurement))
    for skip in measurement.skipped:
        console.print(Text(f"skipped {skip.file}:{skip.line}: {skip.reason}", style="yellow"))


def _header(m: Measurement) -> Text:
    model = m.model
    layers = f"{model['n_layers']} layers"
    if model.get("full_layers"):
        layers = f"{model['n_layers']} of {model['full_layers']} layers"
    return Text(
        f"Measured prefill: {model['name']} ({layers}, weights {m.weights}) on {m.device}, "
        f"{m.dtype}; median of {m.repeats} after {m.warmup} warm-up; "
        f"{len(m.measurements)} of {m.sampled} sampled requests measured"
    )


QUARTILES = 4


def _requests(m: Measurement) -> Table:
    """The sampled requests in prompt-length quartiles, medians per row (every request is in the
    JSON's ``measurements``); two-line headers so that it fits an 80-column terminal."""
    rows = sorted(m.measurements, key=lambda row: row.prompt_tokens)
    groups = [list(part) for part in np.array_split(np.arange(len(rows)), QUARTILES) if len(part)]
    table = Table(
        box=box.SIMPLE,
        title=f"Sampled requests by prompt length (medians, ms; {len(rows)} requests)",
        title_justify="left",
    )
    table.add_column("prompt\ntokens", justify="right", no_wrap=True)
    table.add_column("re-\nquests", justify="right", no_wrap=True)
    table.add_column("full", justify="right", no_wrap=True)
    engines = list(m.measurements[0].engines)
    for engine in engines:
        label = ENGINE_LABELS.get(engine, engine)
        table.add_column(f"{label}\nhit", justify="right", no_wrap=True)
        table.add_column(f"{label}\ncached", justify="right", no_wrap=True)
    table.add_column("max\n|Δlogit|", justify="right", no_wrap=True)
    for group in groups:
        chosen = [rows[i] for i in group]
        lengths = [row.prompt_tokens for row in chosen]
        cells = [
            f"{min(lengths):,}–{max(lengths):,}"
            if min(lengths) != max(lengths)
            else f"{lengths[0]:,}",
            str(len(chosen)),
            f"{np.median([row.full_ms for row in chosen]):.2f}",
        ]
        for engine in engines:
            items = [row.engines[engine] for row in chosen]
            cells += [
                f"{np.median([item.hit_tokens for item in items]):,.0f}",
                f"{np.median([item.cached_ms for item in items]):.2f}",
            ]
        worst = max(
            (item for row in chosen for item in row.engines.values()),
            key=lambda item: item.logits_max_abs_diff,
        )
        style = None if worst.logits_match else "bold red"
        cells.append(Text(f"{worst.logits_max_abs_diff:.1e}", style=style))
        table.add_row(*cells)
    fit = m.fit
    table.caption = (
        f"Fit over {fit.points} prefills: ms = {fit.intercept_ms:.3g} + {fit.per_token_ms:.3g}·new "
        f"+ {fit.per_token_context_ms:.3g}·new·context (R² {fit.r_squared:.3f}); "
        f"logits tolerance {m.logits_rtol:g} × max(1, max |logit|)"
    )
    table.caption_justify = "left"
    return table


def _extrapolation(m: Measurement) -> Group:
    x = m.extrapolated
    table = Table(
        box=box.SIMPLE_HEAVY,
        title=f"Extrapolated to the whole log ({x.requests:,} requests, prefill alone, batch 1)",
        title_justify="left",
    )
    for header in ("", "prefill s", "saved s", "saved share", "TTFT p50", "p90", "p99 (ms)"):
        table.add_column(header, justify="left" if not header else "right")
    none = x.ttft_ms_without_cache
    table.add_row(
        "no cache", f"{x.prefill_seconds_without_cache:,.2f}", "", "", *_ttft(none), style="dim"
    )
    for engine, item in x.engines.items():
        table.add_row(
            ENGINE_LABELS.get(engine, engine),
            f"{item.prefill_seconds:,.2f}",
            f"{item.prefill_seconds_saved:,.2f}",
            f"{item.prefill_time_saved_share:.1%}",
            *_ttft(item.ttft_ms),
        )
    calibration = m.calibration
    notes = [
        Text(
            f"The FLOPs estimate at the measured {calibration['effective_tflops']:.3g} TFLOP/s "
            "saves "
            + ", ".join(
                f"{ENGINE_LABELS.get(e, e)} {s:,.2f} s"
                for e, s in calibration["estimated_seconds_saved_at_effective_tflops"].items()
            )
            + ".",
            style="dim",
        )
    ]
    full = m.model.get("full_layers")
    if full:
        notes.append(
            Text(
                f"Measured {m.model['n_layers']} of {full} layers: times grow about "
                f"×{full / m.model['n_layers']:.3g} for the whole model.",
                style="dim",
            )
        )
    return Group(table, *notes)


def _ttft(percentiles: dict[str, float]) -> list[str]:
    return [f"{percentiles[p]:,.2f}" for p in ("p50", "p90", "p99")]


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(value) >= factor:
            return f"{value / factor:,.3g} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def _bytes(value: int) -> str:
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= factor:
            return f"{value / factor:,.3g} {unit}"
    return f"{value} B"
