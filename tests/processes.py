"""Processes of this machine as /proc shows them (Linux): for tests that check what a run left."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def _stats() -> Iterator[tuple[int, list[str]]]:
    """Each process's pid and the fields of its /proc stat after the command name (state, ppid,
    pgrp, session, ...); none off Linux."""
    if not Path("/proc").is_dir():
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            yield int(entry), stat.rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """The children of ``pid``, zombies included."""
    return [child for child, fields in _stats() if int(fields[1]) == pid]


def in_session(session: int) -> list[int]:
    """The live (not zombie) processes of ``session``."""
    return [pid for pid, fields in _stats() if int(fields[3]) == session and fields[0] != "Z"]
