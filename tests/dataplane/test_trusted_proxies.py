"""Behind a load balancer (`ZTGATE_TRUSTED_PROXIES`), through the real gateway: Envoy, two workers,
one Redis, and clients on two loopback addresses, 127.0.0.2 playing the trusted proxy.

What is proved is who the gateway takes the client to be, seen where it matters: the network
auth_guard counts and blocks, and the `x-forwarded-for` the model server gets. A client that
reaches Envoy directly stays its own address whatever it claims, and the edge's other guarantees
(Envoy's own request id, no client `x-envoy-*` header) hold in this mode too.
"""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.harness import KEY, GatewayEnv, ScriptedUpstream, chat_registry, running_policy, tls_listener_files

pytestmark = pytest.mark.dataplane

PROXY = "127.0.0.2"  # the load balancer: Envoy trusts its x-forwarded-for
DIRECT = "127.0.0.1"  # a client that reaches Envoy without it

POLICY = """\
version: 1
chain:
  - filter: auth_guard
    failures: 2
    window_s: 60
    block_s: 600
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: audit
default_action: allow
"""

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


def _post(env: GatewayEnv, source: str, key: str, **headers: str) -> httpx.Response:
    """A chat request from the loopback address `source`, with the headers a client or proxy set."""
    headers["authorization"] = f"Bearer {key}"
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
        return client.post(f"{env.url}/v1/chat/completions", headers=headers, json=CHAT)


def _forwarded_for(chat_up: ScriptedUpstream, r: httpx.Response) -> str:
    """The x-forwarded-for the model server got with the request that answered `r`."""
    assert r.status_code == 200, r.text
    [got] = [q for q in chat_up.requests if q.headers.get("x-request-id") == r.headers["x-request-id"]]
    return got.headers["x-forwarded-for"]


def _access_log(env: GatewayEnv, r: httpx.Response) -> tuple[str, str, int]:
    """Client, peer and status of `r` in Envoy's access log (flushed once a second)."""
    rid = r.headers["x-request-id"]
    until = time.monotonic() + 10
    while True:
        for line in env.logs(0).splitlines():
            if line.startswith("{") and f'"request_id":"{rid}"' in line.replace(" ", ""):
                doc = json.loads(line)
                if doc.get("logger") == "envoy":
                    return doc["client"], doc["peer"], int(doc["status"])
        assert time.monotonic() < until, f"no access log line for {rid}"
        time.sleep(0.2)


def _blocked(env: GatewayEnv) -> dict[str, Any]:
    shown = env.cli("auth-guard", "show")
    assert shown.returncode == 0, shown.stderr
    return {e["source"]: e["blocked_ms"] > 0 for e in json.loads(shown.stdout)}


def test_the_client_is_the_proxys_forwarded_address_and_a_direct_client_cannot_claim_one(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    env_vars = {"ZTGATE_TRUSTED_PROXIES": f"{PROXY}/32,2001:db8:7e57::/48"}
    with running_policy(tmp_path, chat_registry(chat_up.port), POLICY, env_vars) as env:
        chat_up.requests.clear()
        # Through the proxy, the client is the address it forwarded; the model server is told it.
        via = _post(env, PROXY, KEY, **{"x-forwarded-for": "198.51.100.8"})
        assert _forwarded_for(chat_up, via) == "198.51.100.8"
        # Envoy's access log has both: the client, and the proxy it came through.
        assert _access_log(env, via)[0:2] == ("198.51.100.8", PROXY)
        # A chain of proxies: trusted hops are walked past, to the first address outside them.
        chain = _post(env, PROXY, KEY, **{"x-forwarded-for": "203.0.113.5, 2001:db8:7e57::9, 127.0.0.2"})
        assert _forwarded_for(chat_up, chain) == "203.0.113.5"
        # What is not an address names no client: the proxy itself is the source.
        garbled = _post(env, PROXY, KEY, **{"x-forwarded-for": "not-an-address"})
        assert _forwarded_for(chat_up, garbled) == PROXY
        # A client that reaches Envoy directly is its own address, whatever it claims.
        spoof = {"x-forwarded-for": "198.51.100.8", "x-envoy-external-address": "198.51.100.8"}
        direct = _post(env, DIRECT, KEY, **spoof)
        assert _forwarded_for(chat_up, direct) == DIRECT
        assert _access_log(env, direct)[0:2] == (DIRECT, DIRECT)

        # auth_guard counts the client behind the proxy, not the proxy: two wrong keys from
        # 198.51.100.7 block that client alone ...
        guesses = [_post(env, PROXY, f"ztg-guess-{i}", **{"x-forwarded-for": "198.51.100.7"}) for i in (1, 2)]
        assert [r.status_code for r in guesses] == [401, 401], [r.text for r in guesses]
        blocked = _post(env, PROXY, KEY, **{"x-forwarded-for": "198.51.100.7"})
        assert blocked.status_code == 429 and blocked.json()["error"]["code"] == "too_many_auth_failures"
        # ... while the proxy's other clients, and the proxy's own requests, go on.
        assert (
            _forwarded_for(chat_up, _post(env, PROXY, KEY, **{"x-forwarded-for": "198.51.100.8"}))
            == "198.51.100.8"
        )
        assert _forwarded_for(chat_up, _post(env, PROXY, KEY)) == PROXY
        # A direct client's wrong keys count against its own address, though it claims another's:
        # it cannot get 198.51.100.9 blocked, nor escape its own block by claiming a new one.
        for i in (3, 4):
            assert (
                _post(env, DIRECT, f"ztg-guess-{i}", **{"x-forwarded-for": "198.51.100.9"}).status_code == 401
            )
        assert _post(env, DIRECT, KEY, **{"x-forwarded-for": "198.51.100.10"}).status_code == 429
        assert _blocked(env) == {"198.51.100.7/32": True, f"{DIRECT}/32": True}
        assert (
            _forwarded_for(chat_up, _post(env, PROXY, KEY, **{"x-forwarded-for": "198.51.100.9"}))
            == "198.51.100.9"
        )


def test_the_edge_guarantees_hold_behind_proxies(tmp_path: Path, chat_up: ScriptedUpstream) -> None:
    env_vars = {"ZTGATE_TRUSTED_PROXIES": PROXY}
    with running_policy(tmp_path, chat_registry(chat_up.port), POLICY, env_vars) as env:
        chat_up.requests.clear()
        claims = {
            "x-request-id": "my-own-id",
            "x-envoy-retry-on": "5xx",
            "x-envoy-original-path": "/admin",
            "x-forwarded-proto": "https",
        }
        for source in (DIRECT, PROXY):
            r = _post(env, source, KEY, **claims)
            assert r.status_code == 200, r.text
            rid = r.headers["x-request-id"]
            assert rid != "my-own-id"  # Envoy's own id, the one the audit record carries
            assert env.audit_for(rid)["decision"]["status"] == 200
            got = chat_up.requests[-1].headers
            assert got["x-request-id"] == rid
            assert got["x-forwarded-proto"] == "http"  # the scheme of the connection to Envoy
            # Of the x-envoy-* headers, only Envoy's own note of the client's address goes on.
            assert {h: v for h, v in got.items() if h.startswith("x-envoy-")} == {
                "x-envoy-external-address": source
            }, got
        assert len(chat_up.requests) == 2


def test_behind_proxies_a_tls_listener_still_tells_model_servers_https(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    ca = trustme.CA()
    env_vars = {"ZTGATE_TRUSTED_PROXIES": PROXY, **tls_listener_files(tmp_path, ca)}
    with running_policy(tmp_path, chat_registry(chat_up.port), POLICY, env_vars) as env:
        chat_up.requests.clear()
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        transport = httpx.HTTPTransport(local_address=PROXY, verify=ctx)
        with httpx.Client(transport=transport, timeout=10) as client:
            r = client.post(
                f"{env.url}/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {KEY}", "x-forwarded-proto": "http"},
            )
        assert _forwarded_for(chat_up, r) == PROXY
        assert chat_up.requests[-1].headers["x-forwarded-proto"] == "https"  # the connection's, not the claim
