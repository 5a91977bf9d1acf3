"""Fleet replay: requests placed on replicas by a router model, each replica replaying its share
through its own engine caches, beside one instance holding the fleet's total capacity.

Routing is a pass over the requests in arrival order. Load-aware routers see the router-side
in-flight counts: with ``--replay-in-time`` a request is in flight from its timestamp until its
modelled finish (its whole prompt prefilled at the prefill rate, then its output at the decode
rate); without it each request finishes before the next arrives, so they see no load.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from analyzer.pool import CacheFactory, CacheKey, Routes
from analyzer.progress import Progress
from analyzer.replay import Replays, ReplaySettings, replay_all
from cache_models.routers.base import FleetLoad, RouteRequest
from cache_models.routers.registry import make_router
from cache_models.workload import Workload


@dataclass(frozen=True)
class FleetOptions:
    """--replicas, --router (+ --router-config), --session-field, --replica-field."""

    replicas: int
    router: str = "round-robin"
    router_params: dict[str, Any] = field(default_factory=dict)
    session_field: str | None = None
    replica_field: str | None = None  # the log's own placement instead of a router


@dataclass(frozen=True)
class Placement:
    replica: np.ndarray  # per request (workload order)
    router: str
    source: str
    load_model: str
    peak_in_flight: np.ndarray  # per replica
    decisions: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetReplays:
    fleet: Replays  # per request hits on their own replica (workload order)
    single: Replays  # one instance with the fleet's total capacity
    placement: Placement


def prefix_block_hashes(tokens: np.ndarray, namespace: int, block_size: int) -> np.ndarray:
    """Chained hashes of the full blocks of a prompt (equal prefixes, equal hashes): a
    polynomial hash over per-block digests, vectorised with uint64 wrap-around."""
    n = len(tokens) // block_size
    if n == 0:
        return np.empty(0, np.uint64)
    with np.errstate(over="ignore"):
        body = tokens[: n * block_size].astype(np.uint64).reshape(n, block_size)
        weights = _WEIGHTS[:block_size]
        digest = (body * weights).sum(axis=1) + np.uint64(namespace) * _MIX + np.uint64(1)
        inv_powers = _power(_INV_P, n)
        powers = _power(_P, n)
        return np.cumsum(digest * inv_powers) * powers


_P = np.uint64(0x9E3779B97F4A7C15)
_INV_P = np.uint64(pow(int(_P), -1, 1 << 64))
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_WEIGHTS = (np.arange(1, 4097, dtype=np.uint64) * np.uint64(0x94D049BB133111EB)) | np.uint64(1)


_POWERS: dict[int, np.ndarray] = {}


def _power(base: np.uint64, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) mod 2**64 (cached, grown by doubling)."""
    have = _POWERS.get(int(base), np.ones(1, np.uint64))
    with np.errstate(over="ignore"):
        while len(have) < n:
            have = np.concatenate([have, have * (have[-1] * base)])
    _POWERS[int(base)] = have
    return have[:n]


def place(
    workload: Workload,
    sessions: list[str | None],
    settings: ReplaySettings,
    options: FleetOptions,
    log_placement: np.ndarray | None = None,
    texts: list[np.ndarray] | None = None,
) -> Placement:
    """Each request's replica, routed in arrival order (the workload's order); ``texts`` are the
    requests' routing texts as code points (None: their prompt token ids stand in)."""
    placer = Placer(settings, options, timed=workload.arrival_s is not None)
    return placer.placement(placer.place(workload, sessions, log_placement, texts))


class Placer:
    """The routing pass fed a log chunk by chunk in arrival order: the router, the router-side
    load and the peaks are kept between chunks, so the chunks are placed as the whole log is.
    ``timed``: the log has arrival times (with a time model, requests are in flight until their
    modelled finish; only a whole log is replayed in time)."""

    def __init__(self, settings: ReplaySettings, options: FleetOptions, timed: bool) -> None:
        self.settings, self.options = settings, options
        self.timed = settings.time_model is not None and timed
        n = options.replicas
        self.router = (
            None
            if options.replica_field is not None
            else make_router(options.router, n, options.router_params)
        )
        self.load = FleetLoad.empty(n, settings.max_in_flight, settings.capacity_tokens)
        self.running: list[tuple[float, int, int, int]] = []  # (finish, request, replica, tokens)
        self.peaks = np.zeros(n, np.int64)
        self.placed = 0  # requests placed so far: a request without a time arrives at its index

    def place(
        self,
        workload: Workload,
        sessions: list[str | None],
        log_placement: np.ndarray | None = None,
        texts: list[np.ndarray] | None = None,
    ) -> np.ndarray:
        """The replicas of the next requests (``log_placement``: as the log placed them)."""
        first, self.placed = self.placed, self.placed + workload.n_requests
        if log_placement is not None:
            n = max(len(self.peaks), int(log_placement.max(initial=-1)) + 1)
            peaks = _peaks(workload, log_placement, n, self.settings, self.timed)
            self.peaks = np.maximum(np.pad(self.peaks, (0, n - len(self.peaks))), peaks)
            return log_placement
        router, load, running, peaks = self.router, self.load, self.running, self.peaks
        assert router is not None
        chosen = np.empty(workload.n_requests, np.int64)
        block_size = getattr(getattr(router, "config", None), "block_size", None)
        lengths = workload.prompt_lengths
        outputs = workload.output_lengths
        for i in range(workload.n_requests):
            now = (
                float(workload.arrival_s[i]) if workload.arrival_s is not None else float(first + i)
            )
            while running and (not self.timed or running[0][0] <= now):
                _, _, replica, tokens = heapq.heappop(running)
                load.in_flight[replica] -= 1
                load.active_tokens[replica] -= tokens
            prompt = workload.prompt(i)
            request = RouteRequest(
                symbols=prompt if texts is None else texts[i],
                session=sessions[i],
                arrival_s=now,
                prompt_tokens=int(lengths[i]),
                blocks=prefix_block_hashes(prompt, int(workload.namespace[i]), block_size)
                if block_size
                else None,
            )
            replica = router.route(request, load)
            chosen[i] = replica
            tokens = int(lengths[i] + outputs[i])
            load.in_flight[replica] += 1
            load.active_tokens[replica] += tokens
            peaks[replica] = max(peaks[replica], load.in_flight[replica])
            finish = (
                now + _service_s(self.settings, int(lengths[i]), int(outputs[i]))
                if self.timed
                else now
            )
            heapq.heappush(running, (finish, first + i, replica, tokens))
        return chosen

    def placement(self, replica: np.ndarray) -> Placement:
        """The placement of the requests placed so far (``replica``: theirs, in order)."""
        time_model = self.settings.time_model
        load_model = (
            f"in flight from arrival until a modelled finish (whole prompt at "
            f"{time_model.prefill_tokens_per_s:g} tokens/s, output at "
            f"{time_model.decode_tokens_per_s:g} tokens/s)"
            if self.timed and time_model is not None
            else "none: without --replay-in-time each request finishes before the next, so "
            "load-aware routers see no load"
        )
        if self.router is None:
            source = f"--replica-field {self.options.replica_field}"
            return Placement(replica, "log", source, "as logged", self.peaks)
        decisions = dict(getattr(self.router, "decisions", {}))
        return Placement(
            replica, self.router.name, self.router.source, load_model, self.peaks, decisions
        )


def _service_s(settings: ReplaySettings, prompt: int, output: int) -> float:
    model = settings.time_model
    assert model is not None
    return prompt / model.prefill_tokens_per_s + output / model.decode_tokens_per_s


def _peaks(
    workload: Workload, replica: np.ndarray, n: int, settings: ReplaySettings, timed: bool
) -> np.ndarray:
    peaks = np.zeros(n, np.int64)
    if not timed:
        peaks[np.unique(replica)] = 1
        return peaks
    assert workload.arrival_s is not None
    lengths, outputs = workload.prompt_lengths, workload.output_lengths
    for r in range(n):
        rows = np.flatnonzero(replica == r)
        starts = workload.arrival_s[rows]
        ends = starts + np.array(
            [_service_s(settings, int(lengths[i]), int(outputs[i])) for i in rows]
        )
        events = np.concatenate(
            [np.stack([starts, np.ones(len(rows))], 1), np.stack([ends, -np.ones(len(rows))], 1)]
        )
        events = events[np.lexsort((events[:, 1], events[:, 0]))]
        peaks[r] = int(np.cumsum(events[:, 1]).max()) if len(rows) else 0
    return peaks


class Placed:
    """The replay pool's router for a placement: request i goes to the caches of
    ``CacheKey(model, replica[i])``."""

    def __init__(self, replica: np.ndarray) -> None:
        self.replica = replica

    def route(self, workload: Workload, models: np.ndarray | None) -> Routes:
        names = models if models is not None else np.full(workload.n_requests, "")
        labels = np.array([f"{m}\x00{r}" for m, r in zip(names, self.replica, strict=True)])

        def key(label: str) -> CacheKey:
            model, _, replica = label.partition("\x00")
            return CacheKey(model, int(replica)) if model else CacheKey(replica=int(replica))

        return Routes.of_labels(labels, key)


def replay_fleet(
    workload: Workload,
    models: np.ndarray,
    settings: ReplaySettings,
    placement: Placement,
    replicas: int,
    progress: Progress | None = None,
    caches: tuple[CacheFactory, CacheFactory] | None = None,
) -> FleetReplays:
    """Each replica's requests through its own caches (``settings.capacity_tokens`` each): the
    replay pool keyed by (model, replica); and one instance with ``replicas`` times that capacity
    (unbounded stays unbounded). ``caches``: the two pools' cache factories (an executor's, one
    each so their keys never share caches; None: this process)."""
    fleet_caches, single_caches = caches or (None, None)
    fleet = replay_all(
        workload, settings, progress, models, Placed(placement.replica), fleet_caches
    )
    total = None if settings.capacity_tokens is None else settings.capacity_tokens * replicas
    single = replay_all(
        workload, replace(settings, capacity_tokens=total), progress, models, None, single_caches
    )
    return FleetReplays(fleet, single, placement)
