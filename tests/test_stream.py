"""Streaming: a log replayed chunk by chunk through engine sessions gives the same figures as one
in-memory replay; the diagnosis covers the leading sample and the report says so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from analyzer.pipeline import AnalyzeOptions, analyze
from analyzer.replay import ReplaySettings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
TRACE = ROOT / "tests" / "fixtures" / "mooncake_trace.jsonl"


@pytest.mark.parametrize(
    ("path", "settings", "chunk", "sample"),
    [
        (EXAMPLE, ReplaySettings(capacity_tokens=6000), 37, 3000),
        (EXAMPLE, ReplaySettings(block_size=32, page_size=4, capacity_tokens=9000), 37, 3000),
        (TRACE, ReplaySettings(), 1, 1),
    ],
)
def test_streamed_equals_in_memory(
    path: Path, settings: ReplaySettings, chunk: int, sample: int
) -> None:
    options = AnalyzeOptions(settings=settings, chunk_records=chunk)
    whole = analyze([path], options)
    streamed = analyze([path], replace(options, sample_tokens=sample))
    a, b = whole.report.to_dict(), streamed.report.to_dict()
    for key in ("requests", "prompt_tokens", "output_tokens", "engines", "ceiling"):
        assert a[key] == b[key], key
    assert a["alignment_loss"] == b["alignment_loss"]
    # padding is measured by the diagnosis, on its sample
    assert [{**p, "padding_saves": None} for p in a["shared_prefixes"]] == [
        {**p, "padding_saves": None} for p in b["shared_prefixes"]
    ]
    columns = ["vllm_hit", "sglang_hit", "ceiling_hit", "vllm_evicted_blocks", "sglang_node_splits"]
    assert whole.per_request.select(columns).equals(streamed.per_request.select(columns))

    assert a["diagnosis_scope"]["whole_log"] is True
    scope = b["diagnosis_scope"]
    assert scope["whole_log"] is False
    assert scope["requests"] < b["requests"]
    assert sample <= scope["prompt_tokens"] < b["prompt_tokens"]
    assert any("The log was streamed" in note for note in b["notes"])
    # The diagnosis's losses add up, on its sample, to prompt minus hit tokens.
    sample = streamed.per_request.head(scope["requests"])
    for engine in ("vllm", "sglang"):
        lost = sum(entry["tokens"] for entry in b["losses"][engine].values())
        hits = int(sample[f"{engine}_hit"].sum())
        assert lost == scope["prompt_tokens"] - hits
        tail = streamed.per_request[scope["requests"] :][f"{engine}_lost_eviction"]
        assert tail.null_count() == len(tail)


def test_chunks_share_namespaces_and_unknown_tokens(tmp_path: Path) -> None:
    lines = [
        '{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9], "cache_salt": "a", "output_length": 4}',
        '{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "cache_salt": "b"}',
        '{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 11], "cache_salt": "a"}',
        '{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 12], "output_length": 2}',
        '{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 13]}',
    ]
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(lines) + "\n")
    options = AnalyzeOptions(settings=ReplaySettings(block_size=4), chunk_records=1)
    whole = analyze([log], options)
    streamed = analyze([log], replace(options, sample_tokens=1))
    for result in (whole, streamed):
        # the salted "a" requests share, "b" and the unsalted ones have their own namespaces
        assert result.per_request["sglang_hit"].to_list() == [0, 0, 9, 0, 9]
    assert np.array_equal(
        whole.per_request["vllm_hit"].to_numpy(), streamed.per_request["vllm_hit"].to_numpy()
    )


# The figures a streamed run computes over the whole log (the rest is the diagnosis of its sample).
WHOLE_LOG_KEYS = (
    "inputs",
    "replay_mode",
    "requests",
    "prompt_tokens",
    "output_tokens",
    "skipped",
    "engines",
    "ceiling",
    "alignment_loss",
    "block_size",
    "shared_prefixes",
    "models",
    "server_comparison",
    "prefill_estimate",
)


@pytest.mark.parametrize(
    "settings", [ReplaySettings(), ReplaySettings(capacity_tokens=64, page_size=2)]
)
def test_streamed_logs_of_several_models_equal_in_memory(settings: ReplaySettings) -> None:
    """Two files, two models (one named, one not): each model keeps its own caches across chunks,
    and every whole-log figure of the report is the in-memory run's."""
    paths = [ROOT / "tests" / "fixtures" / "openai_chat.jsonl"]
    paths.append(ROOT / "tests" / "fixtures" / "vllm_server.log")
    options = AnalyzeOptions(settings=settings, chunk_records=1)
    whole = analyze(paths, options)
    streamed = analyze(paths, replace(options, sample_tokens=1))
    a, b = whole.report.to_dict(), streamed.report.to_dict()
    assert len(a["models"]) == 2
    assert b["diagnosis_scope"]["whole_log"] is False
    for key in WHOLE_LOG_KEYS:
        assert a[key] == b[key], key
    assert whole.per_request.drop([c for c in whole.per_request.columns if "_lost_" in c]).equals(
        streamed.per_request.drop([c for c in streamed.per_request.columns if "_lost_" in c])
    )
