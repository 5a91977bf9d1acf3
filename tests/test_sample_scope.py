"""One set of numbers: a streamed log is diagnosed on its leading sample, and every table of the
diagnosis, in the terminal, JSON, Markdown and HTML, shows its shares over that sample and says
so; the hit-rate table stays over the whole log. The generated log's sample hits far less than
the whole log (its later requests repeat earlier ones), so a share over the wrong denominator
cannot pass."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
REQUESTS = 4_500  # the reader's chunk is 2,000 requests: --diagnose-tokens 1 samples the first


def _generated_log(path: Path) -> None:
    """2,000 distinct prompts behind a 16-token header, then requests that each repeat one of
    them and add a few tokens: the sample hits ~20%, the whole log ~60%."""
    rng = np.random.default_rng(7)
    header = list(range(1, 17))
    prompts = [header + rng.integers(100, 50_000, 48).tolist() for _ in range(2_000)]
    lines = []
    for i in range(REQUESTS):
        if i < len(prompts):
            tokens = prompts[i]
        else:
            tokens = (
                prompts[int(rng.integers(0, len(prompts)))] + rng.integers(100, 50_000, 8).tolist()
            )
        lines.append(json.dumps({"prompt_token_ids": tokens, "output_length": 4}))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("streamed")
    log = folder / "log.jsonl"
    _generated_log(log)
    paths = {name: folder / name for name in ("report.json", "summary.md", "report.html")}
    result = runner.invoke(
        app,
        [
            "analyze",
            str(log),
            "--diagnose-tokens",
            "1",
            "--capacity-tokens",
            "100000",
            "--json",
            str(paths["report.json"]),
            "--markdown",
            str(paths["summary.md"]),
            "--html",
            str(paths["report.html"]),
            "--max-loss",
            "never_seen=99%",
        ],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    return {
        "terminal": result.output,
        "report": json.loads(paths["report.json"].read_text()),
        "markdown": paths["summary.md"].read_text(),
        "html": paths["report.html"].read_text(),
    }


def _sample_rate(report: dict, tokens: int) -> float:
    return tokens / report["diagnosis_scope"]["prompt_tokens"]


def test_json_shares_are_over_the_sample(streamed: dict) -> None:
    report = streamed["report"]
    scope = report["diagnosis_scope"]
    assert scope["whole_log"] is False
    assert scope["requests"] == 2_000 and scope["log_requests"] == REQUESTS == report["requests"]
    assert scope["log_prompt_tokens"] == report["prompt_tokens"] > scope["prompt_tokens"]
    for engine in ("vllm", "sglang"):
        whole_rate = report["engines"][engine]["hit_rate"]
        assert scope["hit_rate"][engine] < whole_rate - 0.15  # the sample hits far less
        losses = report["losses"][engine]
        assert sum(entry["tokens"] for entry in losses.values()) == (
            scope["prompt_tokens"] - scope["hit_tokens"][engine]
        )
        for entry in losses.values():
            assert entry["share"] == pytest.approx(_sample_rate(report, entry["tokens"]))
        for point in report["block_size_sweep"][engine]:
            assert point["hit_rate"] == pytest.approx(_sample_rate(report, point["hit_tokens"]))
        for point in report["capacity_curve"][engine]["points"]:
            assert point["model_hit_rate"] == pytest.approx(
                _sample_rate(report, point["model_hit_tokens"])
            )
        belady = report["upper_bounds"]["belady"][engine]
        assert belady["hit_rate"] == pytest.approx(_sample_rate(report, belady["hit_tokens"]))
    # The sweep at the configured block size is the sample's own replay: one set of numbers.
    at_16 = next(p for p in report["block_size_sweep"]["vllm"] if p["size"] == 16)
    assert at_16["hit_tokens"] == scope["hit_tokens"]["vllm"]
    ceiling = report["upper_bounds"]["ceiling"]
    assert ceiling["hit_rate"] == pytest.approx(_sample_rate(report, ceiling["hit_tokens"]))
    assert "over the first 2,000 requests" in scope["description"]


def _row(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(label))


def test_terminal_tables_show_sample_shares_and_say_so(streamed: dict) -> None:
    text, report = streamed["terminal"], streamed["report"]
    scope = report["diagnosis_scope"]
    for engine, label in (("vllm", "vLLM (block 16)"), ("sglang", "SGLang (page 1")):
        assert f"{report['engines'][engine]['hit_rate']:.1%}" in _row(text, label)
    recomputed = _row(text, "recomputed (prompt − hit)")
    vllm_lost = scope["prompt_tokens"] - scope["hit_tokens"]["vllm"]
    assert re.findall(r"\d+\.\d%", recomputed)[0] == f"{_sample_rate(report, vllm_lost):.1%}"
    assert f"{vllm_lost / report['prompt_tokens']:.1%}" not in recomputed
    sizes = text[text.index("Hit rate against block size") :]
    size_16 = _row(sizes, "16 ")  # the size chart's row of the configured block size
    assert f"{scope['hit_rate']['vllm']:.1%}" in size_16
    assert f"{scope['hit_tokens']['vllm'] / report['prompt_tokens']:.1%}" not in size_16
    # Beside each diagnosis table (losses, capacity, size), and the hit table names its scope.
    flat = " ".join(text.split())
    assert flat.count("Measured over the first 2,000 requests") >= 3
    assert f"Over the whole log: {REQUESTS:,} requests" in flat
    gate = _row(text, "PASS vLLM (block 16) never_seen")
    never_seen = report["losses"]["vllm"]["never_seen"]
    assert f"{never_seen['share']:.2%} over the first 2,000 requests" in gate


def test_markdown_and_html_show_sample_shares_and_say_so(streamed: dict) -> None:
    report, md, html = streamed["report"], streamed["markdown"], streamed["html"]
    never_seen = report["losses"]["vllm"]["never_seen"]
    cell = f"{never_seen['tokens']:,} ({never_seen['share']:.1%})"
    assert cell in _row(md, "| never_seen")
    assert "Measured over the first 2,000 requests" in md
    assert "(sample)" in md
    assert cell in html
    sections = [part for part in html.split("<h2>")[1:]]
    diagnosis = [
        s for s in sections if s.startswith(("Recomputed", "Hit rate against", "Token hit rate"))
    ]
    assert len(diagnosis) == 3
    assert all("Measured over the first 2,000 requests" in s for s in diagnosis)
    hits = next(s for s in sections if s.startswith("Prefix-cache hits"))
    assert f"Over the whole log: {REQUESTS:,} requests" in hits
