"""``forked_map``: the diagnosis's replays in forked children, joined without shared locks."""

from __future__ import annotations

import os
import signal
import time

import pytest

from analyzer.diagnose.forked import forked_map
from tests.processes import children

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def test_results_in_task_order_from_several_children() -> None:
    weights = [5, 1, 9, 3, 7, 2]
    results = forked_map(lambda i: (i * i, os.getpid()), weights, workers=2)
    assert [square for square, _ in results] == [i * i for i in range(len(weights))]
    pids = {pid for _, pid in results}
    assert len(pids) == 2 and os.getpid() not in pids  # two children, not this process


def test_a_tasks_error_is_raised_in_the_parent() -> None:
    def task(i: int) -> int:
        if i == 2:
            raise ValueError("bad scenario 2")
        return i

    with pytest.raises(ValueError, match="bad scenario 2"):
        forked_map(task, [1, 1, 1, 1], workers=2)


def test_a_child_that_dies_is_named_and_no_child_is_left() -> None:
    def task(i: int) -> int:
        if i == 0:  # the first child dies; the second would run for a minute
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        return i

    before, start = set(children(os.getpid())), time.monotonic()
    with pytest.raises(RuntimeError, match="died: killed by SIGKILL"):
        forked_map(task, [1, 1], workers=2)
    assert time.monotonic() - start < 30  # the second child was killed, not waited for
    assert set(children(os.getpid())) <= before  # and both were reaped: no zombie left
