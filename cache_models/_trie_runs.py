"""The prefix trie's pass over a run-length workload (``cache_models.runs``): ``feed_tokens``
with run ids for tokens, each stored with its weight.

Under the runs' contract (equal ids are equal runs, different ids differ at their first token)
two requests' token sequences agree exactly as far as their entries do, and every point the trie
acts at (a prompt's end ``L``, the match limit ``L - 1``, what an engine keeps of the answer) is an
entry boundary. So every edge of the token trie is a whole number of entries, and the trie over
entries is the token trie node for node, made in the same order. The store and the node columns
``START`` and ``LENGTH`` count entries; ``DEPTH``, the hits and the views' ``best`` count tokens.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models._trie_kernel import (
    COUNT,
    DEPTH,
    FIRST,
    LENGTH,
    N_REQUESTS,
    N_STORE,
    NO_CHILD,
    PARENT,
    SPACE,
    START,
    add_node,
    find_child,
    grow,
    set_child,
)


@njit(cache=True)
def _entries_within(cum: np.ndarray, n_entries: int, tokens: int) -> int:
    """The most leading entries (of ``n_entries``) whose tokens (prefix sums ``cum``) fit in
    ``tokens``."""
    e = n_entries
    while cum[e] > tokens:
        e -= 1
    return e


@njit(cache=True, nogil=True)
def feed_runs(
    columns,
    best,
    store,
    store_weights,
    children,
    sizes,
    prompt_ids,
    prompt_weights,
    prompt_offsets,
    output_ids,
    output_weights,
    output_offsets,
    namespace,
    stop_finish,
    view_granularity,
    view_vllm,
):
    """``feed_tokens`` over entries (see the module docstring): match then insert each request."""
    n_requests = len(prompt_offsets) - 1
    n_views = len(view_granularity)
    hits = np.zeros((n_views, n_requests), np.int64)
    reach = np.zeros(n_views, np.int64)
    kept = np.zeros(n_views, np.int64)
    seq = np.zeros(1024, np.int32)
    weight = np.zeros(1024, np.int32)
    cum = np.zeros(1025, np.int64)  # tokens before each entry of seq

    for r in range(n_requests):
        request = sizes[N_REQUESTS] + r
        p0, p1 = prompt_offsets[r], prompt_offsets[r + 1]
        o0, o1 = output_offsets[r], output_offsets[r + 1]
        n_prompt = p1 - p0  # entries
        n_all = n_prompt + o1 - o0
        if n_all > len(seq):
            seq = grow(seq, n_all)
            weight = grow(weight, n_all)
        if n_all + 1 > len(cum):
            cum = grow(cum, n_all + 1)
        seq[:n_prompt] = prompt_ids[p0:p1]
        seq[n_prompt:n_all] = output_ids[o0:o1]
        weight[:n_prompt] = prompt_weights[p0:p1]
        weight[n_prompt:n_all] = output_weights[o0:o1]
        cum[0] = 0
        for i in range(n_all):
            cum[i + 1] = cum[i] + weight[i]
        prompt_len = cum[n_prompt]  # tokens
        answer = cum[n_all] - prompt_len
        n_out = answer if stop_finish[r] else answer - 1
        seq_len = _entries_within(cum, n_all, prompt_len + n_out)
        for i in range(seq_len):  # nothing after an unknown entry can ever match
            if seq[i] < 0:
                seq_len = i
                break
        seq_tokens = cum[seq_len]
        for v in range(n_views):
            g = view_granularity[v]
            n_kept = (answer - 1) if view_vllm[v] else n_out
            kept[v] = min((prompt_len + n_kept) // g * g, seq_tokens)

        root = find_child(children, 0, namespace[r])
        if root == NO_CHILD:
            root, columns, best = add_node(columns, best, sizes, 0, 0, 0, 0, 0, -1, namespace[r])
            children = set_child(children, sizes, 0, namespace[r], root)

        # 1. match, limited to prompt_len - 1 tokens; per view, the best min(LCP, kept) on the way
        limit = _entries_within(cum, seq_len, prompt_len - 1)
        reach[:] = 0
        node, pos = root, 0
        while pos < limit:
            child = find_child(children, node, seq[pos])
            if child == NO_CHILD:
                break
            edge, span = columns[child, START], columns[child, LENGTH]
            m = 0
            while m < span and pos + m < limit and store[edge + m] == seq[pos + m]:
                m += 1
            pos += m
            for v in range(n_views):
                reach[v] = max(reach[v], min(cum[pos], best[child, v]))
            if m < span:
                break
            node = child
        for v in range(n_views):
            g = view_granularity[v]
            hits[v, r] = min(prompt_len - 1, reach[v]) // g * g

        # 2. insert prompt + cacheable outputs, splitting at divergences and at the prompt end
        node, pos = root, 0
        while pos < seq_len:
            child = find_child(children, node, seq[pos])
            if child == NO_CHILD:
                cut = n_prompt if pos < n_prompt else seq_len
                while pos < seq_len:
                    end = min(cut, seq_len)
                    n_store = sizes[N_STORE]
                    if n_store + end - pos > len(store):
                        store = grow(store, n_store + end - pos)
                    if n_store + end - pos > len(store_weights):
                        store_weights = grow(store_weights, n_store + end - pos)
                    store[n_store : n_store + end - pos] = seq[pos:end]
                    store_weights[n_store : n_store + end - pos] = weight[pos:end]
                    sizes[N_STORE] = n_store + end - pos
                    counted = pos < n_prompt
                    leaf, columns, best = add_node(
                        columns,
                        best,
                        sizes,
                        node,
                        n_store,
                        end - pos,
                        columns[node, DEPTH] + cum[end] - cum[pos],
                        1 if counted else 0,
                        request if counted else -1,
                        namespace[r],
                    )
                    best[leaf, :] = kept
                    children = set_child(children, sizes, node, seq[pos], leaf)
                    node, pos, cut = leaf, end, seq_len
                break
            span = columns[child, LENGTH]
            m = 0
            while (
                m < span and pos + m < seq_len and store[columns[child, START] + m] == seq[pos + m]
            ):
                m += 1
            cut = min(m, n_prompt - pos) if pos < n_prompt else m
            if cut < span:
                if pos + cut == seq_len and pos + cut != n_prompt:
                    for v in range(n_views):
                        best[child, v] = max(best[child, v], kept[v])
                    break
                mid, columns, best = add_node(
                    columns,
                    best,
                    sizes,
                    node,
                    columns[child, START],
                    cut,
                    columns[node, DEPTH] + cum[pos + cut] - cum[pos],
                    columns[child, COUNT],
                    columns[child, FIRST],
                    columns[child, SPACE],
                )
                best[mid, :] = best[child, :]
                children = set_child(children, sizes, node, seq[pos], mid)
                columns[child, PARENT] = mid
                columns[child, START] += cut
                columns[child, LENGTH] -= cut
                children = set_child(children, sizes, mid, store[columns[child, START]], child)
                child = mid
            if pos < n_prompt:
                columns[child, COUNT] += 1
                if columns[child, FIRST] < 0:
                    columns[child, FIRST] = request
            for v in range(n_views):
                best[child, v] = max(best[child, v], kept[v])
            pos += cut
            node = child
    sizes[N_REQUESTS] += n_requests
    return hits, columns, best, store, store_weights, children
