"""A progress sink the pipeline reports to; the CLI draws it, tests and libraries ignore it."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def stage(self, name: str, total: int | None) -> None:
        """A new stage starts with ``total`` units of work (None when unknown)."""

    def advance(self, units: int) -> None:
        """``units`` more units of the current stage are done."""

    def input(self, step: str, done_bytes: int, total_bytes: int | None, requests: int) -> None:
        """Overall progress through the input, across chunks: ``done_bytes`` of the files'
        ``total_bytes`` (None when unknown: standard input) read and processed, ``requests``
        requests so far, ``step`` what is being done to them now (reading, tokenizing,
        replaying)."""


class NoProgress:
    """Reports nothing."""

    def stage(self, name: str, total: int | None) -> None:
        pass

    def advance(self, units: int) -> None:
        pass

    def input(self, step: str, done_bytes: int, total_bytes: int | None, requests: int) -> None:
        pass
