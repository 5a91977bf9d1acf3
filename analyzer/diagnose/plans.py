"""Named fixes (the recommendations' and ``--what-if``'s): each gives the workload and engine flags
to replay. A plan's gain is always measured by replaying what it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
from numba import njit

from analyzer.diagnose.dynamic import Site, Spans
from analyzer.diagnose.fixes import PAD_TOKEN, EditedLog, Edits, rotate, with_namespace
from analyzer.diagnose.parts import Reordered
from analyzer.diagnose.scenarios import ENGINES, Scenario, replay_many
from analyzer.diagnose.what_if import MOVING, Fix, WhatIfSpec
from analyzer.errors import PrefixcheckError
from analyzer.replay import ReplaySettings
from cache_models.workload import Workload

# The static run after a value is what this share of the site's prompts still share.
STATIC_SHARE = 0.5


@dataclass(frozen=True)
class PadTarget:
    """A shared prefix, the requests whose prompts extend it (replay order), and where in it
    padding goes."""

    tokens: np.ndarray
    requests: np.ndarray
    insert_at: int

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Moves:
    """Per span: the value is moved to the end of the static run that follows it."""

    spans: Spans
    end: np.ndarray  # int64: where the static run after the value ends, per span
    static_tokens: np.ndarray  # int64 per site: the static run most of its prompts share


@dataclass(frozen=True)
class KnownReplay:
    """Hits replayed already: those of ``base`` with its salts left out, unbounded and
    sequential with ``settings`` (per engine), from the pass that built the salt-free trie."""

    base: Workload
    settings: ReplaySettings
    hits: dict[str, np.ndarray]


@dataclass(frozen=True)
class Context:
    """What the plans are built from (replay order)."""

    workload: Workload
    settings: ReplaySettings
    salt_free_namespace: np.ndarray
    pad_targets: list[PadTarget]
    sites: list[Site]
    moves: Moves
    servers: np.ndarray | None  # the model each request goes to, when the log has several
    reordered: Reordered | None = None  # the log with its message parts in one order
    # The context of another workload (the same requests after a fix moved their tokens): its
    # templates and dynamic values found again, so that a second moving fix can follow a first.
    relocate: Callable[[Workload], Context] | None = None
    salt_free_replay: KnownReplay | None = None  # the salt-free log's hits, when replayed


@dataclass(frozen=True)
class Plan:
    """A fix: the log to replay (``log``: a workload, or the context's with edits, built only as
    far as its replay reads it) and the engine flags."""

    name: str
    kind: str
    log: Workload | EditedLog
    settings: ReplaySettings
    engines: tuple[str, ...] = ENGINES
    details: dict[str, Any] = field(default_factory=dict)
    hits: dict[str, np.ndarray] | None = None  # its replay's hits, when known already

    @cached_property
    def workload(self) -> Workload:
        """The whole fixed log (an edited one built here, once)."""
        return self.log.workload if isinstance(self.log, EditedLog) else self.log


def plan_hits(
    plans: list[Plan], context: Context, hits: dict[str, np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """Each plan's hits: known already, or replayed (``edit_scenario``; together)."""
    replayed = iter(
        replay_many([edit_scenario(plan, context, hits) for plan in plans if plan.hits is None])
    )
    return [next(replayed) if plan.hits is None else plan.hits for plan in plans]


def edit_scenario(plan: Plan, context: Context, hits: dict[str, np.ndarray]) -> Scenario:
    """The plan's replay. When it keeps the settings, ``context.workload`` is its base and
    ``hits`` (the log's hits with those settings) the base's hits: an unbounded sequential
    replay then replays only the requests its edits can reach."""
    keeps = (
        plan.settings == context.settings
        and plan.log.n_requests == context.workload.n_requests
        and all(engine in hits for engine in plan.engines)
    )
    return Scenario(
        plan.log,
        plan.settings,
        plan.engines,
        context.servers,
        base=context.workload if keeps else None,
        base_hits=hits if keeps else None,
    )


def pad_plan(context: Context, targets: list[PadTarget]) -> Plan:
    """Pad each target to a multiple of the block size, where it ends (nested targets: the
    longer one is padded after the shorter one's padding)."""
    block = context.settings.block_size
    ordered = sorted(targets, key=lambda t: t.length)
    pads: list[int] = []
    for i, target in enumerate(ordered):
        shift = sum(
            pads[j]
            for j, inner in enumerate(ordered[:i])
            if np.array_equal(target.tokens[: inner.length], inner.tokens)
        )
        pads.append(-(target.length + shift) % block)
    rows = [(t.requests, t.insert_at, pad) for t, pad in zip(ordered, pads, strict=True) if pad]
    edits = Edits.of(
        np.concatenate([r for r, _, _ in rows] or [np.zeros(0, np.int64)]),
        np.concatenate([np.full(len(r), n) for r, n, _ in rows] or [np.zeros(0, np.int64)]),
        0,
        np.concatenate([np.full(len(r), p) for r, _, p in rows] or [np.zeros(0, np.int64)]),
        PAD_TOKEN,
    )
    details = {
        "prefixes": [
            {
                "prefix_tokens": t.length,
                "padding_tokens": pad,
                "insert_at_token": t.insert_at,
                "requests": len(t.requests),
            }
            for t, pad in zip(ordered, pads, strict=True)
        ]
    }
    log = EditedLog(context.workload, edits)
    return Plan("pad-prefixes", "pad_prefix", log, context.settings, details=details)


def move_plan(context: Context, sites: list[int]) -> Plan:
    """Move the values of ``sites`` after the static run that follows them."""
    moves = context.moves
    rows = np.flatnonzero(np.isin(moves.spans.site, sites))
    split = moves.spans.start[rows] + moves.spans.length[rows]
    keep = moves.end[rows] > split
    rows, split = rows[keep], split[keep]
    workload = rotate(
        context.workload, moves.spans.request[rows], moves.spans.start[rows], split, moves.end[rows]
    )
    details = {
        "sites": [
            {
                "position": context.sites[s].start,
                "kind": context.sites[s].kind,
                "move_after_tokens": int(moves.static_tokens[s]),
                "requests": int(np.count_nonzero(moves.spans.site[rows] == s)),
            }
            for s in sites
        ]
    }
    return Plan("move-dynamic", "move_dynamic_content", workload, context.settings, details=details)


def reorder_plan(context: Context) -> Plan:
    """Tool definitions in one order and the system prompt first (re-rendered, re-tokenized)."""
    reordered = context.reordered
    if reordered is None:
        raise PrefixcheckError("--what-if reorder-parts: no message parts to reorder in this log")
    details = {
        "tools_reordered": reordered.tools_reordered,
        "system_moved": reordered.system_moved,
    }
    return Plan(
        "reorder-parts", "reorder_parts", reordered.workload, context.settings, details=details
    )


def salt_plan(context: Context) -> Plan:
    """Every tenant in one cache namespace (LoRA adapters stay apart). Its hits are the salt-free
    pass's when that replayed this log with these settings."""
    workload = with_namespace(context.workload, context.salt_free_namespace)
    known = context.salt_free_replay
    hits = None
    if known is not None and known.base is context.workload and known.settings == context.settings:
        hits = known.hits
    return Plan("no-salt", "salt", workload, context.settings, hits=hits)


def settings_plan(context: Context, name: str | Fix, value: str = "") -> Plan:
    """A different engine flag: block-size, page-size, capacity or eviction-policy."""
    fix = name if isinstance(name, Fix) else Fix.parse(f"{name}={value}")
    settings = fix.settings(context.settings)
    return Plan(fix.label, fix.kind, context.workload, settings, fix.engines)


def what_if_plan(context: Context, spec: WhatIfSpec | str) -> Plan:
    """The plan for one ``--what-if``; fixes joined with ``+`` apply together, in the spec's
    order: engine flags first, then the fixes that move tokens, each on the log the previous one
    left (its targets found again there)."""
    if isinstance(spec, str):
        spec = WhatIfSpec.parse(spec)
    engines: set[str] = set()
    plan: Plan | None = None
    moved = False
    for fix in spec.parts:
        if fix.name in MOVING and moved:
            if context.relocate is None:
                raise PrefixcheckError(f"--what-if {spec.text}: these fixes do not combine here")
            context = replace(context.relocate(context.workload), settings=context.settings)
        plan = _named_plan(context, fix)
        moved = moved or fix.name in MOVING
        context = replace(context, workload=plan.workload, settings=plan.settings)
        engines.update(plan.engines)
    assert plan is not None
    return replace(plan, name=spec.text, engines=tuple(e for e in ENGINES if e in engines))


def static_runs(workload: Workload, spans: Spans, n_sites: int) -> Moves:
    """For each span, where the static run after its value ends, and each site's static run.

    The reference is the continuation of the site's first prompt; a site's static run is the
    longest run at least ``STATIC_SHARE`` of its prompts share with it. A value is moved over the
    part of the static run its own prompt shares, and never past the next value in the prompt.
    """
    after = spans.start + spans.length
    common = _common_runs(workload.prompt_tokens, workload.prompt_offsets, spans, after)
    static = np.zeros(n_sites, np.int64)
    for site in range(n_sites):
        runs = np.sort(common[spans.site == site])[::-1]
        if len(runs):
            static[site] = runs[int(np.ceil(STATIC_SHARE * len(runs))) - 1]
    end = after + np.minimum(common, static[spans.site])
    same_request = np.r_[spans.request[1:] == spans.request[:-1], False]
    next_start = np.where(same_request, np.r_[spans.start[1:], 0], np.iinfo(np.int64).max)
    return Moves(spans, np.minimum(end, next_start), static)


def _named_plan(context: Context, fix: Fix) -> Plan:
    if fix.name == "pad-prefixes":
        if not context.pad_targets:
            raise PrefixcheckError("--what-if pad-prefixes: no shared template in this log")
        return pad_plan(context, context.pad_targets)
    if fix.name == "move-dynamic":
        if not context.sites:
            raise PrefixcheckError("--what-if move-dynamic: no dynamic content in this log")
        return move_plan(context, list(range(len(context.sites))))
    if fix.name == "no-salt":
        return salt_plan(context)
    if fix.name == "reorder-parts":
        return reorder_plan(context)
    return settings_plan(context, fix)


@njit(cache=True)
def _common_runs_kernel(tokens, offsets, requests, sites, after, first_row):
    out = np.zeros(len(requests), np.int64)
    for i in range(len(requests)):
        ref = first_row[sites[i]]
        a = offsets[requests[i]] + after[i]
        b = offsets[requests[ref]] + after[ref]
        limit = min(offsets[requests[i] + 1] - a, offsets[requests[ref] + 1] - b)
        n = 0
        while n < limit and tokens[a + n] == tokens[b + n]:
            n += 1
        out[i] = n
    return out


def _common_runs(
    tokens: np.ndarray, offsets: np.ndarray, spans: Spans, after: np.ndarray
) -> np.ndarray:
    """How many tokens after each value agree with the site's first prompt's continuation."""
    if not len(spans.site):
        return np.zeros(0, np.int64)
    first_row = np.zeros(int(spans.site.max()) + 1, np.int64)
    for site in np.unique(spans.site):
        first_row[site] = np.flatnonzero(spans.site == site)[0]
    return _common_runs_kernel(tokens, offsets, spans.request, spans.site, after, first_row)
