"""Send every request to one upstream, unchecked by model.

For single-upstream deployments behind other checks, and to measure the chain's floor in the
benchmark (`ZTGATE_FILTERS=static_route`). Without ZTGATE_STATIC_UPSTREAM it refuses to build.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from filters.base import BaseFilter, Continue, Decision, Phase, RequestContext
from filters.chain import BuildEnv, register
from filters.route import UPSTREAM_HEADER
from gateway.registry import cluster_name


class StaticRoute(BaseFilter):
    """Route every request to one fixed upstream cluster."""

    name: ClassVar[str] = "static_route"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS

    def __init__(self, upstream: str) -> None:
        self._decision = Continue(set_headers=((UPSTREAM_HEADER, cluster_name(upstream)),), reroute=True)

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        return self._decision


class StaticRouteParams(BaseModel):
    """Parameters of static_route."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    upstream: str | None = Field(
        default=None, description="Registry upstream name (default: ZTGATE_STATIC_UPSTREAM)."
    )


@register("static_route", StaticRouteParams)
def _build(env: BuildEnv, params: StaticRouteParams) -> StaticRoute:
    upstream = params.upstream or env.settings.static_upstream
    if not upstream:
        raise ValueError("static_route needs ZTGATE_STATIC_UPSTREAM (an upstream name from the registry)")
    return StaticRoute(upstream)
