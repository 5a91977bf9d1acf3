"""CI gates: thresholds on a report's hit rates and losses, each a pass or a fail with a reason."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.diagnose.losses import CATEGORIES
from analyzer.engines import ENGINES
from analyzer.errors import PrefixcheckError
from analyzer.shares import share

_LOSS_LIMIT = re.compile(r"^\s*([A-Za-z_-]+)\s*=\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class LossLimit:
    """``--max-loss KIND=N`` (tokens) or ``KIND=N%`` (share of prompt tokens)."""

    kind: str
    value: float
    is_share: bool

    @classmethod
    def parse(cls, text: str) -> LossLimit:
        match = _LOSS_LIMIT.match(text)
        if not match:
            raise PrefixcheckError(
                f"--max-loss {text!r}: expected KIND=TOKENS or KIND=PERCENT% (e.g. alignment=5%)"
            )
        name, number, percent = match.groups()
        kind = name.lower().replace("-", "_")  # dynamic-content, as flags are spelled
        if kind not in CATEGORIES:
            close = difflib.get_close_matches(kind, CATEGORIES, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}? " if close else ""
            raise PrefixcheckError(
                f"--max-loss {text!r}: no cause {name!r}; {hint}(causes: {', '.join(CATEGORIES)})"
            )
        value = float(number)
        if percent and value > 100:
            raise PrefixcheckError(f"--max-loss {text!r}: a percentage is at most 100%")
        return cls(kind=kind, value=value / 100 if percent else value, is_share=bool(percent))

    def describe(self) -> str:
        return (
            f"{self.kind} <= {self.value:.2%}"
            if self.is_share
            else f"{self.kind} <= {self.value:,.0f} tokens"
        )


def parse_rate(text: str, flag: str = "--fail-under") -> float:
    """A hit rate as a share (``0.7``) or a percentage (``70``, ``70%``), as coverage.py's
    ``--fail-under`` users type it."""
    value = text.strip()
    percent = value.endswith("%")
    try:
        number = float(value.removesuffix("%"))
    except ValueError:
        message = f"{flag} {text!r}: expected a rate (0.7) or a percentage (70%)"
        raise PrefixcheckError(message) from None
    if percent or number > 1:
        number /= 100
    if not 0 <= number <= 1:
        raise PrefixcheckError(f"{flag} {text!r}: a rate is between 0 and 1 (0% and 100%)")
    return number


@dataclass(frozen=True)
class GateResult:
    """One check of one engine: its name (a JUnit test case), the measured value, and why."""

    name: str
    engine: str
    passed: bool
    message: str


def engines_for(selection: str) -> Sequence[str]:
    if selection == "both":
        return ENGINES
    if selection in ENGINES:
        return (selection,)
    raise PrefixcheckError(f"unknown --engine {selection!r}; choose vllm, sglang or both")


def evaluate_gates(
    report: dict[str, Any],
    *,
    fail_under: float | None = None,
    max_losses: Sequence[LossLimit] = (),
    engine: str = "both",
) -> list[GateResult]:
    """Check every gate on every selected engine of a report (its JSON form)."""
    results: list[GateResult] = []
    for name in engines_for(engine):
        summary = report["engines"][name]
        label = summary["label"]
        if fail_under is not None:
            rate = summary["hit_rate"]
            passed = rate >= fail_under
            relation = ">=" if passed else "<"
            results.append(
                GateResult(
                    name=f"{name}: hit rate >= {fail_under:.2%}",
                    engine=name,
                    passed=passed,
                    message=f"{label} token hit rate {rate:.2%} {relation} {fail_under:.2%}",
                )
            )
        for limit in max_losses:
            tokens, over = loss_tokens(report, name, limit.kind)
            value = share(tokens, over) if limit.is_share else tokens
            passed = value <= limit.value
            shown = f"{value:.2%}" if limit.is_share else f"{tokens:,} tokens"
            scope = report.get("diagnosis_scope")
            if limit.kind in report.get("losses", {}).get(name, {}) and not _whole(scope):
                shown += f" over the first {scope['requests']:,} requests"
            results.append(
                GateResult(
                    name=f"{name}: {limit.kind} loss {limit.describe().split(' ', 1)[1]}",
                    engine=name,
                    passed=passed,
                    message=f"{label} {limit.kind} loss {shown} "
                    f"({'within' if passed else 'over'} {limit.describe()})",
                )
            )
    return results


def loss_tokens(report: dict[str, Any], engine: str, kind: str) -> tuple[int, int]:
    """Tokens an engine lost to one cause, from the report's ``losses`` section, and the prompt
    tokens they were measured on (the diagnosed sample's when the log was streamed)."""
    losses = report.get("losses", {}).get(engine)
    if losses is None and kind == "alignment":
        tokens = int(report["alignment_loss"]["tokens"]) if engine == "vllm" else 0
        return tokens, report["prompt_tokens"]
    if losses is None or kind not in losses:
        known = sorted(losses or {"alignment": None})
        raise PrefixcheckError(f"--max-loss: unknown loss {kind!r}; known: {', '.join(known)}")
    entry = losses[kind]
    scope = report.get("diagnosis_scope")
    over = report["prompt_tokens"] if _whole(scope) else scope["prompt_tokens"]
    return int(entry["tokens"] if isinstance(entry, dict) else entry), over


def _whole(scope: dict[str, Any] | None) -> bool:
    """Whether the diagnosis covered the whole log (reports without a scope did)."""
    return scope is None or scope["whole_log"]
