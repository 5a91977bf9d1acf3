"""``prefixcheck export-trace``: the tokenized workload as a Mooncake-style hash-id trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.errors import PrefixcheckError
from analyzer.export_trace import export_trace
from analyzer.ingest import ingest
from cli.common import fail
from cli.flags import ReadFlags, flag_groups, writable
from cli.inputs import Files
from cli.progress import RichProgress


@flag_groups
def export_trace_command(
    files: Files,
    output: Annotated[Path, typer.Option("--output", "-o", help="The trace file (JSONL).")],
    read: ReadFlags,
    hash_id_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Tokens per hash id written (Mooncake: 512; vLLM's block: 16). Not --block-size: "
            "that is vLLM's block for analyze and measure.",
        ),
    ] = 512,
    block_size: Annotated[int | None, typer.Option(hidden=True)] = None,  # the old name
) -> None:
    """Tokenize logs and write them as a hash-id trace (timestamp ms, input_length,
    output_length, chained hash_ids; output_hash_ids over known answers) for vLLM's timed_trace
    benchmark, Dynamo or AIPerf."""
    errors = Console(stderr=True)
    if block_size is not None:
        fail(errors, "export-trace --block-size is now --hash-id-tokens (tokens per hash id)")
    try:
        writable(output, "--output")
        with RichProgress(errors, enabled=errors.is_terminal) as progress:
            ingested = ingest(files, read.ingest, progress)
            written = export_trace(ingested.tokenized, hash_id_tokens, output)
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    skipped = len(ingested.loaded.skips) + len(ingested.tokenized.skips)
    errors.print(
        f"prefixcheck: wrote {written:,} requests to {output} ({hash_id_tokens}-token hash ids); "
        f"{skipped:,} lines skipped",
        highlight=False,
        markup=False,
    )
