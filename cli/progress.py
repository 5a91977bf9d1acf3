"""A rich progress display for the pipeline's stages (hidden when stderr is not a terminal)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class RichProgress:
    """Implements analyzer.progress.Progress with one bar per stage."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not enabled,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def stage(self, name: str, total: int | None) -> None:
        if self._task is not None:
            self._progress.update(self._task, visible=False)
        self._task = self._progress.add_task(name, total=total)

    def advance(self, units: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, units)
