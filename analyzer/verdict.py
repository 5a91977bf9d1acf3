"""The report in three lines, read first: the hit rates, the biggest cause of recomputation that
can be avoided, and the best measured fix. Built from the report's JSON form, so the terminal, the
HTML page and a saved report all say the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer.diagnose.recommend import MIN_GAIN_SHARE
from analyzer.engines import ENGINE_LABELS

NO_FIX = f"none: no fix replayed saves {MIN_GAIN_SHARE:.1%} of the prompt tokens on either engine"
# Causes no fix of the log or the engine removes: new tokens, and the token computed for logits.
UNAVOIDABLE = ("never_seen", "last_token")


@dataclass(frozen=True)
class Verdict:
    hit_rates: str  # "vLLM 77.6% · SGLang 81.1% of prompt tokens hit (ceiling 82.8%)"
    biggest_cause: str  # "dynamic content: 5.0% of prompt tokens recomputed (vLLM)"
    best_fix: str  # the top recommendation's summary, or NO_FIX
    best_fix_why: str | None

    @classmethod
    def of(cls, report: dict[str, Any]) -> Verdict:
        rates = " · ".join(
            f"{ENGINE_LABELS.get(name, name)} {summary['hit_rate']:.1%}"
            for name, summary in report["engines"].items()
        )
        hit_rates = (
            f"{rates} of prompt tokens hit (ceiling {report['ceiling']['hit_rate']:.1%}, "
            f"an unbounded token-exact cache)"
        )
        recommendations = report.get("recommendations") or []
        best = recommendations[0] if recommendations else None
        return cls(
            hit_rates=hit_rates,
            biggest_cause=_biggest_cause(report),
            best_fix=best["summary"] if best else NO_FIX,
            best_fix_why=best.get("why") if best else None,
        )


def _biggest_cause(report: dict[str, Any]) -> str:
    """The largest avoidable cause over the engines, its share over the diagnosed requests."""
    losses = report.get("losses") or {}
    found = [
        (entry["tokens"], cause, engine)
        for engine, causes in losses.items()
        for cause, entry in causes.items()
        if cause not in UNAVOIDABLE
    ]
    scope = report.get("diagnosis_scope") or {}
    over = "" if scope.get("whole_log", True) else " of the diagnosed sample"
    if not found or max(found)[0] == 0:
        unavoidable = max(
            (sum(c[name]["share"] for name in UNAVOIDABLE if name in c) for c in losses.values()),
            default=0.0,
        )
        return (
            "nothing avoidable: every recomputed token is new to the log or a request's last "
            f"({unavoidable:.1%} of prompt tokens{over})"
        )
    tokens, cause, engine = max(found)
    share = losses[engine][cause]["share"]
    engines = [ENGINE_LABELS.get(e, e) for e, c in losses.items() if c[cause]["tokens"] == tokens]
    others = {
        ENGINE_LABELS.get(e, e): causes[cause]["share"]
        for e, causes in losses.items()
        if causes[cause]["tokens"] != tokens
    }
    also = "".join(f"; {name} {n:.1%}" for name, n in others.items())
    return (
        f"{cause.replace('_', ' ')}: {tokens:,} tokens, {share:.1%} of prompt tokens{over} "
        f"recomputed ({' and '.join(engines)}{also})"
    )
