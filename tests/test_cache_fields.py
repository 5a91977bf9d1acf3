"""Request fields that change what the engines read from their caches, read from logs that carry
them: SGLang's ``priority``, ``extra_key`` and ``return_logprob`` + ``logprob_start_len``, vLLM's
``prompt_logprobs``; and the replay reading them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.chat import chat_renderer
from analyzer.loaders import load_logs
from analyzer.tokenizer import load_tokenizer
from analyzer.workload import build_workload
from cache_models.config import SglangConfig, VllmConfig
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache

TOKENIZER = load_tokenizer(None)
PROMPT = list(range(1, 41))


def tokenized(tmp_path: Path, rows: list[dict[str, object]]):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_logs([path])
    assert not loaded.skips
    renderer = chat_renderer(None, TOKENIZER.special)
    return build_workload(loaded.records, TOKENIZER, renderer)


def test_tokens_rows_carry_the_cache_fields(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"prompt_token_ids": PROMPT, "output_token_ids": [7]},
        {"prompt_token_ids": PROMPT, "output_token_ids": [7], "priority": 3},
        {"prompt_token_ids": PROMPT, "output_token_ids": [7], "prompt_logprobs": 0},
        {"prompt_token_ids": PROMPT, "output_token_ids": [7], "extra_key": "k"},
        {
            "prompt_token_ids": PROMPT,
            "output_token_ids": [7],
            "return_logprob": True,
            "logprob_start_len": 20,
        },
        {"prompt_token_ids": PROMPT, "output_token_ids": [7], "logprob_start_len": 5},
    ]
    log = tokenized(tmp_path, rows)
    w = log.workload
    assert w.priorities.tolist() == [0, 3, 0, 0, 0, 0]
    assert w.skips_lookup.tolist() == [False, False, True, False, False, False]
    assert w.hit_limits.tolist() == [-1, -1, -1, -1, 20, -1]  # no return_logprob: no cap
    assert w.namespace.tolist() == [0, 0, 0, 1, 0, 0]
    assert log.namespace_labels[1] == "extra_key=k"

    sglang = SglangRadixCache(SglangConfig()).replay(w).hit_tokens.tolist()
    assert sglang == [0, 39, 39, 0, 20, 39]
    vllm = VllmPrefixCache(VllmConfig(block_size=16)).replay(w)
    assert vllm.hit_tokens.tolist() == [0, 32, 0, 0, 32, 32]
    assert vllm.metrics["vllm:prefix_cache_queries"] == 5 * len(PROMPT)  # the skip is not counted


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"priority": "high"}, "'priority' must be an integer"),
        ({"priority": 2**63}, "signed 64-bit"),
        ({"prompt_logprobs": True}, "'prompt_logprobs' must be an integer"),
        ({"return_logprob": "yes"}, "'return_logprob' must be a boolean"),
        ({"extra_key": 5}, "'extra_key' must be a string"),
        ({"max_tokens": -3}, "'max_tokens' = -3 must be non-negative"),
        ({"sampling_params": {"max_new_tokens": "8"}}, "'max_new_tokens' must be an integer"),
    ],
)
def test_bad_cache_fields_are_reasoned_skips(
    tmp_path: Path, row: dict[str, object], reason: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt_token_ids": PROMPT, **row}) + "\n")
    (skip,) = load_logs([path]).skips
    assert skip.line == 1 and reason in skip.reason


def test_sglang_receive_line_fields(tmp_path: Path) -> None:
    line = (
        "[2026-01-05 09:21:00] Receive: obj=GenerateReqInput(text=None, input_ids=[1, 2, 3], "
        "sampling_params={'max_new_tokens': 4}, rid='r1', return_logprob=True, "
        "logprob_start_len=2, priority=7, extra_key='tenant-x', cache_salt='s')\n"
    )
    path = tmp_path / "sglang.log"
    path.write_text(line)
    (record,) = load_logs([path], "sglang-log").records
    assert (record.priority, record.extra_key, record.cache_salt) == (7, "tenant-x", "s")
    assert record.logprob_start_len == 2
    assert record.max_new_tokens == 4


def test_vllm_params_line_prompt_logprobs(tmp_path: Path) -> None:
    lines = [
        "INFO 11-20 08:00:10 [request_logger.py:66] Received request cmpl-1: params: "
        "SamplingParams(n=1, temperature=0.0, prompt_logprobs=1, max_tokens=16), "
        "lora_request: None.",
        "DEBUG 11-20 08:00:10 [request_logger.py:56] Request cmpl-1 details: prompt: 'hi', "
        "prompt_token_ids: [1, 2, 3], prompt_embeds shape: None.",
    ]
    path = tmp_path / "vllm.log"
    path.write_text("\n".join(lines) + "\n")
    (record,) = load_logs([path], "vllm-log").records
    assert record.prompt_logprobs is True
    assert record.max_new_tokens == 16
    assert np.array_equal(record.prompt_token_ids, [1, 2, 3])


def test_output_limits_are_read_from_each_spelling(tmp_path: Path) -> None:
    """OpenAI ``max_completion_tokens`` (ahead of ``max_tokens``), ``max_tokens``, the tokens
    format's ``max_new_tokens`` and SGLang's ``sampling_params.max_new_tokens``; -1: none."""
    base = {"prompt_token_ids": PROMPT, "output_token_ids": [7]}
    rows: list[dict[str, object]] = [
        base,
        base | {"max_tokens": 9},
        base | {"max_completion_tokens": 5, "max_tokens": 9},
        base | {"max_new_tokens": 3},
        base | {"sampling_params": {"max_new_tokens": 12}},
    ]
    w = tokenized(tmp_path, rows).workload
    assert w.max_new_tokens_given.tolist() == [-1, 9, 5, 3, 12]
    assert w.output_limits.tolist() == [1, 9, 5, 3, 12]
    assert w.sglang_stop_finish.tolist() == [True, True, True, True, True]  # no stop on its limit
    assert tokenized(tmp_path, [base, base]).workload.max_new_tokens is None


def test_vllm_ignores_output_limits_and_sglang_stops_at_the_limit() -> None:
    """vLLM's hits do not depend on ``max_new_tokens``. SGLang's overlap scheduler caches all N
    outputs of a stop below the limit and N - 1 of a stop on the limit's last token (it skips
    that request's in-flight step: ``_reqs_finishing_inflight``)."""
    import dataclasses

    from cache_models.workload import Workload

    answer = list(range(100, 117))  # 17 outputs: the follow-up's prompt has them all
    follow_up = PROMPT + answer + [500, 501]
    plain = Workload.from_lists([PROMPT, follow_up], [answer, [9]], stop_finish=[True, True])
    below = dataclasses.replace(plain, max_new_tokens=np.array([64, -1], np.int64))
    unknown = dataclasses.replace(plain, max_new_tokens=np.array([-1, -1], np.int64))
    at_limit = dataclasses.replace(plain, max_new_tokens=np.array([17, -1], np.int64))
    for block_size in (1, 16):
        vllm = [
            VllmPrefixCache(VllmConfig(block_size=block_size)).replay(w).hit_tokens.tolist()
            for w in (plain, below, at_limit)
        ]
        assert vllm[0] == vllm[1] == vllm[2]
    sglang = [
        SglangRadixCache(SglangConfig()).replay(w).hit_tokens[1] for w in (plain, below, unknown)
    ]
    assert sglang == [len(PROMPT) + 17] * 3
    reference = SglangRadixCache(SglangConfig(), "reference").replay(at_limit).hit_tokens[1]
    assert reference == len(PROMPT) + 16
    assert SglangRadixCache(SglangConfig()).replay(at_limit).hit_tokens[1] == len(PROMPT) + 16
    no_overlap = SglangConfig(overlap_schedule=False)
    assert SglangRadixCache(no_overlap).replay(below).hit_tokens[1] == len(PROMPT) + 16
