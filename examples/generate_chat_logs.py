#!/usr/bin/env python3
"""Generate a realistic synthetic chat log (OpenAI chat-completions requests with their responses).

What it holds, so each part of a prefixcheck report has something to find:
- several system prompts of unaligned token lengths, each shared by many requests;
- a few-shot template (a SQL assistant with worked examples);
- multi-turn conversations whose next request holds the previous answer;
- a system prompt that starts with the current time, so its requests never share past the head;
- a tenant that sets ``cache_salt``; a few answers cut off by ``max_tokens`` (finish "length").

    python examples/generate_chat_logs.py --requests 600 --seed 7 > examples/chat_logs.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime, timedelta

SUPPORT_PROMPT = (
    "You are the support assistant for Acme Cloud, a hosting platform for web applications and "
    "managed databases. Answer questions about deployments, billing, DNS, TLS certificates, "
    "build failures and database backups. Be concise and friendly. When a customer reports an "
    "outage, first ask for the project id and the region, then check the status page link "
    "https://status.acme.example before suggesting anything else. Never reveal internal ticket "
    "numbers. If a question is about pricing, quote the public plans only: Hobby (free, one "
    "project, 512 MB RAM), Pro ($20 per month, ten projects, 4 GB RAM) and Team ($99 per month, "
    "unlimited projects, SSO). Escalate to a human when the customer asks for a refund, reports a "
    "security issue, or has asked the same question three times."
)
CODE_PROMPT = (
    "You are a senior Python reviewer. Review the code the user sends for correctness, "
    "readability and performance. Point out bugs first, then style. Suggest a minimal patch as a "
    "unified diff. Prefer the standard library; mention third-party packages only when they "
    "clearly help. Keep the answer under 200 words."
)
SQL_PROMPT = (
    "You translate questions about a shop database into PostgreSQL. Tables: customers(id, name, "
    "country, created_at), orders(id, customer_id, total_cents, status, created_at), "
    "order_items(order_id, product_id, quantity), products(id, name, category, price_cents). "
    "Answer with one SQL query and nothing else."
)
SQL_EXAMPLES = [
    ("How many customers are from Norway?", "SELECT count(*) FROM customers WHERE country = 'NO';"),
    (
        "What was the revenue last month?",
        "SELECT sum(total_cents) / 100.0 FROM orders WHERE status = 'paid' AND created_at >= "
        "date_trunc('month', now()) - interval '1 month' "
        "AND created_at < date_trunc('month', now());",
    ),
    (
        "List the five best-selling products.",
        "SELECT p.name, sum(i.quantity) AS sold FROM order_items i JOIN products p ON p.id = "
        "i.product_id GROUP BY p.name ORDER BY sold DESC LIMIT 5;",
    ),
]
TRAVEL_PROMPT = (
    "You are a travel planning assistant. Suggest itineraries with travel times between stops, "
    "note visa requirements for the traveller's passport, and keep budgets in the user's currency."
)
TOPICS = [
    "deploy",
    "billing",
    "dns",
    "tls",
    "build",
    "backup",
    "outage",
    "domain",
    "logs",
    "scaling",
]
CITIES = ["Lisbon", "Kyoto", "Oslo", "Montreal", "Cape Town", "Hanoi", "Lima", "Tbilisi"]
WORDS = (
    "the service returns an error after the latest release and the dashboard shows the build as "
    "green while the health check keeps failing on port 8080 with a timeout so we rolled back "
    "twice but the database connection pool still looks exhausted during peak traffic"
).split()


def sentence(rng: random.Random, low: int, high: int) -> str:
    start = rng.randrange(len(WORDS))
    n = rng.randrange(low, high)
    words = [WORDS[(start + i) % len(WORDS)] for i in range(n)]
    return " ".join(words).capitalize() + "."


def answer(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng, 6, 18) for _ in range(sentences))


def support_question(rng: random.Random) -> str:
    topic = rng.choice(TOPICS)
    return (
        f"Question about {topic} for project p-{rng.randrange(1000, 9999)}: {sentence(rng, 8, 25)}"
    )


def code_question(rng: random.Random) -> str:
    name = rng.choice(["load_config", "parse_row", "retry", "merge_users", "slugify"])
    body = "\n".join(f"    x{i} = {rng.randrange(100)} * value" for i in range(rng.randrange(2, 8)))
    return f"Please review:\n```python\ndef {name}(value):\n{body}\n    return x0\n```"


def sql_messages(rng: random.Random) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SQL_PROMPT}]
    for question, query in SQL_EXAMPLES:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": query}]
    country = rng.choice(["Chile", "Japan", "Kenya", "Poland", "Canada"])
    messages.append(
        {
            "role": "user",
            "content": f"How many orders came from {country} in {rng.randrange(2020, 2027)}?",
        }
    )
    return messages


def travel_messages(rng: random.Random, now: datetime) -> list[dict[str, str]]:
    system = f"Current time: {now.strftime('%Y-%m-%dT%H:%M:%SZ')}. {TRAVEL_PROMPT}"
    city = rng.choice(CITIES)
    user = f"Plan {rng.randrange(2, 8)} days in {city} for two people, mid-range budget."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def line(
    now: datetime,
    messages: list[dict[str, str]],
    reply: str,
    finish: str,
    salt: str | None,
    rng: random.Random,
) -> dict:
    request: dict = {"model": "qwen2.5-7b-instruct", "messages": messages}
    if salt:
        request["cache_salt"] = salt
    return {
        "timestamp": round(now.timestamp(), 3),
        "request": request,
        "response": {
            "id": f"chatcmpl-{rng.getrandbits(48):012x}",
            "object": "chat.completion",
            "created": int(now.timestamp()),
            "model": "qwen2.5-7b-instruct",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": finish,
                }
            ],
        },
    }


def generate(n_requests: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    now = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    open_chats: list[tuple[list[dict[str, str]], str | None]] = []
    lines = []
    for _ in range(n_requests):
        now += timedelta(seconds=rng.expovariate(1 / 6))
        kind = rng.random()
        salt = None
        if open_chats and kind < 0.30:  # the next turn of an open conversation
            messages, salt = open_chats.pop(rng.randrange(len(open_chats)))
            messages = [*messages, {"role": "user", "content": sentence(rng, 5, 20)}]
        elif kind < 0.55:
            salt = "tenant-globex" if rng.random() < 0.25 else None
            messages = [
                {"role": "system", "content": SUPPORT_PROMPT},
                {"role": "user", "content": support_question(rng)},
            ]
        elif kind < 0.70:
            messages = [
                {"role": "system", "content": CODE_PROMPT},
                {"role": "user", "content": code_question(rng)},
            ]
        elif kind < 0.85:
            messages = sql_messages(rng)
        else:
            messages = travel_messages(rng, now)
        finish = "length" if rng.random() < 0.08 else "stop"
        reply = answer(rng, rng.randrange(1, 6))
        lines.append(line(now, messages, reply, finish, salt, rng))
        if messages[0]["content"] != SQL_PROMPT and len(messages) < 9 and rng.random() < 0.6:
            open_chats.append(([*messages, {"role": "assistant", "content": reply}], salt))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for item in generate(args.requests, args.seed):
        sys.stdout.write(json.dumps(item, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
