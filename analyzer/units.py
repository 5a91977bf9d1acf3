"""Quantities as a person reads them."""

from __future__ import annotations


def binary_bytes(value: int) -> str:
    """``2.31 TiB``: KV memory in the binary units GPU memory is counted in."""
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= factor:
            return f"{value / factor:,.3g} {unit}"
    return f"{value} B"
