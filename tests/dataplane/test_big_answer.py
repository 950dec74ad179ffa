"""An answer bigger than the gateway can hold to check is refused, never passed unchecked.

A whole (not streamed) answer is checked in Envoy's buffer (ZTGATE_BUFFER_LIMIT_BYTES): one that
says it is larger is refused by the chain (or by Envoy, if its body fills the buffer first); one
without a length is cut off by Envoy when it outgrows the buffer. Either way the client gets the
same error (502 answer_too_large, with the request id) at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web

from tests.harness import KEY, GatewayEnv, Recorded, ScriptedUpstream, registry_for, running, streamed

SECRET = "4111 1111 1111 1111"
LIMIT = 1024 * 1024


def _huge(rec: Recorded) -> object:
    # A card number at the start, then more text than the buffer holds.
    content = f"card {SECRET} " + "x" * (LIMIT + 1024)
    doc = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
    }
    raw = json.dumps(doc).encode()
    if b"no-length" in rec.body:  # sent in chunks, without a content-length
        return streamed([raw[i : i + 65536] for i in range(0, len(raw), 65536)], "application/json")
    return web.Response(body=raw, content_type="application/json")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayEnv, ScriptedUpstream]]:
    up = ScriptedUpstream("openai", handler=_huge).start()
    reg = registry_for(
        {"v": ("openai", up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )
    env_vars = {
        "ZTGATE_FILTERS": "principal,protocol,route,pii",
        "ZTGATE_BUFFER_LIMIT_BYTES": str(LIMIT),
        "ZTGATE_MAX_REQUEST_BODY_BYTES": str(LIMIT // 2),
    }
    try:
        with running(tmp_path_factory.mktemp("big"), reg, workers=1, env=env_vars) as env:
            yield env, up
    finally:
        up.stop()


def _ask(env: GatewayEnv, text: str) -> httpx.Response:
    return httpx.post(
        env.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=20,  # before answer bodies were buffered from the start, this one stalled
    )


@pytest.mark.parametrize(
    ("text", "status", "code"),
    [("with a length", 502, "answer_too_large"), ("no-length", 502, "answer_too_large")],
)
def test_an_answer_over_the_buffer_limit_is_refused_not_forwarded(
    gateway: tuple[GatewayEnv, ScriptedUpstream], text: str, status: int, code: str
) -> None:
    env, up = gateway
    before = len(up.requests)
    r = _ask(env, text)
    assert r.status_code == status, r.status_code
    err = r.json()["error"]
    assert err["code"] == code and r.headers["x-request-id"] in err["message"]
    assert SECRET.encode() not in r.content and len(up.requests) == before + 1
