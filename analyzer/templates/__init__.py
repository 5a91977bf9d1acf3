"""Built-in chat templates of common model families, each the model's own ``chat_template`` from
its ``tokenizer_config.json``, with the special tokens the template prints."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    model: str  # the model whose tokenizer_config.json the template comes from
    file: str
    bos_token: str | None
    eos_token: str

    @property
    def source(self) -> str:
        return _read(self.file)


BUILTIN_TEMPLATES: dict[str, BuiltinTemplate] = {
    t.name: t
    for t in (
        BuiltinTemplate("qwen2.5", "Qwen/Qwen2.5-7B-Instruct", "qwen2.5.jinja", None, "<|im_end|>"),
        BuiltinTemplate(
            "llama3",
            "meta-llama/Llama-3.1-8B-Instruct",
            "llama3.jinja",
            "<|begin_of_text|>",
            "<|eot_id|>",
        ),
        BuiltinTemplate(
            "mistral", "mistralai/Mistral-7B-Instruct-v0.3", "mistral.jinja", "<s>", "</s>"
        ),
        BuiltinTemplate("gemma", "google/gemma-3-1b-it", "gemma.jinja", "<bos>", "<end_of_turn>"),
        BuiltinTemplate(
            "deepseek",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            "deepseek.jinja",
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
    )
}
ALIASES = {"chatml": "qwen2.5", "qwen": "qwen2.5", "llama-3": "llama3", "gemma3": "gemma"}


def builtin_template(name: str) -> BuiltinTemplate | None:
    return BUILTIN_TEMPLATES.get(ALIASES.get(name.lower(), name.lower()))


@cache
def _read(file: str) -> str:
    return (resources.files(__package__) / file).read_text(encoding="utf-8")
