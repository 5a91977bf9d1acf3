"""The log fields a fleet routes or places by (``--session-field``, ``--replica-field``,
``--what-if session-field``), added to the reading options so they are read once, with each line."""

from __future__ import annotations

from dataclasses import replace

from analyzer.fleet import FleetOptions
from analyzer.fleet_keys import FIRST_BLOCK, TENANT
from analyzer.fleet_run import fleet_fix
from analyzer.ingest import IngestOptions
from analyzer.loaders.mapped import FieldMap


def routing_fields(options: FleetOptions | None, what_ifs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The dotted fields of the log lines the fleet routes or places by (--session-field,
    --replica-field, --what-if session-field=F): read once, as the lines are parsed."""
    if options is None:
        return ()
    fields = [options.session_field, options.replica_field]
    fields += [fleet_fix(options, text).session_field for text in what_ifs]
    named = (f for f in fields if f is not None and f not in (FIRST_BLOCK, TENANT))
    return tuple(dict.fromkeys(named))


def with_routing_fields(ingest: IngestOptions, fields: tuple[str, ...]) -> IngestOptions:
    """The reading options that also read ``fields`` into the requests frame."""
    if not fields:
        return ingest
    mapped = ingest.fields or FieldMap()
    return replace(ingest, fields=replace(mapped, routing=mapped.routing + fields))
