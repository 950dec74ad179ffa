"""The Filter protocol, Decision values and the per-request context.

Filters never see protobuf: `gateway.extproc` converts Envoy messages into these plain types.
A filter reports its verdict by returning a Decision, never by raising; an exception is a bug
and the chain turns it into a deny (fail closed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Flag, auto
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from filters._protocols import Answer, Prompt
    from gateway.policy import CompiledPolicy, Dependency
    from gateway.registry import Registry, Route


class Phase(Flag):
    """Processing phases a filter wants to see."""

    NONE = 0
    REQUEST_HEADERS = auto()
    REQUEST_BODY = auto()
    RESPONSE_HEADERS = auto()
    RESPONSE_BODY = auto()
    # Not an Envoy message: the request's outcome is known and its last response is about to
    # leave the gateway (or the stream ended early). Risk events and the audit record are written
    # here, before the client has the answer, so a failed write can still refuse it.
    SETTLE = auto()


@dataclass(frozen=True, slots=True)
class Continue:
    """Let the message through, with optional mutations."""

    set_headers: tuple[tuple[str, str], ...] = ()
    remove_headers: tuple[str, ...] = ()
    body: bytes | None = None
    reroute: bool = False


@dataclass(frozen=True, slots=True)
class Deny:
    """Refuse with a user-safe code and message; the client sees it in the protocol's error shape."""

    status: int
    code: str
    message: str
    # Extra response headers (e.g. a 429's retry-after); never any request text.
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer on the gateway's behalf (e.g. a model list) without contacting an upstream."""

    status: int
    body: bytes
    content_type: str = "application/json"


Decision = Continue | Deny | Respond
CONTINUE = Continue()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: resolved from the API key, never from client-supplied identity headers."""

    key_id: str
    user: str
    tenant: str
    groups: tuple[str, ...] = ()


@dataclass(slots=True)
class Verdict:
    """What one filter decided, for the audit record and metrics (never any request text)."""

    filter: str
    phase: str
    action: str
    elapsed_s: float
    detail: str = ""
    # What a content filter found, as (kind, count): counted in metrics, never any text.
    counts: tuple[tuple[str, int], ...] = ()


def fail_mode(
    ctx: RequestContext, filter_name: str, dependency: Dependency, why: str, refusal: Deny
) -> Decision:
    """A dependency failed: the policy's `fail_mode` for it decides (`refusal` unless it says
    allow_with_flag), and a `fail_mode` verdict records which mode fired."""
    let_through = ctx.policy is not None and ctx.policy.fails_open(dependency)
    action = "flag" if let_through else "deny"
    ctx.verdicts.append(Verdict(filter_name, "fail_mode", action, 0.0, f"{dependency}_failed={why}"))
    return CONTINUE if let_through else refusal


@dataclass(frozen=True, slots=True)
class FailModeFired:
    """A fail_mode verdict read back: for the audit record and metrics."""

    dependency: str
    mode: str  # deny or allow_with_flag
    why: str


def fail_mode_fired(v: Verdict) -> FailModeFired | None:
    """The fail mode a verdict records, or None if it records none."""
    if v.phase != "fail_mode":
        return None
    dependency, _, why = v.detail.partition("_failed=")
    return FailModeFired(dependency, "allow_with_flag" if v.action == "flag" else "deny", why)


@dataclass(slots=True)
class RequestContext:
    """State of one HTTP request; made at request headers, dropped when the stream ends."""

    request_id: str
    method: str
    path: str
    headers: dict[str, str]
    registry: Registry
    query: str = ""  # "?…" as the client sent it, or "" (not forwarded: filters/route.py)
    started: float = field(default_factory=time.perf_counter)
    principal: Principal | None = None
    prompt: Prompt | None = None
    route: Route | None = None
    response_status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    # Envoy's response code details when Envoy, not the model server, answered (upstream down,
    # timed out, reset before its headers): the answer headers are then Envoy's local reply.
    upstream_error: str | None = None
    answer: Answer | None = None
    # An OpenAI answer as the client gets it, set by a filter that rewrote its text (pii);
    # None: the client gets `answer` as the upstream sent it.
    delivered: Answer | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    # The policy this request captured at its start (gateway.policy.CompiledPolicy): one per request.
    policy: CompiledPolicy | None = None
    # Set by `access`: the policy's `redact` rules that match this request (PII on both sides).
    redact_rules: tuple[str, ...] = ()
    # Per-filter private state for this request, keyed by filter name; gone with the request.
    state: dict[str, object] = field(default_factory=dict)
    # Set by the server before SETTLE: allowed (forwarded and answered), denied, responded (by
    # the gateway), upstream_error (allowed, but Envoy answered: see upstream_error) or aborted
    # (the stream ended before the answer did); the status the client gets and, for a
    # refusal, its user-safe code.
    outcome: str = "allowed"
    status: int = 0
    error_code: str = ""


@runtime_checkable
class Filter(Protocol):
    """One step of the chain. Hooks return a Decision; only hooks for declared phases are called."""

    name: ClassVar[str]
    phases: ClassVar[Phase]
    # Phases among `phases` that this filter takes only to serve later filters (the protocol
    # filter parses answers so that content filters can read them): the chain drops them when no
    # other filter takes them for itself, so Envoy is not asked for messages nobody reads.
    on_behalf: ClassVar[Phase]
    # Filters that must run earlier in the chain: what this one reads, they set. A chain that
    # breaks this is refused, since e.g. rules checked before routing would not see the model.
    needs: ClassVar[tuple[str, ...]]
    # Filters that must run later in the chain: this one guards them (auth_guard refuses a
    # blocked source before principal reads its key). A chain that breaks this is refused.
    precedes: ClassVar[tuple[str, ...]]

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        """Request headers arrived (ctx.method, ctx.path, ctx.headers are set)."""
        ...

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        """The whole request body (buffered) arrived."""
        ...

    async def on_response_headers(self, ctx: RequestContext) -> Decision:
        """Upstream response headers arrived (ctx.response_status, ctx.response_headers)."""
        ...

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        """A response body chunk (the whole body when not streamed); `end` marks the last one."""
        ...

    async def on_settle(self, ctx: RequestContext) -> Decision:
        """SETTLE: the outcome is in ctx (outcome, status, error_code, verdicts); record it.

        A Deny refuses a request that was going to be let through (where the answer has not
        left yet); an already refused request stays refused as it was.
        """
        ...

    async def on_end(self, ctx: RequestContext) -> None:
        """The stream ended (normally or not); release per-request resources, record results."""
        ...


class BaseFilter:
    """Convenience base: every hook continues. Subclasses override the phases they declare."""

    name: ClassVar[str] = "base"
    phases: ClassVar[Phase] = Phase.NONE
    on_behalf: ClassVar[Phase] = Phase.NONE
    needs: ClassVar[tuple[str, ...]] = ()
    precedes: ClassVar[tuple[str, ...]] = ()

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        return CONTINUE

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        return CONTINUE

    async def on_response_headers(self, ctx: RequestContext) -> Decision:
        return CONTINUE

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        return CONTINUE

    async def on_settle(self, ctx: RequestContext) -> Decision:
        return CONTINUE

    async def on_end(self, ctx: RequestContext) -> None:
        return None
