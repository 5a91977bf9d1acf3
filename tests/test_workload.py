"""Workload building: prompts tokenized as the server does, answers with their stop token, unknown
outputs as unique negative ids, namespaces per salt/LoRA, failures as reasoned skips."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.chat import chat_renderer
from analyzer.errors import StrictModeError
from analyzer.records import Record
from analyzer.tokenizer import load_tokenizer
from analyzer.workload import build_workload

TOKENIZER = load_tokenizer(None)
RENDERER = chat_renderer(None, TOKENIZER.special)


def build(records: list[Record], strict: bool = False):
    return build_workload(records, TOKENIZER, RENDERER, strict=strict)


def test_chat_prompt_is_the_rendered_template() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    log = build([Record("f", 1, messages=messages)])
    expected = TOKENIZER.encode_batch([RENDERER.render(messages)], add_special_tokens=False)[0]
    assert log.workload.prompt(0).tolist() == expected.tolist()
    assert log.workload.prompt(0)[-3:].tolist() == [151644, 77091, 198]  # <|im_start|>assistant\n


def test_answer_tokens_end_with_the_stop_token_on_stop_only() -> None:
    records = [
        Record("f", 1, prompt="a", output_text="Hello world", finish_reason="stop"),
        Record("f", 2, prompt="a", output_text="Hello world", finish_reason="length"),
        Record("f", 3, prompt="a", output_text="Hello world"),
    ]
    log = build(records)
    assert log.workload.output(0).tolist() == [9707, 1879, 151645]
    assert log.workload.output(1).tolist() == [9707, 1879]
    assert log.workload.output(2).tolist() == [9707, 1879, 151645]
    assert log.workload.stop_finish.tolist() == [True, False, True]
    assert log.assumed_stop_finish == 1


def test_unknown_outputs_are_unique_negative_ids() -> None:
    records = [
        Record("f", 1, prompt_token_ids=[1, 2], output_length=3),
        Record("f", 2, prompt_token_ids=[1, 2]),
        Record("f", 3, prompt_token_ids=[1, 2], output_token_ids=[7, 8]),
    ]
    log = build(records)
    unknown = np.concatenate([log.workload.output(0), log.workload.output(1)])
    assert len(unknown) == 4
    assert (unknown < 0).all() and len(set(unknown.tolist())) == 4
    assert log.workload.output(2).tolist() == [7, 8]
    assert log.requests["output_known"].to_list() == [False, False, True]
    assert not log.from_text


def test_namespaces_per_salt_and_lora() -> None:
    records = [
        Record("f", 1, prompt_token_ids=[1], cache_salt="a"),
        Record("f", 2, prompt_token_ids=[1]),
        Record("f", 3, prompt_token_ids=[1], cache_salt="a", lora="x"),
        Record("f", 4, prompt_token_ids=[1], cache_salt="a"),
    ]
    log = build(records)
    assert log.workload.namespace.tolist() == [1, 0, 2, 1]
    assert log.namespace_labels == ["", "cache_salt=a", "cache_salt=a, lora=x"]


def test_failed_render_is_skipped_with_its_line() -> None:
    records = [
        Record("log.jsonl", 7, messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        Record("log.jsonl", 8, prompt="fine"),
    ]
    log = build(records)
    assert log.workload.n_requests == 1
    (skip,) = log.skips
    assert (skip.file, skip.line) == ("log.jsonl", 7)
    assert "content part" in skip.reason
    with pytest.raises(StrictModeError, match=r"log\.jsonl:7"):
        build(records, strict=True)


def test_metadata_columns() -> None:
    log = build([Record("f", 3, prompt="abc", model="m", arrival_s=2.0, finish_reason="stop")])
    row = log.requests.row(0, named=True)
    assert (row["file"], row["line"], row["model"], row["arrival_s"]) == ("f", 3, "m", 2.0)
    assert row["prompt_tokens"] == len(log.workload.prompt(0))
    assert log.workload.arrival_s is not None and log.workload.arrival_s.tolist() == [2.0]


def test_tool_call_answer_is_what_the_next_turn_renders() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"a": 1}'}}
    answer = {"role": "assistant", "content": None, "tool_calls": [call]}
    first = [{"role": "user", "content": "weather?"}]
    second = [*first, answer, {"role": "tool", "tool_call_id": "c1", "content": "4C"}]
    records = [
        Record("f", 1, messages=first, output_message=answer, finish_reason="tool_calls"),
        Record("f", 2, messages=second),
    ]
    log = build(records)
    prompt, output = log.workload.prompt(0).tolist(), log.workload.output(0).tolist()
    assert log.requests["output_known"][0]
    assert output[-1] == TOKENIZER.token_id("<|im_end|>")
    # the answer's tokens are exactly those the next turn's prompt holds after the first prompt
    assert log.workload.prompt(1)[: len(prompt) + len(output)].tolist() == prompt + output
