"""The console script's entry point. Light on purpose: the signal handlers are in place before
the heavy imports (polars, numba, the cache models), so Ctrl-C at any moment ends the run the
same way.

Ctrl-C (exit 130) and SIGTERM (exit 143) end the run with one line, the forked workers with it
(analyzer/diagnose/scenarios.py); an error no check anticipated (a bug) prints one line and a hint
to report it, and exits 70 (sysexits' EX_SOFTWARE, apart from 1, a gate, and 2, bad input);
none of them prints a traceback.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from typing import NoReturn

EXIT_INTERNAL_ERROR = 70
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class _Interrupted(BaseException):
    """Ctrl-C or SIGTERM, raised past click (which would turn a KeyboardInterrupt into
    "Aborted!")."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
    raise _Interrupted(signum)


def main() -> None:
    """Run the prefixcheck command line."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        # What the imports make lives as long as the process: the collector is off while they
        # run (its passes over a thousand modules' objects found nothing to free), and then
        # frozen, so its full passes skip it (they ran over it again and again while a log was
        # read).
        gc.disable()
        from cli.main import app

        gc.freeze()
        # A young-generation pass every 10,000 allocations instead of 700: reading a log makes
        # objects by the million, nearly all freed by their counts (on a 150k-request log, 417
        # passes took 0.07 CPU-s; 10,000 takes a handful). Cycles are collected all the same.
        gc.set_threshold(10_000, 10, 10)
        gc.enable()
        app()
    except (KeyboardInterrupt, _Interrupted) as exc:
        _leave(_signalled(exc), exc)
    except Exception as exc:  # typer re-raises what click did not handle
        cause = _interruption(exc)
        if cause is not None:  # the signal, wrapped on its way out
            _leave(_signalled(cause), cause)
        _leave("internal error", exc)


def _signalled(exc: BaseException) -> str:
    terminated = isinstance(exc, _Interrupted) and exc.signum == signal.SIGTERM
    return "terminated" if terminated else "interrupted"


def _interruption(exc: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM behind ``exc``, when another exception wraps it: Python 3.11
    turns one raised while a class is made (a ``cached_property``'s ``__set_name__``, as a
    module imports) into a RuntimeError."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, KeyboardInterrupt | _Interrupted):
            return found
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


def _leave(what: str, exc: BaseException) -> NoReturn:
    """One line on standard error, then exit at once: threads still in a kernel are not
    waited for, and the forked workers were ended on the way out."""
    if what == "internal error":
        detail = str(exc).splitlines()[0][:300] if str(exc) else ""
        message = (
            f"prefixcheck: internal error: {type(exc).__name__}: {detail} (a bug in prefixcheck "
            f"{_version()}: please report it with the command line that gave it)"
        )
        code = EXIT_INTERNAL_ERROR
    else:
        message = f"prefixcheck: {what}"
        code = EXIT_TERMINATED if what == "terminated" else EXIT_INTERRUPTED
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        print(message, file=sys.stderr, flush=True)
    os._exit(code)


def _version() -> str:
    import importlib.metadata  # here: its import costs a run 25 ms

    try:
        return importlib.metadata.version("prefixcheck")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


if __name__ == "__main__":
    main()
