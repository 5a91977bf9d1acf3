"""The terminal view of a fleet replay: the fleet beside one instance, and each replica."""

from __future__ import annotations

from rich import box
from rich.table import Table

from analyzer.fleet_run import FleetSummary


def fleet_table(fleet: FleetSummary) -> Table:
    capacity = fleet.capacity_tokens_per_replica
    per = "unbounded" if capacity is None else f"{capacity:,} tokens each"
    table = Table(
        title=f"Fleet: {fleet.replicas} replicas ({per}) behind {fleet.router} "
        f"({fleet.router_source})",
        box=box.SIMPLE,
        title_justify="left",
    )
    for header in (
        "replica",
        "requests",
        "prompt tokens",
        "peak in flight",
        "vLLM hit",
        "SGLang hit",
    ):
        table.add_column(header, justify="left" if header == "replica" else "right")
    for r in fleet.per_replica:
        table.add_row(
            r.name,
            f"{r.requests:,}",
            f"{r.prompt_tokens:,}",
            f"{r.peak_in_flight:,}",
            f"{r.hit_rate['vllm']:.1%}",
            f"{r.hit_rate['sglang']:.1%}",
        )
    table.add_row(
        "fleet",
        "",
        "",
        "",
        f"{fleet.hit_rate['vllm']:.1%}",
        f"{fleet.hit_rate['sglang']:.1%}",
        style="bold",
    )
    table.add_row(
        "1 instance",
        "",
        "",
        "",
        f"{fleet.single_instance_hit_rate['vllm']:.1%}",
        f"{fleet.single_instance_hit_rate['sglang']:.1%}",
        style="dim",
    )
    for change in fleet.what_if:
        table.add_row(
            f"what if {change['change']}",
            "",
            "",
            "",
            f"{change['hit_rate']['vllm']:.1%}",
            f"{change['hit_rate']['sglang']:.1%}",
            style="italic",
        )
    table.caption = (
        f"Hit rates are shares of each row's prompt tokens; 1 instance: one server holding "
        f"the fleet's total capacity. Imbalance (busiest / mean): "
        f"{fleet.request_imbalance:.2f} requests, {fleet.token_imbalance:.2f} prompt tokens. "
        f"Load model: {fleet.load_model}."
    )
    table.caption_justify = "left"
    return table
