"""What every command shares: exit codes, the one-line error, writing an output file."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from analyzer.errors import PrefixcheckError

EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2


def fail(errors: Console, message: str) -> NoReturn:
    """Print ``prefixcheck: error: ...`` on one line and exit with code 2."""
    errors.print(f"prefixcheck: error: {message}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot write: {exc.strerror or exc}") from None
