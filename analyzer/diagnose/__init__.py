"""Diagnosis: why each prompt token was recomputed, what the log's templates and dynamic values
are, how hits grow with capacity and block size, and fixes whose gains are measured by replay."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from analyzer.diagnose.capacity import capacity_curves
from analyzer.diagnose.dynamic import Site, Spans, ValueRanges, find_dynamic_content
from analyzer.diagnose.fixes import apply_edits, original_hits, with_namespace
from analyzer.diagnose.losses import CATEGORIES, Ceilings, attribute
from analyzer.diagnose.model import Diagnosis, DynamicSite, EngineLosses, WhatIf
from analyzer.diagnose.parts import PartsSource, Reordered
from analyzer.diagnose.plans import (
    Context,
    KnownReplay,
    PadTarget,
    plan_hits,
    static_runs,
    what_if_plan,
)
from analyzer.diagnose.recommend import Evidence, KvShape, recommend
from analyzer.diagnose.scenarios import Scenario, gains, replay_hits
from analyzer.diagnose.sweep import size_sweep
from analyzer.engines import ENGINES
from analyzer.prefixes import TEMPLATE_MIN_TOKENS, shared_prefixes
from analyzer.progress import NoProgress, Progress
from analyzer.replay import Replays, ReplaySettings
from analyzer.tokenizer import Tokenizer
from cache_models.prefix_trie import PrefixTrie, TrieNodes, View
from cache_models.runs import RunWorkload
from cache_models.trie_walk import nodes_on_paths
from cache_models.workload import Workload

# The static run a dynamic value must precede to count (shorter runs are not worth moving it).
MIN_STATIC_TOKENS = 16
# Shared prefixes considered for padding.
PAD_CANDIDATES = 32
# Dynamic sites the report lists, the costliest first.
SHOWN_SITES = 20


@dataclass(frozen=True)
class DiagnoseInput:
    """Everything in replay order: the workload, its replays and per-request labels."""

    workload: Workload
    replays: Replays  # hits in the workload's order; the trie built from it
    settings: ReplaySettings
    salt_free_namespace: np.ndarray  # the namespace with cache_salt left out
    servers: np.ndarray | None  # the model each request goes to, when the log has several
    decoder: Tokenizer | None
    redact: bool
    what_if: tuple[str, ...] = ()
    reordered: Reordered | None = None  # the log with its message parts in one order
    kv: KvShape | None = None  # the model shape capacity advice also gives bytes for
    check_curves: bool = False  # replay LRU at a few capacities to check the curves
    fleet_hits: dict[str, np.ndarray] | None = None  # fleet replays: hits on the chosen replicas
    runs: RunWorkload | None = None  # the workload as runs (a hash trace replayed as runs)


@dataclass(frozen=True)
class DiagnoseResult:
    diagnosis: Diagnosis
    per_request: dict[str, np.ndarray]  # ``{engine}_lost_{category}``
    values: ValueRanges  # where the dynamic values lie
    # Recomputed tokens that padding a template saves (its tokens' bytes), measured by replay.
    padding_saves: dict[bytes, int]


def diagnose_log(
    workload: Workload,
    replays: Replays,
    order: np.ndarray | None,
    requests: pl.DataFrame,
    settings: ReplaySettings,
    decoder: Tokenizer | None,
    redact: bool,
    what_if: tuple[str, ...] = (),
    parts: PartsSource | None = None,
    progress: Progress | None = None,
    kv: KvShape | None = None,
    fleet_hits: dict[str, np.ndarray] | None = None,
    check_curves: bool = False,
    runs: RunWorkload | None = None,
) -> DiagnoseResult:
    """``diagnose`` for the pipeline: the workload, replays and request table in input order,
    replayed in ``order`` (None: as they are); per-request losses come back in input order.
    ``parts`` gives the requests as read, to reorder their message parts; ``runs``, the workload
    as runs (a hash trace's), which the passes that read runs take instead."""
    reordered = None if parts is None else parts.reordered(workload.n_requests)
    model = requests["model"].fill_null("")
    # the model each request goes to, when the log has several (the servers)
    models = model.to_numpy().astype(str) if model.n_unique() > 1 else None
    salt_free = requests.select(
        pl.struct(pl.col("model").fill_null(""), pl.col("lora").fill_null("")).rank("dense")
    ).to_series()
    if order is not None:
        workload = workload.select(order)
        replays = Replays(
            vllm=replace(replays.vllm, hit_tokens=replays.vllm.hit_tokens[order]),
            sglang=replace(replays.sglang, hit_tokens=replays.sglang.hit_tokens[order]),
            sglang_page1=replace(
                replays.sglang_page1, hit_tokens=replays.sglang_page1.hit_tokens[order]
            ),
            ideal=replace(replays.ideal, hit_tokens=replays.ideal.hit_tokens[order]),
            trie=replays.trie,
        )
        models = None if models is None else models[order]
        salt_free = salt_free[order]
        if fleet_hits is not None:
            fleet_hits = {engine: hits[order] for engine, hits in fleet_hits.items()}
        if reordered is not None:
            reordered = replace(reordered, workload=reordered.workload.select(order))
        if runs is not None:
            runs = runs.select(order)
    inputs = DiagnoseInput(
        workload=workload,
        replays=replays,
        settings=settings,
        salt_free_namespace=salt_free.to_numpy().astype(np.int32),
        servers=models,
        decoder=decoder,
        redact=redact,
        what_if=what_if,
        reordered=reordered,
        kv=kv,
        check_curves=check_curves,
        fleet_hits=fleet_hits,
        runs=runs,
    )
    result = diagnose(inputs, progress)
    if order is None:
        return result
    per_request = {}
    for name, values in result.per_request.items():
        per_request[name] = np.empty_like(values)
        per_request[name][order] = values
    return replace(result, per_request=per_request)


def diagnose(inputs: DiagnoseInput, progress: Progress | None = None) -> DiagnoseResult:
    progress = progress or NoProgress()
    progress.stage("diagnosing", None)
    workload, replays, settings = inputs.workload, inputs.replays, inputs.settings
    hits = {"vllm": replays.vllm.hit_tokens, "sglang": replays.sglang.hit_tokens}
    unbounded = hits
    if settings.capacity_tokens is not None:
        unbounded = replay_hits(
            Scenario(workload, replace(settings, capacity_tokens=None), servers=inputs.servers)
        )
    sequential_unbounded = unbounded
    if settings.max_in_flight > 1 or settings.time_model is not None:
        sequential = replace(settings, capacity_tokens=None, max_in_flight=1, time_model=None)
        sequential_unbounded = replay_hits(Scenario(workload, sequential, servers=inputs.servers))

    salt_free, salt_free_trie, salt_free_ceiling, salt_free_replay = _salt_free(
        workload, replays, inputs
    )
    sites, spans = find_dynamic_content(
        salt_free_trie, salt_free, MIN_STATIC_TOKENS, inputs.decoder
    )
    constant_ceiling = salt_free_ceiling
    if sites:
        edits = spans.edits()
        trie = PrefixTrie()
        normalised = trie.replay(apply_edits(salt_free, edits)).hit_tokens
        constant_ceiling = original_hits(normalised, edits, workload.prompt_lengths)
    ceilings = Ceilings(replays.ideal.hit_tokens, salt_free_ceiling, constant_ceiling)
    lengths = workload.prompt_lengths
    fleet = inputs.fleet_hits or {}
    losses = {
        e: attribute(
            e, lengths, hits[e], unbounded[e], sequential_unbounded[e], ceilings, fleet.get(e)
        )
        for e in hits
    }
    moves = static_runs(workload, spans, len(sites))
    values = ValueRanges.of(sites, spans, salt_free_trie)
    site_loss = np.maximum(constant_ceiling - salt_free_ceiling, 0)
    dynamic_sites = _site_summaries(
        sites, spans, moves.static_tokens, site_loss, lengths, inputs.redact
    )

    context = Context(
        workload=workload,
        settings=settings,
        salt_free_namespace=inputs.salt_free_namespace,
        pad_targets=_pad_targets(replays.trie, workload, values, _end_of_turn(inputs.decoder)),
        sites=sites,
        moves=moves,
        servers=inputs.servers,
        reordered=inputs.reordered,
        relocate=lambda moved: _relocated(moved, inputs),
        salt_free_replay=salt_free_replay,
    )
    curves, belady = capacity_curves(
        replays.trie, workload, settings, inputs.servers, check=inputs.check_curves
    )
    sweep = size_sweep(workload, settings, hits, inputs.servers, inputs.runs, replays.views)
    totals = {e: losses[e].totals() for e in losses}
    evidence = Evidence(
        hits=hits,
        dynamic_sites=dynamic_sites,
        salt_loss=max(t["salts"] for t in totals.values()),
        eviction_loss=max(t["eviction"] for t in totals.values()),
        curves=curves,
        sweep=sweep,
        kv=inputs.kv,
    )
    advice = recommend(context, evidence)
    diagnosis = Diagnosis(
        losses={e: EngineLosses(totals[e], losses[e].clamped) for e in losses},
        dynamic_content=sorted(dynamic_sites, key=lambda site: -site.lost_tokens)[:SHOWN_SITES],
        recommendations=advice.recommendations,
        capacity_curves=curves,
        size_sweep=sweep,
        belady=belady,
        what_if=_what_ifs(context, hits, inputs.what_if),
        eviction_policy=settings.eviction_policy,
    )
    per_request = {
        f"{engine}_lost_{name}": losses[engine].per_request[name]
        for engine in losses
        for name in CATEGORIES
    }
    return DiagnoseResult(diagnosis, per_request, values, advice.padding_saves)


def _relocated(workload: Workload, inputs: DiagnoseInput) -> Context:
    """The plans' context for the same requests after a fix moved their tokens: templates and
    dynamic values found again in ``workload`` (what a second moving fix needs)."""
    salt_free = with_namespace(workload, inputs.salt_free_namespace)
    salt_free_trie = PrefixTrie()
    salt_free_trie.replay(salt_free)
    assert salt_free_trie.nodes is not None
    sites, spans = find_dynamic_content(
        salt_free_trie.nodes, salt_free, MIN_STATIC_TOKENS, inputs.decoder
    )
    values = ValueRanges.of(sites, spans, salt_free_trie.nodes)
    trie = PrefixTrie()
    trie.replay(workload)
    assert trie.nodes is not None
    return Context(
        workload=workload,
        settings=inputs.settings,
        salt_free_namespace=inputs.salt_free_namespace,
        pad_targets=_pad_targets(trie.nodes, workload, values, _end_of_turn(inputs.decoder)),
        sites=sites,
        moves=static_runs(workload, spans, len(sites)),
        servers=inputs.servers,
        reordered=None,
        relocate=lambda moved: _relocated(moved, inputs),
    )


def _salt_free(
    workload: Workload, replays: Replays, inputs: DiagnoseInput
) -> tuple[Workload, TrieNodes, np.ndarray, KnownReplay | None]:
    """The workload without salts, its trie and its ceiling (the replays' own when no salt), and,
    when that needs a pass of its own and the replays are unbounded and sequential on one server,
    the engines' hits of that pass too (the no-salt fix's replay: views of the same trie)."""
    if np.array_equal(inputs.salt_free_namespace, workload.namespace):
        return workload, replays.trie, replays.ideal.hit_tokens, None
    salt_free = with_namespace(workload, inputs.salt_free_namespace)
    renamed = _renamed(replays.trie, workload.namespace, inputs.salt_free_namespace)
    if renamed is not None:  # no salt: the same requests together, under other ids
        return salt_free, renamed, replays.ideal.hit_tokens, None
    settings = inputs.settings
    engines: tuple[str, ...] = ()
    if settings.capacity_tokens is None and settings.sequential and inputs.servers is None:
        engines = ENGINES
    views = [View("ideal")] + [
        View(engine, settings.block_size if engine == "vllm" else settings.page_size)
        for engine in engines
    ]
    trie = PrefixTrie(views)
    ceiling, *engine_hits = trie.feed(salt_free)
    known = None
    if engines:
        known = KnownReplay(workload, settings, dict(zip(engines, engine_hits, strict=True)))
    return salt_free, trie.nodes, ceiling, known


def _renamed(trie: TrieNodes, old: np.ndarray, new: np.ndarray) -> TrieNodes | None:
    """The trie with its namespace ids renamed ``old`` -> ``new`` when that is one to one (the
    same requests share a namespace under either): then it is, node for node, the trie of the
    renamed workload (nodes are made in request order, whatever their namespace ids), and its
    hits are the same. None when the renaming merges or splits namespaces."""
    span = int(new.max(initial=0)) + 1  # each (old, new) pair as one int: ids are >= 0
    keys = np.unique(old.astype(np.int64) * span + new.astype(np.int64))
    pairs = np.stack([keys // span, keys % span])
    if not (len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]):
        return None
    lookup = np.zeros(int(pairs[0].max(initial=0)) + 1, np.int64)
    lookup[pairs[0]] = pairs[1]
    namespace = lookup[trie.namespace]
    namespace[0] = trie.namespace[0]  # the sentinel above the roots
    return trie.with_namespace(namespace)


def _site_summaries(
    sites: list[Site],
    spans: Spans,
    static_tokens: np.ndarray,
    site_loss: np.ndarray,
    prompt_lengths: np.ndarray,
    redact: bool,
) -> list[DynamicSite]:
    first_site = spans.first_per_request(len(prompt_lengths))
    summaries = []
    for index, site in enumerate(sites):
        rows = spans.site == index
        summaries.append(
            DynamicSite(
                position=site.start,
                kind=site.kind,
                requests=int(rows.sum()),
                value_tokens=int(spans.length[rows].max(initial=0)),
                static_tokens_after=int(static_tokens[index]),
                lost_tokens=int(site_loss[first_site == index].sum()),
                examples=None if redact else site.examples,
            )
        )
    return summaries


def _pad_targets(
    trie: TrieNodes, workload: Workload, values: ValueRanges, end_of_turn: int | None
) -> list[PadTarget]:
    """The templates worth padding, the same tokens under every namespace merged, with the
    requests that extend them; none that ends inside a dynamic value.

    Padding anywhere inside a template aligns it the same way (every request through it shifts
    alike), so it goes where a user would put it: at the end of the template's last whole
    message (before its end-of-turn token), else at the template's end.
    """
    groups: dict[bytes, list[int]] = {}
    for prefix in shared_prefixes(trie, top=PAD_CANDIDATES, min_extension=TEMPLATE_MIN_TOKENS):
        if not values.ends_inside(prefix.tokens):
            groups.setdefault(prefix.tokens.tobytes(), []).append(prefix.node)
    if not groups:
        return []
    marked = np.zeros(trie.n_nodes, np.bool_)
    target_of = np.full(trie.n_nodes, -1, np.int64)
    for index, nodes in enumerate(groups.values()):
        marked[nodes] = True
        target_of[nodes] = index
    requests, nodes = nodes_on_paths(trie, workload, marked)
    lengths = workload.prompt_lengths
    targets = []
    for index, key in enumerate(groups):
        tokens = np.frombuffer(key, np.int32)
        rows = requests[(target_of[nodes] == index)]
        ends = np.flatnonzero(tokens == end_of_turn) if end_of_turn is not None else []
        at = int(ends[-1]) if len(ends) else len(tokens)
        targets.append(PadTarget(tokens, rows[lengths[rows] > len(tokens)], at))
    return targets


def _end_of_turn(decoder: Tokenizer | None) -> int | None:
    """The token that ends a chat message (None without text or such a token)."""
    if decoder is None or not decoder.special.eos_token:
        return None
    return decoder.token_id(decoder.special.eos_token)


def _what_ifs(
    context: Context, hits: dict[str, np.ndarray], specs: tuple[str, ...]
) -> list[WhatIf]:
    plans = [what_if_plan(context, spec) for spec in specs]
    results = plan_hits(plans, context, hits)
    return [
        WhatIf(p.name, p.kind, gains(context.workload, hits, p.log, result), p.details)
        for p, result in zip(plans, results, strict=True)
    ]
