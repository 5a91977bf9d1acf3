"""Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM (to the main process
alone, as a supervisor sends it), early in the run and while forked workers replay: exit 130 or
143 with one line, no traceback, no process left behind, and the next run's JSON is the same."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import children, in_session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
# The diagnosis forks its replays for logs of 2M tokens or more; here for any log.
SCRIPT = (
    "import sys, analyzer.diagnose.scenarios as m\n"
    "m.PARALLEL_MIN_TOKENS = 0\n"
    "from cli.entry import main\n"
    "sys.argv = ['prefixcheck', 'analyze', *sys.argv[1:]]\n"
    "main()\n"
)
ARGS = [str(EXAMPLE), "--capacity-tokens", "20000", "--quiet"]

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="checks processes through /proc (Linux)"
)


def _start(cache: Path, *extra: str, plain: bool = False) -> subprocess.Popen[str]:
    command = ["-m", "cli.entry", "analyze"] if plain else ["-c", SCRIPT]
    return subprocess.Popen(
        [sys.executable, *command, *ARGS, *extra],
        cwd=ROOT,
        env={**os.environ, "PREFIXCHECK_CACHE_DIR": str(cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session: what is left of it can be found
    )


def _clean_run(cache: Path, out: Path) -> bytes:
    process = _start(cache, "--json", str(out))
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    return out.read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    folder = tmp_path_factory.mktemp("reference")
    return _clean_run(folder / "cache", folder / "r.json")


@pytest.mark.parametrize(
    ("stage", "signum"),
    [
        ("importing", signal.SIGINT),
        ("importing", signal.SIGTERM),
        ("running", signal.SIGTERM),
        ("forked workers", signal.SIGINT),
        ("forked workers", signal.SIGTERM),
    ],
)
def test_signal_ends_the_run_cleanly(
    tmp_path: Path, reference: bytes, stage: str, signum: int
) -> None:
    cache = tmp_path / "cache"
    process = _start(cache, plain=stage == "importing")
    if stage == "importing":
        time.sleep(0.3)  # python is still importing polars, numba, the cache models
    elif stage == "running":  # reading, tokenizing or replaying, whichever it has reached
        # Not a fixed sleep: on a loaded machine the imports alone can outlast one, and a signal
        # before the handlers are in place is not what this stage checks. The token cache's
        # folder appears once the run reads its first requests.
        deadline = time.monotonic() + 120
        while not cache.exists() and process.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
    else:
        deadline = time.monotonic() + 120
        while not children(process.pid) and process.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError):  # it may have finished already
        if signum == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the group
        else:
            process.send_signal(signal.SIGTERM)  # a supervisor's SIGTERM, to the main process
    _, stderr = process.communicate(timeout=60)
    if process.returncode != 0:  # it may have finished just before the signal
        assert process.returncode == (130 if signum == signal.SIGINT else 143), stderr
        assert "Traceback" not in stderr
        assert stderr.strip().splitlines()[-1] in (
            "prefixcheck: interrupted",
            "prefixcheck: terminated",
        )
    for _ in range(100):  # the kernel reaps killed workers shortly after
        if not in_session(process.pid):
            break
        time.sleep(0.05)
    assert in_session(process.pid) == []
    if signum == signal.SIGTERM and stage == "forked workers":  # the token cache is written
        assert _clean_run(cache, tmp_path / "after.json") == reference


# A signal that lands while a module makes a class: Python 3.11 wraps what ``__set_name__``
# raises (here, as a ``cached_property`` is set on its class) in a RuntimeError.
WRAPPED = (
    "import signal, sys, types\n"
    "import cli.entry as entry\n"
    "def app():\n"
    "    class Field:\n"
    "        def __set_name__(self, owner, name):\n"
    "            raise entry._Interrupted(signal.{signal})\n"
    "    try:\n"
    "        type('Model', (), {{'field': Field()}})\n"
    "    except BaseException as exc:\n"
    "        raise RuntimeError('Error calling __set_name__') from exc\n"
    "sys.modules['cli.main'] = types.SimpleNamespace(app=app)\n"
    "entry.main()\n"
)


@pytest.mark.parametrize(
    ("name", "code", "line"), [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")]
)
def test_a_signal_wrapped_by_another_exception_still_ends_the_run_cleanly(
    name: str, code: int, line: str
) -> None:
    """The run ends as the signal asks (not as an internal error, exit 70), whatever exception
    the signal's own reached the entry point inside."""
    done = subprocess.run(
        [sys.executable, "-c", WRAPPED.format(signal=name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.strip() == f"prefixcheck: {line}"
