"""Where an analysis runs: ``local`` (this process, the default) or ``ray`` (a Ray cluster, the
optional ``prefixcheck[ray]`` extra). An executor reads the log and holds the replay's caches;
the pipeline's steps, their order and the report are the same for both."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from analyzer.errors import PrefixcheckError

if TYPE_CHECKING:
    from analyzer.ingest import ChunkedIngest, IngestOptions
    from analyzer.pool import CacheFactory
    from analyzer.progress import Progress
    from analyzer.replay import Trie

ExecutorName = Literal["local", "ray"]
EXECUTORS: tuple[ExecutorName, ...] = ("local", "ray")
RAY_MISSING = "--executor ray needs Ray: pip install 'prefixcheck[ray]'"


class Executor(Protocol):
    """Runs the read step (its reader yields the chunks a local read yields; the records of the
    first ``sample_tokens`` are the diagnosis's) and holds the replay's caches and a streamed
    log's prefix trie; ``describe`` is the report's ``executor`` block, ``notes`` its terminal
    notes (never in the JSON)."""

    def reader(
        self,
        paths: Sequence[Path],
        options: IngestOptions,
        progress: Progress,
        sample_tokens: int | None,
    ) -> ChunkedIngest: ...

    def caches(self) -> CacheFactory | None: ...

    def trie(self) -> Trie: ...

    def describe(self) -> dict[str, Any]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExecutorOptions:
    """``--executor`` and ``--ray-address``."""

    name: ExecutorName = "local"
    address: str | None = None  # a Ray cluster to join; None: RAY_ADDRESS, else a local one
    split_bytes: int = 64 << 20  # uncompressed line files larger than this are read in ranges

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise PrefixcheckError(f"--executor {self.name!r}: choose {', '.join(EXECUTORS)}")
        if self.address is not None and self.name != "ray":
            raise PrefixcheckError("--ray-address needs --executor ray")
        if self.name == "ray":
            require_ray()
        if self.split_bytes < 1:
            raise PrefixcheckError("split_bytes must be positive")


def require_ray() -> None:
    """A one-line error (exit 2) when the ray extra is not installed."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("pyarrow") is None:
        raise PrefixcheckError(RAY_MISSING)


def make_executor(options: ExecutorOptions) -> Executor | None:
    """The executor of ``options`` (None: this process), connected to its cluster."""
    if options.name == "local":
        return None
    from analyzer.executors.ray_executor import RayExecutor

    return RayExecutor.connect(options)
