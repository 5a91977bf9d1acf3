"""Independent replays in forked child processes, joined without shared locks.

``multiprocessing.Pool`` is not used: a Ctrl-C or SIGTERM turns into an exception raised at any
point of the parent, and one raised inside the pool's own bookkeeping (a queue's lock held, the
handler threads mid-step) left ``Pool.terminate`` waiting forever on the task queue's lock (seen
in ``tests/test_signals.py`` under load). Here each child is handed its tasks at the fork, writes
its pickled results to a pipe of its own and exits; the parent only reads pipes and reaps
children, so an exception anywhere in it ends in killing the children it forked.

The children die with the run: SIGINT and SIGTERM are held across the fork (a signal between the
fork and the child's own handlers would run the parent's, which raise, in the child); a child
then ignores Ctrl-C (the parent handles it and kills the children) and takes SIGTERM's default;
the kernel kills a child whose parent dies (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

_ENDING = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1


def forked_map(task: Callable[[int], T], weights: Sequence[int], workers: int) -> list[T]:
    """``[task(i) for i in range(len(weights))]``, run in ``workers`` forked children; tasks are
    dealt heaviest first to the child with the least weight so far. A task's exception is raised
    here; a child that dies without its results is a ``RuntimeError`` naming how it died."""
    shares: list[list[int]] = [[] for _ in range(max(1, min(workers, len(weights))))]
    loads = [0] * len(shares)
    for index in sorted(range(len(weights)), key=lambda i: -weights[i]):
        lightest = loads.index(min(loads))
        shares[lightest].append(index)
        loads[lightest] += weights[index]
    parent = os.getpid()
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING)
    try:
        try:
            for mine in shares:
                read_end, write_end = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child: never returns
                    os.close(read_end)
                    _child(task, mine, write_end, parent)
                os.close(write_end)
                children.append((pid, read_end))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # pending signals land here
        results: dict[int, T] = {}
        for k, (pid, read_end) in enumerate(children):
            payload = _read_all(read_end)
            os.close(read_end)
            children[k] = (pid, -1)
            status = os.waitpid(pid, 0)[1]
            children[k] = (-1, -1)
            results.update(_unpacked(payload, pid, status))
        return [results[i] for i in range(len(weights))]
    finally:
        for pid, read_end in children:  # an error or a signal: end every child left
            if read_end >= 0:
                os.close(read_end)
            if pid > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def _child(task: Callable[[int], object], mine: list[int], write_end: int, parent: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C: the parent ends us
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if sys.platform == "linux":
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _ENDING)  # held since the fork
        try:
            payload = pickle.dumps(("ok", {i: task(i) for i in mine}), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # the task's own error, raised again in the parent
            try:
                payload = pickle.dumps(("error", exc), pickle.HIGHEST_PROTOCOL)
            except Exception:
                payload = pickle.dumps(("error", RuntimeError(repr(exc))))
        with os.fdopen(write_end, "wb") as out:
            out.write(payload)
        code = 0
    finally:
        os._exit(code)  # no atexit handlers, no flush of the parent's buffers


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def _unpacked(payload: bytes, pid: int, status: int) -> dict:
    """A child's results from what it wrote (its task's error raised again here)."""
    if not payload:
        raise RuntimeError(f"a diagnosis worker (pid {pid}) died: {_how(status)}")
    kind, value = pickle.loads(payload)
    if kind == "error":
        raise value
    return value


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
