"""What a router model sees and answers: one request at a time, the fleet's loads beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class RouteRequest:
    """One request as a router sees it.

    ``symbols`` is the text the router matches (code points of the request text, or token ids
    when the log has no text); ``session`` the routing key (a session or user id, or None);
    ``blocks`` the request's prompt block hashes for routers that index blocks."""

    symbols: np.ndarray
    session: str | None = None
    arrival_s: float = 0.0
    prompt_tokens: int = 0
    blocks: np.ndarray | None = None


@dataclass
class FleetLoad:
    """Router-side in-flight request counts per replica (incremented when a request is routed,
    decremented when its answer is done), as the routers' own ``worker.load()`` counts them, and
    the prompt + output tokens those requests hold."""

    in_flight: np.ndarray
    active_tokens: np.ndarray
    max_running: int | None = None  # requests a replica runs at once; the rest wait (None: all run)
    capacity_tokens: int | None = None  # each replica's KV capacity (None: unbounded)

    @classmethod
    def empty(
        cls, replicas: int, max_running: int | None = None, capacity_tokens: int | None = None
    ) -> FleetLoad:
        zeros = np.zeros(replicas, dtype=np.int64)
        return cls(zeros, zeros.copy(), max_running, capacity_tokens)

    @property
    def waiting(self) -> np.ndarray:
        if self.max_running is None:
            return np.zeros_like(self.in_flight)
        return np.maximum(self.in_flight - self.max_running, 0)

    @property
    def kv_usage(self) -> np.ndarray:
        if not self.capacity_tokens:
            return np.zeros(len(self.in_flight))
        return np.minimum(self.active_tokens / self.capacity_tokens, 1.0)


class Router(Protocol):
    name: str
    source: str  # the package and version whose code the model reproduces
    load_aware: bool  # its choices depend on in-flight counts

    def route(self, request: RouteRequest, load: FleetLoad) -> int: ...


def first_min(values: np.ndarray) -> int:
    """Index of the first smallest value (Rust's ``Iterator::min_by_key``)."""
    return int(np.argmin(values))
