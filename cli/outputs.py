"""Report renderers for CI: Markdown (PR comments, step summaries), JUnit XML, GitHub annotations.

Each takes the one report object; they read its JSON form (``Report.json``, the published
schema), so a saved report renders the same as a fresh one.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analyzer.errors import PrefixcheckError
from analyzer.gates import GateResult
from analyzer.report import Report


def as_json(report: Report | dict[str, Any]) -> dict[str, Any]:
    """The JSON form a renderer reads: of the report object, or a saved report as loaded."""
    return report.json if isinstance(report, Report) else report


def markdown(report: Report | dict[str, Any], gates: Sequence[GateResult] = ()) -> str:
    """A compact Markdown summary: hit rates, gates, losses, shared prefixes, recommendations."""
    report = as_json(report)
    lines = [
        "## prefixcheck",
        "",
        f"{report['requests']:,} requests, {report['prompt_tokens']:,} prompt tokens"
        f" ({report['skipped']['count']:,} lines skipped).",
        "",
        "| engine | hit tokens | token hit rate | mean per request |",
        "| --- | ---: | ---: | ---: |",
    ]
    for summary in [*report["engines"].values(), report["ceiling"]]:
        lines.append(
            f"| {summary['label']} | {summary['hit_tokens']:,} | {summary['hit_rate']:.2%} "
            f"| {summary['mean_request_hit_rate']:.2%} |"
        )
    scope = report.get("diagnosis_scope")
    sampled = bool(scope) and not scope["whole_log"]
    if sampled:
        lines += [
            "",
            f"Hit rates over the whole log; the diagnosis below covers its first "
            f"{scope['requests']:,} requests.",
        ]
    if gates:
        lines += ["", "| gate | result |", "| --- | --- |"]
        lines += [f"| {g.name} | {'✅' if g.passed else '❌'} {g.message} |" for g in gates]
    losses = report.get("losses")
    if losses:
        kinds = sorted({kind for per_engine in losses.values() for kind in per_engine})
        title = "recomputed tokens by cause" + (" (sample)" if sampled else "")
        lines += ["", f"| {title} | " + " | ".join(losses) + " |"]
        lines.append("| --- |" + " ---: |" * len(losses))
        for kind in kinds:
            cells = [_loss_cell(losses[engine].get(kind)) for engine in losses]
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
        if sampled:
            lines += ["", f"Measured {_escape(scope['description'])}."]
    prefixes = report.get("shared_prefixes") or []
    if prefixes:
        block = report.get("block_size", 16)
        lines += [
            "",
            f"| shared prefix (one row per template) | tokens | % {block} | requests | pad |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        seen: set[int] = set()
        for prefix in prefixes:
            template = prefix.get("template")
            if template is not None and template in seen:
                continue  # a variant of a template above
            seen.add(template)
            snippet = _escape(prefix.get("snippet") or "(redacted)")
            lines.append(
                f"| `{snippet}` | {prefix['tokens']:,} | {prefix['remainder']} "
                f"| {prefix['requests']:,} | {_pad(prefix)} |"
            )
        lines += [
            "",
            f"% {block}: tokens past the last full block (recomputed by every request on vLLM); "
            "pad: tokens that align it, where the replay measured a saving.",
        ]
    recommendations = report.get("recommendations") or []
    if recommendations:
        lines += ["", "**Recommendations**" + (" (measured on the sample)" if sampled else ""), ""]
        for item in recommendations:
            lines.append(f"- {_escape(item['summary'])}")
            if item.get("why"):
                lines.append(f"  *why: {_escape(item['why'])}*")
    return "\n".join(lines) + "\n"


def junit_xml(report: Report | dict[str, Any], gates: Sequence[GateResult]) -> str:
    """JUnit XML with one test case per gate (one passing case when no gate is set)."""
    report = as_json(report)
    failures = sum(not gate.passed for gate in gates)
    suite = ET.Element(
        "testsuite",
        name="prefixcheck",
        tests=str(max(1, len(gates))),
        failures=str(failures),
        errors="0",
        skipped="0",
    )
    if not gates:
        ET.SubElement(suite, "testcase", classname="prefixcheck", name="analyze")
    for gate in gates:
        case = ET.SubElement(
            suite, "testcase", classname=f"prefixcheck.{gate.engine}", name=gate.name
        )
        if gate.passed:
            ET.SubElement(case, "system-out").text = gate.message
        else:
            failure = ET.SubElement(case, "failure", message=gate.message, type="gate")
            failure.text = gate.message
    properties = ET.Element("properties")
    for name, summary in report["engines"].items():
        ET.SubElement(
            properties, "property", name=f"{name}.hit_rate", value=f"{summary['hit_rate']:.6f}"
        )
    suite.insert(0, properties)
    root = ET.Element(
        "testsuites", name="prefixcheck", tests=suite.get("tests"), failures=str(failures)
    )
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def github_annotations(gates: Sequence[GateResult]) -> list[str]:
    """Workflow commands: an error for each failed gate."""
    return [
        f"::error title=prefixcheck gate::{_command_escape(g.message)}"
        for g in gates
        if not g.passed
    ]


def github_warnings(report: dict[str, Any]) -> list[str]:
    """Workflow warnings for what a reviewer should see: skipped lines and recommendations."""
    lines = []
    skipped = report["skipped"]["count"]
    if skipped:
        lines.append(
            f"::warning title=prefixcheck::{skipped} log lines were skipped (see the report)"
        )
    for item in report.get("recommendations") or []:
        lines.append(
            f"::warning title=prefixcheck recommendation::{_command_escape(item['summary'])}"
        )
    return lines


def publish_to_github(report: Report | dict[str, Any], gates: Sequence[GateResult]) -> list[str]:
    """Under GitHub Actions: append the Markdown summary to $GITHUB_STEP_SUMMARY and return the
    annotation lines to print on stdout (empty outside Actions)."""
    report = as_json(report)
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return []
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            with Path(summary_path).open("a", encoding="utf-8") as handle:
                handle.write(markdown(report, gates))
        except OSError as exc:
            raise PrefixcheckError(
                f"{summary_path}: cannot write the step summary: {exc}"
            ) from None
    return github_warnings(report) + github_annotations(gates)


def _pad(prefix: dict[str, Any]) -> str:
    if not prefix["padding"]:
        return "0"
    return f"+{prefix['padding']}" if (prefix.get("padding_saves") or 0) > 0 else "-"


def _loss_cell(entry: Any) -> str:
    if entry is None:
        return "-"
    if isinstance(entry, dict):
        share = entry.get("share")
        return f"{entry['tokens']:,}" + (f" ({share:.1%})" if share is not None else "")
    return f"{entry:,}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _command_escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
