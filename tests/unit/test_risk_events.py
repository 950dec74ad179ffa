"""Which verdicts are high-risk events (pure: no Redis is contacted)."""

from __future__ import annotations

from filters.base import Principal, RequestContext, Verdict
from filters.risk import Risk, RiskParams
from gateway.registry import Protocol, Registry, Route
from gateway.risk import Event, RiskStore


def _risk(**kw: object) -> Risk:
    store = RiskStore.from_url("redis://127.0.0.1:1/0", "t:", 0.1)  # never contacted here
    return Risk(store, RiskParams.model_validate(kw))


def _ctx(*verdicts: Verdict) -> RequestContext:
    ctx = RequestContext(
        "r1", "POST", "/v1/chat/completions", {}, Registry.from_yaml("upstreams: {}\nmodels: {}\n")
    )
    ctx.principal = Principal("k", "ann", "acme")
    ctx.route = Route("up_v", Protocol.OPENAI, "m", "2", "m", None, None)
    ctx.verdicts += verdicts
    return ctx


def test_counted_kinds() -> None:
    ctx = _ctx(
        Verdict("prompt_injection", "score", "deny", 0.0, "score=0.9"),
        Verdict("access", "decide", "flag", 0.0, "count-it"),
        Verdict("access", "request_body", "deny", 0.0),
        Verdict("pii", "end", "redact", 0.0, "", (("request:CN_MOBILE", 1),)),
    )
    events, escalate = _risk().events(ctx)
    assert events == [Event("injection", "m@2"), Event("policy_flag", "m@2"), Event("policy_deny", "m@2")]
    assert escalate == ""
    events, _ = _risk(count=["pii_prompt"]).events(ctx)
    assert events == [Event("pii_prompt", "m@2")]


def test_monitor_verdicts_and_passes_never_count_and_review_always_escalates() -> None:
    ctx = _ctx(
        Verdict("prompt_injection", "score", "monitor:deny", 0.0),
        Verdict("prompt_injection", "score", "pass", 0.0),
        Verdict("access", "decide", "monitor:deny", 0.0, "shadow"),
        Verdict("prompt_injection", "fail_mode", "flag", 0.0, "classifier_failed=TimeoutError"),
        Verdict("access", "decide", "review", 0.0, "research-needs-review"),
    )
    events, escalate = _risk(count=["injection"]).events(ctx)
    assert events == [Event("review", "m@2")]
    assert escalate == "rule:research-needs-review"
