"""An answer bigger than the gateway can hold to check is refused, never passed unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from aiohttp import web

from tests.harness import KEY, Recorded, ScriptedUpstream, registry_for, running

SECRET = "4111 1111 1111 1111"


def _huge(rec: Recorded) -> web.Response:
    # A card number at the start, then far more text than the buffer limit holds.
    content = f"card {SECRET} " + "x" * (12 * 1024 * 1024)
    doc = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
    }
    return web.Response(body=json.dumps(doc).encode(), content_type="application/json")


def test_an_answer_over_the_buffer_limit_is_refused_not_forwarded(tmp_path: Path) -> None:
    up = ScriptedUpstream("openai", handler=_huge).start()
    try:
        reg = registry_for(
            {"v": ("openai", up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
        )
        env_vars = {"ZTGATE_FILTERS": "principal,protocol,route,pii"}
        with running(tmp_path, reg, workers=1, env=env_vars) as env:
            r = httpx.post(
                env.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {KEY}"},
                timeout=20,
            )
            # Before answer bodies were buffered from the request's start, this stalled until
            # the client gave up: the body arrived while the answer's headers were with ext_proc.
            assert r.status_code == 500, r.status_code
            err = r.json()["error"]
            assert err["code"] == "gateway_error" and r.headers["x-request-id"] in err["message"]
            assert SECRET.encode() not in r.content and len(up.requests) == 1
    finally:
        up.stop()
