"""``prefixcheck lint PATH...``: check prompt templates for caching, without any log."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from analyzer.chat import chat_renderer
from analyzer.errors import PrefixcheckError
from analyzer.lint import TemplateLint, lint_templates, summary, template_files
from analyzer.tokenizer import load_tokenizer
from cli.common import EXIT_BAD_INPUT, EXIT_GATE_FAILED, fail, to_stdout, write_text


def lint_command(
    paths: Annotated[list[Path], typer.Argument(help="Template files or folders.")],
    tokenizer: Annotated[
        str | None, typer.Option(help="tokenizer.json, a model folder, or a hub name.")
    ] = None,
    block_size: Annotated[int, typer.Option(min=1, help="vLLM --block-size.")] = 16,
    raw: Annotated[
        bool, typer.Option(help="Tokenize templates as they are (no chat template around them).")
    ] = False,
    warnings_as_errors: Annotated[
        bool, typer.Option(help="Exit 1 on warnings (unaligned prefixes) too.")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write findings as JSON.")
    ] = None,
    junit_path: Annotated[
        Path | None, typer.Option("--junit", help="Write JUnit XML, one test case per template.")
    ] = None,
) -> None:
    """Token length, block alignment and dynamic placeholders of prompt templates."""
    console, errors = Console(stderr=to_stdout(json_path, junit_path)), Console(stderr=True)
    try:
        files = template_files(paths)
        loaded = load_tokenizer(tokenizer)
        renderer = chat_renderer(loaded.chat_template, loaded.special)
        results = lint_templates(files, loaded, renderer, block_size, raw)
        if json_path is not None:
            payload = {"templates": [r.to_dict() for r in results], "block_size": block_size}
            write_text(json_path, json.dumps(payload, indent=2) + "\n")
        if junit_path is not None:
            write_text(junit_path, lint_junit(results, warnings_as_errors))
    except PrefixcheckError as exc:
        fail(errors, str(exc))
    console.print(_table(results, block_size))
    failing = False
    for result in results:
        for finding in result.findings:
            style = "bold red" if finding.severity == "error" else "yellow"
            console.print(
                f"[{style}]{result.path}:{finding.line}: {finding.rule} {finding.severity}[/] "
                f"{finding.message}",
                highlight=False,
            )
            failing |= finding.severity == "error" or warnings_as_errors
    console.print(summary(results), highlight=False)
    if any(f.rule == "PC000" for r in results for f in r.findings):
        raise typer.Exit(EXIT_BAD_INPUT)  # a file could not be read: bad input, after the rest
    if failing:
        raise typer.Exit(EXIT_GATE_FAILED)


def _table(results: list[TemplateLint], block_size: int) -> Table:
    table = Table(title="Prompt templates", box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("template", overflow="fold")  # the path is the point: folded, never cut
    for header in ("tokens", "shared\nprefix", f"% {block_size}", "pad"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("placeholder")
    for r in results:
        if any(f.rule == "PC000" for f in r.findings):  # not read: nothing to measure
            table.add_row(r.path, "-", "-", "-", "-", "-")
            continue
        table.add_row(
            r.path,
            f"{r.prompt_tokens:,}",
            f"{r.shared_prefix_tokens:,}",
            str(r.remainder),
            f"+{r.padding}" if r.padding else "0",
            r.first_placeholder or "-",
        )
    return table


def lint_junit(results: list[TemplateLint], warnings_as_errors: bool) -> str:
    suite = ET.Element("testsuite", name="prefixcheck lint", tests=str(len(results)))
    failures = 0
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="prefixcheck.lint", name=r.path)
        bad = [f for f in r.findings if f.severity == "error" or warnings_as_errors]
        if bad:
            failures += 1
            message = "; ".join(f"{f.rule}: {f.message}" for f in bad)
            ET.SubElement(case, "failure", message=message, type="lint").text = message
    suite.set("failures", str(failures))
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
    )
