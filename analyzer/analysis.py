"""What an analysis returns: the report and what it was computed from (for ``measure``)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.replay import Replays
from analyzer.report import Report
from analyzer.workload import TokenizedLog


@dataclass(frozen=True)
class Analysis:
    """The report, the per-request table, and what they were computed from (input order)."""

    report: Report
    per_request: pl.DataFrame
    tokenized: TokenizedLog
    replays: Replays
