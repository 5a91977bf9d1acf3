"""The pool of caches a log is replayed through: one set of engine caches per ``CacheKey``.

A key names what keeps two caches apart: today the model a request goes to (each model is its own
server); a replica index (``--replicas``) and a cache tier next. A ``Router`` gives each request
its key; ``CachePool.feed`` takes the log in arrival order, one chunk or the whole of it at a
time, routes every request, feeds each key's requests to that key's caches (kept between feeds),
and puts the results back in the chunk's order. The in-memory replay, streaming, the per-model
split and the diagnosis's replays of changed logs are all this one loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
import polars as pl

from analyzer.settings import ReplaySettings
from cache_models.prefix_trie import View
from cache_models.result import ReplayResult
from cache_models.sglang_radix import SglangRadixCache
from cache_models.unbounded import UnboundedTrie
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload

T = TypeVar("T")

UNNAMED = "(no model)"  # the key of requests that name no model


@dataclass(frozen=True, order=True)
class CacheKey:
    """What separates one set of engine caches from another: the server of a model, and which of
    its replicas (0 when the fleet has one)."""

    model: str = UNNAMED
    replica: int = 0


@dataclass(frozen=True)
class Routes:
    """Each request's key: ``keys`` in order of first appearance, ``of[i]`` the index of request
    i's key in it."""

    keys: tuple[CacheKey, ...]
    of: np.ndarray  # int64 per request

    @classmethod
    def one(cls, n_requests: int, key: CacheKey = CacheKey()) -> Routes:
        return cls((key,), np.zeros(n_requests, np.int64))

    @classmethod
    def of_labels(cls, labels: np.ndarray, key: Callable[[str], CacheKey]) -> Routes:
        """Requests with equal labels share a key (``key(label)``), in order of first appearance."""
        if len(labels) == 0:
            return cls((), np.zeros(0, np.int64))
        if (labels == labels[0]).all():  # one label, the common case: no sort of strings
            return cls((key(str(labels[0])),), np.zeros(len(labels), np.int64))
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return cls(tuple(key(str(labels[first[k]])) for k in order), rank[inverse.ravel()])

    def parts(self) -> list[np.ndarray]:
        """The request indices of each key, in the requests' order."""
        if len(self.keys) == 1:
            return [np.arange(len(self.of))]
        return [np.flatnonzero(self.of == k) for k in range(len(self.keys))]


class Router(Protocol):
    """Assigns the requests of each chunk to cache keys, in arrival order (a router may keep state
    between chunks: round robin, sticky sessions)."""

    def route(self, workload: Workload, models: np.ndarray | None) -> Routes: ...


class ByModel:
    """Every model its own server with one replica (None: the log is one server's)."""

    def route(self, workload: Workload, models: np.ndarray | None) -> Routes:
        if models is None:
            return Routes.one(workload.n_requests)
        return Routes.of_labels(models, lambda model: CacheKey(model))


def model_labels(models: pl.Series) -> np.ndarray:
    """The ``model`` column as the labels the router reads (no model: ``UNNAMED``), made from
    its few distinct names (not a Python string per request)."""
    filled = models.fill_null(UNNAMED)
    names = filled.unique(maintain_order=True).to_list()
    if len(names) <= 1:
        return np.full(len(filled), names[0]) if names else np.array([], str)
    return np.array(names)[filled.cast(pl.Enum(names)).to_physical().to_numpy()]


class Cache(Protocol):
    """One engine's cache: each feed gives its requests' results, state kept between feeds."""

    def feed(self, chunk: Workload) -> ReplayResult: ...


class _WholeLog:
    """A concurrent or timed replay: requests in flight span any cut, so it takes one feed."""

    def __init__(self, model: VllmPrefixCache | SglangRadixCache) -> None:
        self.model = model
        self.fed = False

    def feed(self, chunk: Workload) -> ReplayResult:
        if self.fed:
            raise ValueError("only sequential replays stream: this replay takes the whole log")
        self.fed = True
        return self.model.replay(chunk)


def engine_cache(engine: str, settings: ReplaySettings) -> Cache:
    """A fresh cache of ``engine`` (vllm, sglang, or sglang_page1: SGLang at page size 1)."""
    return engine_caches((engine,), settings)[engine]


def engine_caches(
    engines: Sequence[str], settings: ReplaySettings, trie: UnboundedTrie | None = None
) -> dict[str, Cache]:
    """Fresh caches of ``engines`` for one server (vllm, sglang, sglang_page1: SGLang at page
    size 1). The unbounded ones that replay tokens by the prefix trie share one
    (``cache_models.unbounded``; ``trie``, else ``shared_trie``'s): the server's log is walked
    once for them all."""
    models = {engine: _model(engine, settings) for engine in engines}
    if not settings.sequential:
        return {engine: _WholeLog(model) for engine, model in models.items()}
    trie = trie or _trie_shared_by(list(models.values()))
    served: set[str] = set()
    caches: dict[str, Cache] = {}
    for engine, model in models.items():
        role = "vllm" if isinstance(model, VllmPrefixCache) else "sglang"
        shares = trie is not None and model.by_trie and role in trie.engines
        shares = shares and role not in served  # one SGLang cache per trie
        if shares:
            served.add(role)
        caches[engine] = model.session(trie if shares else None)
    return caches


def shared_trie(
    engines: Sequence[str], settings: ReplaySettings, ceiling: Sequence[View] = ()
) -> UnboundedTrie | None:
    """The prefix trie one server's unbounded caches of tokens can share, and that gives the
    hits of ``ceiling`` too (``UnboundedTrie``), or None when it would serve one of them alone.
    Under ``--disable-overlap-schedule`` SGLang keeps one token fewer than the ceiling: then
    its cache keeps a trie of its own."""
    if not settings.sequential:
        return None
    return _trie_shared_by([_model(engine, settings) for engine in engines], ceiling)


def _trie_shared_by(
    models: list[VllmPrefixCache | SglangRadixCache], ceiling: Sequence[View] = ()
) -> UnboundedTrie | None:
    """``shared_trie`` of sequential ``models``."""
    vllm = next((m for m in models if isinstance(m, VllmPrefixCache) and m.by_trie), None)
    sglang = next((m for m in models if isinstance(m, SglangRadixCache) and m.by_trie), None)
    if sglang is not None and ceiling and not sglang.config.overlap_schedule:
        sglang = None
    if (vllm is not None) + (sglang is not None) + bool(ceiling) < 2:
        return None
    return UnboundedTrie(
        None if vllm is None else vllm.config.block_size,
        None if sglang is None else sglang.config,
        ceiling,
    )


def _model(engine: str, settings: ReplaySettings) -> VllmPrefixCache | SglangRadixCache:
    if engine == "vllm":
        return VllmPrefixCache(settings.vllm())
    if engine == "sglang":
        return SglangRadixCache(settings.sglang())
    if engine == "sglang_page1":
        return SglangRadixCache(settings.sglang(page_size=1))
    raise ValueError(f"unknown engine {engine!r}")


CacheFactory = Callable[[CacheKey, tuple[str, ...], "ReplaySettings"], dict[str, Cache]]
"""Makes the caches of the engines of one key (``engine_caches`` in this process; an
executor's may hold them elsewhere, e.g. in a Ray actor)."""


def _local_caches(
    key: CacheKey, engines: tuple[str, ...], settings: ReplaySettings
) -> dict[str, Cache]:
    return engine_caches(engines, settings)


class CachePool:
    """Per key, one cache of each of ``engines`` with ``settings``, kept between feeds."""

    def __init__(
        self,
        settings: ReplaySettings,
        engines: Sequence[str] = ("vllm", "sglang"),
        router: Router | None = None,
        cache_factory: CacheFactory | None = None,
    ) -> None:
        self.settings = settings
        self.engines = tuple(engines)
        self.router = router or ByModel()
        self.cache_factory = cache_factory or _local_caches
        self.caches: dict[CacheKey, dict[str, Cache]] = {}

    def trie_with_ceiling(
        self, workload: Workload, models: np.ndarray | None, views: Sequence[View]
    ) -> UnboundedTrie | None:
        """Before the first feed: when every request of ``workload`` goes to one server whose
        caches are made here, the trie its unbounded caches share, made to give the ceiling's
        ``views`` in the same walk (``shared_trie``); None otherwise."""
        if self.caches or self.cache_factory is not _local_caches or workload.n_requests == 0:
            return None
        if not isinstance(self.router, ByModel):
            return None  # a fleet's router keeps state between routings: route once, in feed
        keys = self.router.route(workload, models).keys
        trie = shared_trie(self.engines, self.settings, views) if len(keys) == 1 else None
        if trie is not None:
            self.caches[keys[0]] = engine_caches(self.engines, self.settings, trie)
        return trie

    def feed(
        self,
        workload: Workload,
        models: np.ndarray | None = None,
        alongside: dict[str, Callable[[], T]] | None = None,
        done: Callable[[int], None] | None = None,
    ) -> tuple[dict[str, ReplayResult], dict[str, T]]:
        """Each engine's results for the requests of ``workload`` (its order), every key's
        requests on that key's caches; ``alongside`` runs in the same threads (the prefix trie),
        ``done(tokens)`` after each replay. The replays start ``alongside`` first, then each
        engine's keys in turn: of the caches that share a trie (``engine_caches``), the first
        fed replays it for all, while the threads run the others' work."""
        if workload.n_requests == 0:  # no key to route to: the engines' empty results
            routes = Routes((), np.zeros(0, np.int64))
            empty = {e: engine_cache(e, self.settings).feed(workload) for e in self.engines}
        else:
            routes, empty = self.router.route(workload, models), {}
        parts = routes.parts()
        jobs: dict[object, Callable[[], object]] = {}
        tokens: dict[object, int] = {}
        for name, job in (alongside or {}).items():
            jobs[name] = job
            tokens[name] = workload.prompt_token_count
        keyed_parts = []
        for key, indices in zip(routes.keys, parts, strict=True):
            part = workload if len(indices) == workload.n_requests else workload.select(indices)
            if key not in self.caches:
                self.caches[key] = self.cache_factory(key, self.engines, self.settings)
            keyed_parts.append((key, part))
        for engine in self.engines:
            for key, part in keyed_parts:
                jobs[(engine, key)] = _bound(self.caches[key][engine], part)
                tokens[(engine, key)] = part.prompt_token_count
        results = in_parallel(jobs, None if done is None else lambda name: done(tokens[name]))
        n = workload.n_requests
        keyed = list(zip(routes.keys, parts, strict=True))
        replayed = empty or {
            engine: merged_results([(idx, results[(engine, key)]) for key, idx in keyed], n)
            for engine in self.engines
        }
        return replayed, {name: results[name] for name in alongside or {}}  # type: ignore[misc]


def _bound(cache: Cache, part: Workload) -> Callable[[], ReplayResult]:
    return lambda: cache.feed(part)


def in_parallel(
    jobs: dict[T, Callable[[], object]], done: Callable[[T], None] | None = None
) -> dict[T, object]:
    """Run independent replays at once, in threads: the cache models' kernels release the GIL,
    so they use every core without copying the workload into other processes."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        results = {}
        for name, future in futures.items():
            results[name] = future.result()
            if done is not None:
                done(name)
    return results


def merged_results(parts: list[tuple[np.ndarray, ReplayResult]], n: int) -> ReplayResult:
    """One engine's results on each key put back in the requests' order, metrics summed."""
    if len(parts) == 1 and len(parts[0][0]) == n:
        return parts[0][1]
    first = parts[0][1]
    hits = np.zeros(n, dtype=first.hit_tokens.dtype)
    counters = {name: np.zeros(n, dtype=values.dtype) for name, values in first.counters.items()}
    metrics = dict.fromkeys(first.metrics, 0)
    for indices, result in parts:
        hits[indices] = result.hit_tokens
        for name, values in result.counters.items():
            counters[name][indices] = values
        for name, value in result.metrics.items():
            metrics[name] += value
    return replace(first, hit_tokens=hits, counters=counters, metrics=metrics)


def concatenated(parts: list[ReplayResult]) -> ReplayResult:
    """Consecutive chunks' results of one engine as one, metrics summed."""
    first = parts[0]
    if len(parts) == 1:
        return first
    return replace(
        first,
        hit_tokens=np.concatenate([p.hit_tokens for p in parts]),
        counters={
            name: np.concatenate([p.counters[name] for p in parts]) for name in first.counters
        },
        metrics={name: sum(p.metrics.get(name, 0) for p in parts) for name in first.metrics},
    )
