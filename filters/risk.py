"""Per-user risk: count high-risk events across replicas, put users under review, hold them there.

At request headers a user under review (gateway.risk) gets the policy's `under_review` action:
`deny` (403 user_under_review, the default) or `flag` (let through, marked). At SETTLE, before
the answer leaves, the request's high-risk events are recorded: an injection verdict, a `flag`
or `deny` rule (the kinds listed in `count`), and `review` rules, which put the user under
review at once. `threshold` events within `window_s` put the user under review.

The under-review check is answered from a worker-local copy when it can (`review_cache_s`,
gateway.redis_copies: Redis tells every worker of every change to a review key, and without
that link every request asks Redis).

Redis down or slow: `fail_mode.redis` decides, `deny` (503 risk_unavailable, the default) or
`allow_with_flag`; the verdict (and so the audit record) names the mode that fired. Monitor-mode
verdicts of other filters are never counted, and in this filter's own `monitor` mode users under
review are let through with a `monitor:deny` verdict.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from filters.base import (
    CONTINUE,
    BaseFilter,
    Decision,
    Deny,
    Phase,
    RequestContext,
    Verdict,
    fail_mode,
)
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode
from gateway.observability import log
from gateway.redis_copies import RedisCopies, read_through
from gateway.risk import Event, RiskStore, review_copies

Kind = Literal["injection", "policy_flag", "policy_deny", "pii_prompt"]
_DEFAULT_KINDS: tuple[Kind, ...] = ("injection", "policy_flag", "policy_deny")


class RiskParams(BaseModel):
    """Parameters of the risk filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    window_s: int = Field(
        default=3600, ge=1, le=30 * 86400, description="Sliding window of the count, seconds."
    )
    threshold: int = Field(
        default=5, ge=1, le=100_000, description="Events within the window that put a user under review."
    )
    count: list[Kind] = Field(
        default_factory=lambda: list(_DEFAULT_KINDS),
        description="What counts as a high-risk event: injection (the classifier flagged or denied a "
        "prompt), policy_flag (a flag rule matched), policy_deny (a deny rule refused the request), "
        "pii_prompt (a prompt carried PII). A `review` rule always escalates at once.",
    )
    under_review: Literal["deny", "flag"] = Field(
        default="deny",
        description="What requests of a user under review get: deny, or flag (let through, marked).",
    )
    status: int = Field(default=403, ge=400, le=499, description="HTTP status of the under-review deny.")
    message: str = Field(
        default="your account is under review; contact your administrator",
        description="Public text of the under-review deny.",
    )
    mode: Literal["enforce", "monitor"] = Field(
        default="enforce", description="monitor: count and escalate, but let users under review through."
    )
    timeout_s: float = Field(default=0.25, gt=0.0, le=5.0, description="Time budget of one Redis call.")
    review_cache_s: float = Field(
        default=10.0,
        ge=0.0,
        le=300.0,
        description="How long a worker may reuse a user's under-review lookup, seconds, and only while "
        "Redis tells it of every change to review keys (client-side caching: a change reaches every "
        "worker within milliseconds; without that link every request asks Redis). 0: ask Redis on "
        "every request.",
    )


_UNAVAILABLE = Deny(503, ErrorCode.RISK_UNAVAILABLE, "the risk service is unavailable; try again later")


class Risk(BaseFilter):
    """Hold users under review; record high-risk events."""

    name: ClassVar[str] = "risk"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.SETTLE
    needs: ClassVar[tuple[str, ...]] = ("principal",)

    def __init__(
        self, store: RiskStore, params: RiskParams, cache: RedisCopies[dict[str, Any] | None] | None = None
    ) -> None:
        self.store = store
        self.params = params
        self.counted = frozenset(params.count)
        self.cache = cache if params.review_cache_s > 0 else None

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        who = ctx.principal
        if who is None:
            return CONTINUE
        key = self.store.keys(who.tenant, who.user)[2]
        try:
            review = await read_through(
                self.cache, key, self.store.review_at, self.params.timeout_s, self._keep_s
            )
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            return self._failed(ctx, exc)
        if review is None:
            return CONTINUE
        detail = f"since_ms={review.get('since_ms')},reason={review.get('reason')}"
        if self.params.mode == "monitor":
            ctx.verdicts.append(Verdict(self.name, "check", "monitor:deny", 0.0, detail))
            return CONTINUE
        if self.params.under_review == "flag":
            ctx.verdicts.append(Verdict(self.name, "check", "flag", 0.0, detail))
            return CONTINUE
        ctx.verdicts.append(Verdict(self.name, "check", "deny", 0.0, detail))
        return Deny(self.params.status, ErrorCode.USER_UNDER_REVIEW, self.params.message)

    def _keep_s(self, _review: dict[str, Any] | None) -> float:
        return self.params.review_cache_s

    def events(self, ctx: RequestContext) -> tuple[list[Event], str]:
        """The request's high-risk events, and the review rule that escalates (if any)."""
        model = f"{ctx.route.model}@{ctx.route.version}" if ctx.route else ""
        kinds: list[str] = []
        escalate = ""
        for v in ctx.verdicts:
            if v.filter == "prompt_injection" and v.phase == "score" and v.action in ("deny", "flag"):
                kinds.append("injection")
            elif v.filter == "access" and v.action == "flag":
                kinds.append("policy_flag")
            elif v.filter == "access" and v.action == "review":
                kinds.append("review")
                escalate = escalate or f"rule:{v.detail}"
            elif v.filter == "access" and v.action == "deny":
                kinds.append("policy_deny")
            elif v.filter == "pii" and any(k.startswith("request:") for k, _ in v.counts):
                kinds.append("pii_prompt")
        return [Event(k, model) for k in kinds if k in self.counted or k == "review"], escalate

    async def on_settle(self, ctx: RequestContext) -> Decision:
        who = ctx.principal
        if who is None:
            return CONTINUE
        events, escalate = self.events(ctx)
        if not events:
            return CONTINUE
        try:
            async with asyncio.timeout(self.params.timeout_s):
                rec = await self.store.record(
                    who.tenant,
                    who.user,
                    events,
                    window_s=self.params.window_s,
                    threshold=self.params.threshold,
                    escalate=escalate,
                    request_id=ctx.request_id,
                )
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            log().error("risk_events_not_recorded", request_id=ctx.request_id, events=len(events))
            return self._failed(ctx, exc)
        detail = f"events={','.join(e.kind for e in events)},in_window={rec.count}"
        if rec.escalated and rec.review is not None:
            detail += f",reason={rec.review.get('reason')}"
        action = "escalate" if rec.escalated else "count"
        if rec.escalated and self.cache is not None:
            self.cache.drop(self.store.keys(who.tenant, who.user)[2])
        ctx.verdicts.append(Verdict(self.name, "record", action, 0.0, detail))
        if rec.escalated:
            log().warning(
                "user_under_review",
                request_id=ctx.request_id,
                tenant=who.tenant,
                user=who.user,
                reason=rec.review.get("reason") if rec.review else None,
                in_window=rec.count,
            )
        return CONTINUE

    def _failed(self, ctx: RequestContext, exc: Exception) -> Decision:
        return fail_mode(ctx, self.name, "redis", type(exc).__name__, _UNAVAILABLE)


@register("risk", RiskParams)
def _build(env: BuildEnv, params: RiskParams) -> Risk:
    s = env.settings
    # One pool per process and timeout, shared by every policy revision's chain.
    store = env.engine(
        f"risk:{params.timeout_s}", lambda: RiskStore.from_url(s.redis_url, s.redis_prefix, params.timeout_s)
    )
    # One invalidation link per process, shared like the pool; used when the policy allows copies.
    cache = env.engine(
        "risk:review-copies", lambda: review_copies(s.redis_url, s.redis_prefix, params.timeout_s)
    )
    return Risk(store, params, cache)
