"""Failed API keys per source network through the real gateway: Envoy, two workers, one Redis.

What is proved is what the client got (401s, then 429 even with a right key), that a blocked
request never reached the upstream, what the audit record and metrics say (never the address),
that a client cannot move itself to another network with headers, and that the operator's CLI
lifts a block. The store's script is checked alone against Redis too.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from gateway.auth_guard import AuthFailStore
from gateway.procs import free_port
from tests.harness import KEY, GatewayEnv, ScriptedUpstream, chat_registry, running_policy

pytestmark = pytest.mark.dataplane

REDIS = "redis://127.0.0.1:6379/0"

POLICY = """\
version: 1
chain:
  - filter: auth_guard
{params}
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: audit
default_action: allow
fail_mode: {{redis: {redis_mode}}}
"""

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


def _gateway(tmp: Path, port: int, params: str, redis_mode: str = "deny", **env: str) -> Any:
    return running_policy(tmp, chat_registry(port), POLICY.format(params=params, redis_mode=redis_mode), env)


def _post(
    env: GatewayEnv, key: str | None, path: str = "/v1/chat/completions", **headers: str
) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{env.url}{path}", headers=headers, json=CHAT, timeout=10)


def _ask(env: GatewayEnv, key: str = KEY) -> str:
    with openai.OpenAI(base_url=f"{env.url}/v1", api_key=key, max_retries=0, timeout=10) as client:
        r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hello"}])
    return r.choices[0].message.content or ""


def _guard_verdicts(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (v["phase"], v["action"], v["detail"])
        for v in record["decision"]["verdicts"]
        if v["filter"] == "auth_guard" and v["phase"] in ("check", "failure")
    ]


def test_refused_keys_block_the_network_even_for_a_right_key_until_the_operator_clears_it(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    params = "    failures: 3\n    window_s: 60\n    block_s: 600"
    with _gateway(tmp_path, chat_up.port, params) as env:
        chat_up.requests.clear()
        # Right keys and requests without a key are not failures (count_missing is off).
        assert [_ask(env) for _ in range(4)] == ["ok"] * 4
        assert [_post(env, None).status_code for _ in range(3)] == [401] * 3
        # Three wrong keys, each claiming another address: Envoy overwrites the claim, so all
        # three count for the one network the client really is in.
        spoofs = [
            {"x-envoy-external-address": "198.51.100.7"},
            {"x-forwarded-for": "203.0.113.9", "x-real-ip": "203.0.113.9"},
            {"x-envoy-external-address": "2001:db8::1", "x-forwarded-for": "2001:db8::1"},
        ]
        wrong = [_post(env, f"ztg-guess-{i}", **h) for i, h in enumerate(spoofs)]
        assert [r.status_code for r in wrong] == [401] * 3, [r.text for r in wrong]
        assert {r.json()["error"]["code"] for r in wrong} == {"invalid_api_key"}
        # Now even the right key is refused, before it is read, with when to come back.
        with pytest.raises(openai.RateLimitError) as info:
            _ask(env)
        resp = info.value.response
        err = resp.json()["error"]
        assert resp.status_code == 429 and err["code"] == "too_many_auth_failures", resp.text
        assert err["type"] == "rate_limit_error"
        assert "too many failed authentications from this network" in err["message"]
        assert 590 <= int(resp.headers["retry-after"]) <= 600
        assert 590_000 <= int(resp.headers["retry-after-ms"]) <= 600_000
        assert _post(env, "ztg-guess-again").status_code == 429  # a guess learns nothing more
        assert len(chat_up.requests) == 4  # only the right keys before the block reached the model

        third = env.audit_for(wrong[2].headers["x-request-id"])
        assert third["decision"]["status"] == 401
        assert _guard_verdicts(third) == [
            ("failure", "count", "failures=3/3"),
            ("failure", "block", "block_ms=600000"),
        ]
        assert [_guard_verdicts(env.audit_for(r.headers["x-request-id"])) for r in wrong[:2]] == [
            [("failure", "count", "failures=1/3")],
            [("failure", "count", "failures=2/3")],
        ]
        blocked = env.audit_for(resp.headers["x-request-id"])
        assert blocked["decision"]["outcome"] == "denied" and blocked["principal"] is None
        ((phase, action, detail),) = _guard_verdicts(blocked)
        assert (phase, action) == ("check", "deny") and detail.startswith("blocked,retry_after_ms=")
        # The address is not in the audit log: neither the real one nor the claimed ones.
        written = json.dumps(env.audit())
        assert "127.0.0.1" not in written and "198.51.100.7" not in written and "2001:db8" not in written
        # Each worker writes its counts once a second: wait for every line, not the first alone.
        for event, count in ("block", 1), ("failure", 3), ("refused", 2):
            env.await_metric(f'ztgate_auth_guard_total{{event="{event}"}} {count}.0')
        assert any(
            '"event": "auth_guard_blocked"' in line and '"source": "127.0.0.1/32"' in line
            for line in env.logs(0).splitlines()
        )

        # The operator sees the block and lifts it; the right key works again, a wrong one counts anew.
        shown = env.cli("auth-guard", "show")
        assert shown.returncode == 0, shown.stderr
        (entry,) = json.loads(shown.stdout)
        assert entry["source"] == "127.0.0.1/32" and entry["failures"] == 0
        assert 0 < entry["blocked_ms"] <= 600_000
        assert env.cli("auth-guard", "clear").returncode == 2  # neither --source nor --all
        cleared = env.cli("auth-guard", "clear", "--source", "127.0.0.1")
        assert cleared.stdout.strip() == "1 source network(s) cleared (1 key(s))", cleared.stderr
        assert _ask(env) == "ok"
        again = _post(env, "ztg-guess-4")
        assert _guard_verdicts(env.audit_for(again.headers["x-request-id"])) == [
            ("failure", "count", "failures=1/3")
        ]


def test_a_surge_of_refused_keys_from_many_networks_lowers_every_networks_limit(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    # A botnet behind the load balancer (127.0.0.2, trusted): one wrong key per network, each far
    # under its own limit of 5; the 6th refused key in the window from anywhere is a surge, and
    # then one refused key blocks a network.
    params = (
        "    failures: 5\n    window_s: 60\n    block_s: 600\n"
        "    surge_failures: 6\n    surge_network_failures: 1"
    )

    def via_proxy(client: str, key: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}", "x-forwarded-for": client}
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10) as c:
            return c.post(f"{env.url}/v1/chat/completions", headers=headers, json=CHAT)

    with _gateway(tmp_path, chat_up.port, params, ZTGATE_TRUSTED_PROXIES="127.0.0.2") as env:
        bots = [f"198.51.100.{i}" for i in range(1, 7)]
        wrong = [via_proxy(ip, f"ztg-leaked-{i}") for i, ip in enumerate(bots)]
        assert [r.status_code for r in wrong] == [401] * 6, [r.text for r in wrong]
        assert [_guard_verdicts(env.audit_for(r.headers["x-request-id"])) for r in wrong[:2]] == [
            [("failure", "count", "failures=1/5")],
            [("failure", "count", "failures=1/5")],
        ]
        assert _guard_verdicts(env.audit_for(wrong[5].headers["x-request-id"])) == [
            ("failure", "surge", "failures=6"),
            ("failure", "count", "failures=1/1,surge"),
            ("failure", "block", "block_ms=600000"),
        ]
        blocked = {e["source"] for e in json.loads(env.cli("auth-guard", "show").stdout) if e["blocked_ms"]}
        assert blocked == {"198.51.100.6/32"}
        # During the surge a second wrong key from a network that had one blocks it too ...
        assert via_proxy(bots[0], "ztg-leaked-again").status_code == 401
        assert via_proxy(bots[0], KEY).status_code == 429
        # ... and a network with no failure is not blocked, nor is a right key refused.
        assert via_proxy("198.51.100.99", KEY).status_code == 200
        assert via_proxy(bots[1], KEY).status_code == 200
        env.await_metric('ztgate_auth_guard_total{event="surge"} 1.0')
        assert any('"event": "auth_guard_surge"' in line for line in env.logs(0).splitlines())
        # The operator ends it: --all forgets the all-networks count with the networks' own.
        assert env.cli("auth-guard", "clear", "--all").returncode == 0
        again = via_proxy(bots[2], "ztg-leaked-3")
        assert _guard_verdicts(env.audit_for(again.headers["x-request-id"])) == [
            ("failure", "count", "failures=1/5")
        ]


def test_a_block_ends_by_itself_and_exempt_networks_are_never_counted(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    params = "    failures: 2\n    window_s: 60\n    block_s: 2\n    count_missing: true"
    with _gateway(tmp_path / "short", chat_up.port, params) as env:
        assert [_post(env, None).status_code for _ in range(2)] == [401, 401]  # counted: count_missing
        r = _post(env, KEY)
        assert r.status_code == 429 and int(r.headers["retry-after"]) == 2, r.text
        time.sleep(2.2)
        assert _ask(env) == "ok"
    params = "    failures: 1\n    exempt: [10.0.0.0/8, 127.0.0.0/8, '::1/128']"
    with _gateway(tmp_path / "exempt", chat_up.port, params) as env:
        assert [_post(env, "ztg-guess").status_code for _ in range(3)] == [401] * 3
        assert _ask(env) == "ok"
        shown = env.cli("auth-guard", "show")
        assert json.loads(shown.stdout) == [], shown.stderr


def test_monitor_mode_lets_a_blocked_network_through_marked(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    with _gateway(tmp_path, chat_up.port, "    failures: 1\n    mode: monitor") as env:
        assert _post(env, "ztg-guess").status_code == 401
        r = _post(env, KEY)
        assert r.status_code == 200, r.text
        ((phase, action, detail),) = _guard_verdicts(env.audit_for(r.headers["x-request-id"]))
        assert (phase, action) == ("check", "monitor:deny") and detail.startswith("blocked,")
        env.await_metric('ztgate_auth_guard_total{event="monitor"} 1.0')


def test_redis_down_refuses_every_request_by_default_and_flags_when_the_policy_says_so(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with _gateway(tmp_path / "deny", chat_up.port, "    failures: 5", ZTGATE_REDIS_URL=dead) as env:
        chat_up.requests.clear()
        r = _post(env, KEY)
        assert r.status_code == 503 and r.json()["error"]["code"] == "auth_guard_unavailable", r.text
        r = _post(env, KEY, "/v2/models/chat/infer")
        assert r.status_code == 503 and r.json()["code"] == "auth_guard_unavailable", r.text  # KServe's shape
        assert chat_up.requests == []
    with _gateway(
        tmp_path / "flag", chat_up.port, "    failures: 5", "allow_with_flag", ZTGATE_REDIS_URL=dead
    ) as env:
        r = _post(env, KEY)
        assert r.status_code == 200, r.text
        modes = env.audit_for(r.headers["x-request-id"])["decision"]["fail_modes"]
        assert modes == [{"dependency": "redis", "mode": "allow_with_flag", "why": "ConnectionError"}]


@pytest_asyncio.fixture
async def stores() -> AsyncIterator[tuple[AuthFailStore, AuthFailStore]]:
    """Two stores on their own pools, as two replicas have, under a prefix of this test's own."""
    prefix = f"ztgate-test-{uuid.uuid4().hex[:12]}:"
    a, b = AuthFailStore.from_url(REDIS, prefix, 2.0), AuthFailStore.from_url(REDIS, prefix, 2.0)
    yield a, b
    await a.clear()
    await a.aclose()
    await b.aclose()


async def test_concurrent_failures_from_two_replicas_block_once_at_the_limit(
    stores: tuple[AuthFailStore, AuthFailStore],
) -> None:
    a, b = stores
    got = await asyncio.gather(*(s.fail("203.0.113.7/32", 60, 10, 30) for _ in range(15) for s in (a, b)))
    counted = sorted(g.failures for g in got if g.failures)
    assert counted == list(range(1, 11))  # the 11th and later came when it was blocked already
    assert [g.blocked_ms for g in got if g.failures == 10] == [30_000]
    assert all(0 < g.blocked_ms <= 30_000 for g in got if g.failures == 0)
    assert 29_000 < await b.blocked_ms("203.0.113.7/32") <= 30_000
    assert await a.blocked_ms("203.0.113.8/32") == 0  # a neighbour is its own network
    [entry] = await a.sources()  # one read: the block's time left shrinks between two
    assert entry["source"] == "203.0.113.7/32" and entry["failures"] == 0
    assert 29_000 < entry["blocked_ms"] <= 30_000


async def test_failures_leave_the_window_as_it_slides(stores: tuple[AuthFailStore, AuthFailStore]) -> None:
    a, _ = stores
    assert (await a.fail("2001:db8::/64", 1, 3, 30)).failures == 1
    assert (await a.fail("2001:db8::/64", 1, 3, 30)).failures == 2
    await asyncio.sleep(1.1)
    got = await a.fail("2001:db8::/64", 1, 3, 30)  # the first two left the 1 s window
    assert (got.failures, got.blocked_ms) == (1, 0)
    assert await a.blocked_ms("2001:db8::/64") == 0
    assert await a.clear("2001:db8::/64") == 1
    assert await a.sources() == []


async def test_the_all_networks_count_is_shared_and_slides(
    stores: tuple[AuthFailStore, AuthFailStore],
) -> None:
    a, b = stores
    got = await asyncio.gather(*(s.count_surge(1) for _ in range(5) for s in (a, b)))
    assert sorted(got) == list(range(1, 11))  # one count, whichever replica counts
    await asyncio.sleep(1.1)
    assert await b.count_surge(1) == 1  # the ten left the 1 s window
    assert await a.sources() == []  # not a network
    assert await a.clear() == 1 and await a.count_surge(1) == 1
