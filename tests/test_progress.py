"""What a user sees while a run works: one bar over the whole input (not one per chunk) that
only moves forward, and a one-line notice while numba compiles on a first run."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from numba import njit
from rich.console import Console

from analyzer.kernels import watch_compilation
from analyzer.pipeline import AnalyzeOptions, analyze
from cli.progress import RichProgress

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "chat_logs.jsonl"


@dataclass
class Recorder:
    events: list[tuple] = field(default_factory=list)

    def stage(self, name: str, total: int | None) -> None:
        self.events.append(("stage", name, total))

    def advance(self, units: int) -> None:
        self.events.append(("advance", units))

    def input(self, step: str, done_bytes: int, total_bytes: int | None, requests: int) -> None:
        self.events.append(("input", step, done_bytes, total_bytes, requests))


@pytest.mark.parametrize("sample_tokens", [None, 3000])  # in memory, and streamed
def test_one_overall_bar_across_chunks(sample_tokens: int | None) -> None:
    recorder = Recorder()
    analyze([EXAMPLE], AnalyzeOptions(chunk_records=100, sample_tokens=sample_tokens), recorder)
    inputs = [e for e in recorder.events if e[0] == "input"]
    first_stage = next(i for i, e in enumerate(recorder.events) if e[0] == "stage")
    assert all(e[0] == "input" for e in recorder.events[:first_stage])  # no bar per chunk
    size = EXAMPLE.stat().st_size
    assert {e[3] for e in inputs} == {size}
    done = [e[2] for e in inputs]
    requests = [e[4] for e in inputs]
    assert done == sorted(done) and requests == sorted(requests)  # never restarts
    assert done[-1] == size and requests[-1] == 600
    steps = {e[1] for e in inputs}
    assert {"reading", "tokenizing prompts"} <= steps
    assert ("replaying" in steps) == (sample_tokens is not None)


def test_the_bar_says_count_unit_share_rate_and_time_left() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True)
    progress = RichProgress(console, enabled=True)
    for done in (0, 400_000, 800_000):
        progress.input("tokenizing prompts", done, 1_600_000, done // 100)
    [task] = progress._progress.tasks  # one bar, updated in place
    assert task.completed == 800_000 and task.fields["requests"] == 8_000
    console.print(progress._progress.get_renderable())
    line = out.getvalue().strip().splitlines()[-1]
    assert "8,000 req" in line and "50% of 1.6 MB" in line
    progress.stage("replaying the caches", 3)
    assert not progress._progress.tasks[0].visible  # the input bar gives way to the stages


def test_compiling_is_announced_once_and_only_when_numba_compiles() -> None:
    @njit(cache=False)
    def kernel(x: int) -> int:
        return x + 1

    compiled: list[str] = []
    done: list[bool] = []
    with watch_compilation(compiled.append, lambda: done.append(True)):
        kernel(1)
        kernel(2)  # compiled already: no event
    assert [name.rsplit(".", 1)[-1] for name in compiled] == ["kernel"] and done == [True]
    out = io.StringIO()
    progress = RichProgress(Console(file=out, width=80), enabled=False)
    progress.compiling("cache_models._vllm_kernel.replay_sequential")
    progress.compiling("cache_models._sglang_kernel.replay_sequential")
    assert out.getvalue().count("compiling the replay kernels, once per install") == 1
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80


def test_a_second_pass_over_the_input_starts_the_bar_over() -> None:
    """A cluster tokenizes every shard, then replays from the first byte: the bar's rate and
    time left start over instead of running backwards."""
    progress = RichProgress(Console(file=io.StringIO(), force_terminal=True), enabled=True)
    with progress:
        progress.input("tokenizing on Ray: 4/4 shards", 1000, 1000, 50)
        progress.input("replaying on Ray", 100, 1000, 5)
        (task,) = progress._progress.tasks
    assert (task.description, task.completed, task.fields["requests"]) == (
        "replaying on Ray",
        100,
        5,
    )
    assert not task.finished  # else rich shows no time left and stops the clock
