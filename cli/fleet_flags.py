"""The fleet flags of ``analyze`` (--replicas, --router, --router-config, --session-field,
--replica-field), parsed and checked where they enter."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated

import typer

from analyzer.errors import PrefixcheckError
from analyzer.fleet import FleetOptions
from cache_models.routers.registry import ROUTERS, make_router

Replicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Replay a fleet of N replicas, each with its own caches "
        "(--capacity-tokens each), placed by --router.",
    ),
]
DEFAULT_ROUTER = "round-robin"
RouterName = Annotated[str, typer.Option(help=f"Router of the fleet: {', '.join(ROUTERS)}.")]
RouterConfig = Annotated[
    str | None,
    typer.Option(help="Router parameters as JSON, e.g. '{\"cache_threshold\": 0.5}'."),
]
SessionField = Annotated[
    str | None,
    typer.Option(
        help="Routing key of hash routers: a dotted field of the log line, 'tenant' "
        "(user / prompt_cache_key) or 'first-block' (the prompt's first block)."
    ),
]
ReplicaField = Annotated[
    str | None,
    typer.Option(
        help="Dotted field naming the replica that served each request: replay the "
        "log's own placement."
    ),
]


def fleet_options(
    replicas: int | None,
    router: str,
    router_config: str | None,
    session_field: str | None,
    replica_field: str | None,
) -> FleetOptions | None:
    """The fleet to replay, or None for one instance; PrefixcheckError on bad values."""
    if replicas is None and replica_field is None:
        if router_config or session_field or router != DEFAULT_ROUTER:
            _checked_router(router, 1, {})  # an unknown name is named first, as in a fleet
            raise PrefixcheckError("--router, --router-config and --session-field need --replicas")
        return None
    params = {}
    if router_config:
        try:
            params = json.loads(router_config)
        except ValueError as exc:
            raise PrefixcheckError(f"--router-config is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise PrefixcheckError("--router-config must be a JSON object")
    _checked_router(router, replicas or 1, params)
    return FleetOptions(replicas or 1, router, params, session_field, replica_field)


def _checked_router(router: str, replicas: int, params: dict) -> None:
    """PrefixcheckError when the registry makes no such router with these parameters."""
    try:
        make_router(router, replicas, params)
    except (ValueError, TypeError) as exc:
        raise PrefixcheckError(f"--router {router}: {exc}") from None


@dataclass(frozen=True)
class FleetFlags:
    """The fleet of analyze: replicas behind a router (parsed and checked before the run)."""

    replicas: Replicas = None
    router: RouterName = DEFAULT_ROUTER
    router_config: RouterConfig = None
    session_field: SessionField = None
    replica_field: ReplicaField = None
    options: FleetOptions | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        fleet = fleet_options(
            self.replicas, self.router, self.router_config, self.session_field, self.replica_field
        )
        object.__setattr__(self, "options", fleet)
