"""Terminal tables for logs with several models and for logs that carry the server's own
cached-token counts."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from analyzer.engines import ENGINE_LABELS
from analyzer.report import ModelSummary
from analyzer.server_compare import ServerComparison


def models_table(models: dict[str, ModelSummary]) -> Table:
    """Each model on its own caches; the run's figures above are their sums."""
    table = Table(title="Per model (each on its own caches)", box=box.SIMPLE, title_justify="left")
    table.add_column("model", overflow="fold")  # names are the point: folded, never cut
    for header in ("requests", "prompt\ntokens", "vLLM\nhit rate", "SGLang\nhit rate"):
        table.add_column(header, justify="right", no_wrap=True)
    for name, summary in models.items():
        table.add_row(
            name,
            f"{summary.requests:,}",
            f"{summary.prompt_tokens:,}",
            f"{summary.hit_rate['vllm']:.1%}",
            f"{summary.hit_rate['sglang']:.1%}",
        )
    return table


def server_table(comparison: ServerComparison) -> Table:
    """Our replay next to the server's reported cached tokens, on the requests that have them."""
    table = Table(
        title=f"Replay vs the server's cached tokens ({comparison.requests:,} requests)",
        box=box.SIMPLE,
        title_justify="left",
    )
    table.add_column("")
    for header in ("cached\ntokens", "hit rate", "same\ncount", "within\na block", "mean\n|diff|"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_row(
        "server (logged)",
        f"{comparison.server_cached_tokens:,}",
        f"{comparison.server_hit_rate:.1%}",
        "",
        "",
        "",
    )
    for engine, agreement in comparison.engines.items():
        share = agreement.hit_tokens / comparison.prompt_tokens if comparison.prompt_tokens else 0.0
        table.add_row(
            f"{ENGINE_LABELS.get(engine, engine)} replay",
            f"{agreement.hit_tokens:,}",
            f"{share:.1%}",
            f"{agreement.exact:.0%}",
            f"{agreement.within_block:.0%}",
            f"{agreement.mean_abs_difference:,.1f}",
        )
    counts = comparison.prompt_counts
    if counts is not None:
        table.caption = Text(
            f"Prompt tokens where the server logged its count ({counts.requests:,} requests): "
            f"server {counts.server_prompt_tokens:,}, ours {counts.our_prompt_tokens:,}, "
            f"equal on {counts.equal:.0%} of requests"
            + ("" if counts.equal == 1.0 else " (tokenized otherwise: see the note below)"),
            style="" if counts.equal == 1.0 else "yellow",
        )
        table.caption_justify = "left"
    return table
