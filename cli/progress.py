"""The progress display: one overall bar across the input's chunks (requests, share of the bytes,
rate, time left), then one bar per later stage; hidden when stderr is not a terminal. The
first run's kernel compilation is announced in one line, terminal or not."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

COMPILE_NOTICE = "prefixcheck: compiling the replay kernels, once per install ({seconds} s)"
# What a first run's compilation took on two shared CI cores (tests/bench/bench_first_run.py).
COMPILE_SECONDS = "30-60"


class _InputColumn(ProgressColumn):
    """``12,000 req · 41% of 12.3 MB · 3,400 req/s`` for the overall bar."""

    def render(self, task: Task) -> Text:
        requests = int(task.fields.get("requests", 0))
        parts = [f"{requests:,} req"]
        if task.total:
            parts.append(f"{task.completed / task.total:.0%} of {_size(int(task.total))}")
        elapsed = task.elapsed or 0.0
        if elapsed > 0.5 and requests:
            parts.append(f"{requests / elapsed:,.0f} req/s")
        return Text(" · ".join(parts))


class _StageColumn(ProgressColumn):
    """``3,000/7,000`` for a stage with a total, nothing for an open-ended one or the input."""

    def render(self, task: Task) -> Text:
        if task.fields.get("input") or task.total is None:
            return Text("")
        return Text(f"{int(task.completed):,}/{int(task.total):,}")


class _InputOnly(ProgressColumn):
    """Draw ``column`` for the input bar only (the stage bars have their own counts)."""

    def __init__(self, column: ProgressColumn, *, stages: bool = False) -> None:
        super().__init__()
        self._column = column
        self._stages = stages

    def render(self, task: Task) -> Text:
        if bool(task.fields.get("input")) == (not self._stages):
            rendered = self._column.render(task)
            return rendered if isinstance(rendered, Text) else Text(str(rendered))
        return Text("")


class RichProgress:
    """Implements analyzer.progress.Progress: the input bar, then one bar per stage."""

    def __init__(self, console: Console, enabled: bool, announce: bool = True) -> None:
        self._console = console
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=16),
            _InputOnly(_InputColumn()),
            _StageColumn(),
            _InputOnly(TimeElapsedColumn(), stages=True),
            _InputOnly(TimeRemainingColumn(compact=True)),
            console=console,
            transient=True,
            disable=not enabled,
        )
        self._enabled = enabled
        self._announce = announce
        self._task: TaskID | None = None
        self._input: TaskID | None = None
        self._compiling: TaskID | None = None
        self._compiled = 0

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

    def input(self, step: str, done_bytes: int, total_bytes: int | None, requests: int) -> None:
        if self._input is None:
            self._input = self._progress.add_task(step, total=total_bytes, input=True)
        elif done_bytes < next(t.completed for t in self._progress.tasks if t.id == self._input):
            # a second pass over the input (a cluster's replay after its ingest): rate and time
            # left start over
            self._progress.reset(self._input, total=total_bytes, completed=done_bytes)
        self._progress.update(
            self._input, description=step, completed=done_bytes, requests=requests
        )

    def stage(self, name: str, total: int | None) -> None:
        if self._input is not None:  # the input is read: later stages have their own bars
            self._progress.update(self._input, visible=False)
            self._input = None
        if self._task is not None:
            self._progress.update(self._task, visible=False)
        self._task = self._progress.add_task(name, total=total)

    def advance(self, units: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, units)

    def compiling(self, kernel: str) -> None:
        """numba is compiling ``kernel`` (first run only): say so once, and count them."""
        self._compiled += 1
        if self._compiled == 1 and self._announce:
            self._console.print(
                COMPILE_NOTICE.format(seconds=COMPILE_SECONDS),
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        if not self._enabled:
            return
        label = f"compiling kernel {self._compiled} ({kernel.rsplit('.', 1)[-1]})"
        if self._compiling is None:
            self._compiling = self._progress.add_task(label, total=None)
        self._progress.update(self._compiling, description=label, visible=True)

    def compiled(self) -> None:
        """numba is not compiling any more: hide the compilation line."""
        if self._compiling is not None:
            self._progress.update(self._compiling, visible=False)


def _size(n: int) -> str:
    """``12.3 MB``: decimal units, as rich's download columns."""
    value, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            break
        value /= 1000
    return f"{n} B" if unit == "B" else f"{value:,.1f} {unit}"
