"""Field mapping for any JSON log: ``--prompt-field`` or ``--messages-field`` name where the
request is (dotted paths such as ``payload.input.messages``); ``--time-field``,
``--tenant-field`` and ``--salt-field`` also apply on top of a detected format, and so do the
fleet's dotted routing fields (``--session-field``, ``--replica-field``), read into
``Record.routing`` as the line is parsed (once, so standard input works)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import dotted, parse_time
from analyzer.loaders.joins import Answer
from analyzer.loaders.openai_chat import check_messages
from analyzer.records import Record


@dataclass(frozen=True)
class FieldMap:
    prompt: str | None = None
    messages: str | None = None
    time: str | None = None
    tenant: str | None = None
    salt: str | None = None
    routing: tuple[str, ...] = ()  # dotted fields the fleet routes or places by

    def has_request(self) -> bool:
        return self.prompt is not None or self.messages is not None

    def is_empty(self) -> bool:
        return not any(
            (self.prompt, self.messages, self.time, self.tenant, self.salt, self.routing)
        )


def matches(obj: dict[str, Any]) -> bool:
    return False  # never detected: chosen by the --*-field flags


def parse(obj: dict[str, Any], file: str, line: int, fields: FieldMap) -> Record:
    record = Record(file=file, line=line)
    if fields.messages is not None:
        messages = dotted(obj, fields.messages)
        if messages is None:
            raise BadLine(f"no field {fields.messages!r}")
        record.messages = check_messages(messages)
    else:
        assert fields.prompt is not None
        prompt = dotted(obj, fields.prompt)
        if not isinstance(prompt, str) or not prompt:
            raise BadLine(f"field {fields.prompt!r} must be a non-empty string")
        record.prompt = prompt
    model = obj.get("model")
    record.model = model if isinstance(model, str) else None
    return record


def apply_overrides(
    parsed: Record | list[Record] | Answer, obj: dict[str, Any], fields: FieldMap
) -> None:
    """Set arrival time, tenant, cache salt and the routing fields from the mapped fields,
    where named."""
    if isinstance(parsed, Answer):
        return
    for record in parsed if isinstance(parsed, list) else [parsed]:
        if fields.time is not None:
            record.arrival_s = parse_time(dotted(obj, fields.time), fields.time)
        if fields.tenant is not None:
            record.tenant = _text(dotted(obj, fields.tenant))
        if fields.salt is not None:
            record.cache_salt = _text(dotted(obj, fields.salt))
        if fields.routing:
            record.routing = {path: _text(dotted(obj, path)) for path in fields.routing}


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
