"""``prefixcheck lint``: check prompt templates for caching before any log exists.

Each template is rendered as the server would see it (a system prompt in the chat template, a JSON
message list as it is, or raw text), twice, with different values in every placeholder. The tokens
both renderings share are what every request built from the template can hit; the first placeholder
ends that shared prefix, so static text after it is recomputed by every request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.chat import ChatRenderer
from analyzer.errors import BadLine, PrefixcheckError
from analyzer.loaders.jsonl import bounded_json
from analyzer.tokenizer import Tokenizer

TEMPLATE_SUFFIXES = (".txt", ".md", ".prompt", ".j2", ".jinja", ".jinja2", ".json")
# {{ jinja }}, {% jinja %}, {python_format}, ${shell}: the placeholder kinds prompt files use.
PLACEHOLDER = re.compile(
    r"\{\{.*?\}\}|\{%.*?%\}|\$\{[A-Za-z_][\w.]*\}|(?<!\{)\{[A-Za-z_][\w.]*\}(?!\})", re.DOTALL
)
# The two fillers whose renderings are compared: word-like, like most placeholder values, and
# different from their first byte on (so no shared partial-character token).
FILLERS = ("Xqzj", "Qvxk")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # "error" or "warning"
    message: str
    line: int


@dataclass(frozen=True)
class TemplateLint:
    """What one template gives the cache, and what is wrong with it."""

    path: str
    prompt_tokens: int
    shared_prefix_tokens: int
    block_size: int
    first_placeholder: str | None
    static_tokens_after_placeholder: int
    findings: list[Finding] = field(default_factory=list)

    @property
    def remainder(self) -> int:
        return self.shared_prefix_tokens % self.block_size

    @property
    def padding(self) -> int:
        return -self.shared_prefix_tokens % self.block_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "prompt_tokens": self.prompt_tokens,
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "remainder": self.remainder,
            "padding": self.padding,
            "first_placeholder": self.first_placeholder,
            "static_tokens_after_placeholder": self.static_tokens_after_placeholder,
            "findings": [vars(finding) for finding in self.findings],
        }


def template_files(paths: Sequence[Path]) -> list[Path]:
    """The template files named, and those under the folders named (sorted)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(
                p for p in path.rglob("*") if p.suffix in TEMPLATE_SUFFIXES and p.is_file()
            )
        elif path.is_file():
            files.append(path)
        else:
            raise PrefixcheckError(f"{path}: no such file or folder")
    if not files:
        raise PrefixcheckError(f"no template files ({', '.join(TEMPLATE_SUFFIXES)}) found")
    return files


def lint_template(
    path: Path,
    tokenizer: Tokenizer,
    renderer: ChatRenderer,
    block_size: int,
    *,
    raw: bool = False,
) -> TemplateLint:
    source = _read(path)
    first = PLACEHOLDER.search(source)
    renderings = [_render(path, source, filler, renderer, raw) for filler in FILLERS]
    bare = _render(path, source, "", renderer, raw)
    first_ids, second_ids, bare_ids = tokenizer.encode_batch(
        [*renderings, bare], add_special_tokens=raw
    )
    shared = _common_prefix(first_ids, second_ids)
    static_after = max(0, len(bare_ids) - shared - _tail_tokens(renderings[0], tokenizer, raw))
    if first is None:
        static_after = 0
    result = TemplateLint(
        path=str(path),
        prompt_tokens=len(bare_ids),
        shared_prefix_tokens=shared,
        block_size=block_size,
        first_placeholder=first.group(0) if first else None,
        static_tokens_after_placeholder=static_after,
    )
    line = source.count("\n", 0, first.start()) + 1 if first else 1
    if first is not None and static_after >= block_size:
        result.findings.append(
            Finding(
                "PC001",
                "error",
                f"placeholder {first.group(0)} at token {shared} makes the {static_after} static "
                "tokens after it uncacheable across requests: move it after the static text",
                line,
            )
        )
    if result.remainder and not result.findings:
        result.findings.append(
            Finding(
                "PC002",
                "warning",
                f"the shared prefix is {shared} tokens, {result.remainder} past the last "
                f"{block_size}-token block: {result.remainder} tokens are recomputed by every "
                f"request on vLLM; pad with {result.padding} tokens to cache them",
                line,
            )
        )
    return result


def lint_templates(
    paths: Iterable[Path], tokenizer: Tokenizer, renderer: ChatRenderer, block_size: int, raw: bool
) -> list[TemplateLint]:
    """Every template's lint; one that cannot be read or rendered is a PC000 error of its own,
    and the others are still linted."""
    results = []
    for path in paths:
        try:
            results.append(lint_template(path, tokenizer, renderer, block_size, raw=raw))
        except PrefixcheckError as exc:
            reason = str(exc).removeprefix(f"{path}: ")
            results.append(
                TemplateLint(
                    path=str(path),
                    prompt_tokens=0,
                    shared_prefix_tokens=0,
                    block_size=block_size,
                    first_placeholder=None,
                    static_tokens_after_placeholder=0,
                    findings=[Finding("PC000", "error", reason, 1)],
                )
            )
    return results


def summary(results: Sequence[TemplateLint]) -> str:
    """One line over every template: how many, and the errors and warnings by rule."""
    rules: dict[tuple[str, str], int] = {}
    for result in results:
        for finding in result.findings:
            key = (finding.severity, finding.rule)
            rules[key] = rules.get(key, 0) + 1
    clean = sum(not result.findings for result in results)
    parts = [f"{len(results)} template{'s' * (len(results) != 1)}"]
    for severity in ("error", "warning"):
        found = {rule: n for (kind, rule), n in sorted(rules.items()) if kind == severity}
        if found:
            total = sum(found.values())
            detail = ", ".join(f"{rule} ×{n}" for rule, n in found.items())
            parts.append(f"{total} {severity}{'s' * (total != 1)} ({detail})")
    parts.append(f"{clean} clean")
    return f"{parts[0]}: {', '.join(parts[1:])}"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PrefixcheckError(f"{path}: cannot read: {exc}") from None


def _render(path: Path, source: str, filler: str, renderer: ChatRenderer, raw: bool) -> str:
    """The prompt text with every placeholder replaced by ``filler``; a system prompt file gets a
    user turn after it, as a request would."""
    text = PLACEHOLDER.sub(lambda _: filler, source)
    if raw:
        return text
    if path.suffix == ".json":
        messages = _messages(path, text)
    else:
        messages = [{"role": "system", "content": text}, {"role": "user", "content": filler}]
    try:
        return renderer.render(messages)
    except BadLine as exc:
        raise PrefixcheckError(f"{path}: {exc.reason}") from None


def _messages(path: Path, text: str) -> list[dict[str, Any]]:
    try:
        messages = bounded_json(text)
    except ValueError as exc:
        raise PrefixcheckError(f"{path}: not a JSON message list ({exc})") from None
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise PrefixcheckError(f"{path}: expected a JSON list of chat messages")
    return messages


def _tail_tokens(rendering: str, tokenizer: Tokenizer, raw: bool) -> int:
    """Tokens after the last placeholder: the template's closing text, not part of its head."""
    last = max(rendering.rfind(filler) for filler in FILLERS)
    if last < 0:
        return 0
    tail = rendering[last + 1 :]
    return len(tokenizer.encode_batch([tail], add_special_tokens=False)[0]) if tail else 0


def _common_prefix(first: np.ndarray, second: np.ndarray) -> int:
    n = min(len(first), len(second))
    differ = np.flatnonzero(first[:n] != second[:n])
    return int(differ[0]) if len(differ) else n
