"""A fresh install's first and second run of ``prefixcheck analyze`` in a terminal (prints,
never asserts): seconds to the first line on screen and to the report, with the numba and token
caches empty for the first run, as after ``pip install``.

    .venv/bin/python tests/bench/bench_first_run.py [LOG] [-- FLAGS...]

LOG defaults to examples/chat_logs.jsonl. The command runs in a pseudo-terminal of 80 columns
(so the progress display is drawn) with NUMBA_CACHE_DIR and PREFIXCHECK_CACHE_DIR in a fresh
temporary folder. Targets: the first line within 2 s; the second run's report within a few.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "chat_logs.jsonl"
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Seconds to the first visible character, seconds to exit, and the first line drawn."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    start = time.perf_counter()
    child = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    first, seen = None, b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                break
            if not data:
                break
            seen += data
            if first is None and ANSI.sub(b"", seen).strip():
                first = time.perf_counter() - start
        elif child.poll() is not None:
            break
    child.wait()
    total = time.perf_counter() - start
    os.close(master)
    if child.returncode:
        raise SystemExit(f"{' '.join(command)} exited {child.returncode}")
    text = ANSI.sub(b"", seen).decode(errors="replace")
    line = next((part.strip() for part in re.split(r"[\r\n]", text) if part.strip()), "")
    return first or total, total, line


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    log = argv[0] if split else str(EXAMPLE)
    flags = argv[split + 1 :]
    command = [str(Path(sys.executable).parent / "prefixcheck"), "analyze", log, *flags]
    with tempfile.TemporaryDirectory() as fresh:
        env = dict(os.environ, NUMBA_CACHE_DIR=f"{fresh}/numba", PREFIXCHECK_CACHE_DIR=fresh)
        env.update(COLUMNS="80", LINES="50")
        print(f"{'run':<8}{'first line (target 2 s)':>26}{'report':>10}  first line shown")
        for name in ("first", "second"):
            first, total, line = run_in_terminal(command, env)
            print(f"{name:<8}{first:>24.2f} s{total:>8.1f} s  {line[:60]}")


if __name__ == "__main__":
    main()
