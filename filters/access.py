"""Scoped policy rules: allow, deny, flag, review or redact by tenant, group, user, model, route, protocol.

Runs after `route`, when the caller and the exact model version are known. The most specific
enforce-mode rule decides (docs/policy.md); monitor-mode rules only record what they would have
done. `flag` and `review` let the request through and leave a verdict for the risk filter;
`redact` tells the pii filter to redact this request's prompt and answer.
"""

from __future__ import annotations

from typing import ClassVar

from filters.base import CONTINUE, BaseFilter, Decision, Deny, Phase, RequestContext, Verdict
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode
from gateway.policy import Action, request_subject


class Access(BaseFilter):
    """Apply the policy's rules to the request."""

    name: ClassVar[str] = "access"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.REQUEST_BODY
    needs: ClassVar[tuple[str, ...]] = ("principal", "route")

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        # Calls without a body are complete now (protocol has set the prompt); others wait.
        return self._decide(ctx) if ctx.prompt is not None else CONTINUE

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        if "access" in ctx.state:
            return CONTINUE
        return self._decide(ctx)

    def _decide(self, ctx: RequestContext) -> Decision:
        ctx.state["access"] = True
        policy = ctx.policy
        if policy is None:
            return Deny(500, ErrorCode.INTERNAL, "internal gateway error")
        out = policy.decide(request_subject(ctx))
        for name, action in out.shadow:
            ctx.verdicts.append(Verdict(self.name, "decide", f"monitor:{action.value}", 0.0, name))
        rule = out.rule.rule if out.rule else None
        if out.action is Action.DENY:
            return Deny(
                rule.status if rule else 403,
                ErrorCode.POLICY_DENIED,
                rule.message if rule else "this request is not allowed by policy",
            )
        if out.action in (Action.FLAG, Action.REVIEW):
            # Each matching rule with its own action: a review rule escalates, a flag rule counts.
            ctx.verdicts += [
                Verdict(self.name, "decide", policy.action_of(name).value, 0.0, name) for name in out.marks
            ]
        if out.redact:
            ctx.redact_rules = out.redact
            ctx.verdicts += [Verdict(self.name, "decide", "redact", 0.0, name) for name in out.redact]
        return CONTINUE


@register("access")
def _build(env: BuildEnv, _params: object) -> Access:
    return Access()
