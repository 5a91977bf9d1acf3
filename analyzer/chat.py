"""Chat rendering: messages to the exact prompt string the server builds, the way Hugging Face
``apply_chat_template`` does it (vLLM and SGLang call it), in a sandboxed jinja2 environment."""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from analyzer.errors import BadLine, PrefixcheckError
from analyzer.records import Message
from analyzer.tokenizer import SpecialTokens

# Qwen2.5-Instruct's chat template (ChatML with Qwen's default system prompt and tool rendering):
# the built-in default, matching the default tokenizer.
CHATML_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Templates that call strftime_now() get this date when the request has no timestamp, so the
# same log always renders the same prompts.
FALLBACK_DATE = datetime(2026, 1, 1, tzinfo=UTC)


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
    """Renders chat messages with one template (a string, or named templates as in transformers)."""

    template: str | dict[str, str]
    special: SpecialTokens
    name: str = "chatml (Qwen2.5)"

    @cached_property
    def _compiled(self) -> dict[str, jinja2.Template]:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        sources = self.template if isinstance(self.template, dict) else {"default": self.template}
        try:
            return {name: env.from_string(source) for name, source in sources.items()}
        except jinja2.TemplateError as exc:
            raise PrefixcheckError(f"chat template {self.name!r} does not compile: {exc}") from None

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        arrival_s: float | None = None,
    ) -> str:
        """The prompt text for one request, with the generation prompt appended."""
        templates = self._compiled
        template = templates.get("tool_use") if tools and "tool_use" in templates else None
        template = template or templates.get("default") or next(iter(templates.values()))
        when = (
            FALLBACK_DATE if arrival_s is None else datetime.fromtimestamp(arrival_s, UTC)
        )
        try:
            return template.render(
                messages=_normalize(messages),
                tools=tools,
                add_generation_prompt=True,
                bos_token=self.special.bos_token or "",
                eos_token=self.special.eos_token or "",
                strftime_now=when.strftime,
            )
        except BadLine:
            raise
        except Exception as exc:
            raise BadLine(f"chat template failed: {type(exc).__name__}: {exc}") from None


def _normalize(messages: list[Message]) -> list[Message]:
    """Message content as vLLM hands it to a string template: text parts joined by newlines, and
    tool-call arguments parsed from their JSON strings."""
    normalized = []
    for position, message in enumerate(messages):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = "\n".join(_text_parts(content, position))
        if message.get("tool_calls"):
            message["tool_calls"] = [_parse_arguments(call) for call in message["tool_calls"]]
        normalized.append(message)
    return normalized


def _text_parts(parts: list[Any], position: int) -> list[str]:
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif (
            isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        ):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise BadLine(f"messages[{position}] has a {kind!r} content part (only text is read)")
    return texts


def _parse_arguments(call: Any) -> Any:
    call = copy.deepcopy(call)
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        with contextlib.suppress(ValueError):  # vLLM keeps unparseable arguments as they are
            function["arguments"] = json.loads(function["arguments"])
    return call


def chat_renderer(template: str | dict[str, str] | None, special: SpecialTokens) -> ChatRenderer:
    """The tokenizer's own template when it has one, else the built-in ChatML (Qwen2.5) one."""
    if template is None:
        return ChatRenderer(CHATML_TEMPLATE, special)
    return ChatRenderer(template, special, name="tokenizer_config.json chat_template")
