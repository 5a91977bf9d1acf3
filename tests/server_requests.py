"""Realistic agent requests and, beside each, the conversation and tools that vLLM 0.33.0's OpenAI
server hands ``apply_chat_template`` for it (templates in the "string" content format), written
out by hand from vLLM's code: ``parse_chat_message_content`` and ``_postprocess_messages``
(vllm/renderers/chat_utils/chat_message.py), ``ChatCompletionRequest._normalize_messages_before``
and ``FunctionDefinition`` (vllm/entrypoints/.../protocol.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
WEATHER_DUMPED = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": WEATHER["function"]["parameters"],
    },
}
# No description, the keys in another order, `strict` and a key vLLM's model does not have.
SEARCH = {
    "type": "function",
    "function": {
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "name": "search",
        "strict": True,
        "x-origin": "mcp",
    },
}
SEARCH_DUMPED = {
    "type": "function",
    "function": {
        "name": "search",
        "description": None,
        "parameters": SEARCH["function"]["parameters"],
        "strict": True,
    },
}
SYSTEM = {"role": "system", "content": "You are a coding agent. Use tools when needed."}
USER = {"role": "user", "content": "What is the weather in Oslo?"}


def call(arguments: Any, name: str = "get_weather", call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class Case(NamedTuple):
    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    conversation: list[dict[str, Any]]  # what vLLM passes to apply_chat_template
    tools_dumped: list[dict[str, Any]] | None
    kwargs: dict[str, Any] | None = None


CASES = [
    Case("single turn", [SYSTEM, USER], None, [SYSTEM, USER], None),
    Case(
        "multi-turn",
        [
            SYSTEM,
            USER,
            {"role": "assistant", "content": "Cold."},
            {"role": "user", "content": "And Rome?"},
        ],
        None,
        [
            SYSTEM,
            USER,
            {"role": "assistant", "content": "Cold."},
            {"role": "user", "content": "And Rome?"},
        ],
        None,
    ),
    Case("tools with descriptions", [SYSTEM, USER], [WEATHER], [SYSTEM, USER], [WEATHER_DUMPED]),
    Case(
        "tools without descriptions",
        [USER],
        [WEATHER, SEARCH],
        [USER],
        [WEATHER_DUMPED, SEARCH_DUMPED],
    ),
    Case(
        "tool call with null content and its result",
        [
            SYSTEM,
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call('{"city": "Oslo"}')]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 4}'},
        ],
        [WEATHER],
        [
            SYSTEM,
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call({"city": "Oslo"})]},
            {"role": "tool", "content": '{"temp_c": 4}', "tool_call_id": "call_1"},
        ],
        [WEATHER_DUMPED],
    ),
    Case(
        "tool call with empty content, then the answer and a new question",
        [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call('{"city":"Oslo"}')]},
            {"role": "tool", "tool_call_id": "call_1", "content": "4C, rain"},
            {"role": "assistant", "content": "It is 4C and raining in Oslo."},
            {"role": "user", "content": "Thanks. Rome?"},
        ],
        [WEATHER],
        [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call({"city": "Oslo"})]},
            {"role": "tool", "content": "4C, rain", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "It is 4C and raining in Oslo."},
            {"role": "user", "content": "Thanks. Rome?"},
        ],
        [WEATHER_DUMPED],
    ),
    Case(
        "invalid, empty and non-object arguments",
        [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call('{"city": "Osl', call_id="a"),
                    call("", call_id="b"),
                    call("[1, 2]", call_id="c"),
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "error: bad arguments"},
            {"role": "tool", "tool_call_id": "b", "content": "error: no city"},
            {"role": "tool", "tool_call_id": "c", "content": "error: not an object"},
        ],
        [WEATHER],
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call({}, call_id="a"), call({}, call_id="b"), call({}, call_id="c")],
            },
            {"role": "tool", "content": "error: bad arguments", "tool_call_id": "a"},
            {"role": "tool", "content": "error: no city", "tool_call_id": "b"},
            {"role": "tool", "content": "error: not an object", "tool_call_id": "c"},
        ],
        [WEATHER_DUMPED],
    ),
    Case(
        "tool call with 9-character ids (as Mistral's server makes them)",
        [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call('{"city": "Oslo"}', call_id="a1B2c3D4e")],
            },
            {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "4C"},
            {"role": "assistant", "content": "4C in Oslo."},
            {"role": "user", "content": "Rome?"},
        ],
        [WEATHER],
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call({"city": "Oslo"}, call_id="a1B2c3D4e")],
            },
            {"role": "tool", "content": "4C", "tool_call_id": "a1B2c3D4e"},
            {"role": "assistant", "content": "4C in Oslo."},
            {"role": "user", "content": "Rome?"},
        ],
        [WEATHER_DUMPED],
    ),
    Case(
        "empty tool_calls",
        [USER, {"role": "assistant", "content": "Let me think.", "tool_calls": []}, USER],
        None,
        [USER, {"role": "assistant", "content": "Let me think."}, USER],
        None,
    ),
    Case(
        "parallel tool calls with results as text parts",
        [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call('{"city": "Oslo"}', call_id="o"),
                    call('{"q": "Oslo news"}', name="search", call_id="s"),
                ],
            },
            {"role": "tool", "tool_call_id": "o", "content": [{"type": "text", "text": "4C"}]},
            {
                "role": "tool",
                "tool_call_id": "s",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        [WEATHER, SEARCH],
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call({"city": "Oslo"}, call_id="o"),
                    call({"q": "Oslo news"}, name="search", call_id="s"),
                ],
            },
            {"role": "tool", "content": "4C", "tool_call_id": "o"},
            {"role": "tool", "content": "a\nb", "tool_call_id": "s"},
        ],
        [WEATHER_DUMPED, SEARCH_DUMPED],
    ),
    Case(
        "thinking history",
        [
            USER,
            {"role": "assistant", "reasoning_content": "Oslo is cold.", "content": "Cold."},
            {"role": "user", "content": "Why?"},
        ],
        None,
        [
            USER,
            {
                "role": "assistant",
                "content": "Cold.",
                "reasoning": "Oslo is cold.",
                "reasoning_content": "Oslo is cold.",
            },
            {"role": "user", "content": "Why?"},
        ],
        None,
    ),
    Case(
        "thinking history with a tool call, thinking off",
        [
            USER,
            {
                "role": "assistant",
                "reasoning": "Need the weather.",
                "content": None,
                "tool_calls": [call('{"city": "Oslo"}')],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "4C"},
        ],
        [WEATHER],
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call({"city": "Oslo"})],
                "reasoning": "Need the weather.",
                "reasoning_content": "Need the weather.",
            },
            {"role": "tool", "content": "4C", "tool_call_id": "call_1"},
        ],
        [WEATHER_DUMPED],
        {"enable_thinking": False},
    ),
    Case(
        "content parts with cache_control and extra message fields",
        [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "More rules."},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ann", "id": 7},
        ],
        None,
        [
            {"role": "system", "content": "Rules.\nMore rules."},
            {"role": "user", "content": "Hi", "name": "ann"},
        ],
        None,
    ),
    Case(
        "Claude Code billing header in the system prompt",
        [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=9f1\n"},
                    {"type": "text", "text": "You are Claude Code."},
                ],
            },
            USER,
        ],
        None,
        [{"role": "system", "content": "You are Claude Code."}, USER],
        None,
    ),
]
