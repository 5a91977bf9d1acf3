"""What every command shares: exit codes, the one-line error, writing an output file (``-``:
standard output), and a command class that refuses a single-valued option given twice."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from analyzer.errors import PrefixcheckError

EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2


def fail(errors: Console, message: str) -> NoReturn:
    """Print ``prefixcheck: error: ...`` on one line and exit with code 2."""
    errors.print(f"prefixcheck: error: {message}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


STDOUT = Path("-")  # an output path of "-" is standard output, as ruff's and jq's users expect


def to_stdout(*paths: Path | None) -> bool:
    """Whether one of the outputs goes to standard output (then the terminal report does not)."""
    return any(path == STDOUT for path in paths)


def write_text(path: Path, text: str) -> None:
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot write: {exc.strerror or exc}") from None


class Command(typer.core.TyperCommand):
    """A command whose single-valued options may be given once: click keeps the last of a
    repeated ``--per-request a.csv --per-request b.csv`` silently; this says so, exit 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        repeated_options(ctx, self.params, args)
        return super().parse_args(ctx, args)


def repeated_options(ctx: Any, params: Sequence[Any], args: Sequence[str]) -> None:
    """A usage error (exit 2) when an option that takes one value appears twice in ``args``."""
    words = list(args[: args.index("--")] if "--" in args else args)
    for param in params:
        if getattr(param, "param_type_name", None) != "option":
            continue
        if param.multiple or param.is_flag or param.count:
            continue
        names = [*param.opts, *param.secondary_opts]
        given = [
            word
            for word in words
            if word in names or any(word.startswith(f"{n}=") for n in names if n.startswith("--"))
        ]
        if len(given) > 1:
            raise typer.BadParameter(
                f"given {len(given)} times; it takes one value: give it once", ctx, param
            )
