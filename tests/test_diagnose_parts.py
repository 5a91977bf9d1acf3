"""Message parts in an order that breaks sharing: the same tools listed in different orders, a
system prompt after a varying note. The recommendation's gain is a replay of the log written
with the parts in order."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from analyzer.tokenizer import load_tokenizer
from cli.main import app

runner = CliRunner()
SYSTEM = (
    "You are the operations assistant of a parcel carrier. Answer with the tools when a "
    "question needs live data; otherwise answer from the handbook, briefly and politely."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} for a parcel or a depot, by id",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
    for name in ("track_parcel", "depot_status", "reschedule_delivery", "refund_shipping")
]


def analyze(path: Path, *flags: str) -> dict:
    out = path.with_suffix(".json")
    result = runner.invoke(app, ["analyze", str(path), *flags, "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def write(path: Path, bodies: list[dict]) -> Path:
    path.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    return path


def question(rng: random.Random) -> str:
    return f"Where is parcel P{rng.randrange(10**6)}? It was due on day {rng.randrange(1, 29)}."


def test_tool_order_is_fixed_and_measured(tmp_path: Path) -> None:
    rng = random.Random(5)
    orders = [rng.sample(range(len(TOOLS)), len(TOOLS)) for _ in range(3)]
    chosen = [orders[0] if rng.random() < 0.5 else rng.choice(orders) for _ in range(60)]
    bodies = [
        {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question(rng)},
            ],
            "tools": [TOOLS[i] for i in order],
        }
        for order in chosen
    ]
    report = analyze(write(tmp_path / "tools.jsonl", bodies))
    [item] = [r for r in report["recommendations"] if r["kind"] == "reorder_parts"]
    common = Counter(tuple(order) for order in chosen).most_common(1)[0][0]
    differing = sum(tuple(order) != common for order in chosen)
    assert item["details"] == {"tools_reordered": differing, "system_moved": 0}
    for body in bodies:
        body["tools"] = [TOOLS[i] for i in common]
    fixed = analyze(write(tmp_path / "tools-fixed.jsonl", bodies))
    for engine, gain in item["measured"].items():
        assert gain["hit_tokens_after"] == fixed["engines"][engine]["hit_tokens"]
        assert gain["prompt_tokens_after"] == fixed["prompt_tokens"]
    assert item["measured"]["vllm"]["recomputed_tokens_saved"] > 0


def test_system_prompt_first_is_fixed_and_measured(tmp_path: Path) -> None:
    rng = random.Random(6)
    bodies = [
        {
            "messages": [
                {"role": "user", "content": f"Note from agent {rng.randrange(10**4)}."},
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question(rng)},
            ]
        }
        for _ in range(40)
    ]
    log = write(tmp_path / "system.jsonl", bodies)
    report = analyze(log, "--what-if", "reorder-parts")
    [item] = [r for r in report["recommendations"] if r["kind"] == "reorder_parts"]
    assert item["details"] == {"tools_reordered": 0, "system_moved": 40}
    for body in bodies:
        body["messages"] = [body["messages"][1], body["messages"][0], body["messages"][2]]
    fixed = analyze(write(tmp_path / "system-fixed.jsonl", bodies))
    [what_if] = report["what_if"]
    for engine in ("vllm", "sglang"):
        after = fixed["engines"][engine]["hit_tokens"]
        assert item["measured"][engine]["hit_tokens_after"] == after
        assert what_if["measured"][engine]["hit_tokens_after"] == after


def test_nothing_to_reorder_is_a_usage_error(tmp_path: Path) -> None:
    log = write(tmp_path / "plain.jsonl", [{"prompt": "hello there"}, {"prompt": "hello you"}])
    result = runner.invoke(app, ["analyze", str(log), "--what-if", "reorder-parts", "--quiet"])
    assert result.exit_code == 2 and "no message parts to reorder" in result.output


def test_padding_goes_at_the_end_of_the_system_message(tmp_path: Path) -> None:
    """In a chat log the padding is appended to the shared system message's text: the same
    alignment as padding at the template's end, where a user would write it."""
    rng = random.Random(7)
    bodies = [
        {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question(rng)},
            ]
        }
        for _ in range(80)
    ]
    report = analyze(write(tmp_path / "chat.jsonl", bodies))
    [item] = [r for r in report["recommendations"] if r["kind"] == "pad_prefix"]
    [prefix] = item["details"]["prefixes"]
    tokenizer = load_tokenizer(None)
    head = tokenizer.encode_batch(["<|im_start|>system\n" + SYSTEM], add_special_tokens=False)[0]
    assert prefix["insert_at_token"] == len(head) < prefix["prefix_tokens"]
    assert (prefix["prefix_tokens"] + prefix["padding_tokens"]) % 16 == 0


def test_move_dynamic_and_reorder_parts_combine(tmp_path: Path) -> None:
    """The combined what-if is reordering, then moving the values found in the reordered log: the
    same as moving them in a log written with the tools in order."""
    rng = random.Random(8)
    orders = [rng.sample(range(len(TOOLS)), len(TOOLS)) for _ in range(3)]
    chosen = [orders[0] if rng.random() < 0.5 else rng.choice(orders) for _ in range(60)]
    bodies = [
        {
            "messages": [
                {
                    "role": "system",
                    "content": f"Now: 2026-11-02T09:{i // 60:02d}:{i % 60:02d}Z. {SYSTEM}",
                },
                {"role": "user", "content": question(rng)},
            ],
            "tools": [TOOLS[i] for i in order],
        }
        for i, order in enumerate(chosen)
    ]
    both = "move-dynamic+reorder-parts"
    flags = ["--what-if", "move-dynamic", "--what-if", "reorder-parts", "--what-if", both]
    report = analyze(write(tmp_path / "mixed.jsonl", bodies), *flags)
    saved = {
        item["name"]: item["measured"]["vllm"]["recomputed_tokens_saved"]
        for item in report["what_if"]
    }
    assert saved[both] > max(saved["move-dynamic"], saved["reorder-parts"]) > 0
    common = Counter(tuple(order) for order in chosen).most_common(1)[0][0]
    for body in bodies:
        body["tools"] = [TOOLS[i] for i in common]
    ordered = analyze(write(tmp_path / "ordered.jsonl", bodies), "--what-if", "move-dynamic")
    [moved] = ordered["what_if"]
    [combined] = [item for item in report["what_if"] if item["name"] == both]
    for engine, gain in combined["measured"].items():
        assert gain["hit_tokens_after"] == moved["measured"][engine]["hit_tokens_after"]
