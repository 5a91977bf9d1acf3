"""End to end on a log with planted causes (``tests/planted_causes.py``): the report names each
cause with the figures the plant implies, every recommendation's gain is what a replay of the
fixed log gives (the fixed log is built here, from the plant, and run through the CLI), and the
losses agree with brute-force ceilings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from analyzer.diagnose.recommend import MIN_GAIN_SHARE
from analyzer.tokenizer import load_tokenizer
from cache_models.workload import Workload
from cli.main import app
from tests.planted_causes import (
    AUDIT_HEAD,
    AUDIT_STATIC,
    SYSTEM_TOKENS,
    TIMESTAMP_AT,
    TIMESTAMP_TOKENS,
    planted_requests,
)
from tests.test_prefix_trie import brute_force_ceiling

CAPACITY = 300  # tokens: far below the working set (the curve needs ~600 for 95% of the hits)
PAD = 10**9  # a padding token no prompt holds
runner = CliRunner()


def run(*args: object) -> dict[str, Any]:
    """``prefixcheck analyze`` on ``args``; the JSON report."""
    out = Path(str(args[0])).with_suffix(f".{abs(hash(args))}.json")
    result = runner.invoke(app, ["analyze", *map(str, args), "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def tokens_log(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The planted log as text, the same requests as token ids, and the report."""
    folder = tmp_path_factory.mktemp("planted")
    requests = planted_requests()
    text_log = tokens_log(folder / "planted.jsonl", [r.line for r in requests])
    tokenizer = load_tokenizer(None)
    eos = tokenizer.token_id("<|im_end|>")
    rows = []
    for request in requests:
        line = request.line
        prompt = tokenizer.encode_batch([line["prompt"]], add_special_tokens=True)[0]
        answer = tokenizer.encode_batch([line["output"]], add_special_tokens=False)[0]
        row = {
            "prompt_token_ids": prompt.tolist(),
            "output_token_ids": [*answer.tolist(), eos],
            "finish_reason": "stop",
            "timestamp": line["timestamp"],
        }
        if "cache_salt" in line:
            row["cache_salt"] = line["cache_salt"]
        rows.append(row)
    report = run(text_log, "--capacity-tokens", CAPACITY, "--check-curves")
    return {"folder": folder, "requests": requests, "rows": rows, "report": report}


def replay_rows(plant: dict[str, Any], name: str, rows: list[dict], *flags: object) -> dict:
    return run(tokens_log(plant["folder"] / f"{name}.jsonl", rows), "--format", "tokens", *flags)


def static_tokens() -> int:
    """Tokens of the audit template from the end of the timestamp to "Task:"."""
    text = AUDIT_HEAD + "2026-03-04T05:06:07" + AUDIT_STATIC
    ids = load_tokenizer(None).encode_batch([text], add_special_tokens=True)[0]
    return len(ids) - TIMESTAMP_AT - TIMESTAMP_TOKENS


def test_token_ids_reproduce_the_text_log(plant: dict[str, Any]) -> None:
    """The fixed logs below are token-id logs; the unfixed one replays exactly like the text."""
    again = replay_rows(plant, "tokens", plant["rows"], "--capacity-tokens", CAPACITY)
    for engine in ("vllm", "sglang"):
        assert (
            again["engines"][engine]["hit_tokens"]
            == plant["report"]["engines"][engine]["hit_tokens"]
        )


def test_names_the_planted_template_and_value(plant: dict[str, Any]) -> None:
    report, requests = plant["report"], plant["requests"]
    template_a = [r for r in requests if r.template == "A"]
    template_b = [r for r in requests if r.template == "B"]
    salted = sum(r.salted for r in template_a)
    found = {(p["namespace"], p["tokens"]): p for p in report["shared_prefixes"]}
    plain, tenant = found[("", SYSTEM_TOKENS)], found[("cache_salt=tenant-b", SYSTEM_TOKENS)]
    assert (plain["requests"], tenant["requests"]) == (len(template_a) - salted, salted)
    assert plain["remainder"] == SYSTEM_TOKENS % 16 == 5 and plain["padding"] == 11
    assert plain["covered_tokens"] == SYSTEM_TOKENS * plain["requests"]
    assert "Northwind" in plain["snippet"]
    assert not any(p["tokens"] < SYSTEM_TOKENS for p in report["shared_prefixes"])

    [site] = report["dynamic_content"]
    assert site["position"] == TIMESTAMP_AT
    assert site["kind"] == "iso_datetime"
    assert site["requests"] == len(template_b)
    assert site["value_tokens"] == TIMESTAMP_TOKENS
    assert site["static_tokens_after"] == static_tokens()
    assert site["examples"][0].startswith("2026-03-04T")

    pads = [r for r in report["recommendations"] if r["kind"] == "pad_prefix"]
    assert pads[0]["details"]["prefixes"] == [
        {
            "prefix_tokens": SYSTEM_TOKENS,
            "padding_tokens": 11,
            "insert_at_token": SYSTEM_TOKENS,
            "requests": len(template_a),
        }
    ]
    kinds = {r["kind"] for r in report["recommendations"]}
    assert {"pad_prefix", "move_dynamic_content", "salt", "capacity"} <= kinds


def fixed_rows(plant: dict[str, Any], recommendation: dict[str, Any]) -> tuple[list[dict], list]:
    """The log with a recommendation applied, built from the plant, and the flags to replay it."""
    rows, requests = plant["rows"], plant["requests"]
    kind, details = recommendation["kind"], recommendation["details"]
    flags: list = ["--capacity-tokens", CAPACITY]
    fixed = [dict(row) for row in rows]
    if kind == "pad_prefix":
        [prefix] = details["prefixes"]
        at, pad = prefix["insert_at_token"], prefix["padding_tokens"]
        system = rows[next(i for i, r in enumerate(requests) if r.template == "A")]
        head = system["prompt_token_ids"][:at]
        for row in fixed:
            ids = row["prompt_token_ids"]
            if ids[:at] == head and len(ids) > at:
                row["prompt_token_ids"] = ids[:at] + [PAD] * pad + ids[at:]
    elif kind == "move_dynamic_content":
        start, end = TIMESTAMP_AT, TIMESTAMP_AT + TIMESTAMP_TOKENS
        static_end = end + static_tokens()
        for row, request in zip(fixed, requests, strict=True):
            if request.template == "B":
                ids = row["prompt_token_ids"]
                row["prompt_token_ids"] = (
                    ids[:start] + ids[end:static_end] + ids[start:end] + ids[static_end:]
                )
    elif kind == "salt":
        for row in fixed:
            row.pop("cache_salt", None)
    elif kind == "capacity":
        flags = ["--capacity-tokens", details["capacity_tokens_after"]]
    elif kind == "block_size":
        flag = "--block-size" if details["engine"] == "vllm" else "--page-size"
        flags += [flag, details["size_after"]]
    else:
        raise AssertionError(f"no fixed log for {kind}")
    return fixed, flags


def test_every_gain_is_a_replay_of_the_fixed_log(plant: dict[str, Any]) -> None:
    report = plant["report"]
    assert report["recommendations"]
    for index, recommendation in enumerate(report["recommendations"]):
        rows, flags = fixed_rows(plant, recommendation)
        replayed = replay_rows(plant, f"fixed{index}", rows, *flags)
        floor = MIN_GAIN_SHARE * report["prompt_tokens"]
        helped = recommendation["engines"]
        assert helped and recommendation["why"]
        for engine, gain in recommendation["measured"].items():
            after = replayed["engines"][engine]["hit_tokens"]
            assert gain["hit_tokens_before"] == report["engines"][engine]["hit_tokens"]
            assert gain["hit_tokens_after"] == after, recommendation["summary"]
            assert gain["prompt_tokens_after"] == replayed["prompt_tokens"]
            saved = (gain["prompt_tokens_before"] - gain["hit_tokens_before"]) - (
                gain["prompt_tokens_after"] - gain["hit_tokens_after"]
            )
            assert gain["recomputed_tokens_saved"] == saved
            # shown (and counted) only for the engines it saves tokens on
            assert (engine in helped) == (saved >= floor), recommendation["summary"]
            if engine in helped:
                assert f"{gain['hit_rate_after']:.1%}" in recommendation["summary"]


def test_losses_add_up_and_match_brute_force(plant: dict[str, Any]) -> None:
    report, rows = plant["report"], plant["rows"]
    prompt = report["prompt_tokens"]
    for engine in ("vllm", "sglang"):
        losses = {kind: entry["tokens"] for kind, entry in report["losses"][engine].items()}
        assert sum(losses.values()) == prompt - report["engines"][engine]["hit_tokens"]
        assert report["loss_totals"][engine]["clamped_requests"] == 0
        assert losses["last_token"] == len(rows)

    def ceiling(prompts: list[list[int]], salted: bool) -> int:
        salts = {None: 0, "tenant-b": 1}
        workload = Workload.from_lists(
            prompts,
            [row["output_token_ids"] for row in rows],
            namespace=[salts[row.get("cache_salt")] if salted else 0 for row in rows],
        )
        return sum(brute_force_ceiling(workload))

    prompts = [row["prompt_token_ids"] for row in rows]
    constant = [
        ids[:TIMESTAMP_AT] + [PAD] * TIMESTAMP_TOKENS + ids[TIMESTAMP_AT + TIMESTAMP_TOKENS :]
        if request.template == "B"
        else ids
        for ids, request in zip(prompts, plant["requests"], strict=True)
    ]
    with_salts, without = ceiling(prompts, True), ceiling(prompts, False)
    assert report["ceiling"]["hit_tokens"] == with_salts
    for engine in ("vllm", "sglang"):
        assert report["losses"][engine]["salts"]["tokens"] == without - with_salts
        dynamic = report["losses"][engine]["dynamic_content"]["tokens"]
        assert dynamic == ceiling(constant, False) - without
    assert report["dynamic_content"][0]["lost_tokens"] == dynamic

    unbounded = replay_rows(plant, "unbounded", rows)
    for engine in ("vllm", "sglang"):
        eviction = report["losses"][engine]["eviction"]["tokens"]
        expected = (
            unbounded["engines"][engine]["hit_tokens"] - report["engines"][engine]["hit_tokens"]
        )
        assert eviction == expected > 0


def test_capacity_curve_agrees_with_replays(plant: dict[str, Any]) -> None:
    report = plant["report"]
    prompt = report["prompt_tokens"]
    for engine, curve in report["capacity_curve"].items():
        assert len(curve["checks"]) >= 2
        for check in curve["checks"]:
            replayed = replay_rows(
                plant,
                f"curve-{check['capacity_tokens']}",
                plant["rows"],
                "--capacity-tokens",
                check["capacity_tokens"],
            )
            assert check["replay_hit_tokens"] == replayed["engines"][engine]["hit_tokens"]
            assert abs(check["model_hit_tokens"] - check["replay_hit_tokens"]) <= 0.03 * prompt
            assert check["replay_hit_tokens"] <= check["belady_hit_tokens"]
        assert (
            curve["unbounded_hit_tokens"]
            == replay_rows(plant, "unbounded", plant["rows"])["engines"][engine]["hit_tokens"]
        )
    bounds = report["upper_bounds"]["belady"]
    for engine, bound in bounds.items():
        assert report["engines"][engine]["hit_tokens"] <= bound["hit_tokens"]
        assert bound["hit_tokens"] <= report["ceiling"]["hit_tokens"]
