"""Every log format: its fixture (tests/fixtures, written from each tool's own field names and log
lines) is detected and yields the right requests; bad and mixed lines give reasons and lines."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import zstandard

from analyzer.errors import PrefixcheckError, StrictModeError
from analyzer.loaders import detect_format, hash_trace, load_logs
from analyzer.loaders.mapped import FieldMap

FIXTURES = Path(__file__).parent / "fixtures"


def load(*names: str, **kwargs: object):  # type: ignore[no-untyped-def]
    return load_logs([FIXTURES / name for name in names], **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("openai_chat.jsonl", "openai"),
        ("openai_batch_input.jsonl", "openai-batch"),
        ("openai_batch_output.jsonl", "openai-batch"),
        ("anthropic_messages.jsonl", "anthropic"),
        ("litellm_payloads.jsonl", "litellm"),
        ("langfuse_observations.json", "langfuse"),
        ("helicone_export.jsonl", "helicone"),
        ("sharegpt.json", "sharegpt"),
        ("lmsys_chat.jsonl", "lmsys"),
        ("vllm_server.log", "vllm-log"),
        ("sglang_server.log", "sglang-log"),
        ("bailian_trace.jsonl", "bailian-trace"),
        ("mooncake_trace.jsonl", "hash-trace"),
        ("prompts.jsonl", "prompt"),
        ("tokens.jsonl", "tokens"),
        ("vllm_server_v0_3.log", "vllm-log"),
        ("vllm_server_v0_33.log", "vllm-log"),
        ("litellm_spend_logs.jsonl", "litellm"),
        ("openai_cache_control.jsonl", "openai"),
        ("sharegpt_system.json", "sharegpt"),
        ("langfuse_batch_export.jsonl", "langfuse"),
        ("langfuse_api_observations.json", "langfuse"),
        ("helicone_export.json", "helicone"),
        ("helicone_export.csv", "helicone"),
    ],
)
def test_each_fixture_is_detected(name: str, expected: str) -> None:
    assert detect_format(FIXTURES / name).name == expected


def test_openai_requests_and_responses() -> None:
    loaded = load("openai_chat.jsonl")
    first, second, third = loaded.records
    assert first.messages[1]["content"] == "My deploy of p-1042 fails with exit code 137."
    assert first.tools[0]["function"]["name"] == "get_status"
    assert (first.tenant, first.server_cached_tokens, first.finish_reason) == (
        "team-alpha",
        0,
        "stop",
    )
    assert first.output_text.startswith("Exit code 137")
    assert first.arrival_s == pytest.approx(1767225600.12)
    assert (second.cache_salt, second.tenant) == ("tenant-b", "support-v3")
    assert second.chat_template_kwargs == {"enable_thinking": False}
    assert second.server_cached_tokens == 224
    assert second.finish_reason == "tool_calls" and second.output_text is None
    assert third.output_text is None and third.server_cached_tokens is None
    assert loaded.skips == []


def test_batch_input_joined_with_its_output() -> None:
    loaded = load("openai_batch_input.jsonl", "openai_batch_output.jsonl")
    assert [r.request_id for r in loaded.records] == ["req-001", "req-002"]
    assert [r.output_text for r in loaded.records] == ["billing", "outage"]
    assert loaded.answers_joined == 2
    (skip,) = loaded.skips
    assert skip.line == 3 and "/v1/embeddings" in skip.reason


def test_batch_output_alone_names_the_missing_requests() -> None:
    loaded = load("openai_batch_output.jsonl")
    assert loaded.records == []
    assert [s.line for s in loaded.skips] == [1, 2]
    assert "no request line has" in loaded.skips[0].reason


def test_anthropic_converted_like_vllms_messages_endpoint() -> None:
    first, second = load("anthropic_messages.jsonl").records
    assert first.messages[0] == {
        "role": "system",
        "content": "You are a code reviewer for the Acme monorepo.",
    }
    assert first.tools[0]["function"]["parameters"]["required"] == ["path"]
    assert first.tenant == "user-77" and first.finish_reason == "tool_calls"
    assert first.max_new_tokens == 1024  # the body's max_tokens
    roles = [m["role"] for m in second.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    call = second.messages[2]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"path": "api/handlers.py"}
    assert second.messages[3]["tool_call_id"] == "toolu_01"
    assert second.server_cached_tokens == 380
    assert second.output_text == "The handler passes an unchecked id straight to the database."


def test_litellm_payloads() -> None:
    loaded = load("litellm_payloads.jsonl")
    (record,) = loaded.records
    assert record.tenant == "team-search" and record.model == "llama-3.1-8b"
    assert record.server_cached_tokens == 32 and record.arrival_s == 1767228000.25
    (skip,) = loaded.skips
    assert skip.line == 2 and skip.reason.startswith("failed call, not served (RateLimitError")


def test_langfuse_generations_and_skipped_spans() -> None:
    loaded = load("langfuse_observations.json")
    first, second = loaded.records
    assert first.output_text == "Refunds are possible within 30 days of purchase."
    assert (first.server_cached_tokens, first.tenant, first.finish_reason) == (
        384,
        "cust-31",
        "stop",
    )
    assert first.arrival_s == pytest.approx(1767261600.25)
    assert second.tools is not None and second.output_text.startswith("Yes")
    (skip,) = loaded.skips
    assert skip.line == 1 and skip.reason == "a SPAN observation, not a generation"


def test_langfuse_batch_export_and_api_response() -> None:
    # langfuse_batch_export.jsonl: the observations table's batch export (JSONL), one agent run
    # with the fields worker/src/features/database-read-stream/observation-stream.ts writes
    # (convertObservation's camelCase fields, traceName/userId from the trace, prices, scores,
    # comments); the OpenAI integration's input {"tools", "messages"} and output message.
    loaded = load("langfuse_batch_export.jsonl")
    first, second = loaded.records
    assert first.output_text is None and first.output_message is not None
    assert first.output_message["tool_calls"][0]["function"]["name"] == "get_order"
    assert first.tools is not None and first.tenant == "cust-88" and first.request_id == "obs-g1"
    assert second.messages[2]["tool_calls"] == first.output_message["tool_calls"]
    assert (second.server_cached_tokens, second.output_length) == (128, 15)
    assert [(s.line, s.reason) for s in loaded.skips] == [
        (1, "an AGENT observation, not a generation"),
        (3, "a TOOL observation, not a generation"),
        (5, "an EVENT observation, not a generation"),
    ]
    # langfuse_api_observations.json: GET /api/public/observations saved as it came
    # ({"data": [...], "meta": {...}}, pretty-printed), with a completion whose input is a prompt.
    loaded = load("langfuse_api_observations.json")
    chat, completion = loaded.records
    assert chat.output_message is not None and chat.tenant is None  # API items carry no userId
    assert completion.prompt.startswith("Summarise:") and completion.output_text.startswith("It")
    assert [s.reason for s in loaded.skips] == ["a TOOL observation, not a generation"]


def test_helicone_export_json_and_csv(tmp_path: Path) -> None:
    # helicone_export.json / .csv: `npx @helicone/export --include-body` as
    # examples/export/typescript/index.ts of Helicone's repository writes them (rows of
    # /v1/request/query-clickhouse): the JSON form with a comma before "]", the CSV form with
    # convertToCSVRow's columns (no response body, quotes of the JSON doubled twice).
    loaded = load("helicone_export.json")
    call, answer = loaded.records
    assert call.output_message is not None and call.finish_reason == "tool_calls"
    assert answer.output_text.startswith("Order A-1001") and answer.server_cached_tokens == 128
    assert (call.request_id, call.tenant, call.model) == ("hreq-1", "cust-88", "gpt-4o-mini")
    (skip,) = loaded.skips
    assert skip.line == 3 and "no 'messages'" in skip.reason  # an embeddings request
    rows = load("helicone_export.csv").records
    assert [r.line for r in rows] == [2, 3]
    assert [len(r.messages) for r in rows] == [2, 4] and rows[1].tools is not None
    assert [(r.output_length, r.output_text) for r in rows] == [(18, None), (15, None)]
    # Without --include-body the rows hold no request body: a reasoned skip.
    bare = tmp_path / "export.jsonl"
    bare.write_text(
        json.dumps(
            {
                "request_id": "h",
                "request_created_at": "2026-01-03T09:00:00Z",
                "request_body": {},
                "response_body": {},
            }
        )
        + "\n"
    )
    (skip,) = load_logs([bare]).skips
    assert "--include-body" in skip.reason


def test_helicone_export() -> None:
    (record,) = load("helicone_export.jsonl").records
    assert record.tenant == "alice@example.com" and record.server_cached_tokens == 64
    assert record.output_text == "Open Settings > API keys and press Rotate."
    assert record.request_id == "hreq-1" and record.arrival_s == pytest.approx(1767340800.5)


@pytest.mark.parametrize(
    ("names", "prompt_tokens"),
    [
        (("openai_chat.jsonl",), [233, 236, None]),  # usage.prompt_tokens
        (("openai_batch_input.jsonl", "openai_batch_output.jsonl"), [30, 31]),  # joined by id
        # Anthropic's input_tokens leaves out the cache writes and reads: 412 + 380, 40 + 380.
        (("anthropic_messages.jsonl",), [792, 420]),
        (("litellm_payloads.jsonl",), [52]),
        # Langfuse: total less output (input includes the cached 384 in the first; none cached).
        (("langfuse_observations.json",), [410, 395]),
        (("helicone_export.jsonl",), [80]),
        # Langfuse's OpenAI integration splits the cached 128 off input: 155 total - 15 output.
        (("langfuse_batch_export.jsonl",), [95, 140]),
        (("langfuse_api_observations.json",), [95, 11]),
        (("helicone_export.json",), [95, 140]),
        (("helicone_export.csv",), [95, 140]),  # the CSV's prompt_tokens column
        (("sglang_server.log",), [26, 26]),  # meta_info.prompt_tokens, joined by rid
        (("vllm_server.log",), [None, None]),  # vLLM's log has no usage
    ],
)
def test_server_prompt_token_counts(names: tuple[str, ...], prompt_tokens: list) -> None:
    assert [r.server_prompt_tokens for r in load(*names).records] == prompt_tokens


def test_conversations_expand_to_one_request_per_assistant_turn() -> None:
    sharegpt = load("sharegpt.json").records
    assert len(sharegpt) == 3
    assert [len(r.messages) for r in sharegpt] == [2, 4, 1]
    assert sharegpt[1].messages[-1] == {"role": "user", "content": "Add a tea ceremony."}
    assert sharegpt[1].output_text.startswith("Book the tea ceremony")
    assert {r.line for r in sharegpt} == {1, 2}
    lmsys = load("lmsys_chat.jsonl").records
    assert [(r.model, len(r.messages)) for r in lmsys] == [
        ("vicuna-13b", 1),
        ("llama-2-13b-chat", 1),
        ("llama-2-13b-chat", 3),
    ]


def test_vllm_server_log() -> None:
    loaded = load("vllm_server.log")
    first, second = loaded.records
    assert first.request_id == "chatcmpl-4d1f0c2a" and len(first.prompt_token_ids) == 30
    assert first.prompt is None
    assert first.output_text == "SELECT count(*) FROM customers WHERE country = 'NO';"
    assert first.output_token_ids[-1] == 151645 and first.finish_reason == "stop"
    assert second.prompt.startswith("<|im_start|>system\nYou are a SQL assistant.")
    assert (second.lora, second.add_special_tokens) == ("sql-lora", False)
    assert second.arrival_s - first.arrival_s == 3
    assert loaded.answers_joined == 1
    reasons = {s.reason.split(" (")[0] for s in loaded.skips}
    assert reasons == {"not a 'Received request' or 'Generated response' line", "streaming delta"}
    assert len(loaded.skips) == 6


def test_sglang_server_log() -> None:
    loaded = load("sglang_server.log")
    first, second = loaded.records
    assert first.prompt.endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert (first.output_text, first.server_cached_tokens, first.finish_reason) == ("4", 0, "stop")
    assert first.output_token_ids == [19, 151645]
    assert second.prompt is None and second.prompt_token_ids[0] == 151644
    assert (first.lora, second.lora, second.server_cached_tokens) == ("math-lora", "math-lora", 17)
    assert (first.server_prompt_tokens, second.server_prompt_tokens) == (26, 26)
    assert second.arrival_s - first.arrival_s == 2
    truncated = [s for s in loaded.skips if s.line == 7]
    assert truncated and "truncated" in truncated[0].reason


def test_hash_traces() -> None:
    bailian = load("bailian_trace.jsonl").records
    prompts = [hash_trace.expanded(r.hash_blocks)[0] for r in bailian]
    assert [len(p) for p in prompts] == [40, 70]
    assert np.array_equal(prompts[0][:32], prompts[1][:32])
    assert prompts[0][32] != prompts[1][32]
    assert bailian[1].arrival_s == 2.5 and bailian[1].request_id == "1"
    mooncake = load("mooncake_trace.jsonl").records
    assert mooncake[1].arrival_s == 0.25 and mooncake[1].hash_blocks.prompt_length == 1600
    assert len(hash_trace.expanded(mooncake[1].hash_blocks)[0]) == 1600


def test_compressed_parquet_and_folders(tmp_path: Path) -> None:
    source = (FIXTURES / "openai_chat.jsonl").read_bytes()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(source))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(source))
    rows = [json.loads(line) for line in source.splitlines()]
    frame = pl.DataFrame(
        {
            "timestamp": [r.get("timestamp") for r in rows],
            "messages": [json.dumps((r.get("request") or r)["messages"]) for r in rows],
            "model": [(r.get("request") or r)["model"] for r in rows],
        }
    )
    frame.write_parquet(tmp_path / "c.parquet")
    loaded = load_logs([tmp_path])
    assert loaded.formats == {
        str(tmp_path / "a.jsonl.gz"): "openai",
        str(tmp_path / "b.jsonl.zst"): "openai",
        str(tmp_path / "c.parquet"): "openai",
    }
    assert len(loaded.records) == 9 and loaded.skips == []
    assert loaded.records[6].messages[1]["content"].startswith("My deploy")
    assert load_logs([str(tmp_path / "*.zst")]).formats == {str(tmp_path / "b.jsonl.zst"): "openai"}


def test_standard_input() -> None:
    code = (
        "from analyzer.loaders import load_logs\n"
        "loaded = load_logs(['-'])\n"
        "print(len(loaded.records), loaded.formats)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=(FIXTURES / "lmsys_chat.jsonl").read_bytes(),
        capture_output=True,
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    assert result.stdout.decode().strip() == "3 {'-': 'lmsys'}"


def test_field_mapping(tmp_path: Path) -> None:
    log = tmp_path / "custom.jsonl"
    rows = [
        {
            "ts": "2026-01-01T00:00:01Z",
            "org": {"id": "o1"},
            "payload": {"input": {"chat": [{"role": "user", "content": "hi"}]}},
            "k": "s",
        },
        {"ts": "2026-01-01T00:00:02Z", "org": {"id": "o2"}, "payload": {"input": {"chat": "oops"}}},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = FieldMap(messages="payload.input.chat", time="ts", tenant="org.id", salt="k")
    loaded = load_logs([log], fields=fields)
    assert loaded.formats == {str(log): "mapped"}
    (record,) = loaded.records
    assert (record.tenant, record.cache_salt, record.arrival_s) == ("o1", "s", 1767225601.0)
    (skip,) = loaded.skips
    assert (skip.line, skip.reason) == (2, "field 'messages' must be a list")
    overridden = load("prompts.jsonl", fields=FieldMap(tenant="model"))
    assert overridden.records[0].tenant == "qwen2.5-7b-instruct"


def test_mixed_formats_name_the_line(tmp_path: Path) -> None:
    log = tmp_path / "mixed.jsonl"
    shutil.copy(FIXTURES / "openai_chat.jsonl", log)
    with log.open("a") as handle:
        handle.write(json.dumps({"prompt_token_ids": [1, 2]}) + "\n{broken\n")
    loaded = load_logs([log])
    assert len(loaded.records) == 3
    first, second = loaded.skips
    assert (first.line, second.line) == (4, 5)
    assert first.reason.startswith("a 'tokens' line in a 'openai' file (mixed formats")
    assert second.reason.startswith("malformed JSON")
    with pytest.raises(StrictModeError, match=r"mixed\.jsonl:4: a 'tokens' line"):
        load_logs([log], strict=True)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', "not UTF-8 text"),
        (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON nested too deeply"),
        (b'{"prompt_token_ids": [1' + b"0" * 5000 + b"]}", "an integer of over 4,300 digits"),
    ],
)
def test_a_log_of_unreadable_lines_says_why_the_first_is(
    tmp_path: Path, line: bytes, why: str
) -> None:
    """No format is found when no line reads: the error names the first line and its reason,
    not only that no format matched."""
    (tmp_path / "bad.jsonl").write_bytes(line + b"\n" + line + b"\n")
    with pytest.raises(PrefixcheckError, match=rf"in the first 2 lines; .*bad\.jsonl:1: .*{why}"):
        load_logs([tmp_path / "bad.jsonl"])


def test_unknown_and_empty_inputs(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(PrefixcheckError, match="empty input"):
        load_logs([tmp_path / "empty.jsonl"])
    (tmp_path / "text.log").write_text("just some text\n")
    with pytest.raises(PrefixcheckError, match="no JSON object and no vLLM/SGLang request line"):
        load_logs([tmp_path / "text.log"])
    with pytest.raises(PrefixcheckError, match="no file matches"):
        load_logs([str(tmp_path / "*.nothing")])
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(PrefixcheckError, match="cannot decompress"):
        load_logs([tmp_path / "bad.jsonl.gz"])


def test_langfuse_prompt_count_under_either_input_convention() -> None:
    from analyzer.loaders.langfuse import _prompt_tokens

    cached_inside = {"input": 410, "input_cached_tokens": 384, "output": 12, "total": 422}
    cached_apart = {"input": 26, "input_cached_tokens": 384, "output": 12, "total": 422}
    with_reasoning = {"input": 26, "output": 12, "output_reasoning_tokens": 30, "total": 68}
    assert [_prompt_tokens(u) for u in (cached_inside, cached_apart, with_reasoning)] == [
        410,
        410,
        26,
    ]
    assert _prompt_tokens({"input": 26, "output": 12}) is None  # no total: unknown


def test_vllm_0_3_log_spells_prompt_token_ids_with_spaces() -> None:
    # vllm_server_v0_3.log: the line vLLM 0.2-0.3 writes (vllm/engine/async_llm_engine.py,
    # AsyncLLMEngine.add_request: "Received request ...: prompt: ..., sampling params: ...,
    # prompt token ids: ...").
    result = load("vllm_server_v0_3.log")
    assert len(result.records) == 1
    assert result.records[0].prompt_token_ids[:3] == [151644, 872, 198]
    assert result.skips[0].reason.startswith("not a 'Received request'")


def test_vllm_0_33_log_joins_the_debug_details_line() -> None:
    # vllm_server_v0_33.log: RequestLogger.log_inputs / log_outputs of vLLM 0.33
    # (vllm/entrypoints/serve/utils/request_logger.py): prompt and ids on a DEBUG line, the
    # parameters and LoRA on the INFO line, the answer's ids on a DEBUG line of their own.
    result = load("vllm_server_v0_33.log")
    (record,) = result.records
    assert record.prompt_token_ids[-3:] == [151644, 77091, 198]
    assert record.lora == "support"
    assert record.output_token_ids == [9707, 0, 151645]
    assert record.output_text == "Hello!" and record.finish_reason == "stop"
    reasons = [s.reason for s in result.skips]
    assert any("chatcmpl-77aa: vLLM logged no prompt" in r for r in reasons)


def test_litellm_times_as_date_strings_and_tool_call_answers() -> None:
    # litellm_spend_logs.jsonl: LiteLLM_SpendLogs rows (litellm/proxy/schema.prisma, startTime
    # DateTime) as the proxy's /spend/logs API returns them, ISO strings with or without "T".
    first, second = load("litellm_spend_logs.jsonl").records
    assert first.arrival_s == 1767225600.25 and second.arrival_s == 1767225605.5
    assert first.request_id == "chatcmpl-sl-1" and first.server_prompt_tokens == 21
    assert second.output_message["tool_calls"][0]["function"]["name"] == "get_weather"


def test_openai_parts_with_cache_control_stay_openai() -> None:
    # openai_cache_control.jsonl: OpenAI chat bodies with cache_control on text parts, as
    # LiteLLM's prompt-caching docs send them to OpenAI-compatible servers.
    result = load("openai_cache_control.jsonl")
    assert len(result.records) == 2 and not result.skips
    assert result.records[1].server_cached_tokens == 16


def test_sharegpt_top_level_system() -> None:
    # sharegpt_system.json: the "system" column of LLaMA-Factory's ShareGPT format
    # (data/README.md) and FastChat's conversation records.
    records = load("sharegpt_system.json").records
    assert [len(r.messages) for r in records] == [2, 4]
    assert records[0].messages[0] == {"role": "system", "content": "You are a terse assistant."}
