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
from cli.inputs import (
    Cache,
    ChatTemplate,
    ChatTemplateKwargs,
    FastTokenizer,
    Files,
    Format,
    HashBlockSize,
    MessagesField,
    PromptField,
    RenderAs,
    SaltField,
    TenantField,
    TimeField,
    TokenizerSpec,
    ingest_options,
)
from cli.progress import RichProgress


def export_trace_command(
    files: Files,
    output: Annotated[Path, typer.Option("--output", "-o", help="The trace file (JSONL).")],
    block_size: Annotated[
        int, typer.Option(min=1, help="Tokens per hash id (Mooncake: 512; vLLM's block: 16).")
    ] = 512,
    log_format: Format = "auto",
    tokenizer: TokenizerSpec = None,
    hash_block_size: HashBlockSize = None,
    prompt_field: PromptField = None,
    messages_field: MessagesField = None,
    time_field: TimeField = None,
    tenant_field: TenantField = None,
    salt_field: SaltField = None,
    chat_template: ChatTemplate = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    render_as: RenderAs = "vllm",
    cache: Cache = True,
    fast_tokenizer: FastTokenizer = True,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad line (exit 2).")] = False,
) -> None:
    """Tokenize logs and write them as a hash-id trace (timestamp ms, input_length,
    output_length, chained hash_ids) for vLLM's timed_trace benchmark, Dynamo or AIPerf."""
    errors = Console(stderr=True)
    try:
        options = ingest_options(
            log_format=log_format,
            tokenizer=tokenizer,
            strict=strict,
            hash_block_size=hash_block_size,
            prompt_field=prompt_field,
            messages_field=messages_field,
            time_field=time_field,
            tenant_field=tenant_field,
            salt_field=salt_field,
            chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs,
            render_as=render_as,
            cache=cache,
            fast_tokenizer=fast_tokenizer,
        )
        with RichProgress(errors, enabled=errors.is_terminal) as progress:
            ingested = ingest(files, options, progress)
            written = export_trace(ingested.tokenized, block_size, output)
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    skipped = len(ingested.loaded.skips) + len(ingested.tokenized.skips)
    errors.print(
        f"prefixcheck: wrote {written:,} requests to {output} ({block_size}-token hash ids); "
        f"{skipped:,} lines skipped",
        highlight=False,
        markup=False,
    )
