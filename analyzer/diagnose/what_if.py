"""``--what-if`` parsed where it enters: named fixes and engine flags joined with ``+``, each
checked before anything is read. ``plans.what_if_plan`` turns a spec into the workload and flags
to replay."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from analyzer.engines import ENGINES
from analyzer.errors import PrefixcheckError
from cache_models.config import SGLANG_EVICTION_POLICIES

if TYPE_CHECKING:
    from analyzer.replay import ReplaySettings

WHAT_IFS = (
    "pad-prefixes",
    "move-dynamic",
    "reorder-parts",
    "no-salt",
    "block-size=N",
    "page-size=N",
    "capacity=N",
    "eviction-policy=P",
)
# Fixes that move tokens, in the order they combine: reordering re-renders the log as read, so it
# comes first; each later one finds its targets again in the log the previous one left.
MOVING = ("reorder-parts", "move-dynamic", "pad-prefixes")
FIXES = (*MOVING, "no-salt")
FLAGS = ("block-size", "page-size", "capacity", "eviction-policy")


@dataclass(frozen=True)
class Fix:
    """One part of a ``--what-if``: a named fix (``no-salt``) or an engine flag with its parsed
    value (``block-size=32``: ``change`` is ``{"block_size": 32}``)."""

    name: str
    value: str = ""
    change: dict[str, Any] = field(default_factory=dict)  # ReplaySettings fields, for a flag
    kind: str = ""  # the report's kind of a flag's fix
    engines: tuple[str, ...] = ENGINES  # the engines a flag's fix changes

    @property
    def label(self) -> str:
        return f"{self.name}={self.value}" if self.value else self.name

    @classmethod
    def parse(cls, part: str) -> Fix:
        name, _, value = part.partition("=")
        if name in FIXES and not value:
            return cls(name)
        if not (value and name in FLAGS):
            raise PrefixcheckError(f"unknown --what-if {part!r} (one of: {', '.join(WHAT_IFS)})")
        try:
            if name == "block-size":
                return cls(name, value, {"block_size": _positive(value)}, "block_size", ("vllm",))
            if name == "page-size":
                return cls(name, value, {"page_size": _positive(value)}, "block_size", ("sglang",))
            if name == "capacity":
                unbounded = value.lower() in ("none", "unbounded", "inf")
                capacity = None if unbounded else _positive(value)
                return cls(name, value, {"capacity_tokens": capacity}, "capacity")
            if value in SGLANG_EVICTION_POLICIES:
                return cls(name, value, {"eviction_policy": value}, "eviction", ("sglang",))
            raise ValueError(value)
        except ValueError as exc:
            raise PrefixcheckError(f"--what-if {name}={value}: not a valid value ({exc})") from None

    def settings(self, base: ReplaySettings) -> ReplaySettings:
        """``base`` with this flag changed, checked as the engines check theirs."""
        settings = replace(base, **self.change)
        try:
            settings.vllm(), settings.sglang()  # the engines' own checks (a block fits the cache)
        except ValueError as exc:
            raise PrefixcheckError(f"--what-if {self.label}: not a valid value ({exc})") from None
        return settings


@dataclass(frozen=True)
class WhatIfSpec:
    """A ``--what-if`` as written (``text``, the report's name) and its parts, in the order they
    apply: engine flags and ``no-salt`` first, then the fixes that move tokens in MOVING's
    order."""

    text: str
    parts: tuple[Fix, ...]

    @classmethod
    def parse(cls, text: str) -> WhatIfSpec:
        parts = [part.strip() for part in text.split("+")]
        repeated = sorted({part for part in parts if parts.count(part) > 1})
        if repeated:
            raise PrefixcheckError(f"--what-if {text}: {', '.join(repeated)} given twice")
        moving = sorted((part for part in parts if part in MOVING), key=MOVING.index)
        ordered = [p for p in parts if p not in moving] + moving
        return cls(text, tuple(Fix.parse(part) for part in ordered))

    def check(self, base: ReplaySettings) -> None:
        """Whether the engines accept the flags this spec sets on ``base`` (raises if not)."""
        settings = base
        for fix in self.parts:
            settings = fix.settings(settings)


def _positive(value: str) -> int:
    number = float(value)
    if number < 1 or number != int(number):
        raise ValueError(value)
    return int(number)
