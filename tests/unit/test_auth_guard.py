"""The auth_guard filter's parameters, place in the chain and source networks (pure: no Redis is contacted)."""

from __future__ import annotations

import pytest

from filters.auth_guard import AuthGuard, guard_event
from filters.base import CONTINUE, Deny, Phase, RequestContext, Verdict
from filters.chain import BuildEnv
from gateway import policy
from gateway.registry import Registry
from gateway.settings import Settings
from tests.policy_text import assert_refused_where, compile_text, problems

# Nothing listens on port 1: a test that reached Redis would see its fail mode fire.
ENV = BuildEnv(Settings(redis_url="redis://127.0.0.1:1/0"))
CHAIN = """\
version: 1
chain:
  - filter: auth_guard
    failures: 5
    exempt: [10.20.0.0/16, "fd00::/8"]
  - filter: principal
  - filter: protocol
  - filter: route
"""


def _compile(text: str) -> policy.CompiledPolicy:
    return compile_text(text, ENV)


def _errors(text: str) -> list[str]:
    return problems(text, ENV)


def _guard(text: str = CHAIN) -> AuthGuard:
    (guard,) = [f for f in _compile(text).chain.filters if f.name == "auth_guard"]
    assert isinstance(guard, AuthGuard)
    return guard


def _ctx(address: str | None, error_code: str = "") -> RequestContext:
    headers = {} if address is None else {"x-envoy-external-address": address}
    ctx = RequestContext(
        "rid", "POST", "/v1/chat/completions", headers, Registry.from_yaml("upstreams: {}\nmodels: {}\n", "-")
    )
    ctx.error_code = error_code
    return ctx


def test_it_checks_request_headers_and_counts_at_settle() -> None:
    chain = _compile(CHAIN).chain
    assert _guard().phases == Phase.REQUEST_HEADERS | Phase.SETTLE
    assert chain.settles


@pytest.mark.parametrize(
    ("address", "network"),
    [
        ("203.0.113.7", "203.0.113.7/32"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),  # one host may hold a whole /64
        ("[2001:db8::5]", "2001:db8::/64"),
        ("::ffff:198.51.100.4", "198.51.100.4/32"),  # an IPv4 client on a dual-stack listener
        (" 192.0.2.1 ", "192.0.2.1/32"),
        ("10.20.3.4", None),  # exempt
        ("fd12::1", None),
        ("10.21.0.1", "10.21.0.1/32"),
    ],
)
def test_addresses_count_in_their_network_and_exempt_ones_not_at_all(
    address: str, network: str | None
) -> None:
    assert _guard().network(address) == network


def test_prefixes_widen_the_network() -> None:
    guard = _guard(CHAIN.replace("failures: 5", "failures: 5\n    ipv4_prefix: 24\n    ipv6_prefix: 48"))
    assert guard.network("203.0.113.77") == "203.0.113.0/24"
    assert guard.network("2001:db8:1:2::9") == "2001:db8:1::/48"


@pytest.mark.parametrize("header", [None, "", "not-an-address", "203.0.113.7:4431", "unix:/tmp/s"])
async def test_no_source_address_is_refused_not_let_through(header: str | None) -> None:
    ctx = _ctx(header)
    got = await _guard().on_request_headers(ctx)
    assert isinstance(got, Deny) and got.status == 500 and got.code == "internal_error"
    assert [(v.phase, v.action, v.detail) for v in ctx.verdicts] == [("check", "deny", "no_source_address")]


async def test_an_exempt_network_is_not_looked_up() -> None:
    ctx = _ctx("10.20.9.9")
    assert await _guard().on_request_headers(ctx) is CONTINUE
    assert ctx.verdicts == [] and "auth_guard" not in ctx.state


async def test_only_refused_keys_are_counted_at_settle() -> None:
    guard = _guard()
    for code in ("", "policy_denied", "rate_limit_exceeded", "missing_api_key"):
        ctx = _ctx("203.0.113.7", code)
        ctx.state["auth_guard"] = "203.0.113.7/32"
        # Counting would reach the (absent) Redis and fire the fail mode: nothing is tried.
        assert await guard.on_settle(ctx) is CONTINUE
        assert ctx.verdicts == [], code
    ctx = _ctx("203.0.113.7", "invalid_api_key")
    ctx.state["auth_guard"] = "203.0.113.7/32"
    got = await guard.on_settle(ctx)
    assert isinstance(got, Deny) and got.code == "auth_guard_unavailable"  # it did try
    assert [(v.phase, v.action) for v in ctx.verdicts] == [("fail_mode", "deny")]
    assert "missing_api_key" in _guard(CHAIN.replace("failures: 5", "count_missing: true")).counted


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "exempt: [10.20.0.0/16",
            "exempt: [10.20.0.1/16",
            "'10.20.0.1/16' is not a network: 10.20.0.1/16 has host bits set",
        ),
        ("exempt: [10.20.0.0/16", "exempt: [intranet", "'intranet' is not a network"),
        ("failures: 5", "failures: 0", "Input should be greater than or equal to 1"),
        ("failures: 5", "ipv6_prefix: 129", "Input should be less than or equal to 128"),
        ("failures: 5", "mode: warn", "Input should be 'enforce' or 'monitor'"),
        # It guards principal, so it must run before it, and there must be one.
        (
            '  - filter: auth_guard\n    failures: 5\n    exempt: [10.20.0.0/16, "fd00::/8"]\n  - filter: principal\n',
            "  - filter: principal\n  - filter: auth_guard\n",
            "filter 'auth_guard' must come before 'principal' in the chain",
        ),
        ("  - filter: principal\n", "", "filter 'auth_guard' must come before 'principal' in the chain"),
    ],
)
def test_bad_parameters_and_places_are_refused_where_they_are(old: str, new: str, message: str) -> None:
    assert old in CHAIN
    assert_refused_where(CHAIN.replace(old, new), ENV, message)


def test_an_override_by_caller_is_refused_since_the_caller_is_not_known_yet() -> None:
    text = (
        CHAIN
        + """\
overrides:
  - name: lenient-for-ops
    filter: auth_guard
    when: {group: [ops]}
    params: {failures: 50}
"""
    )
    errors = _errors(text)
    assert any(
        "'auth_guard' cannot be overridden by group: principal must come before it" in e for e in errors
    ), errors
    by_path = text.replace("when: {group: [ops]}", "when: {route: [/v2/*]}")
    assert _compile(by_path).overrides


@pytest.mark.parametrize(
    ("verdict", "event"),
    [
        (Verdict("auth_guard", "failure", "count", 0.0, "failures=1/5"), "failure"),
        (Verdict("auth_guard", "failure", "block", 0.0, "block_ms=900000"), "block"),
        (Verdict("auth_guard", "failure", "surge", 0.0, "failures=200"), "surge"),
        (Verdict("auth_guard", "check", "deny", 0.0, "blocked,retry_after_ms=5"), "refused"),
        (Verdict("auth_guard", "check", "monitor:deny", 0.0, "blocked,retry_after_ms=5"), "monitor"),
        (Verdict("auth_guard", "check", "deny", 0.0, "no_source_address"), None),
        (Verdict("auth_guard", "fail_mode", "deny", 0.0, "redis_failed=ConnectionError"), None),
        (Verdict("quota", "failure", "count", 0.0, ""), None),
    ],
)
def test_verdicts_map_to_metric_events(verdict: Verdict, event: str | None) -> None:
    assert guard_event(verdict) == event
