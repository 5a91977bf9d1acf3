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
  unless a node already ends there; the leaves it adds end at every ``e > D``. The trie keeps
  SGLang's node ends as one byte per stored token (``_trie_kernel._sglang_splits``);
- nothing is evicted or rejected (an unbounded pool takes every request).

``tests/test_sglang_unbounded.py`` checks every counter against the kernel, request by request.
"""

from __future__ import annotations

import numpy as np

from cache_models.config import SglangConfig
from cache_models.prefix_trie import PrefixTrie, SplitCount, View
from cache_models.workload import Workload


def by_trie(config: SglangConfig) -> bool:
    """Whether a sequential replay of tokens goes by the prefix trie: unbounded, page size 1."""
    return config.capacity_tokens is None and config.page_size == 1


class UnboundedSglang:
    """An unbounded SGLang cache at page size 1, fed chunks of one log's tokens in order."""

    def __init__(self, config: SglangConfig) -> None:
        if not by_trie(config):
            raise ValueError("the trie replays SGLang unbounded at page size 1 only")
        self.overlap = config.overlap_schedule
        self.trie = PrefixTrie([View("sglang")], SplitCount(0, config.chunked_prefill_size))

    def feed(self, chunk: Workload) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The chunk's hit tokens and counters (``_sglang_kernel.COUNTERS``' names), as the
        tree's sequential replay of the log so far gives them."""
        stops = chunk.sglang_stop_finish & self.overlap  # those that keep every output
        fed = self.trie.feed_tokens(chunk, stops)
        assert fed.splits is not None
        (shared,) = fed.reach
        prompt = chunk.prompt_lengths
        limits = chunk.hit_limits
        limit = np.where(limits >= 0, np.minimum(prompt - 1, limits), prompt - 1)
        kept = prompt + chunk.output_lengths - 1 + stops  # L + rules.sglang_kv_steps
        none = np.zeros(chunk.n_requests, np.int64)
        counters = {
            "evicted_tokens": none,
            "inserted_tokens": np.maximum(kept - shared, 0),
            "node_splits": fed.splits,
            "rejected": none,
        }
        return np.minimum(shared, limit), counters
