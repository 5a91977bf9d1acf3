"""The fleet step of ``analyze``: routing keys and the log's own placement from the log, the fleet
and single-instance replays, and the report's fleet section."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from analyzer.errors import PrefixcheckError
from analyzer.fleet import FleetOptions, FleetReplays, Placed, Placement, place, replay_fleet
from analyzer.fleet_keys import field_values, session_keys
from analyzer.pool import CacheFactory, model_labels
from analyzer.progress import Progress
from analyzer.replay import (
    Replayed,
    Replays,
    ReplaySettings,
    arrival_order,
    check_arrivals,
    in_input_order,
    replay_all,
)
from analyzer.shares import hit_rate
from analyzer.workload import TokenizedLog
from cache_models.workload import Workload


def log_placement(
    requests: pl.DataFrame, field: str, names: dict[str, int] | None = None
) -> tuple[np.ndarray, list[str]]:
    """The replica each request was served by, numbered by first appearance (in ``names``, kept
    between the chunks of a streamed log)."""
    values = field_values(requests, field)
    names = {} if names is None else names
    placed = np.empty(len(values), np.int64)
    for i, value in enumerate(values):
        if value is None or value == "":
            raise PrefixcheckError(
                f"{requests['file'][i]}:{requests['line'][i]}: no --replica-field {field!r}"
            )
        placed[i] = names.setdefault(str(value), len(names))
    return placed, list(names)


@dataclass(frozen=True)
class ReplicaSummary:
    name: str
    requests: int
    prompt_tokens: int
    peak_in_flight: int
    hit_rate: dict[str, float]


@dataclass(frozen=True)
class FleetSummary:
    """The fleet beside one instance with its total capacity."""

    replicas: int
    router: str
    router_source: str
    load_model: str
    capacity_tokens_per_replica: int | None
    hit_rate: dict[str, float]  # the fleet's, per engine
    single_instance_hit_rate: dict[str, float]
    routing_loss_tokens: dict[str, int]
    per_replica: list[ReplicaSummary]
    request_imbalance: float  # busiest replica's requests / the mean
    token_imbalance: float
    keyless_requests: int  # routed by their text: no --session-field value
    decisions: dict[str, int]
    what_if: list[dict[str, Any]] = field(default_factory=list)  # --what-if router=/replicas=
    router_ranking: list[dict[str, Any]] = field(default_factory=list)  # measured candidates
    capacity_for_share: dict[str, Any] | None = None  # per-replica capacity for 90% of hits
    advice_skipped: str | None = None  # why no ranking was measured
    # a streamed log's: the diagnosed sample the ranking and capacity advice were measured on
    # (its requests and prompt tokens); None: the whole log (and not in the JSON)
    advice_sample: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = self.__dict__ | {"per_replica": [r.__dict__ for r in self.per_replica]}
        if self.advice_sample is None:
            del out["advice_sample"]
        out["definition"] = (
            "hit rates over all prompt tokens; single_instance: one instance holding the "
            "fleet's total capacity; routing loss: its hits minus the fleet's"
        )
        return out


@dataclass(frozen=True)
class FleetRun:
    replayed: Replayed  # the fleet's (input order), as the replay step gives it
    single: Replays  # input order
    placement: np.ndarray  # input order
    summary: FleetSummary
    settings: ReplaySettings  # the single instance's (total capacity)
    single_sample: Replays | None = None  # a streamed log's: the single instance's on the sample

    @property
    def sample_single(self) -> Replays:
        """The single instance's results on the diagnosed sample (the whole log unless streamed)."""
        return self.single if self.single_sample is None else self.single_sample


FLEET_FIXES = ("router=", "replicas=", "session-field=")


def is_fleet_fix(text: str) -> bool:
    return text.startswith(FLEET_FIXES)


def fleet_fix(options: FleetOptions, text: str) -> FleetOptions:
    """The fleet with one --what-if change (``router=NAME``, ``replicas=N``,
    ``session-field=F``, joined with +)."""
    for part in text.split("+"):
        name, _, value = part.partition("=")
        if name == "router":
            options = replace(options, router=value, router_params={})
        elif name == "replicas" and value.isdigit() and int(value) >= 1:
            options = replace(options, replicas=int(value))
        elif name == "session-field" and value:
            options = replace(options, session_field=value)
        else:
            raise PrefixcheckError(f"--what-if {text!r}: cannot read {part!r}")
    return options


def what_if(
    workload: Workload,
    requests: pl.DataFrame,
    models: np.ndarray,
    settings: ReplaySettings,
    options: FleetOptions,
    text: str,
    texts: list[np.ndarray] | None = None,
) -> dict[str, Any]:
    """The fleet's hit rates with one change, replayed the same way (workload in arrival order)."""
    changed = fleet_fix(options, text)
    try:
        keys, _ = session_keys(requests, workload, changed.session_field, settings.block_size)
        placement = place(workload, keys, settings, changed, texts=texts)
    except ValueError as exc:
        raise PrefixcheckError(f"--what-if {text!r}: {exc}") from None
    lengths = workload.prompt_lengths
    replayed = replay_all(workload, settings, None, models, Placed(placement.replica))
    hits = {"vllm": replayed.vllm.total_hit_tokens, "sglang": replayed.sglang.total_hit_tokens}
    total = int(lengths.sum())
    return {
        "change": text,
        "replicas": changed.replicas,
        "router": placement.router,
        "router_source": placement.source,
        "hit_rate": {e: h / total if total else 0.0 for e, h in hits.items()},
    }


def run_fleet(
    log: TokenizedLog,
    settings: ReplaySettings,
    options: FleetOptions,
    progress: Progress | None = None,
    what_ifs: tuple[str, ...] = (),
    advice_tokens: int | None = None,
    texts: list[np.ndarray] | None = None,
    caches: tuple[CacheFactory, CacheFactory] | None = None,
) -> FleetRun:
    """Route and replay the whole log in arrival order; results in input order. Logs of at most
    ``advice_tokens`` prompt tokens (None: any) also get the measured router ranking and the
    capacity advice. ``caches`` holds the fleet's and the single instance's caches (an
    executor's: a Ray actor per replica and model; None: this process)."""
    workload, requests = log.workload, log.requests
    check_arrivals(workload, settings)
    order = arrival_order(workload)
    models = model_labels(requests["model"])
    replicas = options.replicas
    placed_by_log = names = None
    if options.replica_field is not None:
        placed_by_log, names = log_placement(requests, options.replica_field)
        replicas = max(replicas, len(names))
    keys, keyless = session_keys(requests, workload, options.session_field, settings.block_size)
    if order is not None:
        workload, models = workload.select(order), models[order]
        requests = requests[order]
        keys = [keys[i] for i in order]
        texts = None if texts is None else [texts[i] for i in order]
        placed_by_log = None if placed_by_log is None else placed_by_log[order]
    placement = place(
        workload, keys, settings, replace(options, replicas=replicas), placed_by_log, texts
    )
    replayed = replay_fleet(workload, models, settings, placement, replicas, progress, caches)
    if order is not None:
        replayed = FleetReplays(
            in_input_order(replayed.fleet, order),
            in_input_order(replayed.single, order),
            replace(placement, replica=_unpermute(placement.replica, order)),
        )
    changes = [what_if(workload, requests, models, settings, options, t, texts) for t in what_ifs]
    lengths = requests["prompt_tokens"].to_numpy()
    if order is not None:
        lengths = _unpermute(lengths, order)
    summary = replace(
        fleet_summary(replayed, lengths, replicas, settings, keyless, names), what_if=changes
    )
    prompt_tokens = int(lengths.sum())
    if options.replica_field is not None:
        summary = replace(summary, advice_skipped="the log's own placement was replayed")
    elif advice_tokens is not None and prompt_tokens > advice_tokens:
        summary = replace(
            summary,
            advice_skipped=f"the log holds more than {advice_tokens:,} "
            "prompt tokens (--diagnose-tokens); try --what-if router=NAME",
        )
    else:
        fleet = replace(options, replicas=replicas)
        summary = with_advice(
            summary, workload, requests, models, settings, fleet, replayed.single, texts
        )
    total = None if settings.capacity_tokens is None else settings.capacity_tokens * replicas
    return FleetRun(
        Replayed(log, replayed.fleet, order, log, replayed.fleet),
        replayed.single,
        replayed.placement.replica,
        summary,
        replace(settings, capacity_tokens=total),
    )


def with_advice(
    summary: FleetSummary,
    workload: Workload,
    requests: pl.DataFrame,
    models: np.ndarray,
    settings: ReplaySettings,
    fleet: FleetOptions,
    single: Replays,
    texts: list[np.ndarray] | None,
) -> FleetSummary:
    """``summary`` with the measured router ranking and capacity advice on ``workload`` (the
    whole log, or a streamed log's sample); ``single``: one instance's replay of it."""
    from analyzer.fleet_advice import capacity_for_share, rank_routers

    ranking = rank_routers(workload, requests, models, settings, fleet, texts)
    single_unbounded = (
        single
        if settings.capacity_tokens is None
        else replay_all(workload, replace(settings, capacity_tokens=None), None, models)
    )
    capacity = capacity_for_share(
        workload,
        requests,
        models,
        settings,
        fleet,
        single_unbounded.sglang.total_hit_tokens,
        int(single.trie.length.sum()),
        texts=texts,
    )
    return replace(summary, router_ranking=ranking, capacity_for_share=capacity)


def _unpermute(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    restored = np.empty_like(values)
    restored[order] = values
    return restored


def fleet_summary(
    replayed: FleetReplays,
    lengths: np.ndarray,
    replicas: int,
    settings: ReplaySettings,
    keyless: int,
    names: list[str] | None,
) -> FleetSummary:
    placement: Placement = replayed.placement
    engines = {
        "vllm": (replayed.fleet.vllm, replayed.single.vllm),
        "sglang": (replayed.fleet.sglang, replayed.single.sglang),
    }
    per_replica = []
    for r in range(replicas):
        mask = placement.replica == r
        per_replica.append(
            ReplicaSummary(
                name=names[r] if names else f"replica {r}",
                requests=int(mask.sum()),
                prompt_tokens=int(lengths[mask].sum()),
                peak_in_flight=int(placement.peak_in_flight[r]),
                hit_rate={
                    e: hit_rate(f.hit_tokens[mask], lengths[mask]) for e, (f, _) in engines.items()
                },
            )
        )
    counts = np.array([r.requests for r in per_replica], float)
    tokens = np.array([r.prompt_tokens for r in per_replica], float)
    return FleetSummary(
        replicas=replicas,
        router=placement.router,
        router_source=placement.source,
        load_model=placement.load_model,
        capacity_tokens_per_replica=settings.capacity_tokens,
        hit_rate={e: hit_rate(f.hit_tokens, lengths) for e, (f, _) in engines.items()},
        single_instance_hit_rate={
            e: hit_rate(s.hit_tokens, lengths) for e, (_, s) in engines.items()
        },
        routing_loss_tokens={
            e: int(s.total_hit_tokens - f.total_hit_tokens) for e, (f, s) in engines.items()
        },
        per_replica=per_replica,
        request_imbalance=float(counts.max() / counts.mean()) if counts.sum() else 0.0,
        token_imbalance=float(tokens.max() / tokens.mean()) if tokens.sum() else 0.0,
        keyless_requests=keyless,
        decisions=placement.decisions,
    )


def fleet_notes(
    summary: FleetSummary, diagnose_tokens: int | None = None, streamed: bool = False
) -> list[str]:
    notes = [
        f"Fleet of {summary.replicas} replicas behind {summary.router} ({summary.router_source}); "
        f"engine hit rates are the fleet's. Load model: {summary.load_model}."
    ]
    requests = sum(r.requests for r in summary.per_replica)
    tokens = sum(r.prompt_tokens for r in summary.per_replica)
    if not streamed and diagnose_tokens is not None and tokens > diagnose_tokens:
        notes.append(
            f"The fleet was not streamed: the whole log ({requests:,} requests, {tokens:,} "
            f"prompt tokens, more than --diagnose-tokens {diagnose_tokens:,}) was held in memory "
            "(it was read in one chunk, or --concurrency, --replay-in-time or --executor ray "
            "hold a fleet whole), and the diagnosis (losses by cause, routing included, and "
            "recommendations) covers all of it."
        )
    if summary.advice_sample is not None:
        notes.append(
            "The measured router ranking and capacity advice (fleet.router_ranking, "
            "fleet.capacity_for_share) replayed the diagnosed sample: the first "
            f"{summary.advice_sample['requests']:,} requests "
            f"({summary.advice_sample['prompt_tokens']:,} prompt tokens); their hit rates are "
            "over its prompt tokens, not the whole log's."
        )
    if summary.advice_skipped:
        notes.append(f"No measured router ranking or capacity advice: {summary.advice_skipped}.")
    if summary.keyless_requests and summary.router == "consistent-hash":
        notes.append(
            f"{summary.keyless_requests} requests had no routing key: hashed on their text, as "
            "vllm-router does."
        )
    return notes


def fleet_recommendations(summary: FleetSummary, options: FleetOptions) -> list:
    """The measured router and capacity advice as report recommendations."""
    if not summary.router_ranking or summary.capacity_for_share is None:
        return []
    from analyzer.fleet_advice import advice

    scope = "this log" if summary.advice_sample is None else "the diagnosed sample"
    return advice(summary.router_ranking, options, summary.capacity_for_share, scope)
