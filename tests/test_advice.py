"""Advice that applies: each recommendation helps the engines it names by a measured saving,
says why in one line, and never suggests what does not apply (another engine, a vLLM block size
its default attention backend cannot run, padding the replay scores negative)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.diagnose.recommend import MIN_GAIN_SHARE, VLLM_BLOCK_MULTIPLE
from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
runner = CliRunner()


def report_of(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["analyze", str(EXAMPLE), *flags, "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def unbounded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return report_of(tmp_path_factory.mktemp("advice"))


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return report_of(tmp_path_factory.mktemp("advice"), "--capacity-tokens", "3000")


def test_recommendations_apply_and_are_ranked(small_cache: dict) -> None:
    items = small_cache["recommendations"]
    assert {item["kind"] for item in items} >= {"capacity", "move_dynamic_content", "salt"}
    floor = MIN_GAIN_SHARE * small_cache["prompt_tokens"]
    best = []
    for item in items:
        assert item["kind"] != "engine"  # switching engines is not a fix of the log
        assert item["why"] and "\n" not in item["why"]
        saved = {e: g["recomputed_tokens_saved"] for e, g in item["measured"].items()}
        assert (
            item["engines"] == sorted((e for e in saved if saved[e] >= floor), key=saved.get)[::-1]
        )
        for engine in ("vllm", "sglang"):
            label = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
            assert (f"{label} " in item["summary"].split(": ", 1)[-1]) == (
                engine in item["engines"]
            ), item["summary"]
        if item["kind"] == "block_size" and item["details"]["engine"] == "vllm":
            assert item["details"]["size_after"] % VLLM_BLOCK_MULTIPLE == 0
        best.append(max(saved[e] for e in item["engines"]))
    assert best == sorted(best, reverse=True)


def test_salt_advice_names_the_timing_attack(small_cache: dict) -> None:
    [salt] = [item for item in small_cache["recommendations"] if item["kind"] == "salt"]
    assert "timing attack" in salt["why"] and "trust" in salt["why"]


def test_capacity_advice_in_bytes_of_kv(small_cache: dict) -> None:
    [item] = [i for i in small_cache["recommendations"] if i["kind"] == "capacity"]
    details = item["details"]
    per_token = small_cache["prefill_estimate"]["kv_bytes_per_token"]
    assert details["kv_bytes_per_token"] == per_token
    assert details["capacity_bytes_after"] == details["capacity_tokens_after"] * per_token
    assert details["model_shape"] == "llama-3.1-8b"
    gib = details["capacity_bytes_after"] / 2**30
    assert f"{gib:,.3g} GiB of KV on llama-3.1-8b" in item["summary"]


def test_no_small_vllm_block_or_engine_switch_by_default(unbounded: dict, tmp_path: Path) -> None:
    """The example gains from --block-size 8 and from SGLang's page 1, and neither is advice:
    FlashAttention needs multiples of 16, and the engine is the user's choice."""
    report = unbounded
    sweep = {p["size"]: p["hit_tokens"] for p in report["block_size_sweep"]["vllm"]}
    assert sweep[8] - sweep[16] > MIN_GAIN_SHARE * report["prompt_tokens"]
    assert not [i for i in report["recommendations"] if i["kind"] in ("block_size", "engine")]
    coarse = report_of(tmp_path, "--block-size", "64")
    [size] = [i for i in coarse["recommendations"] if i["kind"] == "block_size"]
    assert size["details"]["size_after"] in (16, 32)


def test_padding_is_only_advised_where_the_replay_gains(unbounded: dict) -> None:
    padded = {
        item["details"]["prefixes"][0]["prefix_tokens"]: item
        for item in unbounded["recommendations"]
        if item["kind"] == "pad_prefix"
    }
    measured = [p for p in unbounded["shared_prefixes"] if p["padding_saves"] is not None]
    assert measured and any(p["padding_saves"] <= 0 for p in measured)
    for prefix in measured:
        if prefix["padding_saves"] <= 0:
            assert prefix["tokens"] not in padded


def test_markdown_pads_only_where_the_replay_gains_and_says_why(unbounded: dict) -> None:
    from cli.outputs import markdown

    text = markdown(unbounded)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    leads: dict[int, dict] = {}
    for prefix in unbounded["shared_prefixes"]:
        leads.setdefault(prefix["template"], prefix)
    assert len(rows) == len(leads)  # one row per template
    for row, prefix in zip(rows, leads.values(), strict=True):
        pad = row.rstrip(" |").rsplit("|", 1)[-1].strip()
        gains = (prefix["padding_saves"] or 0) > 0
        assert pad == (f"+{prefix['padding']}" if gains else "-" if prefix["padding"] else "0")
    for item in unbounded["recommendations"]:
        assert f"*why: {item['why']}*" in text
