"""Reading JSON Lines: each line becomes a parsed object or a reasoned skip."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from analyzer.errors import PrefixcheckError, Skip


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | Skip]]:
    """Yield ``(line_number, object)`` for each line, or a Skip saying why it is not an object."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        for line_number, raw in enumerate(handle, 1):
            if not raw.strip():
                yield line_number, Skip(str(path), line_number, "blank line")
                continue
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                yield line_number, Skip(str(path), line_number, "not UTF-8 text")
                continue
            except json.JSONDecodeError as exc:
                yield line_number, Skip(str(path), line_number, f"malformed JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                kind = type(obj).__name__
                yield (
                    line_number,
                    Skip(str(path), line_number, f"expected a JSON object, got {kind}"),
                )
                continue
            yield line_number, obj
