"""Chat rendering: messages to the exact prompt string the server builds, the way Hugging Face
``apply_chat_template`` does it (vLLM and SGLang call it), in a sandboxed jinja2 environment like
transformers' ``_compile_jinja_template``.

The messages and tools reach the template as the server prepares them (analyzer/chat_server.py:
vLLM 0.33's OpenAI server by default, SGLang 0.5.23's with ``rendering="sglang"``), in the
template's content format, detected as that server detects it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import msgspec
from jinja2 import nodes
from jinja2.ext import Extension

from analyzer.chat_server import (
    RENDERINGS,
    alias_reasoning,
    server_messages,
    server_tools,
    sglang_content_format,
    vllm_content_format,
)
from analyzer.errors import BadLine, PrefixcheckError
from analyzer.records import Message
from analyzer.sandbox import BoundedSandbox, render_bounded
from analyzer.templates import BUILTIN_TEMPLATES, builtin_template
from analyzer.tokenizer import SpecialTokens

# Qwen2.5-Instruct's chat template: the built-in default, matching the default tokenizer.
CHATML_TEMPLATE = BUILTIN_TEMPLATES["qwen2.5"].source
_BUILTIN_SOURCES = frozenset(builtin.source for builtin in BUILTIN_TEMPLATES.values())
# Templates that call strftime_now() get this date when the request has no timestamp, so the
# same log always renders the same prompts.
FALLBACK_DATE = datetime(2026, 1, 1, tzinfo=UTC)
# Variables the renderer sets itself; chat_template_kwargs cannot replace them (as in vLLM).
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "documents"})


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: no HTML escaping, keys kept in order (jinja's own differs)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class _Generation(Extension):
    """transformers' ``{% generation %}`` tag (its AssistantTracker): renders its body."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@dataclass
class ChatRenderer:
    """Renders chat messages with one template (a string, or named templates as in transformers).

    ``image_placeholder`` is the text a "string" template gets for each image (the model
    family's, e.g. Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``); None when the
    model takes no images. ``default_kwargs`` are ``--chat-template-kwargs``, under each
    request's own ``chat_template_kwargs``. ``rendering`` is the server whose preparation of
    messages and tools is reproduced: "vllm" or "sglang".
    """

    template: str | dict[str, str]
    special: SpecialTokens
    name: str = "chatml (Qwen2.5)"
    image_placeholder: str | None = None
    default_kwargs: dict[str, Any] = field(default_factory=dict)
    rendering: str = "vllm"

    def __post_init__(self) -> None:
        if self.rendering not in RENDERINGS:
            raise PrefixcheckError(
                f"unknown rendering {self.rendering!r} (expected one of {', '.join(RENDERINGS)})"
            )

    @cached_property
    def fingerprint(self) -> str:
        """A hash of what decides the rendered text besides the request: the template(s),
        the default kwargs, the special tokens, the image placeholder and the rendering."""
        parts = [
            self.template,
            self.default_kwargs,
            asdict(self.special),
            self.image_placeholder,
            self.rendering,
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()

    @cached_property
    def _reads_time(self) -> bool:
        """Whether a template can read the request's time (``strftime_now``)."""
        sources = self.template.values() if isinstance(self.template, dict) else [self.template]
        return any("strftime_now" in str(source) for source in sources)

    def request_key(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        arrival_s: float | None,
        kwargs: dict[str, Any] | None,
        add_generation_prompt: bool,
        add_special_tokens: bool,
    ) -> bytes | None:
        """A 16-byte key of everything a chat request's prompt ids depend on besides the
        renderer (``fingerprint``) and the tokenizer: the messages, tools and kwargs in
        MessagePack (exact for floats, ints and booleans, keys in their order), the two flags,
        and the time only for a template that reads it. None when they do not encode."""
        when = arrival_s if self._reads_time else None
        flags = (add_generation_prompt, add_special_tokens)
        try:
            payload = _PACK([messages, tools, kwargs, flags, when])
        except (TypeError, ValueError, OverflowError):
            return None
        return hashlib.blake2b(payload, digest_size=16, person=b"pc-chat-request").digest()

    @cached_property
    def _compiled(self) -> dict[str, tuple[jinja2.Template, str, bool]]:
        """Each template, its content format and whether it names the developer role."""
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation])
        env.add_filter("tojson", _tojson)
        env.globals["raise_exception"] = _raise_exception
        sources = self.template if isinstance(self.template, dict) else {"default": self.template}
        if not isinstance(sources, dict) or not all(
            isinstance(name, str) and isinstance(source, str) for name, source in sources.items()
        ):
            raise PrefixcheckError(
                f"chat template {self.name!r} is not a string (nor named strings), but "
                f"{type(self.template).__name__}"
            )
        try:
            return {
                name: (
                    env.from_string(source),
                    self._content_format(source, env.parse(source)),
                    '"developer"' in source or "'developer'" in source,
                )
                for name, source in sources.items()
            }
        except jinja2.TemplateError as exc:
            raise PrefixcheckError(f"chat template {self.name!r} does not compile: {exc}") from None
        except (RecursionError, MemoryError, ValueError, TypeError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            message = f"chat template {self.name!r} does not compile: {reason}"
            raise PrefixcheckError(message) from None

    def check(self) -> ChatRenderer:
        """The renderer, its template compiled (a template that does not compile is an error of
        the run, found before any request)."""
        self._compiled  # noqa: B018
        return self

    def _content_format(self, source: str, tree: nodes.Template) -> str:
        if self.rendering == "sglang":
            return sglang_content_format(source, tree)
        return vllm_content_format(tree)

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        arrival_s: float | None = None,
        *,
        kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for one request (with the generation prompt appended by default).

        Named templates are chosen as transformers' ``get_chat_template`` chooses: "tool_use"
        when the request has tools, else "default"."""
        templates = self._compiled
        chosen = templates.get("tool_use") if tools is not None else None
        template, form, names_developer = (
            chosen or templates.get("default") or next(iter(templates.values()))
        )
        when = FALLBACK_DATE if arrival_s is None else datetime.fromtimestamp(arrival_s, UTC)
        extra = {**self.default_kwargs, **(kwargs or {})}
        prepared = server_messages(
            messages,
            form,
            self.image_placeholder,
            self.name,
            rendering=self.rendering,
            names_developer=names_developer,
        )
        try:
            return render_bounded(
                template,
                {
                    **self.special.template_tokens(),
                    **{k: v for k, v in extra.items() if k not in RESERVED},
                    "messages": [alias_reasoning(m) for m in prepared],
                    "tools": server_tools(tools, self.rendering),
                    "documents": None,
                    "add_generation_prompt": add_generation_prompt,
                    "strftime_now": when.strftime,
                },
            )
        except BadLine:
            raise
        except Exception as exc:
            raise BadLine(
                f"chat template failed: {type(exc).__name__}: {exc} (template: {self.name})"
            ) from None

    @property
    def description(self) -> str:
        """The template's name and the server whose request preparation is reproduced."""
        server = {"vllm": "vLLM 0.33", "sglang": "SGLang 0.5.23"}[self.rendering]
        return f"{self.name}; requests prepared as {server}'s OpenAI server does"

    def with_rendering(self, rendering: str) -> ChatRenderer:
        """The same templates, prepared as another server prepares requests."""
        return replace(self, rendering=rendering)


_PACK = msgspec.msgpack.Encoder().encode


def content_format(tree: nodes.Template) -> str:
    """vLLM's detection of a template's content format, "string" or "openai"."""
    return vllm_content_format(tree)


def chat_renderer(
    template: str | dict[str, str] | None,
    special: SpecialTokens,
    *,
    choice: str | None = None,
    default_kwargs: dict[str, Any] | None = None,
    rendering: str = "vllm",
) -> ChatRenderer:
    """The renderer for ``--chat-template``: one of the tokenizer's named templates, a built-in
    family template, or a template file; by default the tokenizer's own template, else Qwen2.5's.
    ``rendering`` is the server whose request preparation is reproduced ("vllm", "sglang").
    Its template is compiled here: one that does not compile, or is not a string, is an error
    before any request. A built-in template (they all compile: tests/test_chat_templates.py) is
    compiled at its first request instead, so a log without chats never compiles it.
    """
    renderer = _chosen_renderer(template, special, choice, default_kwargs).with_rendering(rendering)
    if isinstance(renderer.template, str) and renderer.template in _BUILTIN_SOURCES:
        return renderer
    return renderer.check()


def _chosen_renderer(
    template: str | dict[str, str] | None,
    special: SpecialTokens,
    choice: str | None,
    default_kwargs: dict[str, Any] | None,
) -> ChatRenderer:
    kwargs = default_kwargs or {}
    placeholder = special.image_placeholder
    if choice is None:
        if template is None:
            return ChatRenderer(CHATML_TEMPLATE, special, default_kwargs=kwargs)
        return ChatRenderer(
            template,
            special,
            name="tokenizer_config.json chat_template",
            image_placeholder=placeholder,
            default_kwargs=kwargs,
        )
    if isinstance(template, dict) and choice in template:
        return ChatRenderer(
            template[choice],
            special,
            name=f"tokenizer_config.json chat_template {choice!r}",
            image_placeholder=placeholder,
            default_kwargs=kwargs,
        )
    builtin = builtin_template(choice)
    if builtin is not None:
        tokens = SpecialTokens(bos_token=builtin.bos_token, eos_token=builtin.eos_token)
        name = f"{builtin.name} ({builtin.model}, built-in)"
        return ChatRenderer(builtin.source, tokens, name=name, default_kwargs=kwargs)
    path = Path(choice)
    if path.is_file():
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PrefixcheckError(f"{path}: cannot read the chat template ({exc})") from None
        return ChatRenderer(
            source, special, name=str(path), image_placeholder=placeholder, default_kwargs=kwargs
        )
    named = (
        f", nor one of the tokenizer's ({', '.join(template)})"
        if isinstance(template, dict)
        else ""
    )
    raise PrefixcheckError(
        f"unknown --chat-template {choice!r}: not a built-in ({', '.join(BUILTIN_TEMPLATES)}) "
        f"and not a template file{named}"
    )
