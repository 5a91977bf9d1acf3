"""The flags that say how to read and tokenize logs, shared by ``analyze``, ``measure`` and
``export-trace``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from analyzer.chat_server import RENDERINGS
from analyzer.errors import PrefixcheckError
from analyzer.ingest import IngestOptions
from analyzer.loaders import format_names
from analyzer.loaders.jsonl import bounded_json
from analyzer.loaders.mapped import FieldMap
from analyzer.templates import BUILTIN_TEMPLATES
from analyzer.token_cache import default_cache_dir

Files = Annotated[
    list[Path],
    typer.Argument(
        help="Log files, folders or globs (.jsonl, .json, .log, .parquet; .gz/.zst); - for stdin.",
        show_default=False,
    ),
]
Format = Annotated[str, typer.Option("--format", help=f"{', '.join(format_names())}.")]
TokenizerSpec = Annotated[
    str | None,
    typer.Option(
        help="tokenizer.json, a model folder, tiktoken:NAME (local cache), or a hub name "
        "(default: qwen2.5)."
    ),
]
HashBlockSize = Annotated[
    int | None,
    typer.Option(min=1, help="Tokens per hash id in hash-id traces (Mooncake 512, Bailian 16)."),
]
PromptField = Annotated[str | None, typer.Option(help="Dotted path of the prompt text.")]
MessagesField = Annotated[str | None, typer.Option(help="Dotted path of the chat messages.")]
TimeField = Annotated[
    str | None, typer.Option(help="Dotted path of the arrival time (epoch s/ms or ISO 8601).")
]
TenantField = Annotated[str | None, typer.Option(help="Dotted path of the tenant / user.")]
SaltField = Annotated[str | None, typer.Option(help="Dotted path of the cache salt.")]
ChatTemplate = Annotated[
    str | None,
    typer.Option(
        help=f"Built-in template ({', '.join(BUILTIN_TEMPLATES)}), one of the tokenizer's named "
        "templates, or a .jinja file (default: the tokenizer's own)."
    ),
]
ChatTemplateKwargs = Annotated[
    str | None,
    typer.Option(help="JSON object passed to the template, e.g. '{\"enable_thinking\": false}'."),
]
RenderAs = Annotated[
    str,
    typer.Option(
        help="Prepare chat requests as this server does before the template: vllm (its OpenAI "
        "server) or sglang."
    ),
]
Cache = Annotated[
    bool, typer.Option(help=f"Keep token ids in the token cache ({default_cache_dir()}).")
]
FastTokenizer = Annotated[
    bool, typer.Option(help="Run byte-level BPE tokenizer.json files through tiktoken.")
]


def field_map(
    prompt: str | None,
    messages: str | None,
    time: str | None,
    tenant: str | None,
    salt: str | None,
) -> FieldMap | None:
    fields = FieldMap(prompt=prompt, messages=messages, time=time, tenant=tenant, salt=salt)
    return None if fields.is_empty() else fields


def template_kwargs(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = bounded_json(text)
    except ValueError as exc:
        raise PrefixcheckError(f"--chat-template-kwargs is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise PrefixcheckError("--chat-template-kwargs must be a JSON object")
    return value


def cache_dir(enabled: bool) -> Path | None:
    return default_cache_dir() if enabled else None


def ingest_options(
    *,
    log_format: str,
    tokenizer: str | None,
    strict: bool,
    hash_block_size: int | None,
    prompt_field: str | None,
    messages_field: str | None,
    time_field: str | None,
    tenant_field: str | None,
    salt_field: str | None,
    chat_template: str | None,
    chat_template_kwargs: str | None,
    render_as: str = "vllm",
    cache: bool,
    fast_tokenizer: bool,
) -> IngestOptions:
    """The reading flags of a command as IngestOptions; a bad --chat-template-kwargs or
    --render-as raises."""
    if render_as not in RENDERINGS:
        raise PrefixcheckError(
            f"--render-as {render_as!r}: expected one of {', '.join(RENDERINGS)}"
        )
    return IngestOptions(
        format=log_format,
        tokenizer=tokenizer,
        strict=strict,
        hash_block_size=hash_block_size,
        fields=field_map(prompt_field, messages_field, time_field, tenant_field, salt_field),
        chat_template=chat_template,
        chat_template_kwargs=template_kwargs(chat_template_kwargs),
        rendering=render_as,
        cache_dir=cache_dir(cache),
        fast_tokenizer=fast_tokenizer,
    )
