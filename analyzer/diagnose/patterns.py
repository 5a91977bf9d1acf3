"""The common kinds of dynamic values (dates, times, ids), recognised on decoded prompt text."""

from __future__ import annotations

import re

# Most specific first: the first pattern whose match overlaps the varying text names its kind.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uuid", re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")),
    (
        "iso_datetime",
        re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
    ),
    (
        "date",
        re.compile(
            r"\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4}|"
            r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2},? \d{4}|"
            r"\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}"
        ),
    ),
    ("time", re.compile(r"\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?")),
    ("epoch_time", re.compile(r"(?<!\d)1\d{9}(?:\d{3}|\.\d+)?(?!\d)")),
    (
        "hex_id",
        re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}"),
    ),
    ("number", re.compile(r"\d+")),
)


def recognise(text: str, begin: int, end: int) -> tuple[str, int] | None:
    """The kind of the value that overlaps ``text[begin:end]`` (the characters that vary), and
    where it starts; None when no pattern overlaps."""
    for kind, pattern in PATTERNS:
        for match in pattern.finditer(text):
            if match.start() < end and match.end() > begin:
                return kind, match.start()
    return None
