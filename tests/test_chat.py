"""Chat rendering: the built-in template is Qwen2.5's, custom templates render as transformers
renders them, and a failing template names the problem."""

from __future__ import annotations

import pytest

from analyzer.chat import CHATML_TEMPLATE, ChatRenderer, chat_renderer
from analyzer.errors import BadLine, PrefixcheckError
from analyzer.tokenizer import SpecialTokens

SPECIAL = SpecialTokens(bos_token="<s>", eos_token="</s>")


def builtin() -> ChatRenderer:
    return chat_renderer(None, SpecialTokens())


def test_system_and_user() -> None:
    text = builtin().render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_default_system_prompt_when_none_given() -> None:
    text = builtin().render([{"role": "user", "content": "Hi"}])
    assert text.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_tools_render_as_json_lines_without_html_escaping() -> None:
    tool = {"function": {"description": "a <b> & c", "name": "get", "x-extra": 1}}
    text = builtin().render([{"role": "user", "content": "x"}], tools=[tool])
    # dumped as vLLM's request model dumps it: its field order, parameters null, extras dropped
    assert (
        '<tools>\n{"type": "function", "function": {"name": "get", "description": "a <b> & c", '
        '"parameters": null}}\n</tools>' in text
    )
    assert text.index("# Tools") < text.index("<|im_start|>user")


def test_multi_turn_with_tool_calls_and_results() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "w", "arguments": '{"city": "Oslo"}'}}],
        },
        {"role": "tool", "content": "5C"},
        {"role": "tool", "content": "rain"},
    ]
    text = builtin().render(messages)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5C\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text


def test_text_parts_are_joined_with_newlines() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    text = builtin().render([{"role": "user", "content": parts}])
    assert "<|im_start|>user\na\nb<|im_end|>" in text


def test_image_for_a_text_only_template_is_a_reasoned_error() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "x"}}]
    with pytest.raises(BadLine, match=r"image content part.*defines no image placeholder"):
        builtin().render([{"role": "user", "content": parts}])


def test_audio_part_is_a_reasoned_error() -> None:
    parts = [{"type": "input_audio", "input_audio": {"data": "x"}}]
    with pytest.raises(BadLine, match="'input_audio' content part"):
        builtin().render([{"role": "user", "content": parts}])


def test_custom_template_sees_special_tokens_and_date() -> None:
    template = (
        "{{ bos_token }}{{ strftime_now('%d %b %Y') }}|"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    renderer = chat_renderer(template, SPECIAL)
    text = renderer.render([{"role": "user", "content": "hi"}], arrival_s=86400 * 365)
    assert text == "<s>01 Jan 1971|user:hi</s>assistant:"


def test_template_raise_exception_is_a_bad_line() -> None:
    renderer = chat_renderer("{{ raise_exception('roles must alternate') }}", SPECIAL)
    with pytest.raises(BadLine, match=r"chat template failed: .*roles must alternate"):
        renderer.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_attribute_escape() -> None:
    renderer = chat_renderer("{{ messages.__class__.__mro__ }}", SPECIAL)
    with pytest.raises(BadLine, match="chat template failed"):
        renderer.render([{"role": "user", "content": "x"}])


def test_template_that_does_not_compile() -> None:
    with pytest.raises(PrefixcheckError, match="does not compile"):  # before any request
        chat_renderer("{% for %}", SPECIAL)
    with pytest.raises(PrefixcheckError, match="does not compile"):
        ChatRenderer("{% for %}", SPECIAL).render([{"role": "user", "content": "x"}])


TOOL = {"type": "function", "function": {"name": "get"}}


def test_named_templates_pick_tool_use_when_tools_given() -> None:
    renderer = ChatRenderer({"default": "plain", "tool_use": "tools"}, SPECIAL)
    assert renderer.render([{"role": "user", "content": "x"}]) == "plain"
    assert renderer.render([{"role": "user", "content": "x"}], tools=[TOOL]) == "tools"


def test_builtin_template_is_the_default() -> None:
    assert builtin().template == CHATML_TEMPLATE


def test_sglang_rendering_differs_where_its_server_does() -> None:
    vllm = builtin()
    sglang = vllm.with_rendering("sglang")
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert "user\na b<|im_end|>" in sglang.render([{"role": "user", "content": parts}])
    assert "user\na\nb<|im_end|>" in vllm.render([{"role": "user", "content": parts}])
    bad = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{"}}],
        },
    ]
    assert '"arguments": {}' in vllm.render(bad)  # vLLM coerces invalid JSON to {}
    with pytest.raises(BadLine, match="must be valid JSON"):
        sglang.render(bad)
    tool = {"type": "function", "function": {"parameters": {}, "name": "f"}}
    assert '{"parameters": {}, "name": "f", "description": null}' in sglang.render(bad[:1], [tool])
    assert "SGLang" in sglang.description and "vLLM" in vllm.description
