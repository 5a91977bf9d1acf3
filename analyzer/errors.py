"""Errors and skips with the place they come from: every bad input names its file and line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


class PrefixcheckError(Exception):
    """A failure the user can act on; the CLI prints it on one line and exits with code 2."""


@dataclass(frozen=True)
class Skip:
    """An input line that did not become a request, and why."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class BadLine(PrefixcheckError):
    """A line that cannot be turned into a request (raised by parsers, caught by the reader)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StrictModeError(PrefixcheckError):
    """The first bad line under ``--strict``."""

    def __init__(self, skip: Skip) -> None:
        super().__init__(f"{skip} (--strict stops at the first bad line)")
        self.skip = skip


SKIPS_KEPT = 1000  # skipped lines kept as examples; every skip is counted
REASON_KINDS_KEPT = 100  # distinct reasons counted by name; the rest as "other reasons"


def reason_kind(reason: str) -> str:
    """Group reasons that differ only in details (a position, a value) under one heading."""
    return reason.split(" (", 1)[0]


class SkipLog:
    """Skipped lines in bounded memory: every one counted (by kind of reason), the first
    SKIPS_KEPT kept as examples. Iterating, indexing and ``==`` see the kept ones."""

    def __init__(self, skips: Iterable[Skip] = ()) -> None:
        self.count = 0
        self.reasons: Counter[str] = Counter()
        self.kept: list[Skip] = []
        self.extend(skips)

    def append(self, skip: Skip) -> None:
        self.count += 1
        kind = reason_kind(skip.reason)
        if kind not in self.reasons and len(self.reasons) >= REASON_KINDS_KEPT:
            kind = "other reasons"
        self.reasons[kind] += 1
        if len(self.kept) < SKIPS_KEPT:
            self.kept.append(skip)

    def extend(self, skips: Iterable[Skip]) -> None:
        if isinstance(skips, SkipLog):
            self.count += skips.count
            for kind, number in skips.reasons.items():
                if kind not in self.reasons and len(self.reasons) >= REASON_KINDS_KEPT:
                    kind = "other reasons"
                self.reasons[kind] += number
            self.kept.extend(skips.kept[: SKIPS_KEPT - len(self.kept)])
            return
        for skip in skips:
            self.append(skip)

    def __add__(self, other: Iterable[Skip]) -> SkipLog:
        joined = SkipLog(self)
        joined.extend(other)
        return joined

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[Skip]:
        return iter(self.kept)

    def __getitem__(self, index: int) -> Skip:
        return self.kept[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SkipLog):
            return self.count == other.count and self.kept == other.kept
        if isinstance(other, list):
            return self.count == len(other) and self.kept == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"SkipLog(count={self.count}, kept={self.kept[:3]!r}...)"
