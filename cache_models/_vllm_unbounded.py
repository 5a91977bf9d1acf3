"""The sequential replay of an unbounded vLLM cache, by the prefix trie: the same hits and
counters as the block pool's replay (``_vllm_kernel`` over tokens, ``_vllm_runs`` over a
run-length workload), without a pool.

With no eviction, and every earlier request freed before the next one is admitted, block ``j``
of request r (its first ``(j + 1) * B`` tokens of prompt then answer) is cached when r arrives
exactly when an earlier request of its namespace kept those tokens: vLLM caches every full block
of a request's first ``K = L + n - 1`` tokens (all outputs but the last, whose KV is never
computed), chained keys name a block by its whole prefix, and a copy of a key stays cached as
long as the first. So r finds ``E`` leading blocks cached, ``E = floor(min(K, D) / B)`` with
``D`` the longest prefix r's ``K`` tokens share with an earlier request's ``K'``. Then (as
``_vllm_runs.replay_sequential``):

- the hit is ``min(E, (L - 1) // B)`` blocks (the lookup's limit; 0 when the request skips the
  lookup, ``Workload.skip_prefix_lookup``);
- it caches its ``C = K // B`` full blocks but the hit: ``inserted_blocks = C - hit``, of which
  those already cached are ``duplicate_blocks = E - hit``;
- nothing is evicted, preempted or rejected (an unbounded pool takes every request).

``D`` is a prefix trie's reach in a vLLM view (``TrieFeed.reach``: the longest
``min(LCP, K')`` over the request's whole sequence, each node keeping the most an earlier
request through it keeps), capped at ``K``; ``E`` floors it to whole blocks. A run-length
workload is fed as sequences of what vLLM keeps (``kept_sequences``): each request a "prompt"
of its ``K`` tokens and one unknown token (so the trie's match limit, the prompt less one token,
is the ``K`` tokens), with one unknown output; the trie then keeps, of each request, its ``K``
tokens (nothing after an unknown token is stored), and its hits in the view are ``B * E``.
"""

from __future__ import annotations

import numpy as np

from cache_models import engine_rules as rules
from cache_models.prefix_trie import PrefixTrie, View
from cache_models.runs import RunWorkload
from cache_models.workload import Workload, offsets_of

UNKNOWN = -1  # an unknown token: matches nothing, ends what the trie stores of a request


class UnboundedVllm:
    """An unbounded vLLM cache at ``block_size``, fed chunks of one log's runs in order (a log
    of tokens goes by ``cache_models.unbounded.UnboundedTrie``)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.trie = PrefixTrie([View("vllm", block_size)])

    def feed(self, chunk: RunWorkload) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The chunk's hit tokens and counters (``vllm_apc._counters``' names), as the pool's
        sequential replay of the log so far gives them."""
        (present_tokens,) = self.trie.feed(kept_sequences(chunk))
        return of_present(chunk, present_tokens, chunk.runs.skips_lookup, self.block_size)


def of_reach(
    chunk: Workload, reach: np.ndarray, block_size: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The hit tokens and counters of a chunk of tokens from its reach in a vLLM view at
    ``block_size`` (``TrieFeed.reach``): ``D``, capped at what the request keeps."""
    kept = rules.vllm_peak_tokens(chunk.prompt_lengths, chunk.output_lengths)
    return of_present(chunk, np.minimum(reach, kept), chunk.skips_lookup, block_size)


def of_present(
    chunk: Workload | RunWorkload, present_tokens: np.ndarray, skips: np.ndarray, size: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The hit tokens and counters from ``E`` (``present_tokens // size``; see the module
    docstring)."""
    prompt = chunk.prompt_lengths
    present = present_tokens // size
    cached = rules.vllm_peak_tokens(prompt, chunk.output_lengths) // size
    hit = np.where(skips, 0, np.minimum(present, (prompt - 1) // size))
    none = np.zeros(chunk.n_requests, np.int64)
    counters = {
        "evicted_blocks": none,
        "inserted_blocks": cached - hit,
        "duplicate_blocks": present - hit,
        "preemptions": none,
        "rehit_tokens": none,
        "rejected": none,
    }
    return hit * size, counters


def kept_sequences(workload: RunWorkload) -> RunWorkload:
    """Each request as a prompt of what vLLM keeps of it (its prompt and answer but the last
    token) and one unknown token, with one unknown output (see the module docstring). The
    answer's last token is an entry of its own (the runs' contract cuts at ``L + n - 1``)."""
    runs = workload.runs
    prompt_counts = np.diff(runs.prompt_offsets)
    output_counts = np.diff(runs.output_offsets)
    if len(output_counts) and output_counts.min() < 1:
        raise ValueError("every request has an answer entry")
    last = runs.output_offsets[1:] - 1
    if len(last) and (workload.output_weights[last] != 1).any():
        raise ValueError("the answer's last token is not an entry of its own")
    n = workload.n_requests
    counts = prompt_counts + output_counts  # the prompt, the answer but its last, the unknown
    offsets = offsets_of(counts)
    keep = np.ones(len(runs.output_tokens), bool)
    keep[last] = False
    ids = np.empty(int(offsets[-1]), np.int32)
    weights = np.empty(int(offsets[-1]), np.int32)
    prompt_at = _positions(offsets[:-1], prompt_counts)
    answer_at = _positions(offsets[:-1] + prompt_counts, output_counts - 1)
    ids[prompt_at], weights[prompt_at] = runs.prompt_tokens, workload.prompt_weights
    ids[answer_at] = runs.output_tokens[keep]
    weights[answer_at] = workload.output_weights[keep]
    ids[offsets[1:] - 1], weights[offsets[1:] - 1] = UNKNOWN, 1
    ones = np.ones(n, np.int32)
    sequences = Workload(
        prompt_tokens=ids,
        prompt_offsets=offsets,
        output_tokens=np.full(n, UNKNOWN, np.int32),
        output_offsets=np.arange(n + 1, dtype=np.int64),
        namespace=runs.namespace,
        stop_finish=np.ones(n, bool),
    )
    return RunWorkload(sequences, weights, ones, workload.first_tokens, workload.log_tokens_hint)


def _positions(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[r] + k`` for ``k < counts[r]``, request after request."""
    owner = np.repeat(np.arange(len(counts)), counts)
    first = offsets_of(counts)
    return starts[owner] + np.arange(int(first[-1])) - first[:-1][owner]
