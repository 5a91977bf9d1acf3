"""Shared prefixes: where prompts that share a start diverge, read off the prefix trie."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cache_models.prefix_trie import TrieNodes


@dataclass(frozen=True)
class SharedPrefix:
    """A prefix shared by ``requests`` prompts that no longer prefix is shared by as many."""

    node: int
    length: int
    requests: int
    namespace: int
    first_request: int
    tokens: np.ndarray

    def padding(self, block_size: int) -> int:
        """Tokens to append so the prefix ends on a block boundary."""
        return -self.length % block_size

    def recompute_saved_per_request(self, block_size: int) -> int:
        """Prompt tokens each sharing request stops recomputing once the prefix is padded.

        Unpadded, vLLM hits the prefix's full blocks only; padded, the whole prefix plus the
        padding hit. The padding's own tokens are prompt tokens too, so the net saving is the
        prefix's remainder ``length % block_size``.
        """
        return self.length % block_size


def shared_prefixes(trie: TrieNodes, *, min_requests: int = 2, top: int = 10) -> list[SharedPrefix]:
    """The ``top`` shared prefixes by tokens they could serve from cache (length × (requests-1)).

    A node qualifies when at least ``min_requests`` prompts pass through it and no child keeps all
    of them (so the prefix is maximal: the requests diverge right after it).
    """
    count = trie.count
    best_child = np.zeros(trie.n_nodes, np.int64)
    np.maximum.at(best_child, trie.parent[1:], count[1:])
    is_root = trie.parent == 0
    candidates = np.flatnonzero((count >= min_requests) & (best_child < count) & ~is_root)
    score = trie.depth[candidates] * (count[candidates] - 1)
    order = candidates[np.lexsort((candidates, -score))][:top]
    return [
        SharedPrefix(
            node=int(node),
            length=int(trie.depth[node]),
            requests=int(count[node]),
            namespace=int(trie.namespace[node]),
            first_request=int(trie.first_request[node]),
            tokens=trie.tokens(int(node)),
        )
        for node in order
    ]
