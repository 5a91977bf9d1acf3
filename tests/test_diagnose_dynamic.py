"""Dynamic content: found on the trie where a template's prompts differ for a few tokens and then
agree again, with each prompt's value span, its static run, and the kind of value by pattern."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.diagnose.dynamic import find_dynamic_content
from analyzer.diagnose.patterns import recognise
from analyzer.diagnose.plans import static_runs
from analyzer.replay import ReplaySettings
from cache_models.prefix_trie import PrefixTrie, TrieNodes
from cache_models.workload import Workload
from tests.test_diagnose_losses import diagnosed
from tests.test_prefix_trie import brute_force_ceiling

HEAD = list(range(1, 11))  # 10 tokens
STATIC = list(range(100, 140))  # 40 tokens


def planted(seed: int, reconverge: bool = True) -> tuple[Workload, list[int]]:
    """Requests HEAD + value (3-8 tokens) + STATIC + a question, and one-off prompts between."""
    rng = np.random.default_rng(seed)
    prompts, lengths = [], []
    for i in range(60):
        if i % 4 == 3:
            prompts.append(rng.integers(5000, 6000, 20).tolist())
            lengths.append(0)
            continue
        value = rng.integers(1000, 2000, int(rng.integers(3, 9))).tolist()
        tail = STATIC if reconverge else rng.integers(3000, 4000, 40).tolist()
        prompts.append(HEAD + value + tail + rng.integers(7000, 8000, 6).tolist())
        lengths.append(len(value))
    return Workload.from_lists(prompts, [[9]] * len(prompts)), lengths


def trie_of(workload: Workload) -> TrieNodes:
    trie = PrefixTrie()
    trie.replay(workload)
    assert trie.nodes is not None
    return trie.nodes


@pytest.mark.parametrize("seed", range(4))
def test_finds_the_value_and_each_prompts_span(seed: int) -> None:
    workload, lengths = planted(seed)
    sites, spans = find_dynamic_content(trie_of(workload), workload, 16, None)
    assert len(sites) == 1
    site = sites[0]
    assert site.start == site.divergence == len(HEAD)
    assert site.anchor.tolist() == STATIC[:4]
    assert site.kind == "unknown"  # no text to recognise
    with_value = [i for i, n in enumerate(lengths) if n]
    assert spans.request.tolist() == with_value
    assert spans.start.tolist() == [len(HEAD)] * len(with_value)
    assert spans.length.tolist() == [lengths[i] for i in with_value]
    moves = static_runs(workload, spans, 1)
    assert moves.static_tokens.tolist() == [len(STATIC)]
    assert (moves.end == spans.start + spans.length + len(STATIC)).all()


def test_no_site_without_a_static_run_after_the_value() -> None:
    workload, _ = planted(0, reconverge=False)
    sites, spans = find_dynamic_content(trie_of(workload), workload, 16, None)
    assert sites == [] and len(spans.request) == 0


def test_dynamic_loss_is_the_constant_value_ceiling() -> None:
    """The loss equals the brute-force ceiling with each value replaced by one constant token
    (its tokens then count as hit), minus the plain ceiling."""
    workload, lengths = planted(1)
    result = diagnosed(workload, ReplaySettings())
    prompts = [
        HEAD + [10**6] + workload.prompt(i).tolist()[len(HEAD) + n :]
        if n
        else workload.prompt(i).tolist()
        for i, n in enumerate(lengths)
    ]
    normalised = brute_force_ceiling(Workload.from_lists(prompts, [[9]] * len(prompts)))
    mapped = [
        h - 1 + n if n and h > len(HEAD) else h for h, n in zip(normalised, lengths, strict=True)
    ]
    plain = brute_force_ceiling(workload)
    expected = [m - p for m, p in zip(mapped, plain, strict=True)]
    assert result.per_request["vllm_lost_dynamic_content"].tolist() == expected
    [site] = result.diagnosis.dynamic_content
    assert site.lost_tokens == sum(expected) > 0
    assert site.static_tokens_after == len(STATIC)


@pytest.mark.parametrize(
    ("text", "varying", "kind", "starts_at"),
    [
        ("Current time: 2026-11-02T09:00:55Z. You are", "55", "iso_datetime", "2026"),
        ("Today is 2026-11-02. You are", "02", "date", "2026"),
        ("Today is Nov 2, 2026. Be", "2", "date", "Nov"),
        ("session 3f2b8c1e-9a7d-4e21-b5c3-0d9e8f7a6b5c started", "9a7d", "uuid", "3f2b"),
        ("ts=1793610002 level=info", "02", "epoch_time", "1793"),
        ("request chatcmpl-d3ac0f21ddb6 done", "0f21", "hex_id", "d3ac"),
        ("user #4821 asks", "21", "number", "4821"),
        ("Hello Alice, welcome", "Alice", None, None),
    ],
)
def test_recognises_common_kinds(
    text: str, varying: str, kind: str | None, starts_at: str | None
) -> None:
    begin = text.index(varying)
    found = recognise(text, begin, begin + len(varying))
    if kind is None:
        assert found is None
    else:
        assert found == (kind, text.index(starts_at))


def _chats(questions: list[str], suffix: str, follow_up: bool) -> list[dict]:
    system = "You are the help desk of a parcel carrier. Answer briefly, citing the handbook. " * 2
    rows = []
    for question in questions:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": question + suffix},
        ]
        rows.append({"messages": messages})
        if follow_up:
            rows.append(
                {
                    "messages": [
                        *messages,
                        {"role": "assistant", "content": "Let me look that up in the handbook."},
                        {
                            "role": "user",
                            "content": "Please sum that up in one sentence and "
                            "name the handbook section you used for it.",
                        },
                    ]
                }
            )
    return rows


def test_a_users_own_question_is_not_dynamic_content(tmp_path) -> None:
    """Questions that differ, then the same follow-up turn: the question is the conversation,
    not a value a template put before shared text. The same questions before fixed instructions
    in the same message are (moving them after the instructions is a fix)."""
    import json

    from typer.testing import CliRunner

    from cli.main import app

    questions = [
        "How do I reset my password?",
        "What is the refund policy?",
        "Can I change my shipping address?",
        "Where is my parcel now?",
    ] * 25
    instructions = (
        "\n\nAnswer in one short paragraph, in plain words, and end with the number of the "
        "handbook section you used."
    )
    found = {}
    for name, suffix, follow_up in (("turns", "", True), ("instructions", instructions, False)):
        log = tmp_path / f"{name}.jsonl"
        log.write_text("".join(json.dumps(r) + "\n" for r in _chats(questions, suffix, follow_up)))
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(app, ["analyze", str(log), "--json", str(out), "--quiet"])
        assert result.exit_code == 0, result.output
        found[name] = json.loads(out.read_text())
    assert found["turns"]["dynamic_content"] == []
    assert found["turns"]["losses"]["vllm"]["dynamic_content"]["tokens"] == 0
    [site] = found["instructions"]["dynamic_content"]
    assert site["kind"] == "text" and site["requests"] == len(questions)
