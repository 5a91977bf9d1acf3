"""What a serving engine's OpenAI server hands ``apply_chat_template``: the messages and tools of a
chat-completions request, prepared as vLLM 0.33.0 or SGLang 0.5.23 prepares them.

vLLM (the default rendering), from its own code:

- ``ChatCompletionRequest._normalize_messages_before``
  (vllm/entrypoints/openai/chat_completion/protocol.py): ``reasoning_content`` renamed to
  ``reasoning``;
- ``parse_chat_message_content`` / ``parse_chat_message_content_parts`` /
  ``parse_chat_message_content_part`` (vllm/renderers/chat_utils/chat_message.py): content
  ``None`` is no parts, a string is one text part; "string" templates get the text parts joined
  by newlines (empty texts dropped, image placeholders first), "openai" templates a list of
  ``{"type": "text", "text": ...}`` / ``{"type": "image"}`` parts (a part's unknown keys kept);
  only role, content, ``tool_calls`` (assistant), ``reasoning`` and ``reasoning_content``
  (assistant), ``tool_call_id`` (tool), ``name`` and ``task`` reach the template; a tool result
  made of text parts is one string joined by newlines; Claude Code's billing-header line is
  dropped from system text (``_strip_claude_code_billing_header``);
- ``_postprocess_messages``: an empty ``tool_calls`` list is dropped; ``arguments`` is parsed
  from JSON, and empty, invalid or non-object arguments become ``{}``;
- ``ChatCompletionToolsParam`` / ``FunctionDefinition`` ``model_dump``
  (vllm/entrypoints/generate/base/protocol.py): tools as ``{"type", "function": {"name",
  "description", "parameters", ["strict"], ["defer_loading"]}}`` in that order, a missing
  ``description`` or ``parameters`` as ``null``, unknown keys dropped;
- ``safe_apply_chat_template`` (vllm/renderers/hf.py): a ``developer`` message becomes a system
  message (and the system messages are merged first) when the template never names the role.

SGLang (``--render-as sglang``), from ``OpenAIServingChat._apply_jinja_template``
(sglang/srt/entrypoints/openai/serving_chat.py) and ``process_content_for_template_format``
(sglang/srt/parser/jinja_template_utils.py): content ``None`` is ``""`` and a string stays a
string for every template; text parts are joined by spaces; a tool result's text parts are
joined by spaces (``normalize_tool_content``); an empty ``tool_calls`` list is kept; arguments
that are not a JSON object reject the request (``parse_tool_call_arguments``);
``reasoning_content`` keeps its name; tools keep the client's key order, with a missing
``description``/``parameters`` added as ``null`` after it (``Function._serialize``).

Then transformers' ``render_jinja_template`` (transformers/utils/chat_template_utils.py) aliases
a message's reasoning as ``reasoning_content`` and ``thinking`` (``_alias_reasoning_fields``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from jinja2 import nodes

from analyzer.errors import BadLine
from analyzer.records import Message

RENDERINGS = ("vllm", "sglang")
# vLLM's MM_PARSER_MAP text kinds and the key each one's text is under.
TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
IMAGE_PARTS = frozenset({"image_url", "image", "input_image", "image_pil", "image_embeds"})
# Keys of OpenAI's content-part types; vLLM copies a part's other keys (_collect_extra_fields).
KNOWN_PART_KEYS = frozenset(
    {"type", "text", "image_url", "input_audio", "refusal", "thinking", "file", "detail", "uuid"}
)
BILLING_HEADER = "x-anthropic-billing-header"
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
FUNCTION_FIELDS = ("name", "description", "parameters")


def server_messages(
    messages: list[Message],
    form: str,
    placeholder: str | None,
    template_name: str,
    *,
    rendering: str = "vllm",
    names_developer: bool = True,
) -> list[Message]:
    """The messages as the server passes them to ``apply_chat_template``. ``form`` is the
    template's content format, "string" or "openai"."""
    if rendering == "sglang":
        prepared = [
            _sglang_message(m, i, form, placeholder, template_name) for i, m in enumerate(messages)
        ]
    else:
        prepared = [
            _vllm_message(m, i, form, placeholder, template_name) for i, m in enumerate(messages)
        ]
        for position, message in enumerate(prepared):
            _vllm_tool_calls(message, position)
        if not names_developer and any(m["role"] == "developer" for m in prepared):
            prepared = _developer_as_system(prepared)
    return prepared


def server_tools(tools: list[dict[str, Any]] | None, rendering: str = "vllm") -> list[Any] | None:
    """The request's tools as the server's request model dumps them."""
    if tools is None:
        return None
    return [_sglang_tool(t) if rendering == "sglang" else _vllm_tool(t) for t in tools]


def _vllm_message(
    message: Message, position: int, form: str, placeholder: str | None, template_name: str
) -> Message:
    role = message.get("role")
    content = message.get("content")
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    parts: list[Any] = [] if content is None else [content] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise BadLine(f"messages[{position}].content must be a string or a list of parts")
    if role == "system":
        parts = _strip_billing_header(parts)
    result: Message = {
        "role": role,
        "content": _vllm_content(parts, position, form, placeholder, template_name),
    }
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = copy.deepcopy(list(message["tool_calls"]))
        if reasoning is not None:
            result["reasoning"] = reasoning
            result["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if isinstance(result["content"], list) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in result["content"]
        ):
            result["content"] = "\n".join(p.get("text", "") for p in result["content"])
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            result[key] = message[key]
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


def _vllm_content(
    parts: list[Any], position: int, form: str, placeholder: str | None, template_name: str
) -> str | list[dict[str, Any]]:
    items: list[Any] = []
    images = 0
    for part in parts:
        if isinstance(part, str):
            if form == "openai":
                items.append({"type": "text", "text": part})
            elif part:  # vLLM drops an empty text
                items.append(part)
            continue
        if not isinstance(part, dict):
            raise BadLine(
                f"messages[{position}] has a {type(part).__name__} content part (not read)"
            )
        kind = part.get("type")
        extra = {k: v for k, v in part.items() if k not in KNOWN_PART_KEYS}
        if kind in TEXT_PARTS:
            text = part.get(TEXT_PARTS[kind])
            if text is None:
                continue  # vLLM skips a text part without text
            if form == "openai":
                items.append({"type": "text", "text": text, **extra})
            elif text:
                items.append(text)
        elif kind in IMAGE_PARTS or (kind is None and "image_url" in part):
            images += 1
            if form == "openai":
                items.append({"type": "image", **extra})
        else:
            raise BadLine(f"messages[{position}] has a {kind!r} content part (not read)")
    if form == "openai":
        return items
    if images and placeholder is None:
        raise BadLine(
            f"messages[{position}] has an image content part, and the chat template "
            f"{template_name!r} defines no image placeholder (a text-only model)"
        )
    text = "\n".join(items)
    return "\n".join([placeholder or ""] * images + ([text] if text else []))


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """vLLM drops Claude Code's ``x-anthropic-billing-header`` line from system text parts."""
    kept: list[Any] = []
    for part in parts:
        text = (
            part
            if isinstance(part, str)
            else part.get("text")
            if isinstance(part, dict) and part.get("type") == "text"
            else None
        )
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            kept.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            kept.append(rest if isinstance(part, str) else {**part, "text": rest})
    return kept


def _vllm_tool_calls(message: Message, position: int) -> None:
    """vLLM's ``_postprocess_messages``: drop empty tool_calls, arguments as JSON objects."""
    calls = message.get("tool_calls")
    if message["role"] != "assistant" or not isinstance(calls, list):
        return
    if not calls:
        del message["tool_calls"]
        return
    for call in calls:
        if not isinstance(call, dict):
            raise BadLine(f"messages[{position}]: assistant tool_calls entries must be objects.")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise BadLine(
                f"messages[{position}]: chat completions only support assistant tool_calls "
                "of type 'function'."
            )
        arguments = function.get("arguments")
        if not arguments:
            function["arguments"] = {}
        elif not isinstance(arguments, dict):
            parsed: Any = None
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    parsed = None  # vLLM coerces arguments that are not JSON to {}
            else:
                parsed = arguments
            function["arguments"] = parsed if isinstance(parsed, dict) else {}


def _developer_as_system(messages: list[Message]) -> list[Message]:
    """vLLM's ``_convert_developer_to_system`` then ``_consolidate_system_messages``."""
    converted = [
        {k: v for k, v in {**m, "role": "system"}.items() if k != "tools"}
        if m["role"] == "developer"
        else m
        for m in messages
    ]
    contents: list[str] = []
    others: list[Message] = []
    merge = False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or i > 0 or bool(contents)
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if (isinstance(p, dict) and "text" in p) or isinstance(p, str)
            )
        if content:
            contents.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(contents)}, *others]


def _vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, dict):
        raise BadLine(
            "a tool must be {'type': 'function', 'function': {...}} (vLLM's request model)"
        )
    if not isinstance(function.get("name"), str):
        raise BadLine("a tool's function has no 'name' (vLLM's request model rejects it)")
    dumped: dict[str, Any] = {key: function.get(key) for key in FUNCTION_FIELDS}
    for key in ("strict", "defer_loading"):
        if function.get(key) is not None:
            dumped[key] = function[key]
    if tool.get("defer_loading") is not None and "defer_loading" not in dumped:
        dumped["defer_loading"] = tool["defer_loading"]
    result: dict[str, Any] = {"type": "function", "function": dumped}
    if tool.get("defer_loading") is not None:
        result["defer_loading"] = tool["defer_loading"]
    return result


def _sglang_message(
    message: Message, position: int, form: str, placeholder: str | None, template_name: str
) -> Message:
    del placeholder, template_name  # SGLang's string format leaves images out of the text
    keys = ("role", "content", "tool_call_id", "name", "reasoning_content", "tool_calls", "tools")
    result: Message = {k: copy.deepcopy(message[k]) for k in keys if message.get(k) is not None}
    result["content"] = _sglang_content(message.get("content"), position, form)
    if result["role"] == "tool" and isinstance(result["content"], list):
        parts = result["content"]
        if all(
            (isinstance(p, dict) and p.get("type") == "text") or isinstance(p, str) for p in parts
        ):
            result["content"] = " ".join(
                p.get("text", "") if isinstance(p, dict) else p for p in parts
            )
    calls = result.get("tool_calls")
    if isinstance(calls, list):
        result["tool_calls"] = [_sglang_tool_call(call, position) for call in calls]
    return result


def _sglang_content(content: Any, position: int, form: str) -> Any:
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text"):
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        elif kind in ("image_url", "input_image"):
            parts.append({"type": "image"})
        elif kind is None or kind not in IMAGE_PARTS | {"video_url", "audio_url"}:
            raise BadLine(f"messages[{position}] has a {kind!r} content part (not read)")
    return parts if form == "openai" else " ".join(texts)


def _sglang_tool_call(call: Any, position: int) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise BadLine(f"messages[{position}]: a tool call must be an object with a 'function'")
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        try:
            parsed = json.loads(function["arguments"])
        except ValueError:
            raise BadLine(
                f"messages[{position}]: Assistant tool call function.arguments must be valid JSON. "
                "(SGLang rejects the request)"
            ) from None
        if not isinstance(parsed, dict):
            raise BadLine(
                f"messages[{position}]: Assistant tool call function.arguments must be a JSON "
                "object. (SGLang rejects the request)"
            )
        function["arguments"] = parsed
    return {
        "id": call.get("id"),
        "index": call.get("index"),
        "type": "function",
        "function": {"name": function.get("name"), "arguments": function.get("arguments")},
    }


def _sglang_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadLine("a tool's function has no 'name' (SGLang's request model rejects it)")
    known = (*FUNCTION_FIELDS, "strict", "defer_loading")
    dumped = {
        k: function[k]
        for k in function
        if k in known and (k in FUNCTION_FIELDS or function[k] is not None)
    }
    for key in FUNCTION_FIELDS:
        dumped.setdefault(key, None)
    return {
        "type": tool.get("type", "function"),
        "function": dumped,
        "defer_loading": tool.get("defer_loading"),
    }


def alias_reasoning(message: Message) -> Message:
    """transformers' ``_alias_reasoning_fields``."""
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


# -- content format: vLLM's ``_detect_content_format`` (vllm/renderers/hf.py) -----------------


def vllm_content_format(tree: nodes.Template) -> str:
    """ "openai" when a loop iterates over a message's content (through the aliases of
    ``messages`` and of its items, or a macro parameter bound to ``message.content``)."""
    try:
        next(_content_loops(tree))
    except StopIteration:
        return "string"
    return "openai"


def sglang_content_format(source: str, tree: nodes.Template) -> str:
    """SGLang's ``detect_jinja_template_content_format``: any of image/audio/video/vision in the
    template text, or a loop over ``message``/``msg``/``m`` ``.content``."""
    if any(word in source for word in ("image", "audio", "video", "vision")):
        return "openai"
    for loop in tree.find_all(nodes.For):
        if any(
            _is_var_or_elems_access(loop.iter, name, "content") for name in ("message", "msg", "m")
        ):
            return "openai"
    return "string"


def _is_var_access(node: nodes.Node, varname: str) -> bool:
    if isinstance(node, nodes.Name):
        return node.ctx == "load" and node.name == varname
    if isinstance(node, nodes.Getattr) and "." in varname:
        base, _, attr = varname.rpartition(".")
        return node.attr == attr and _is_var_access(node.node, base)
    return False


def _is_attr_access(node: nodes.Node, varname: str, key: str) -> bool:
    if isinstance(node, nodes.Getitem):
        return (
            _is_var_access(node.node, varname)
            and isinstance(node.arg, nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node: nodes.Node, varname: str, key: str | None = None) -> bool:
    if isinstance(node, nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _dotted_name(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    parts = []
    while isinstance(node, nodes.Getattr):
        parts.append(node.attr)
        node = node.node
    if isinstance(node, nodes.Name):
        parts.append(node.name)
        return ".".join(reversed(parts))
    return None


def _aliases(root: nodes.Node, varname: str) -> Iterator[str]:
    """``varname`` and the variables assigned from it (vLLM: _iter_nodes_assign_var_or_elems)."""
    yield varname
    seen = {varname}
    queue = [varname]
    while queue:
        related = queue.pop(0)
        for assign in root.find_all(nodes.Assign):
            lhs, rhs = assign.target, assign.node
            found: list[str] = []
            if isinstance(lhs, nodes.Name) and _is_var_or_elems_access(rhs, related):
                found.append(lhs.name)
            if (
                isinstance(lhs, nodes.Name)
                and isinstance(rhs, nodes.Call)
                and isinstance(rhs.node, nodes.Name)
                and rhs.node.name == "namespace"
            ):
                found += [
                    f"{lhs.name}.{kw.key}"
                    for kw in rhs.kwargs
                    if _is_var_or_elems_access(kw.value, related)
                ]
            elif isinstance(lhs, nodes.Getattr | nodes.NSRef) and _is_var_or_elems_access(
                rhs, related
            ):
                dotted = _dotted_name(lhs)
                found += [dotted] if dotted is not None else []
            for alias in found:
                yield alias
                if alias not in seen:
                    seen.add(alias)
                    queue.append(alias)


def _message_names(root: nodes.Node) -> list[str]:
    names = list(_aliases(root, "messages"))
    found = []
    for loop in root.find_all(nodes.For):
        if any(_is_var_or_elems_access(loop.iter, name) for name in names) and isinstance(
            loop.target, nodes.Name
        ):
            found.append(loop.target.name)
    return found


def _content_loops(root: nodes.Node) -> Iterator[nodes.For]:
    """vLLM's ``_iter_nodes_assign_content_item``."""
    message_names = _message_names(root)
    params_by_loop: dict[int, set[str]] = {}
    loops_in_macros: set[int] = set()
    for macro in root.find_all(nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(
                    _is_var_or_elems_access(arg, name, "content") for name in message_names
                ):
                    content_params.add(macro.args[i].name)
            for kwarg in call.kwargs:
                if kwarg.key in param_names and any(
                    _is_var_or_elems_access(kwarg.value, name, "content") for name in message_names
                ):
                    content_params.add(kwarg.key)
        for loop in macro.find_all(nodes.For):
            loops_in_macros.add(id(loop))
            if content_params:
                params_by_loop[id(loop)] = content_params
    for loop in root.find_all(nodes.For):
        if any(_is_var_or_elems_access(loop.iter, name, "content") for name in message_names):
            yield loop
            continue
        params = params_by_loop.get(id(loop)) or set()
        if isinstance(loop.iter, nodes.Name) and (
            loop.iter.name in params
            or (id(loop) not in loops_in_macros and loop.iter.name == "content")
        ):
            yield loop
