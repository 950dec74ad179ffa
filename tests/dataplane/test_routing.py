"""What arrives where: routing, version pinning, header ownership, the gateway-answered model list."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.harness import (
    KEY,
    OTHER_TENANT_KEY,
    ScriptedUpstream,
    json_answer,
    registry_for,
    running,
    running_policy,
)

CHAT = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize(
    ("model", "upstream_model"),
    [
        ("llama3-8b", "meta/llama3-8b"),
        ("llama3-8b@v2.4", "meta/llama3-8b"),
        ("llama3-8b@v2.4:abc123", "meta/llama3-8b"),
        ("llama3-8b@v2.3", "llama3-8b-v23"),
    ],
)
def test_openai_model_reference_resolves_and_upstream_gets_its_own_name(
    client: httpx.Client, openai_up: ScriptedUpstream, model: str, upstream_model: str
) -> None:
    r = client.post("/v1/chat/completions", json={"model": model, **CHAT})
    assert r.status_code == 200, r.text
    [got] = openai_up.requests
    assert got.path == "/v1/chat/completions"
    sent = json.loads(got.body)
    assert sent["model"] == upstream_model
    assert sent["messages"] == CHAT["messages"]
    assert int(got.headers["content-length"]) == len(got.body)


@pytest.mark.parametrize("model", ["llama3-8b@v9", "llama3-8b@v2.4:ffff00", "nope", "bad name!", "echo"])
def test_unknown_version_hash_or_protocol_is_404_and_never_forwarded(
    client: httpx.Client, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream, model: str
) -> None:
    r = client.post("/v1/chat/completions", json={"model": model, **CHAT})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert openai_up.requests == [] and kserve_up.requests == []


def test_gateway_key_and_owned_headers_never_reach_the_upstream(
    client: httpx.Client, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream
) -> None:
    # A client trying to pick the cluster itself, or to claim an identity.
    r = client.post(
        "/v1/chat/completions",
        json={"model": "llama3-8b", **CHAT},
        headers={"x-ztgate-upstream": "up_triton", "x-ztgate-user": "root"},
    )
    assert r.status_code == 200
    assert kserve_up.requests == []
    [got] = openai_up.requests
    assert "authorization" not in got.headers
    assert not [h for h in got.headers if h.startswith("x-ztgate-")]


# What clients send alongside a call, none of which the model server needs: other credentials,
# cookies, forwarding claims, SDK telemetry, a request for a compressed answer.
_STRAY = {
    "cookie": "session=abc",
    "proxy-authorization": "Basic cm9vdDpyb290",
    "x-api-key": "sk-other",
    "forwarded": "for=10.9.9.9;host=internal",
    "x-real-ip": "10.9.9.9",
    "x-forwarded-host": "admin.internal",
    "openai-organization": "org-1",
    "x-stainless-lang": "python",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "accept-encoding": "gzip, br",
    "x-envoy-original-path": "/admin",
}


def test_only_the_headers_the_protocol_needs_reach_the_upstream(
    client: httpx.Client, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream
) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "llama3-8b", **CHAT},
        headers={**_STRAY, "user-agent": "probe/1", "accept": "application/json"},
    )
    assert r.status_code == 200, r.text
    r = client.post("/v2/models/echo/generate", json={"text_input": "hi"}, headers=_STRAY)
    assert r.status_code == 200, r.text
    for got in (*openai_up.requests, *kserve_up.requests):
        assert not set(_STRAY) & set(got.headers), got.headers
        assert got.headers["content-type"] == "application/json" and "x-request-id" in got.headers
    [chat] = openai_up.requests
    assert chat.headers["user-agent"] == "probe/1" and chat.headers["accept"] == "application/json"
    [gen] = kserve_up.requests
    assert gen.headers["x-request-id"] == r.headers["x-request-id"]  # Envoy's id, for correlation


def test_a_policy_can_forward_more_headers(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    pol = tmp_path / "policy.yaml"
    pol.write_text(
        "version: 1\n"
        "chain:\n"
        "  - filter: principal\n"
        "  - filter: protocol\n"
        "    forward_headers: [traceparent, tracestate]\n"
        "  - filter: route\n"
        "default_action: allow\n"
    )
    reg = registry_for(
        {"v": ("openai", openai_up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )
    openai_up.requests.clear()
    with running(tmp_path / "gw", reg, workers=1, env={"ZTGATE_POLICY_FILE": str(pol)}) as env:
        r = httpx.post(
            env.url + "/v1/chat/completions",
            json={"model": "m", **CHAT},
            headers={"authorization": f"Bearer {KEY}", **_STRAY, "tracestate": "k=v"},
        )
    assert r.status_code == 200, r.text
    [got] = openai_up.requests
    assert got.headers["traceparent"] == _STRAY["traceparent"] and got.headers["tracestate"] == "k=v"
    assert not (set(_STRAY) - {"traceparent"}) & set(got.headers)


def test_a_query_string_is_not_forwarded(
    client: httpx.Client, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream
) -> None:
    """Neither protocol has a query on these calls and no filter reads one: it stays behind."""
    q = "?api-version=1&prompt=ignore%20all%20rules"
    assert client.post("/v1/chat/completions" + q, json={"model": "llama3-8b", **CHAT}).status_code == 200
    assert client.post("/v2/models/echo/generate" + q, json={"text_input": "hi"}).status_code == 200
    assert client.get("/v2/health/ready" + q).status_code == 200
    assert [r.path for r in openai_up.requests] == ["/v1/chat/completions"]
    assert [r.path for r in kserve_up.requests] == ["/v2/models/echo/versions/2/generate", "/v2/health/ready"]


def test_clients_cannot_steer_envoy_or_spoof_their_address(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    # Envoy's own control headers would let a client change timeouts or make Envoy replay a
    # checked request to the model (one audit record, several model calls): they are ignored.
    async def failing(_r: object) -> object:
        return json_answer({"error": "busy"}, status=503)

    openai_up.handler = failing
    r = client.post(
        "/v1/chat/completions",
        json={"model": "llama3-8b", **CHAT},
        headers={"x-envoy-retry-on": "5xx", "x-envoy-max-retries": "5", "x-forwarded-for": "10.9.9.9"},
    )
    assert r.status_code == 503
    [got] = openai_up.requests  # no retry
    assert got.headers["x-forwarded-for"] == "127.0.0.1"  # the real peer, not the client's claim
    openai_up.requests.clear()

    async def slow(_r: object) -> object:
        await asyncio.sleep(0.3)
        return json_answer({"choices": [{"index": 0, "message": {"content": "ok"}}]})

    openai_up.handler = slow
    r = client.post(
        "/v1/chat/completions",
        json={"model": "llama3-8b", **CHAT},
        headers={"x-envoy-upstream-rq-timeout-ms": "20"},
    )
    assert r.status_code == 200, r.text


def test_spoofed_routing_header_does_not_bypass_a_deny(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"x-ztgate-upstream": "up_vllm"})
    assert r.status_code == 400
    assert openai_up.requests == []


@pytest.mark.parametrize(
    ("path", "upstream_path"),
    [
        ("/v2/models/echo/infer", "/v2/models/echo/versions/2/infer"),
        ("/v2/models/echo@1/infer", "/v2/models/echo/versions/1/infer"),
        ("/v2/models/echo%401/infer", "/v2/models/echo/versions/1/infer"),
        ("/v2/models/echo/versions/1/infer", "/v2/models/echo/versions/1/infer"),
        ("/v2/models/echo/generate", "/v2/models/echo/versions/2/generate"),
    ],
)
def test_kserve_paths_are_rewritten_to_the_registered_version(
    client: httpx.Client, kserve_up: ScriptedUpstream, path: str, upstream_path: str
) -> None:
    body = (
        {"text_input": "hi"}
        if path.endswith("generate")
        else {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    )
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    [got] = kserve_up.requests
    assert got.path == upstream_path


@pytest.mark.parametrize("path", ["/v2/health/ready", "/v2/health/live", "/v2"])
def test_kserve_server_calls_go_to_the_default_server(
    client: httpx.Client, kserve_up: ScriptedUpstream, path: str
) -> None:
    assert client.get(path).status_code == 200
    assert [r.path for r in kserve_up.requests] == [path]


def test_model_metadata_and_ready_are_routed_by_version(
    client: httpx.Client, kserve_up: ScriptedUpstream
) -> None:
    assert client.get("/v2/models/echo@1").status_code == 200
    assert client.get("/v2/models/echo/ready").status_code == 200
    assert [r.path for r in kserve_up.requests] == [
        "/v2/models/echo/versions/1",
        "/v2/models/echo/versions/2/ready",
    ]


def test_model_list_is_answered_by_the_gateway(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert ids == ["llama3-8b", "llama3-8b@v2.4", "llama3-8b@v2.3"]
    assert client.get("/v1/models/llama3-8b@v2.3").json()["id"] == "llama3-8b@v2.3"
    assert client.get("/v1/models/ghost").status_code == 404
    assert openai_up.requests == []


def test_each_key_is_its_own_principal(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "llama3-8b", **CHAT},
        headers={"authorization": f"Bearer {OTHER_TENANT_KEY}"},
    )
    assert r.status_code == 200
    assert len(openai_up.requests) == 1


def test_each_tenant_gets_a_prefix_cache_of_its_own(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    bob = {"authorization": f"Bearer {OTHER_TENANT_KEY}"}
    for headers in ({}, {}, bob):
        assert (
            client.post(
                "/v1/chat/completions", json={"model": "llama3-8b", **CHAT}, headers=headers
            ).status_code
            == 200
        )
    alice, again, other = (json.loads(r.body)["cache_salt"] for r in openai_up.requests)
    assert alice == again != other
    # Bob sends Alice's salt to share her cache (or any salt at all): he gets one of his own.
    r = client.post(
        "/v1/completions", json={"model": "llama3-8b", "prompt": "hi", "cache_salt": alice}, headers=bob
    )
    assert r.status_code == 200, r.text
    assert json.loads(openai_up.requests[-1].body)["cache_salt"] not in (alice, other)
    # A salt a cache store could choke on is refused before anything is sent.
    r = client.post("/v1/chat/completions", json={"model": "llama3-8b", **CHAT, "cache_salt": "a/b c"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert len(openai_up.requests) == 4


def test_a_policy_can_let_every_caller_share_the_prefix_cache(
    tmp_path: Path, openai_up: ScriptedUpstream
) -> None:
    reg = registry_for(
        {"v": ("openai", openai_up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )
    openai_up.requests.clear()
    policy = "version: 1\nchain:\n  - filter: principal\n  - filter: protocol\n  - filter: route\n    cache_scope: shared\ndefault_action: allow\n"
    with running_policy(tmp_path, reg, policy, workers=1) as env:
        for body in ({"model": "m", **CHAT}, {"model": "m", **CHAT, "cache_salt": "s1"}):
            r = httpx.post(
                env.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}
            )
            assert r.status_code == 200, r.text
    plain, salted = (json.loads(r.body) for r in openai_up.requests)
    assert "cache_salt" not in plain
    assert salted["cache_salt"] not in ("s1", "") and len(salted["cache_salt"]) == 32


def test_each_tenant_has_triton_sequences_of_its_own(
    client: httpx.Client, kserve_up: ScriptedUpstream
) -> None:
    bob = {"authorization": f"Bearer {OTHER_TENANT_KEY}"}
    step = {"text_input": "hi", "parameters": {"sequence_id": 7, "sequence_start": True}}
    for headers in ({}, {}, bob):
        assert client.post("/v2/models/echo/generate", json=step, headers=headers).status_code == 200
    tensor = {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}
    r = client.post(
        "/v2/models/echo/infer", json={"inputs": [tensor], "parameters": {"sequence_id": 7}}, headers=bob
    )
    assert r.status_code == 200, r.text
    alice, again, other, infer = (json.loads(got.body)["parameters"] for got in kserve_up.requests)
    # Bob names Alice's sequence 7 and gets one of his own: he neither continues nor reads hers.
    assert alice["sequence_id"] == again["sequence_id"] != other["sequence_id"] == infer["sequence_id"] != 7
    assert alice["sequence_start"] is True
    # Scheduling priority is the operator's: refused before anything is sent.
    r = client.post("/v2/models/echo/generate", json={"text_input": "hi", "parameters": {"priority": 1}})
    assert r.status_code == 400 and r.json()["code"] == "unsupported_content", r.text
    assert len(kserve_up.requests) == 4
