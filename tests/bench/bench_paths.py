"""Where the benchmarks find the real traces: ``shared/data/traces`` beside the project, or beside
a folder above it (a worktree's); never copied into the project."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = next(
    (up / "shared" / "data" / "traces" for up in ROOT.parents if (up / "shared").is_dir()),
    ROOT.parent / "shared" / "data" / "traces",
)
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"
