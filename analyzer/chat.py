"""Chat rendering: messages to the exact prompt string the server builds, the way Hugging Face
``apply_chat_template`` does it (vLLM and SGLang call it), in a sandboxed jinja2 environment.

Message content reaches the template as vLLM hands it over, in the template's content format
(detected as vLLM detects it: does the template loop over ``message['content']``?): "string"
templates get the text parts joined by newlines, with each image's placeholder text on its own
line before them; "openai" templates get a list of ``{"type": "text", "text": ...}`` and
``{"type": "image"}`` parts.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes

from analyzer.errors import BadLine, PrefixcheckError
from analyzer.records import Message
from analyzer.sandbox import BoundedSandbox, render_bounded
from analyzer.templates import BUILTIN_TEMPLATES, builtin_template
from analyzer.tokenizer import SpecialTokens

# Qwen2.5-Instruct's chat template: the built-in default, matching the default tokenizer.
CHATML_TEMPLATE = BUILTIN_TEMPLATES["qwen2.5"].source
# Templates that call strftime_now() get this date when the request has no timestamp, so the
# same log always renders the same prompts.
FALLBACK_DATE = datetime(2026, 1, 1, tzinfo=UTC)
IMAGE_PARTS = frozenset({"image_url", "image", "input_image", "image_pil", "image_embeds"})
# Variables the renderer sets itself; chat_template_kwargs cannot replace them (as in vLLM).
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


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


@dataclass
class ChatRenderer:
    """Renders chat messages with one template (a string, or named templates as in transformers).

    ``image_placeholder`` is the text a "string" template gets for each image (the model
    family's, e.g. Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``); None when the
    model takes no images. ``default_kwargs`` are ``--chat-template-kwargs``, under each
    request's own ``chat_template_kwargs``.
    """

    template: str | dict[str, str]
    special: SpecialTokens
    name: str = "chatml (Qwen2.5)"
    image_placeholder: str | None = None
    default_kwargs: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def fingerprint(self) -> str:
        """A hash of what decides the rendered text besides the request: the template(s),
        the default kwargs, the special tokens and the image placeholder."""
        parts = [self.template, self.default_kwargs, asdict(self.special), self.image_placeholder]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()

    @cached_property
    def _compiled(self) -> dict[str, tuple[jinja2.Template, str]]:
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
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
                name: (env.from_string(source), content_format(env.parse(source)))
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

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        arrival_s: float | None = None,
        *,
        kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for one request (with the generation prompt appended by default)."""
        templates = self._compiled
        chosen = templates.get("tool_use") if tools and "tool_use" in templates else None
        template, form = chosen or templates.get("default") or next(iter(templates.values()))
        when = FALLBACK_DATE if arrival_s is None else datetime.fromtimestamp(arrival_s, UTC)
        extra = {**self.default_kwargs, **(kwargs or {})}
        try:
            variables = {k: v for k, v in extra.items() if k not in RESERVED}
            return render_bounded(
                template,
                variables
                | {
                    "messages": _normalize(messages, form, self.image_placeholder, self.name),
                    "tools": tools,
                    "add_generation_prompt": add_generation_prompt,
                    "bos_token": self.special.bos_token or "",
                    "eos_token": self.special.eos_token or "",
                    "strftime_now": when.strftime,
                },
            )
        except BadLine:
            raise
        except Exception as exc:
            raise BadLine(
                f"chat template failed: {type(exc).__name__}: {exc} (template: {self.name})"
            ) from None


def content_format(tree: nodes.Template) -> str:
    """vLLM's detection: "openai" when the template loops over a message's content (directly or
    through a variable set from it), else "string"."""
    content_vars = {
        target.name
        for assign in tree.find_all(nodes.Assign)
        if _is_content(assign.node)
        for target in [assign.target]
        if isinstance(target, nodes.Name)
    }
    for loop in tree.find_all(nodes.For):
        if _is_content(loop.iter) or (
            isinstance(loop.iter, nodes.Name) and loop.iter.name in content_vars
        ):
            return "openai"
    return "string"


def _is_content(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    return isinstance(node, nodes.Getattr) and node.attr == "content"


def _normalize(
    messages: list[Message], form: str, placeholder: str | None, template_name: str
) -> list[Message]:
    """Message content as vLLM hands it to the template, and tool-call arguments parsed from
    their JSON strings."""
    normalized = []
    for position, message in enumerate(messages):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, str) and form == "openai":
            message["content"] = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            texts, images = _parts(content, position)
            if form == "openai":
                message["content"] = [
                    {"type": "image"} if text is None else {"type": "text", "text": text}
                    for text in texts
                ]
            else:
                if images and placeholder is None:
                    raise BadLine(
                        f"messages[{position}] has an image content part, and the chat template "
                        f"{template_name!r} defines no image placeholder (a text-only model)"
                    )
                words = [text for text in texts if text is not None]
                message["content"] = "\n".join([placeholder or ""] * images + words)
        if message.get("tool_calls"):
            message["tool_calls"] = [_parse_arguments(call) for call in message["tool_calls"]]
        normalized.append(message)
    return normalized


def _parts(parts: list[Any], position: int) -> tuple[list[str | None], int]:
    """The content parts in order (None for an image) and the number of images."""
    items: list[str | None] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if isinstance(part, str):
            items.append(part)
        elif kind in ("text", "input_text") and isinstance(part.get("text"), str):
            items.append(part["text"])
        elif kind in IMAGE_PARTS:
            items.append(None)
        else:
            raise BadLine(f"messages[{position}] has a {kind!r} content part (not read)")
    return items, items.count(None)


def _parse_arguments(call: Any) -> Any:
    call = copy.deepcopy(call)
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        with contextlib.suppress(ValueError):  # vLLM keeps unparseable arguments as they are
            function["arguments"] = json.loads(function["arguments"])
    return call


def chat_renderer(
    template: str | dict[str, str] | None,
    special: SpecialTokens,
    *,
    choice: str | None = None,
    default_kwargs: dict[str, Any] | None = None,
) -> ChatRenderer:
    """The renderer for ``--chat-template`` (see ``_chosen_renderer``), its template compiled:
    one that does not compile, or is not a string, is an error before any request."""
    return _chosen_renderer(template, special, choice=choice, default_kwargs=default_kwargs).check()


def _chosen_renderer(
    template: str | dict[str, str] | None,
    special: SpecialTokens,
    *,
    choice: str | None = None,
    default_kwargs: dict[str, Any] | None = None,
) -> ChatRenderer:
    """The renderer for ``--chat-template``: one of the tokenizer's named templates, a built-in
    family template, or a template file; by default the tokenizer's own template, else Qwen2.5's.
    """
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
