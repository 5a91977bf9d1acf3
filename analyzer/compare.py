"""``prefixcheck compare``: what changed between two saved reports (base and head of a PR)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.errors import PrefixcheckError
from analyzer.gates import engines_for
from analyzer.loaders.jsonl import bounded_json
from analyzer.report import SCHEMA_VERSION


@dataclass(frozen=True)
class EngineChange:
    engine: str
    label: str
    base_hit_rate: float
    head_hit_rate: float

    @property
    def drop(self) -> float:
        """Fall in token hit rate, in rate units (0.02 = two percentage points)."""
        return self.base_hit_rate - self.head_hit_rate


@dataclass(frozen=True)
class TemplateChange:
    """A shared prefix present in both reports whose length or alignment changed, or one that
    appeared or disappeared."""

    fingerprint: str
    snippet: str | None
    base_tokens: int | None
    head_tokens: int | None
    base_remainder: int | None
    head_remainder: int | None
    base_requests: int | None
    head_requests: int | None

    @property
    def status(self) -> str:
        if self.base_tokens is None:
            return "added"
        if self.head_tokens is None:
            return "removed"
        return "changed"


@dataclass(frozen=True)
class Comparison:
    engines: list[EngineChange]
    losses: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    templates: list[TemplateChange] = field(default_factory=list)
    block_size: int = 16
    warnings: list[str] = field(default_factory=list)  # why some changes do not compare

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "warnings": self.warnings,
            "engines": {
                c.engine: {
                    "base_hit_rate": c.base_hit_rate,
                    "head_hit_rate": c.head_hit_rate,
                    "drop": c.drop,
                }
                for c in self.engines
            },
            "losses": {
                engine: {
                    kind: {"base": b, "head": h, "delta": h - b} for kind, (b, h) in kinds.items()
                }
                for engine, kinds in self.losses.items()
            },
            "templates": [
                {
                    "status": t.status,
                    "fingerprint": t.fingerprint,
                    "snippet": t.snippet,
                    "base_tokens": t.base_tokens,
                    "head_tokens": t.head_tokens,
                    "base_remainder": t.base_remainder,
                    "head_remainder": t.head_remainder,
                    "base_requests": t.base_requests,
                    "head_requests": t.head_requests,
                }
                for t in self.templates
            ],
        }


def load_report(path: Path) -> dict[str, Any]:
    try:
        report = bounded_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PrefixcheckError(f"{path}: not a JSON report ({exc})") from None
    if not isinstance(report, dict) or report.get("schema_version") != SCHEMA_VERSION:
        raise PrefixcheckError(
            f"{path}: not a prefixcheck report of schema version {SCHEMA_VERSION} "
            "(write one with `prefixcheck analyze ... --json PATH`)"
        )
    problem = _shape_problem(report)
    if problem:
        raise PrefixcheckError(f"{path}: not a prefixcheck report ({problem})")
    return report


def _shape_problem(report: dict[str, Any]) -> str:
    """What in a report compare cannot read (a hand-edited or truncated file), or ""."""

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    engines = report.get("engines")
    if not isinstance(engines, dict):
        return "'engines' is not an object"
    for name in ("vllm", "sglang"):
        engine = engines.get(name)
        if not isinstance(engine, dict) or not number(engine.get("hit_rate")):
            return f"'engines.{name}.hit_rate' is not a number"
        if not isinstance(engine.get("label"), str):
            return f"'engines.{name}.label' is not a string"
    losses = report.get("losses", {})
    if not isinstance(losses, dict) or not all(
        isinstance(kinds, dict)
        and all(
            number(entry) or (isinstance(entry, dict) and number(entry.get("tokens")))
            for entry in kinds.values()
        )
        for kinds in losses.values()
    ):
        return "'losses' is not an object of token counts"
    prefixes = report.get("shared_prefixes", [])
    keys = ("fingerprint", "tokens", "remainder", "requests")
    if not isinstance(prefixes, list) or not all(
        isinstance(p, dict) and isinstance(p.get("fingerprint"), str) and all(k in p for k in keys)
        for p in prefixes
    ):
        return "'shared_prefixes' is not a list of prefixes"
    if not all(number(p[k]) for p in prefixes for k in keys[1:]):
        return "'shared_prefixes' has a count that is not a number"
    if not all(isinstance(p.get("snippet"), str | None) for p in prefixes):
        return "'shared_prefixes' has a snippet that is not text"
    if not isinstance(report.get("block_size", 16), int):
        return "'block_size' is not an integer"
    return ""


def _label(base: str, head: str) -> str:
    """The engine's label, both configurations when they differ: ``vLLM (block 16 → block 32)``."""
    if base == head:
        return head
    name, _, _ = head.partition(" (")
    if base.startswith(name + " (") and head.startswith(name + " ("):
        return f"{name} ({base[len(name) + 2 : -1]} → {head[len(name) + 2 : -1]})"
    return f"{base} → {head}"


def compare_reports(base: dict[str, Any], head: dict[str, Any], engine: str = "both") -> Comparison:
    engines = [
        EngineChange(
            engine=name,
            label=_label(base["engines"][name]["label"], head["engines"][name]["label"]),
            base_hit_rate=base["engines"][name]["hit_rate"],
            head_hit_rate=head["engines"][name]["hit_rate"],
        )
        for name in engines_for(engine)
    ]
    warnings = _scope_warnings(base.get("diagnosis_scope"), head.get("diagnosis_scope"))
    losses: dict[str, dict[str, tuple[int, int]]] = {}
    for name in engines_for(engine) if not warnings else ():
        base_losses = base.get("losses", {}).get(name, {})
        head_losses = head.get("losses", {}).get(name, {})
        kinds = sorted(set(base_losses) | set(head_losses))
        losses[name] = {
            kind: (_tokens(base_losses.get(kind)), _tokens(head_losses.get(kind))) for kind in kinds
        }
    return Comparison(
        engines=engines,
        losses=losses,
        templates=_template_changes(
            base.get("shared_prefixes", []), head.get("shared_prefixes", [])
        ),
        block_size=head.get("block_size", 16),
        warnings=warnings,
    )


def _scope_warnings(base: Any, head: Any) -> list[str]:
    """Why the two reports' losses by cause do not compare (then none are shown): one report has
    no diagnosis (``--no-diagnosis``), or the diagnoses cover different requests (a streamed log's
    leading sample of another size, or a sample beside a whole log)."""
    if not isinstance(base, dict) and not isinstance(head, dict):
        return []
    if not isinstance(base, dict) or not isinstance(head, dict):
        which = "base" if not isinstance(base, dict) else "head"
        return [f"the {which} report has no diagnosis: losses by cause are not compared"]
    if base.get("whole_log") is True and head.get("whole_log") is True:
        return []  # each over its whole log, as a change to the template would leave it
    keys = ("whole_log", "requests", "prompt_tokens")
    if all(base.get(k) == head.get(k) for k in keys):
        return []
    return [
        f"the diagnoses cover different requests (base {base.get('description', '?')}; head "
        f"{head.get('description', '?')}): losses by cause are not compared"
    ]


def _tokens(entry: Any) -> int:
    if entry is None:
        return 0
    return int(entry["tokens"] if isinstance(entry, dict) else entry)


def _template_changes(base: list[dict], head: list[dict]) -> list[TemplateChange]:
    """Pair templates by fingerprint (nested templates share one: pair them by length order)."""
    by_fingerprint: dict[str, tuple[list[dict], list[dict]]] = defaultdict(lambda: ([], []))
    for prefix in base:
        by_fingerprint[prefix["fingerprint"]][0].append(prefix)
    for prefix in head:
        by_fingerprint[prefix["fingerprint"]][1].append(prefix)
    changes = []
    for fingerprint, (olds, news) in by_fingerprint.items():
        olds.sort(key=lambda p: p["tokens"])
        news.sort(key=lambda p: p["tokens"])
        for index in range(max(len(olds), len(news))):
            old = olds[index] if index < len(olds) else None
            new = news[index] if index < len(news) else None
            if (
                old
                and new
                and (old["tokens"], old["remainder"]) == (new["tokens"], new["remainder"])
            ):
                continue
            shown = new or old
            assert shown is not None
            changes.append(
                TemplateChange(
                    fingerprint=fingerprint,
                    snippet=shown.get("snippet"),
                    base_tokens=old and old["tokens"],
                    head_tokens=new and new["tokens"],
                    base_remainder=old and old["remainder"],
                    head_remainder=new and new["remainder"],
                    base_requests=old and old["requests"],
                    head_requests=new and new["requests"],
                )
            )
    return changes
