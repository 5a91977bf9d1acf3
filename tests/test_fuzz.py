"""Property tests over every loader: malformed, oversized and wrongly-typed records, near-valid
ones among them, never crash the reader; every line read is a request, a joined answer or a
counted skip (requests + skips + answers = lines), and every request read is tokenized or a
counted skip. Deterministic (derandomize) and bounded (max_examples), so CI is stable and quick.
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.chat import chat_renderer
from analyzer.loaders import FORMATS, load_logs
from analyzer.tokenizer import load_tokenizer
from analyzer.workload import build_workload

FUZZ = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
roles = st.sampled_from(["system", "user", "assistant", "tool", "human", "gpt", "bogus"])
content = (
    st.text(max_size=60)
    | json_values
    | st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "tool_result", "x"])})
        | json_values,
        max_size=3,
    )
)
message = st.fixed_dictionaries({"role": roles | json_values, "content": content}) | json_values
messages = st.lists(message, max_size=4) | json_values
times = (
    st.integers(min_value=0, max_value=2 * 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(
        [
            "2024-06-01T10:00:00Z",
            "0001-01-01T00:00:00+05:00",
            "9999-12-31T23:59:59-12:00",
            "not a date",
        ]
    )
    | json_values
)
counts = st.integers(min_value=-5, max_value=5000) | st.integers() | json_values
ids = st.lists(st.integers(min_value=-3, max_value=2**32), max_size=40) | json_values
usage = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": counts,
        "completion_tokens": counts,
        "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": counts}) | json_values,
        "input_tokens": counts,
        "output_tokens": counts,
        "cache_read_input_tokens": counts,
    },
)
body = st.fixed_dictionaries({"messages": messages}, optional={"model": json_values})

# Per format: the keys its lines carry, each near-valid or anything at all.
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "openai": {
        "messages": messages,
        "tools": json_values,
        "model": st.text(max_size=5) | json_values,
        "user": json_values,
        "cache_salt": json_values,
        "usage": usage | json_values,
        "created": times,
        "chat_template_kwargs": json_values,
        "response": st.fixed_dictionaries({"usage": usage, "choices": json_values}) | json_values,
    },
    "openai-batch": {
        "custom_id": st.text(max_size=4) | json_values,
        "method": st.just("POST"),
        "url": st.just("/v1/chat/completions") | json_values,
        "body": body | json_values,
        "response": st.fixed_dictionaries({"body": json_values}) | json_values,
    },
    "anthropic": {
        "system": st.text(max_size=20) | json_values,
        "messages": messages,
        "model": json_values,
        "usage": usage | json_values,
        "metadata": json_values,
    },
    "litellm": {
        "call_type": st.sampled_from(["completion", "acompletion"]) | json_values,
        "startTime": times,
        "messages": messages,
        "response": json_values,
        "metadata": json_values,
        "status": st.sampled_from(["success", "failure"]) | json_values,
    },
    "langfuse": {
        "traceId": json_values,
        "type": st.sampled_from(["GENERATION", "SPAN"]) | json_values,
        "startTime": times,
        "input": messages,
        "output": json_values,
        "usageDetails": json_values,
    },
    "helicone": {
        "request_body": body | json_values,
        "response_body": json_values,
        "request_created_at": times,
        "request_user_id": json_values,
        "prompt_cache_read_tokens": counts,
    },
    "sharegpt": {
        "conversations": st.lists(
            st.fixed_dictionaries({"from": roles | json_values, "value": content}), max_size=5
        )
        | json_values
    },
    "lmsys": {"conversation": messages},
    "prompt": {"prompt": st.text(max_size=50) | json_values, "output": json_values},
    "tokens": {
        "prompt_token_ids": ids,
        "output_token_ids": ids,
        "cache_salt": json_values,
        "finish_reason": json_values,
        "output_length": counts,
    },
    "hash-trace": {
        "timestamp": times,
        "input_length": counts,
        "output_length": counts | st.just(3_000_000_000),
        "hash_ids": ids,
    },
    "bailian-trace": {
        "chat_id": json_values,
        "parent_chat_id": json_values,
        "timestamp": times,
        "input_length": counts,
        "output_length": counts,
        "hash_ids": ids,
        "type": json_values,
        "turn": json_values,
    },
}
JSON_FORMATS = [name for name, log_format in FORMATS.items() if not log_format.text]
assert set(JSON_FORMATS) == set(FIELDS)
garbage_lines = (
    st.binary(max_size=40)
    | st.just(b"")
    | st.just(b"[" * 3000 + b"]" * 3000)
    | st.just(b'{"a": ' + b"9" * 5000 + b"}")
    | st.just(b"\xef\xbb\xbf{}")
    | json_values.map(lambda v: json.dumps(v).encode())
)


def _line(data: st.DataObject, name: str) -> bytes:
    if data.draw(st.integers(0, 4)) == 0:
        return data.draw(garbage_lines).replace(b"\n", b" ").replace(b"\r", b" ")
    record = data.draw(
        st.fixed_dictionaries({}, optional=FIELDS[name]) | st.fixed_dictionaries(FIELDS[name])
    )
    return json.dumps(record).encode()


@cache
def _tokenizing() -> tuple[Any, Any]:
    tokenizer = load_tokenizer(None)
    return tokenizer, chat_renderer(None, tokenizer.special)


def _check_accounting(path: Path, format_name: str, n_lines: int) -> None:
    loaded = load_logs([path], format_name)
    request_lines = {record.line for record in loaded.records}
    skip_lines = {skip.line for skip in loaded.skips}
    assert loaded.lines_read == n_lines
    assert len(loaded.skips) == len(skip_lines)  # one skip per skipped line
    assert not request_lines & skip_lines
    # A line is a request, a skip, or an answer joined to a request of another line.
    assert len(request_lines | skip_lines) + loaded.answers_joined == n_lines
    tokenizer, renderer = _tokenizing()
    tokenized = build_workload(loaded.records, tokenizer, renderer)
    assert tokenized.workload.n_requests + len(tokenized.skips) == len(loaded.records)


@pytest.mark.parametrize("name", JSON_FORMATS)
@FUZZ
@given(data=st.data())
def test_every_json_loader_accounts_for_every_line(data: st.DataObject, name: str) -> None:
    raw = [_line(data, name) for _ in range(data.draw(st.integers(1, 6)))]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "log.jsonl"
        path.write_bytes(b"\n".join(raw) + b"\n")
        _check_accounting(path, name, len(raw))


repr_values = st.recursive(
    scalars | st.text(max_size=10).map(repr),
    lambda children: (
        st.lists(children, max_size=3).map(lambda v: "[" + ", ".join(map(str, v)) + "]")
        | st.dictionaries(st.text(max_size=4).map(repr), children, max_size=3).map(
            lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
        )
    ),
    max_leaves=8,
).map(str)
VLLM_HEAD = "INFO 06-12 10:30:45 [logger.py:41] Received request chatcmpl-{}: prompt: "
VLLM_ANSWER = "INFO 06-12 10:30:46 [logger.py:71] Generated response chatcmpl-{}: output: "
SGLANG_HEAD = "[2025-06-12 10:30:45] Receive: obj=GenerateReqInput("


@pytest.mark.parametrize("name", ["vllm-log", "sglang-log"])
@FUZZ
@given(data=st.data())
def test_server_log_loaders_account_for_every_line(data: st.DataObject, name: str) -> None:
    out = []
    for i in range(data.draw(st.integers(1, 5))):
        value = data.draw(repr_values)
        kind = data.draw(st.integers(0, 3))
        if name == "vllm-log":
            line = VLLM_HEAD.format(i) + value
            if kind == 1:
                line += f", params: SamplingParams(n=1), prompt_token_ids: {data.draw(repr_values)}"
            elif kind == 2:
                line = f"{VLLM_ANSWER.format(i)}{value}"
        else:
            fields = f"text={value}, rid='{i}', sampling_params={data.draw(repr_values)}"
            line = SGLANG_HEAD + fields + ")"
            if kind == 2:
                line = (
                    f"[{data.draw(st.sampled_from(['2025-06-12 10:30:46', '0000-00-00 99:99']))}]"
                    f" Finish: obj=GenerateReqInput(rid='{i}'), out={{'meta_info': {value}}}"
                )
        if kind == 3:
            line = data.draw(st.text(max_size=40))
        out.append(line.replace("\n", " ").replace("\r", " "))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "server.log"
        path.write_text("\n".join(out) + "\n", encoding="utf-8", errors="surrogatepass")
        _check_accounting(path, name, len(out))
