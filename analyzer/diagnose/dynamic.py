"""Dynamic content: where prompts of one template differ for a few tokens (a timestamp, a request
id, a user name) and then agree again, so everything after the value is recomputed.

Found on the prefix trie, without looking at every prompt: a node where the prompts through it
split (a candidate site) is a dynamic site when the continuations of its children, after at most
``MAX_VALUE_TOKENS`` differing tokens, meet again on a common ``ANCHOR_TOKENS``-token run that is
followed by at least ``min_static`` tokens they also share. Each child is represented by its
heaviest path (the continuation most of its prompts take). Then each prompt through a site gets
its own span: the tokens from the site to where the anchor appears in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from numba import njit

from analyzer.diagnose.fixes import DYNAMIC_TOKEN, Edits
from analyzer.diagnose.patterns import recognise
from analyzer.tokenizer import Tokenizer
from cache_models.prefix_trie import TrieNodes
from cache_models.trie_walk import nodes_on_paths
from cache_models.workload import Workload

ANCHOR_TOKENS = 4
MAX_VALUE_TOKENS = 32
MIN_SITE_REQUESTS = 3
# The anchor (and the static run after it) must be shared by children holding this share of the
# site's prompts.
AGREEING_SHARE = 0.5
MAX_CANDIDATES = 128
MAX_CHILDREN = 64
# Tokens before the divergence searched for the start of a recognised value ("2026-" before "11").
LOOKBACK_TOKENS = 32
SAMPLES = 5
# A user turn's header in the built-in templates (analyzer/templates: ChatML/Qwen, Llama 3, Gemma,
# Mistral, DeepSeek) and plain "User:" / "Human:" transcripts.
USER_TURN = re.compile(
    r"<\|im_start\|>user|<\|start_header_id\|>user|<start_of_turn>user|\[INST\]|<｜User｜>"
    r"|(?:^|\n)(?:User|Human):"
)


@dataclass(frozen=True)
class Site:
    """A place where a template's prompts carry a varying value."""

    node: int  # the trie node where the prompts first differ
    divergence: int  # its depth: the first token position that varies
    start: int  # where the value starts (before the divergence when a pattern says so)
    anchor: np.ndarray  # int32: the tokens that follow the value in every prompt
    kind: str  # a pattern name, "text", or "unknown" (no text)
    examples: list[str]  # decoded values of a few prompts


@dataclass(frozen=True)
class Spans:
    """A row per (request, site) the request passes; its value is prompt[start : start + length]."""

    request: np.ndarray  # int64, sorted
    site: np.ndarray  # int64 index into the site list
    start: np.ndarray  # int64
    length: np.ndarray  # int64

    def edits(self) -> Edits:
        """The normalisation: each value replaced by one constant token."""
        return Edits.of(self.request, self.start, self.length, 1, DYNAMIC_TOKEN)

    def first_per_request(self, n_requests: int) -> np.ndarray:
        """The first site of each request (-1: none)."""
        first = np.full(n_requests, -1, np.int64)
        rows = np.flatnonzero(np.diff(self.request, prepend=-1) != 0)
        first[self.request[rows]] = self.site[rows]
        return first


@dataclass(frozen=True)
class ValueRanges:
    """Where each site's values lie, to tell prefixes that end inside a varying value."""

    heads: list[np.ndarray]  # the tokens before each site's value
    ends: list[int]  # where each site's longest value ends

    def ends_inside(self, tokens: np.ndarray) -> bool:
        """Whether a prefix ends inside a value (where prompts differ by design)."""
        return any(
            len(head) < len(tokens) <= end and np.array_equal(tokens[: len(head)], head)
            for head, end in zip(self.heads, self.ends, strict=True)
        )

    @classmethod
    def of(cls, sites: list[Site], spans: Spans, trie: TrieNodes) -> ValueRanges:
        """``trie`` is the one the sites were found on."""
        heads = [trie.tokens(site.node)[: site.start] for site in sites]
        ends = [
            site.start + int(spans.length[spans.site == index].max(initial=0))
            for index, site in enumerate(sites)
        ]
        return cls(heads, ends)


def find_dynamic_content(
    trie: TrieNodes,
    workload: Workload,
    min_static: int,
    decoder: Tokenizer | None,
) -> tuple[list[Site], Spans]:
    """The dynamic sites of ``workload`` (``trie`` built from it) and every prompt's value span."""
    trie = trie.expanded  # the windows read the store as tokens
    found = _find_sites(trie, min_static)
    if not found:
        empty = np.zeros(0, np.int64)
        return [], Spans(empty, empty, empty, empty)
    nodes = np.array([node for node, _ in found], np.int64)
    marked = np.zeros(trie.n_nodes, np.bool_)
    marked[nodes] = True
    requests, on_path = nodes_on_paths(trie, workload, marked)
    index_of = np.full(trie.n_nodes, -1, np.int64)
    index_of[nodes] = np.arange(len(nodes))
    site_of = index_of[on_path]
    anchors = np.stack([anchor for _, anchor in found])
    depths = trie.depth[nodes]
    offsets = _anchor_offsets(
        workload.prompt_tokens,
        workload.prompt_offsets,
        requests,
        depths[site_of],
        anchors[site_of],
    )
    keep = offsets > 0
    spans = Spans(requests[keep], site_of[keep], depths[site_of[keep]], offsets[keep])
    sites = []
    for index, (node, anchor) in enumerate(found):
        rows = np.flatnonzero(spans.site == index)
        kind, start, examples = _describe(workload, spans, rows, int(trie.depth[node]), decoder)
        spans.length[rows] += spans.start[rows] - start
        spans.start[rows] = start
        sites.append(Site(int(node), int(trie.depth[node]), start, anchor, kind, examples))
    users = [
        index
        for index, site in enumerate(sites)
        if site.kind == "text" and _ends_a_user_message(trie, site, decoder)
    ]
    return _without(sites, spans, users)


def _ends_a_user_message(trie: TrieNodes, site: Site, decoder: Tokenizer | None) -> bool:
    """Whether the value runs to the end of a user message: the user's own words (a question),
    the conversation itself, not a value a template put before shared text."""
    if decoder is None or not decoder.special.eos_token:
        return False
    end_of_turn = decoder.special.eos_token
    if decoder.token_id(end_of_turn) not in site.anchor.tolist():  # the message ends there
        return False
    head = trie.tokens(site.node)[: site.start]
    before = decoder.decode(head[-LOOKBACK_TOKENS:])
    message = before.rsplit(end_of_turn, 1)[-1]  # the message the value is in
    return USER_TURN.search(message) is not None


def _without(sites: list[Site], spans: Spans, dropped: list[int]) -> tuple[list[Site], Spans]:
    """The sites and spans less the ``dropped`` sites (the rest renumbered)."""
    if not dropped:
        return sites, spans
    kept = [index for index in range(len(sites)) if index not in dropped]
    renumber = np.full(len(sites), -1, np.int64)
    renumber[kept] = np.arange(len(kept))
    rows = renumber[spans.site] >= 0
    kept_spans = Spans(
        spans.request[rows], renumber[spans.site[rows]], spans.start[rows], spans.length[rows]
    )
    return [sites[index] for index in kept], kept_spans


def _find_sites(trie: TrieNodes, min_static: int) -> list[tuple[int, np.ndarray]]:
    """(node, anchor) of each dynamic site, shallowest first, none inside another's value."""
    count = trie.count
    kids, first_kid, heaviest = _kids(trie.parent, count)  # by parent, then node
    n_kids = np.diff(first_kid)
    heaviest_count = np.where(heaviest >= 0, count[np.maximum(heaviest, 0)], 0)
    split_away = count - heaviest_count
    candidates = np.flatnonzero((count >= MIN_SITE_REQUESTS) & (n_kids >= 2) & (split_away >= 2))
    candidates = candidates[np.argsort(-split_away[candidates], kind="stable")][:MAX_CANDIDATES]
    candidates = candidates[np.argsort(trie.depth[candidates], kind="stable")]
    width = MAX_VALUE_TOKENS + ANCHOR_TOKENS + min_static
    sites: list[tuple[int, np.ndarray]] = []
    reach: list[tuple[int, int]] = []  # (site node, depth its value and static run reach)
    for node in candidates:
        if any(_descends(trie, int(node), site, end) for site, end in reach):
            continue
        children = kids[first_kid[node] : first_kid[node + 1]]
        children = children[np.argsort(-count[children], kind="stable")][:MAX_CHILDREN]
        windows = _windows(trie.start, trie.length, trie.store, heaviest, children, width)
        found = _anchor(windows, count[children], int(count[node]), min_static)
        if found is not None:
            anchor, span = found
            sites.append((int(node), anchor))
            reach.append((int(node), int(trie.depth[node]) + span + ANCHOR_TOKENS + min_static))
    return sites


def _descends(trie: TrieNodes, node: int, ancestor: int, below: int) -> bool:
    """Whether ``node`` lies under ``ancestor`` at a depth less than ``below``."""
    if trie.depth[node] >= below:
        return False
    while node > 0 and trie.depth[node] > trie.depth[ancestor]:
        node = int(trie.parent[node])
    return node == ancestor


def _anchor(
    windows: np.ndarray, weights: np.ndarray, total: int, min_static: int
) -> tuple[np.ndarray, int] | None:
    """The run of tokens where most children's continuations meet again, and the longest value
    before it; None when too few children agree or nothing static follows."""
    n_children, width = windows.shape
    n_offsets = min(MAX_VALUE_TOKENS, width - ANCHOR_TOKENS - min_static)
    grams = np.zeros((n_children, n_offsets), np.uint64)
    valid = np.ones((n_children, n_offsets), bool)
    for k in range(ANCHOR_TOKENS):
        column = windows[:, 1 + k : 1 + k + n_offsets]
        grams = grams * np.uint64(0x100000001B3) ^ column.astype(np.uint64)
        valid &= column >= 0
    child = np.repeat(np.arange(n_children), n_offsets)
    offset = np.tile(np.arange(1, n_offsets + 1), n_children)
    flat, child, offset = grams.ravel()[valid.ravel()], child[valid.ravel()], offset[valid.ravel()]
    if not len(flat):
        return None
    order = np.lexsort((offset, child, flat))
    flat, child, offset = flat[order], child[order], offset[order]
    first = np.r_[True, (np.diff(flat) != 0) | (np.diff(child) != 0)]  # earliest per child
    flat, child, offset = flat[first], child[first], offset[first]
    starts = np.flatnonzero(np.r_[True, np.diff(flat) != 0])
    weight = np.add.reduceat(weights[child], starts)
    mean_offset = np.add.reduceat(offset * weights[child], starts) / weight
    best = starts[np.lexsort((mean_offset, -weight))[0]]
    stop = starts[np.searchsorted(starts, best) + 1] if best != starts[-1] else len(flat)
    members, at = child[best:stop], offset[best:stop]
    if len(members) < 2:
        return None
    # The static run after the anchor must be shared too, by the same share of prompts.
    reference = windows[members[0], at[0] : at[0] + ANCHOR_TOKENS + min_static]
    agree = np.array(
        [
            np.array_equal(windows[c, a : a + ANCHOR_TOKENS + min_static], reference)
            for c, a in zip(members, at, strict=True)
        ]
    )
    if (reference < 0).any() or weights[members[agree]].sum() < AGREEING_SHARE * total:
        return None
    if np.count_nonzero(agree) < 2:
        return None
    return reference[:ANCHOR_TOKENS].astype(np.int32), int(at[agree].max())


@njit(cache=True)
def _kids(parent, count):
    """The nodes with prompts through them (count > 0) under a parent (> 0), grouped by parent
    in node order (``first_kid[p]`` on: a counting sort), and each parent's heaviest such child
    (the first of the largest count; -1: none)."""
    n = len(parent)
    first_kid = np.zeros(n + 1, np.int64)
    heaviest = np.full(n, -1, np.int64)
    for node in range(n):
        p = parent[node]
        if p > 0 and count[node] > 0:
            first_kid[p + 1] += 1
            if heaviest[p] < 0 or count[node] > count[heaviest[p]]:
                heaviest[p] = node
    for p in range(n):
        first_kid[p + 1] += first_kid[p]
    kids = np.empty(first_kid[n], np.int64)
    filled = first_kid[:-1].copy()
    for node in range(n):
        p = parent[node]
        if p > 0 and count[node] > 0:
            kids[filled[p]] = node
            filled[p] += 1
    return kids, first_kid, heaviest


@njit(cache=True)
def _windows(start, length, store, heaviest, children, width):
    """Each child's first ``width`` tokens along its heaviest path (-1 past the end)."""
    out = np.full((len(children), width), -1, np.int64)
    for i in range(len(children)):
        node = children[i]
        filled = 0
        while node >= 0 and filled < width:
            n = min(length[node], width - filled)
            out[i, filled : filled + n] = store[start[node] : start[node] + n]
            filled += n
            node = heaviest[node]
    return out


@njit(cache=True)
def _anchor_offsets(prompt_tokens, prompt_offsets, requests, depths, anchors):
    """For each (request, site): how many tokens after the site its anchor starts (0: absent)."""
    out = np.zeros(len(requests), np.int64)
    n_anchor = anchors.shape[1]
    for i in range(len(requests)):
        r = requests[i]
        base = prompt_offsets[r] + depths[i]
        room = prompt_offsets[r + 1] - base - n_anchor
        for offset in range(1, min(MAX_VALUE_TOKENS, room) + 1):
            k = 0
            while k < n_anchor and prompt_tokens[base + offset + k] == anchors[i, k]:
                k += 1
            if k == n_anchor:
                out[i] = offset
                break
    return out


def _describe(
    workload: Workload, spans: Spans, rows: np.ndarray, divergence: int, decoder: Tokenizer | None
) -> tuple[str, int, list[str]]:
    """The value's kind, where it starts, and a few decoded examples, from sample prompts."""
    samples = rows[:: max(1, len(rows) // SAMPLES)][:SAMPLES]
    if decoder is None:
        examples = [_ids(workload, spans, row, divergence) for row in samples]
        return "unknown", divergence, examples
    votes: dict[tuple[str, int], int] = {}
    for row in samples:
        prompt = workload.prompt(int(spans.request[row]))
        back = min(LOOKBACK_TOKENS, divergence)
        window = prompt[divergence - back : divergence + int(spans.length[row])]
        ends = [len(decoder.decode(window[:k])) for k in range(len(window) + 1)]
        text = decoder.decode(window)
        found = recognise(text, ends[back], ends[-1])
        if found is None:
            key = ("text", divergence)
        else:
            kind, char_start = found
            token = max(k for k in range(back + 1) if ends[k] <= char_start)
            key = (kind, divergence - back + token)
        votes[key] = votes.get(key, 0) + 1
    kind, start = max(votes, key=lambda key: votes[key])
    examples = []
    for row in samples[:3]:
        prompt = workload.prompt(int(spans.request[row]))
        end = int(spans.start[row] + spans.length[row])
        examples.append(decoder.decode(prompt[start:end]).replace("\n", "⏎")[:40])
    return kind, start, examples


def _ids(workload: Workload, spans: Spans, row: int, start: int) -> str:
    prompt = workload.prompt(int(spans.request[row]))
    value = prompt[start : int(spans.start[row] + spans.length[row])]
    return "[" + ", ".join(str(int(t)) for t in value[:8]) + (", …]" if len(value) > 8 else "]")
