"""A synthetic prompt log with planted causes of recomputation, each with known token positions:

- template A: a 37-token system prompt shared by most requests (37 % 16 = 5: vLLM recomputes 5
  of its tokens on every request; 11 tokens of padding at token 37 fix that);
- a tenant that sets ``cache_salt`` on a quarter of template A's requests;
- template B: an audit prompt with an ISO timestamp at token 10 (19 tokens, a new one on every
  request) before a long static part, so everything after the timestamp is recomputed;
- a few one-off prompts; the test replays it with a cache too small for the working set.

    python -m tests.planted_causes > planted.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from analyzer.tokenizer import load_tokenizer

SYSTEM_PROMPT = (
    "You are the billing assistant of Northwind Traders. Answer questions about invoices, refunds "
    "and payment methods politely, in plain English, and never share full card numbers or any "
    "bank details.\n\n"
)
SYSTEM_TOKENS = 37
AUDIT_HEAD = "Audit export for the compliance team, generated at "
TIMESTAMP_AT = 10
TIMESTAMP_TOKENS = 19  # 2026-03-04T05:06:07: one token per digit and separator
AUDIT_STATIC = (
    ". Summarise the events below for the quarterly review. List every failed login, every change "
    "to user roles, and every export of customer data, each with its time, the account, and the "
    "source address. Group the events by account, most active first, and flag accounts with more "
    "than three failed logins within an hour. Mention configuration changes to the firewall, to "
    "single sign-on, and to the retention policy separately, quoting the old and the new value. "
    "Do not speculate about intent; state only what the log shows, and say so when a field is "
    "missing. Keep the summary under three hundred words and end with a table of the five "
    "accounts with the most events.\n\nTask:"
)
SALT = "tenant-b"
WORDS = (
    "invoice refund card payment charge receipt plan upgrade discount coupon tax address "
    "delivery order account balance credit debit transfer statement"
).split()
TASKS = [
    "Summarise last week.",
    "Summarise the night shift.",
    "Focus on exports.",
    "Focus on role changes.",
    "Only the finance accounts.",
    "Only the admin accounts.",
    "Include service accounts.",
    "Compare with the previous quarter.",
]


@dataclass(frozen=True)
class PlantedRequest:
    template: str  # "A", "B" or "other"
    salted: bool
    line: dict


def planted_requests(n_requests: int = 400, seed: int = 0) -> list[PlantedRequest]:
    """The log's lines (``--format prompt``), with what was planted in each."""
    rng = random.Random(seed)
    start = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    now = start
    requests = []
    for _ in range(n_requests):
        now += timedelta(seconds=rng.randrange(1, 40))
        kind = rng.random()
        salted = False
        if kind < 0.6:
            template = "A"
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(6, 20)))
            prompt = SYSTEM_PROMPT + words.capitalize() + "?"
            salted = rng.random() < 0.25
        elif kind < 0.9:
            template = "B"
            stamp = now.strftime("%Y-%m-%dT%H:%M:%S")
            prompt = AUDIT_HEAD + stamp + AUDIT_STATIC + " " + rng.choice(TASKS)
        else:
            template = "other"
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 30)))
        line = {
            "prompt": prompt,
            "output": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 12))),
            "finish_reason": "stop",
            "timestamp": now.timestamp(),
        }
        if salted:
            line["cache_salt"] = SALT
        requests.append(PlantedRequest(template, salted, line))
    _check_token_positions(requests)
    return requests


def _check_token_positions(requests: list[PlantedRequest]) -> None:
    """The planted positions hold for the default tokenizer (Qwen2.5)."""
    tokenizer = load_tokenizer(None)
    system = tokenizer.encode_batch([SYSTEM_PROMPT], add_special_tokens=True)[0]
    head = tokenizer.encode_batch([AUDIT_HEAD], add_special_tokens=True)[0]
    assert len(system) == SYSTEM_TOKENS and len(head) == TIMESTAMP_AT  # ..." at", " "
    for request in requests:
        ids = tokenizer.encode_batch([request.line["prompt"]], add_special_tokens=True)[0]
        if request.template == "A":
            assert ids[:SYSTEM_TOKENS].tolist() == system.tolist()
        if request.template == "B":
            assert ids[:TIMESTAMP_AT].tolist() == head.tolist()


if __name__ == "__main__":
    for request in planted_requests():
        sys.stdout.write(json.dumps(request.line) + "\n")
