"""A progress sink the pipeline reports to; the CLI draws it, tests and libraries ignore it."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def stage(self, name: str, total: int | None) -> None:
        """A new stage starts with ``total`` units of work (None when unknown)."""

    def advance(self, units: int) -> None:
        """``units`` more units of the current stage are done."""


class NoProgress:
    """Reports nothing."""

    def stage(self, name: str, total: int | None) -> None:
        pass

    def advance(self, units: int) -> None:
        pass
