"""The sequential replay of an unbounded SGLang cache at page size 1, by the prefix trie: the
same hits and counters as the radix tree's replay (``_sglang_kernel.replay_sequential``), without
a tree.

Nothing is evicted, so when request r arrives the tree holds, per namespace, exactly what every
earlier request kept: its prompt and ``K = L + steps`` tokens in all (``rules.sglang_kv_steps``:
every output after a stop under the overlap scheduler, all but the last otherwise). With ``D``
the longest prefix r's ``K`` tokens share with the tree (the trie's reach in an SGLang view fed
the same stops):

- the hit is ``min(D, limit)``, ``limit`` the match's (``rules.sglang_match_limit``: L - 1, or
  ``logprob_start_len``);
- r inserts ``max(K - D, 0)`` new tokens (``inserted_tokens``), whatever its prefill chunks;
- its node splits are those of its walks: each ends at some ``e`` (the match, each prefill
  chunk's checkpoint, the prompt's, the release), cutting the tree at ``min(D, e)``, a split
  unless a node already ends there; an insert's new leaf ends at its ``e > D``. The trie keeps
  SGLang's node ends as one byte per stored token (``_trie_kernel._sglang_splits``);
- nothing is evicted or rejected (an unbounded pool takes every request).

The trie's walk is ``cache_models.unbounded.UnboundedTrie``'s (one for the server's engines).
``tests/test_sglang_unbounded.py`` checks every counter against the kernel, request by request.
"""

from __future__ import annotations

import numpy as np

from cache_models import engine_rules as rules
from cache_models.config import SglangConfig
from cache_models.workload import Workload


def by_trie(config: SglangConfig) -> bool:
    """Whether a sequential replay of tokens goes by the prefix trie: unbounded, page size 1."""
    return config.capacity_tokens is None and config.page_size == 1


def of_reach(
    chunk: Workload, shared: np.ndarray, splits: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The hit tokens and counters (``_sglang_kernel.COUNTERS``' names) of a chunk of tokens
    from ``D`` (``shared``: its reach in an SGLang view fed ``stops``, the requests that keep
    every output) and the node splits the trie counted."""
    prompt = chunk.prompt_lengths
    limits = chunk.hit_limits
    limit = np.where(limits >= 0, np.minimum(prompt - 1, limits), prompt - 1)
    # L + steps; ``stops`` already holds the overlap scheduler's part of the rule
    kept = prompt + rules.sglang_kv_steps(chunk.output_lengths, stops, True)
    none = np.zeros(chunk.n_requests, np.int64)
    counters = {
        "evicted_tokens": none,
        "inserted_tokens": np.maximum(kept - shared, 0),
        "node_splits": splits,
        "rejected": none,
    }
    return np.minimum(shared, limit), counters
