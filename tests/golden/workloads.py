"""Seeded random workloads that look like production traffic, for differential tests against the
engines' own code: system prompts of unaligned lengths, few-shot blocks, multi-turn conversations
whose next prompt holds the previous answer, identical re-sends, and tenants with their own
``cache_salt``. Each request is a dict in the ``--format tokens`` schema."""

from __future__ import annotations

import random
from typing import Any

Request = dict[str, Any]


def random_workload(seed: int, n_requests: int = 80, vocab: int = 50) -> list[Request]:
    """A reproducible request stream; small vocabularies make accidental partial matches common."""
    rng = random.Random(seed)

    def tokens(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(rng.randrange(lo, hi + 1))]

    system_prompts = [tokens(3, 70) for _ in range(rng.randrange(2, 5))]
    few_shot = [tokens(10, 50) for _ in range(2)]
    salts = [None, None, None, "tenant-a", "tenant-b"]
    history: list[Request] = []
    requests: list[Request] = []
    for _ in range(n_requests):
        kind = rng.random()
        if history and kind < 0.30:
            previous = rng.choice(history)  # the next turn: prompt + answer + message
            prompt = previous["prompt_token_ids"] + previous["output_token_ids"] + tokens(1, 20)
            salt = previous.get("cache_salt")
        elif history and kind < 0.40:
            previous = rng.choice(history)  # identical re-send
            prompt = list(previous["prompt_token_ids"])
            salt = previous.get("cache_salt")
        elif kind < 0.85:
            prompt = list(rng.choice(system_prompts))
            if rng.random() < 0.4:
                prompt += rng.choice(few_shot)
            prompt += tokens(0, 30)
            salt = rng.choice(salts)
        else:
            prompt = tokens(1, 40)
            salt = rng.choice(salts)
        request: Request = {
            "prompt_token_ids": prompt,
            "output_token_ids": tokens(1, 14),
            "finish_reason": rng.choice(["stop", "stop", "length"]),
        }
        if salt:
            request["cache_salt"] = salt
        requests.append(request)
        history.append(request)
    return requests


def long_prompt_workload(
    seed: int, n_requests: int = 120, vocab: int = 50, scale: int = 1
) -> list[Request]:
    """Like ``random_workload`` with prompts of hundreds to thousands of tokens, so that a
    scheduler's per-step token budget (vLLM's 2048 to 16384 default) chunks prefills and a batch
    of requests in flight does not fit in one step. About 1 request in 8 asks for prompt logprobs
    (vLLM then skips the prefix lookup for it). ``scale`` multiplies the prompt lengths."""
    rng = random.Random(seed)

    def tokens(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(rng.randrange(lo, hi + 1))]

    system_prompts = [tokens(100 * scale, 2500 * scale) for _ in range(rng.randrange(2, 5))]
    documents = [tokens(300 * scale, 1500 * scale) for _ in range(3)]
    history: list[Request] = []
    requests: list[Request] = []
    for _ in range(n_requests):
        kind = rng.random()
        if history and kind < 0.30:
            previous = rng.choice(history)  # the next turn
            prompt = previous["prompt_token_ids"] + previous["output_token_ids"] + tokens(1, 200)
            prompt = prompt[-6000 * scale :]
        elif history and kind < 0.40:
            prompt = list(rng.choice(history)["prompt_token_ids"])  # identical re-send
        elif kind < 0.85:
            prompt = list(rng.choice(system_prompts))
            if rng.random() < 0.4:
                prompt += rng.choice(documents)
            prompt += tokens(1, 400 * scale)
        else:
            prompt = tokens(1, 3000 * scale)
        request: Request = {
            "prompt_token_ids": prompt,
            "output_token_ids": tokens(1, 40),
            "finish_reason": rng.choice(["stop", "stop", "length"]),
        }
        if rng.random() < 0.12:
            request["prompt_logprobs"] = 1
        requests.append(request)
        history.append(request)
    return requests
