"""Shared prefixes: where prompts that share a start diverge, read off the prefix trie."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from cache_models.prefix_trie import TrieNodes

FINGERPRINT_TOKENS = 16
# What reports list as templates: prefixes that add at least this many tokens to the nearest
# shorter shared prefix, or to nothing (fewer: a role header, or the first words of varied
# content after a template).
TEMPLATE_MIN_TOKENS = 8


@dataclass(frozen=True)
class SharedPrefix:
    """A prefix shared by ``requests`` prompts that no longer prefix is shared by as many."""

    node: int
    length: int
    requests: int
    namespace: int
    first_request: int
    shared_beyond_parent: int
    tokens: np.ndarray

    @property
    def covered_tokens(self) -> int:
        """Prompt tokens that are this prefix, over all the requests that share it."""
        return self.length * self.requests

    def fingerprint(self, namespace_label: str) -> str:
        """A stable id for the template across runs: a hash of its head and namespace, so a
        template that grows or shrinks at its end keeps its fingerprint."""
        head = self.tokens[:FINGERPRINT_TOKENS].astype("<i4").tobytes()
        return hashlib.sha256(head + namespace_label.encode()).hexdigest()[:16]

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


def template_groups(prefixes: list[SharedPrefix]) -> list[int]:
    """Per prefix, its template: prefixes that begin with the same ``FINGERPRINT_TOKENS`` tokens
    (in any namespace) are one template's variants (a system prompt, the same prompt with a
    few-shot block, the same prompt under another cache_salt). Numbered in order of first
    appearance."""
    groups: dict[bytes, int] = {}
    return [
        groups.setdefault(p.tokens[:FINGERPRINT_TOKENS].tobytes(), len(groups)) for p in prefixes
    ]


def shared_prefixes(
    trie: TrieNodes,
    *,
    min_requests: int = 2,
    top: int = 10,
    min_extension: int = 1,
) -> list[SharedPrefix]:
    """The ``top`` shared prefixes by the tokens they add to the sharing.

    A node qualifies when at least ``min_requests`` prompts pass through it and no child keeps all
    of them (the prefix is maximal: the requests diverge right after it). Qualifying prefixes nest
    (a system prompt, then the same system prompt with a few-shot block); each is scored by the
    tokens it shares beyond its nearest qualifying ancestor times the requests that reuse them,
    so a template ranks high and its many small variations do not. A prefix that adds fewer than
    ``min_extension`` tokens to its nearest qualifying ancestor (or to nothing) is left out.
    Columnar throughout: the trie holds each distinct token once, so this scales with the
    distinct prefixes, not with the log.
    """
    candidates, beyond = _ranked(trie, min_requests, min_extension)
    count = trie.count
    return [
        SharedPrefix(
            node=int(node),
            length=int(trie.depth[node]),
            requests=int(count[node]),
            namespace=int(trie.namespace[node]),
            first_request=int(trie.first_request[node]),
            shared_beyond_parent=int(extra),
            tokens=trie.tokens(int(node)),
        )
        for node, extra in zip(candidates[:top], beyond[:top], strict=True)
    ]


def _ranked(
    trie: TrieNodes, min_requests: int, min_extension: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every qualifying prefix's node, best first, and the tokens it adds to its nearest
    qualifying ancestor. Made once per trie and arguments (kept on it, as a cached property is:
    the report and the diagnosis each ask for their top; read only)."""
    kept = trie.__dict__.setdefault("_shared_prefixes", {})
    if (min_requests, min_extension) in kept:
        return kept[min_requests, min_extension]
    count = trie.count
    best_child = np.zeros(trie.n_nodes, np.int64)
    np.maximum.at(best_child, trie.parent[1:], count[1:])
    qualifies = (count >= min_requests) & (best_child < count) & (trie.parent != 0)
    qualifies[0] = False
    ancestor = _nearest_qualifying_ancestor(trie.parent, qualifies)
    candidates = np.flatnonzero(qualifies)
    beyond = trie.depth[candidates] - trie.depth[ancestor[candidates]]
    candidates, beyond = candidates[beyond >= min_extension], beyond[beyond >= min_extension]
    score = beyond * (count[candidates] - 1)
    ranked = np.lexsort((candidates, -score))
    kept[min_requests, min_extension] = candidates[ranked], beyond[ranked]
    return kept[min_requests, min_extension]


def _nearest_qualifying_ancestor(parent: np.ndarray, qualifies: np.ndarray) -> np.ndarray:
    """For every node, its closest proper ancestor that qualifies (0, the sentinel, if none)."""
    ancestor = parent.copy()
    pending = np.flatnonzero((ancestor > 0) & ~qualifies[ancestor])
    while len(pending):
        ancestor[pending] = parent[ancestor[pending]]
        pending = pending[(ancestor[pending] > 0) & ~qualifies[ancestor[pending]]]
    return ancestor
