"""Errors and skips with the place they come from: every bad input names its file and line."""

from __future__ import annotations

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
