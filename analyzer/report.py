"""The report: one object that every renderer (terminal, JSON, per-request table) reads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

from analyzer.diagnose.model import Diagnosis, DiagnosisScope, Recommendation
from analyzer.errors import Skip, SkipLog
from analyzer.fleet_run import FleetSummary
from analyzer.measure.estimate import PrefillEstimate
from analyzer.measure.result import Measurement
from analyzer.server_compare import ServerComparison
from analyzer.shares import share

SCHEMA_VERSION = 1
SKIP_EXAMPLES = 5


@dataclass(frozen=True)
class EngineSummary:
    """One engine's replay: hits, rates, the engine's own metrics, and counter totals."""

    engine: str
    label: str
    config: dict[str, Any]
    hit_tokens: int
    hit_rate: float
    mean_request_hit_rate: float
    metrics: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSummary:
    """One model's share of the run: its requests and each engine's hits on its own caches."""

    requests: int
    prompt_tokens: int
    hit_tokens: dict[str, int]
    hit_rate: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "engines": {
                engine: {"hit_tokens": self.hit_tokens[engine], "hit_rate": self.hit_rate[engine]}
                for engine in self.hit_tokens
            },
        }


@dataclass(frozen=True)
class PrefixSummary:
    """A shared prefix as the report shows it."""

    tokens: int
    remainder: int
    requests: int
    covered_tokens: int  # tokens x requests: the prompt tokens that are this prefix
    namespace: str
    # Identifies a template across runs (hash of its first tokens and namespace) for `compare`.
    fingerprint: str
    padding: int  # tokens that would align it to a block
    recompute_saved_per_request: int
    snippet: str | None
    # Recomputed tokens that padding it saves on the diagnosed requests, by replay (the padding's
    # own tokens count against it); None when it was not replayed (aligned, or too few requests).
    padding_saves: int | None = None
    # The template it is a variant of (prefixes with the same first tokens, in any namespace),
    # numbered from 0 in the order the report lists them.
    template: int = 0


@dataclass(frozen=True)
class SkipSummary:
    count: int
    reasons: dict[str, int]
    examples: list[str]

    @classmethod
    def of(cls, skips: SkipLog | list[Skip]) -> SkipSummary:
        log = skips if isinstance(skips, SkipLog) else SkipLog(skips)
        return cls(
            count=log.count,
            reasons=dict(log.reasons.most_common()),
            examples=[str(skip) for skip in log.kept[:SKIP_EXAMPLES]],
        )


@dataclass(frozen=True)
class Report:
    inputs: dict[str, str]
    tokenizer: str | None
    chat_template: str | None
    replay_mode: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    skipped: SkipSummary
    engines: dict[str, EngineSummary]
    ceiling: EngineSummary
    alignment_loss_tokens: int
    block_size: int
    shared_prefixes: list[PrefixSummary]
    recommendations: list[Recommendation]
    notes: list[str] = field(default_factory=list)
    # What this run did that another run over the same input may not (the token cache's
    # reads): shown on the terminal, kept out of the JSON so that equal inputs give equal JSON.
    run_notes: list[str] = field(default_factory=list)
    models: dict[str, ModelSummary] = field(default_factory=dict)  # when the log has several
    server_comparison: ServerComparison | None = None  # the server's own cached-token counts
    prefill_estimate: PrefillEstimate | None = None  # FLOPs and KV bytes on a model shape
    measurement: Measurement | None = None  # analyze --measure: timed prefills on a GPU or CPU
    diagnosis: Diagnosis | None = None  # losses by cause, curves, bounds, what-ifs
    diagnosis_scope: DiagnosisScope | None = None
    executor: dict[str, Any] | None = None  # where it ran, when not in this process (--executor)
    fleet: FleetSummary | None = None  # --replicas: the fleet beside one instance

    @cached_property
    def json(self) -> dict[str, Any]:
        """``to_dict()``, computed once: what the JSON file, the gates and the CI renderers read."""
        return self.to_dict()

    @property
    def alignment_share(self) -> float:
        """The alignment loss as a share of the whole log's prompt tokens."""
        return share(self.alignment_loss_tokens, self.prompt_tokens)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (stable keys)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "inputs": self.inputs,
            "tokenizer": self.tokenizer,
            "chat_template": self.chat_template,
            "replay_mode": self.replay_mode,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "skipped": asdict(self.skipped),
            "engines": {name: asdict(summary) for name, summary in self.engines.items()},
            "ceiling": asdict(self.ceiling),
            "alignment_loss": {
                "tokens": self.alignment_loss_tokens,
                "share_of_prompt_tokens": self.alignment_share,
                "definition": "SGLang page-size-1 hits minus vLLM hits at the same capacity",
            },
            "block_size": self.block_size,
            "shared_prefixes": [asdict(prefix) for prefix in self.shared_prefixes],
            "recommendations": [asdict(item) for item in self.recommendations],
            "notes": self.notes,
            "models": {name: summary.to_dict() for name, summary in self.models.items()},
            "server_comparison": (
                self.server_comparison.to_dict() if self.server_comparison else None
            ),
            "prefill_estimate": self.prefill_estimate.to_dict() if self.prefill_estimate else None,
            "measurement": self.measurement.to_dict() if self.measurement else None,
            "diagnosis_scope": self.diagnosis_scope.to_dict() if self.diagnosis_scope else None,
            "fleet": self.fleet.to_dict() if self.fleet else None,
            **(
                self.diagnosis.to_dict(self.diagnosis_scope)
                if self.diagnosis and self.diagnosis_scope
                else {}
            ),
            **({"executor": self.executor} if self.executor is not None else {}),
        }


def report_schema() -> dict[str, Any]:
    """The published JSON Schema of ``Report.to_dict`` (analyzer/schemas/report.schema.json)."""
    text = resources.files("analyzer").joinpath("schemas", "report.schema.json").read_text("utf-8")
    return json.loads(text)
