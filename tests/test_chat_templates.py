"""Chat templates: a model folder's own template renders what the model's template produces (the
expected strings below are written out by hand from the templates), built-in family templates,
content formats, images, template kwargs, and failures that name the request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from analyzer.chat import ChatRenderer, chat_renderer, content_format
from analyzer.errors import PrefixcheckError
from analyzer.records import Record
from analyzer.templates import BUILTIN_TEMPLATES
from analyzer.tokenizer import SpecialTokens, load_tokenizer
from analyzer.workload import build_workload

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]


def llama_folder(folder: Path, extra_files: dict[str, str] | None = None) -> Path:
    """A model folder shaped like meta-llama/Llama-3.1-8B-Instruct's (a small vocabulary)."""
    folder.mkdir()
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=[*LLAMA_SPECIALS, "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(["Be brief. Hi there, the cache is warm."] * 20, trainer=trainer)
    backend.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": BUILTIN_TEMPLATES["llama3"].source,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text)
    return folder


def test_model_folder_template_renders_like_the_model(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(str(llama_folder(tmp_path / "llama")))
    renderer = chat_renderer(tokenizer.chat_template, tokenizer.special)
    assert renderer.render(CHAT) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert renderer.render(CHAT, add_generation_prompt=False).endswith("Hi<|eot_id|>")
    # With tools, Llama 3.1 puts them in the first user message as indented JSON.
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    with_tools = renderer.render(CHAT, tools=[tool])
    assert "Environment: ipython\n" in with_tools
    assert '{\n    "type": "function",' in with_tools
    # The template's text tokenizes without a second BOS (vLLM: no special tokens for chats).
    log = build_workload([Record("l", 1, messages=CHAT)], tokenizer, renderer)
    prompt = log.workload.prompt(0)
    assert prompt[0] == tokenizer.token_id("<|begin_of_text|>")
    assert (prompt == tokenizer.token_id("<|begin_of_text|>")).sum() == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gemma", "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"),
        ("mistral", "<s>[INST] Be brief.\n\nHi[/INST]"),
        ("deepseek", "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>"),
        (
            "qwen2.5",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
    ],
)
def test_builtin_family_templates(name: str, expected: str) -> None:
    renderer = chat_renderer(None, SpecialTokens(), choice=name)
    assert renderer.render(CHAT) == expected
    assert name in renderer.name


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_every_builtin_template_compiles(name: str) -> None:
    """chat_renderer leaves a built-in uncompiled until its first request (a log without chats
    never compiles it): that skips no error only because every built-in compiles."""
    for rendering in ("vllm", "sglang"):
        renderer = chat_renderer(None, SpecialTokens(), choice=name, rendering=rendering)
        assert "_compiled" not in vars(renderer)  # not compiled yet
        assert renderer.check() is renderer
        assert renderer.render(CHAT)


def test_content_format_detected_like_vllm() -> None:
    import jinja2

    env = jinja2.Environment()
    assert content_format(env.parse(BUILTIN_TEMPLATES["gemma"].source)) == "openai"
    assert content_format(env.parse(BUILTIN_TEMPLATES["qwen2.5"].source)) == "string"
    # vLLM follows aliases of `messages` and loops over `<message>.content` or a `content`
    # variable, not any variable set from the content.
    loop = "{% for m in msgs %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}"
    assert content_format(env.parse("{% set msgs = messages %}" + loop)) == "openai"
    assert content_format(env.parse("{% set msgs = other %}" + loop)) == "string"
    named = "{% set content = message['content'] %}{% for p in content %}{{ p }}{% endfor %}"
    assert content_format(env.parse(named)) == "openai"
    other = "{% set c = message['content'] %}{% for p in c %}{{ p.text }}{% endfor %}"
    assert content_format(env.parse(other)) == "string"


def test_openai_format_template_sees_parts_and_images() -> None:
    renderer = chat_renderer(None, SpecialTokens(), choice="gemma")
    parts = [
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": "What?"},
    ]
    text = renderer.render([{"role": "user", "content": parts}])
    assert (
        text
        == "<bos><start_of_turn>user\n<start_of_image>What?<end_of_turn>\n<start_of_turn>model\n"
    )


def test_string_format_gets_the_family_placeholder_before_the_text() -> None:
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    renderer = ChatRenderer(
        "{% for m in messages %}{{ m.content }}|{% endfor %}",
        SpecialTokens(),
        image_placeholder=placeholder,
    )
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert renderer.render([{"role": "user", "content": parts}]) == f"{placeholder}\na\nb|"


def test_multimodal_folder_gets_its_placeholder(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "vl", {"preprocessor_config.json": "{}"})
    assert load_tokenizer(str(folder)).special.image_placeholder == (
        "<|vision_start|><|image_pad|><|vision_end|>"
    )
    text_only = llama_folder(tmp_path / "text")
    assert load_tokenizer(str(text_only)).special.image_placeholder is None


def test_template_kwargs_reach_the_template() -> None:
    template = "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}x"
    renderer = chat_renderer(template, SpecialTokens(), default_kwargs={"enable_thinking": True})
    assert renderer.render(CHAT) == "x"
    assert renderer.render(CHAT, kwargs={"enable_thinking": False}) == "<no-think>x"
    # Reserved names cannot be replaced by a request's kwargs.
    assert renderer.render(CHAT, kwargs={"messages": []}) == "x"


def test_choosing_a_named_template_and_errors(tmp_path: Path) -> None:
    named = {"default": "D", "rag": "R"}
    assert chat_renderer(named, SpecialTokens(), choice="rag").render(CHAT) == "R"
    template_file = tmp_path / "t.jinja"
    template_file.write_text("F{{ messages | length }}")
    assert chat_renderer(None, SpecialTokens(), choice=str(template_file)).render(CHAT) == "F2"
    with pytest.raises(PrefixcheckError, match=r"unknown --chat-template 'nope'.*rag"):
        chat_renderer(named, SpecialTokens(), choice="nope")


def test_failing_template_names_the_request() -> None:
    renderer = chat_renderer(None, SpecialTokens(), choice="gemma")
    records = [
        Record("chats.jsonl", 3, messages=[{"role": "assistant", "content": "first"}]),
        Record("chats.jsonl", 4, messages=[{"role": "user", "content": "ok"}]),
    ]
    log = build_workload(records, load_tokenizer(None), renderer)
    (skip,) = log.skips
    assert str(skip).startswith("chats.jsonl:3: chat template failed: TemplateError: Conversation")
    assert "gemma" in skip.reason
