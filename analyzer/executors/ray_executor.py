"""``--executor ray``: ingest shards as Ray tasks, each pool of caches in a Ray actor.

- Ingest: one generator task per shard (``analyzer.executors.shards``) runs the loaders, chat
  rendering and tokenizer (with the token cache) and yields an Arrow table of its requests
  (no token ids) and one token table per pool key (``keyed``); the driver cuts the local
  reader's chunks from the request tables (``RayIngest``).
- Replay: the pipeline's own ``CachePool`` routes every chunk; the caches of each pool key
  (a model's server; each replica of a fleet, routed on the driver) live in one actor, which
  consumes that key's requests in the log's order, so keys replay in parallel on the cluster
  and each cache sees exactly the requests, in exactly the order, of a local run. Past the
  diagnosed sample a chunk reaches an actor as a ``KeyedWorkload`` and the actor fetches its
  key's token tables itself; the prefix trie (the ceiling) is an actor of its own reading every
  key's. The diagnosis of the leading sample runs on the driver, where the sample is.
- Failures: tasks and actors are never retried (an actor's cache state cannot be rebuilt); a
  lost worker, actor or task fails the run (exit 2) naming the shard or the pool, and no report
  is written.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.errors import PrefixcheckError
from analyzer.executors import ExecutorOptions, require_ray
from analyzer.executors.keyed import KeyedWorkload
from analyzer.executors.ray_ingest import RayIngest, ShardRefs, failure
from analyzer.executors.shards import ShardMeta, ShardSpec, ingest_shard
from analyzer.ingest import ChunkedIngest, IngestOptions
from analyzer.pool import Cache, CacheFactory, CacheKey, engine_caches
from analyzer.progress import Progress
from analyzer.replay import ReplaySettings
from cache_models.prefix_trie import PrefixTrie, TrieNodes
from cache_models.result import ReplayResult
from cache_models.workload import Workload

ACTOR_PREFIX = "prefixcheck-pool-"  # replay actors' names (tests find them by it)


class _Parts:
    """The workload of the last chunk part shipped to an actor (``[ref]``: the ref itself, not
    its value), its token ids fetched once for all the actor's engines."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: tuple[str, Workload] | None = None

    def workload(self, shipped: list[Any]) -> Workload:
        import ray

        (ref,) = shipped
        with self.lock:
            if self.last is None or self.last[0] != ref.hex():
                part = ray.get(ref)
                if isinstance(part, KeyedWorkload):
                    part = part.materialize(ray.get)
                self.last = (ref.hex(), part)
            return self.last[1]


class PoolCaches:
    """The caches of one pool key: one per engine, kept between feeds (a Ray actor)."""

    def __init__(self, settings: ReplaySettings, engines: Sequence[str]) -> None:
        self.caches = engine_caches(engines, settings)
        self.parts = _Parts()

    def feed(self, engine: str, shipped: list[Any]) -> ReplayResult:
        return self.caches[engine].feed(self.parts.workload(shipped))

    def where(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid()}


class CeilingTrie:
    """The prefix trie of the whole log (the ceiling), fed every chunk in order (a Ray actor)."""

    def __init__(self) -> None:
        self.trie = PrefixTrie()
        self.parts = _Parts()

    def feed(self, shipped: list[Any]) -> list[Any]:
        return self.trie.feed(self.parts.workload(shipped))

    def nodes(self) -> TrieNodes:
        return self.trie.nodes


@dataclass
class _RemoteCache:
    """One engine's cache inside its key's actor; the pool calls it like a local one."""

    actor: Any
    engine: str
    key: CacheKey
    shared: _Shipped
    feeds: int = 0

    def feed(self, chunk: Workload) -> ReplayResult:
        import ray

        self.feeds += 1
        try:
            return ray.get(self.actor.feed.remote(self.engine, [self.shared.ref(chunk)]))
        except ray.exceptions.RayError as exc:
            lines = str(getattr(exc, "cause", None) or exc).strip().splitlines()
            raise PrefixcheckError(
                f"ray: the replay of pool model={self.key.model!r} replica {self.key.replica} "
                f"({self.engine}) failed on its chunk {self.feeds} ({chunk.n_requests:,} "
                f"requests): {type(exc).__name__}: {lines[-1] if lines else ''}; "
                "no report written"
            ) from None


@dataclass
class _RemoteTrie:
    """The ceiling's trie in its actor; the replay calls it like a local one."""

    actor: Any
    feeds: int = 0

    def feed(self, chunk: Workload) -> list[Any]:
        import ray

        self.feeds += 1
        try:
            return ray.get(self.actor.feed.remote([ray.put(chunk)]))
        except ray.exceptions.RayError as exc:
            raise _lost("the ceiling's prefix trie", self.feeds, chunk, exc) from None

    @property
    def nodes(self) -> TrieNodes:
        import ray

        try:
            return ray.get(self.actor.nodes.remote())
        except ray.exceptions.RayError as exc:
            raise _lost("the ceiling's prefix trie", self.feeds, None, exc) from None


def _lost(what: str, feeds: int, chunk: Any, exc: BaseException) -> PrefixcheckError:
    lines = str(getattr(exc, "cause", None) or exc).strip().splitlines()
    at = f" on its chunk {feeds} ({chunk.n_requests:,} requests)" if chunk is not None else ""
    return PrefixcheckError(
        f"ray: {what} failed{at}: {type(exc).__name__}: {lines[-1] if lines else ''}; "
        "no report written"
    )


@dataclass
class _Shipped:
    """A key's part of a chunk put into the object store once for all its engines."""

    part: Workload | None = None
    object_ref: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ref(self, part: Workload) -> Any:
        import ray

        with self.lock:
            if self.part is not part:
                self.part, self.object_ref = part, ray.put(part)
            return self.object_ref


class IngestWatch:
    """The cluster's ingest on the input bar: shards' bytes read, requests, and the cluster's
    rate in prompt tokens per second (rich adds the time left, from the bytes)."""

    def __init__(self, specs: Sequence[ShardSpec], progress: Progress) -> None:
        self.progress = progress
        self.shards = len(specs)
        self.total = sum(spec.size for spec in specs)
        self.began = time.perf_counter()
        self.finished = self.bytes = self.requests = self.tokens = 0
        progress.input(self.step(), 0, self.total, 0)

    def step(self) -> str:
        seconds = time.perf_counter() - self.began
        rate = f", {self.tokens / seconds / 1e6:,.2f}M tokens/s" if self.tokens else ""
        return f"tokenizing on Ray: {self.finished}/{self.shards} shards{rate}"

    def done(self, spec: ShardSpec, meta: ShardMeta) -> None:
        self.finished += 1
        self.bytes += spec.size
        self.requests += int((meta.row_of >= 0).sum())
        self.tokens += meta.prompt_tokens
        self.progress.input(self.step(), self.bytes, self.total, self.requests)


class RayExecutor:
    """A connection to a Ray cluster, and what this run placed on it."""

    def __init__(self, options: ExecutorOptions, address: str) -> None:
        import ray

        self.options = options
        self.address = address
        self._ingest = ray.remote(num_returns="streaming", max_retries=0)(ingest_shard)
        self._actor = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=8)(PoolCaches)
        self._trie = ray.remote(max_restarts=0, max_task_retries=0)(CeilingTrie)
        self.actors: list[tuple[CacheKey, Any]] = []  # every pool's, in order of creation
        self.tries: list[Any] = []
        self.ingest: RayIngest | None = None

    @classmethod
    def connect(cls, options: ExecutorOptions) -> RayExecutor:
        """Join ``--ray-address`` (or RAY_ADDRESS), else start a cluster on this machine."""
        require_ray()
        import ray

        if not ray.is_initialized():
            address = options.address or os.environ.get("RAY_ADDRESS")
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    configure_logging=True,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                target = address or "a local cluster"
                raise PrefixcheckError(
                    f"--executor ray: cannot connect to {target}: {exc}"
                ) from None
        context = ray.get_runtime_context()
        return cls(options, getattr(context, "gcs_address", None) or "local")

    def reader(
        self,
        paths: Sequence[Path],
        options: IngestOptions,
        progress: Progress,
        sample_tokens: int | None,
    ) -> ChunkedIngest:
        self.ingest = RayIngest(
            paths,
            options,
            progress,
            submit=self._submit,
            gather=self._gather,
            fetch=self._fetch,
            split_bytes=self.options.split_bytes,
            records_budget=sample_tokens,
        )
        return self.ingest

    def _submit(self, spec: ShardSpec, options: IngestOptions) -> Any:
        return self._ingest.options(name=f"prefixcheck-ingest-{spec.index}").remote(spec, options)

    def _gather(
        self, generators: list[Any], specs: Sequence[ShardSpec], progress: Progress
    ) -> list[tuple[ShardMeta, ShardRefs]]:
        """Every shard's metadata and the refs of its tables, with progress as shards finish;
        the first failed shard (in input order) fails the run."""
        import ray

        watch = IngestWatch(specs, progress)
        index = {id(g): i for i, g in enumerate(generators)}
        pending = list(generators)
        gathered: dict[int, tuple[ShardMeta, ShardRefs]] = {}
        failed: dict[int, BaseException] = {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for generator in done:
                at = index[id(generator)]
                try:
                    gathered[at] = _outputs(generator)
                    watch.done(specs[at], gathered[at][0])
                except Exception as exc:  # a task's error, a lost worker
                    failed[at] = exc
            if failed and not any(index[id(p)] < min(failed) for p in pending):
                for generator in pending:
                    ray.cancel(generator, force=True)
                break
        if failed:
            first = min(failed)
            raise failure(specs[first], failed[first])
        return [gathered[i] for i in range(len(specs))]

    def _fetch(self, ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise PrefixcheckError(
                f"ray: a shard's table was lost: {exc}; no report written"
            ) from None

    def caches(self) -> CacheFactory:
        """The caches of one pool (each call: its own actors, so a fleet's replicas and its
        single instance never share a cache)."""
        actors: dict[CacheKey, Any] = {}
        shipped: dict[CacheKey, _Shipped] = {}

        def make(
            key: CacheKey, engines: tuple[str, ...], settings: ReplaySettings
        ) -> dict[str, Cache]:
            if key not in actors:
                name = f"{ACTOR_PREFIX}{len(self.actors)}"
                actors[key] = self._actor.options(name=name).remote(settings, engines)
                self.actors.append((key, actors[key]))
                shipped[key] = _Shipped()
            return {e: _RemoteCache(actors[key], e, key, shipped[key]) for e in engines}

        return make

    def trie(self) -> _RemoteTrie:
        """The ceiling's prefix trie of a streamed log, in an actor of its own."""
        self.tries.append(self._trie.options(name=f"prefixcheck-trie-{len(self.tries)}").remote())
        return _RemoteTrie(self.tries[-1])

    def close(self) -> None:
        """End this run's replay actors (their caches are merged into the report by now)."""
        import ray

        for actor in [actor for _, actor in self.actors] + self.tries:
            ray.kill(actor)

    def notes(self) -> list[str]:
        """How the token cache's note counts on a cluster (terminal only)."""
        metas = self.ingest.metas if self.ingest else []
        stats = [m.token_cache for m in metas]
        if self.ingest is None or not any(s.from_cache for s in stats):
            return []
        where = self.ingest.options.cache_dir
        return [
            f"Token cache on Ray: each of the {len({m.worker for m in metas})} ingest workers "
            f"used the cache at {where} on its own machine; the counts above are summed over "
            f"the {len(metas)} shards (a text in several shards counts in each), so they can "
            "differ from a local run's."
        ]

    def describe(self) -> dict[str, Any]:
        """The report's ``executor`` block."""
        import ray

        metas = self.ingest.metas if self.ingest else []
        resources = ray.cluster_resources()
        return {
            "name": "ray",
            "address": self.address,
            "nodes": sum(1 for node in ray.nodes() if node.get("Alive")),
            "cpus": int(resources.get("CPU", 0)),
            "ingest_shards": len(metas),
            "ingest_workers": len({m.worker for m in metas}),
            "replay_actors": len(self.actors),
            "pool_keys": sorted({f"{k.model}#{k.replica}" for k, _ in self.actors}),
            "ceiling_actor": bool(self.tries),
            "driver_token_ids": self.ingest.driver_tokens if self.ingest else 0,
        }


def _outputs(generator: Any) -> tuple[ShardMeta, ShardRefs]:
    """A finished ingest task's metadata and the refs of its tables (``ingest_shard``'s
    yields, in order)."""
    import ray

    meta = ray.get(next(generator))
    table, records = next(generator), next(generator)
    return meta, ShardRefs(table, records, tuple(next(generator) for _ in meta.keys))
