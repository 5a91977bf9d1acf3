"""Router goldens: which worker the real router packages chose for each request
(written by tests/golden/gen_router_goldens.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load_router_goldens() -> dict[str, dict[str, Any]]:
    """Each package's golden file by package name."""
    goldens = {}
    for path in sorted(HERE.glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            golden = json.load(f)
        goldens[golden["package"]] = golden
    return goldens
