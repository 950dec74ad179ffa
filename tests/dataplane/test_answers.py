"""Answers on their way back: streamed byte for byte, unreadable ones refused, upstream errors kept."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.harness import ScriptedUpstream, json_answer, streamed

CHAT = {"model": "llama3-8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _sse(docs: Sequence[object]) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(d, ensure_ascii=False).encode() + b"\n\n" for d in docs)
        + b"data: [DONE]\n\n"
    )


def _split(raw: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(raw)), 12))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


def _events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _without_content(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _without_content(v) for k, v in doc.items() if k != "content"}
    if isinstance(doc, list):
        return [_without_content(v) for v in doc]
    return doc


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sse_stream_arrives_event_for_event_across_odd_chunking(
    client: httpx.Client, openai_up: ScriptedUpstream, seed: int
) -> None:
    deltas: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"content": w}}]} for w in ["Hé", "llo ", "wörld ", "你好"]
    ]
    deltas += [
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}},
    ]
    raw = _sse(deltas)
    openai_up.handler = lambda _r: streamed(_split(raw, random.Random(seed)))
    with client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        got = _events(b"".join(r.iter_raw()))
    sent = _events(raw)
    # The PII filter re-cuts content between events (it holds back what could grow into PII),
    # but the client gets the same events, in order, with the same text.
    assert [_without_content(e) for e in got] == [_without_content(e) for e in sent]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in got[:-1] if e["choices"]) == (
        "Héllo wörld 你好"
    )


def test_unreadable_answer_is_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    openai_up.handler = lambda _r: web.Response(body=b"<html>SECRET</html>", content_type="application/json")
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": False})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_bad_response"
    assert b"SECRET" not in r.content


def test_unreadable_stream_event_cuts_the_stream(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    good = _sse([{"choices": [{"index": 0, "delta": {"content": "ok"}}]}]).removesuffix(b"data: [DONE]\n\n")
    openai_up.handler = lambda _r: streamed([good, b"data: {SECRET\n\n", b"data: [DONE]\n\n"], gap_s=0.05)
    received = b""
    with pytest.raises(httpx.HTTPError), client.stream("POST", "/v1/chat/completions", json=CHAT) as r:  # noqa: PT012
        for chunk in r.iter_raw():
            received += chunk
    assert b"SECRET" not in received


def test_upstream_errors_pass_through(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    err = {"error": {"message": "context too long", "type": "invalid_request_error", "code": 400}}
    openai_up.handler = lambda _r: json_answer(err, status=400)
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": False})
    assert r.status_code == 400
    assert r.json() == err


def test_kserve_generate_stream_without_done(client: httpx.Client, kserve_up: ScriptedUpstream) -> None:
    events = b"".join(
        b"data: " + json.dumps({"model_name": "echo", "text_output": t}).encode() + b"\n\n"
        for t in ["a", " b", " c"]
    )
    kserve_up.handler = lambda _r: streamed(_split(events, random.Random(7)))
    with client.stream("POST", "/v2/models/echo/generate_stream", json={"text_input": "x"}) as r:
        assert r.status_code == 200
        got = _events(b"".join(r.iter_raw()))
    # Same events; the text may be re-cut between them (held back while it could grow into PII).
    # generate_stream has no end marker: text still held when the body ends goes out in one
    # more event of the same shape.
    assert [set(e) for e in got] == [{"model_name", "text_output"}] * len(got) and len(got) in (3, 4)
    assert "".join(e["text_output"] for e in got) == "a b c"
    assert kserve_up.requests[0].path == "/v2/models/echo/versions/2/generate_stream"


def test_upstream_is_asked_for_uncompressed_answers(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    r = client.post(
        "/v1/chat/completions", json={**CHAT, "stream": False}, headers={"accept-encoding": "gzip, br"}
    )
    assert r.status_code == 200
    assert "accept-encoding" not in openai_up.requests[0].headers


def test_compressed_answer_is_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    import gzip

    payload = gzip.compress(b'{"choices": [{"index": 0, "message": {"content": "SECRET"}}]}')
    openai_up.handler = lambda _r: web.Response(
        body=payload, headers={"content-type": "application/json", "content-encoding": "gzip"}
    )
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": False})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_bad_response"


def test_token_ids_in_kserve_generate_answers_are_not_passed_unread(
    client: httpx.Client, kserve_up: ScriptedUpstream
) -> None:
    """Token ids could spell what the gateway redacts (the default policy redacts answers):
    a whole answer holding them is refused, a stream is cut before the event that holds them."""
    ids = [52, 49, 49, 49]  # "4111…" as byte tokens
    kserve_up.handler = lambda _r: json_answer({"model_name": "echo", "text_output": "ok", "output_ids": ids})
    r = client.post("/v2/models/echo/generate", json={"text_input": "x"})
    assert r.status_code == 502, r.text
    doc = r.json()
    assert doc["code"] == "upstream_bad_response" and "'output_ids'" in doc["error"]
    # The ids are not echoed (a random request id may hold "52": look for the array).
    assert r.headers["x-request-id"] in doc["error"] and "52, 49" not in r.text and "52,49" not in r.text

    first = {"model_name": "echo", "text_output": "ok", "sequence_id": 7}  # a scalar: metadata, passes
    events = [
        b"data: " + json.dumps(e).encode() + b"\n\n"
        for e in (first, {"model_name": "echo", "output_ids": ids})
    ]
    kserve_up.handler = lambda _r: streamed(events, gap_s=0.05)
    received = b""
    stream = client.stream("POST", "/v2/models/echo/generate_stream", json={"text_input": "x"})
    with pytest.raises(httpx.HTTPError), stream as r:  # noqa: PT012
        assert r.status_code == 200
        for chunk in r.iter_raw():
            received += chunk
    assert b"output_ids" not in received and b"[52" not in received


def test_tokens_in_an_openai_answer_are_not_passed_unread(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    """An answer's logprobs spell its text token by token, where redaction cannot follow: asked
    for, the request is refused (test_pii); sent unasked (llama.cpp does for its own `n_probs`
    field, which the gateway also refuses), the answer is refused, a stream cut before them."""
    tokens = {"content": [{"token": "4111", "bytes": [52, 49, 49, 49], "logprob": -0.1, "top_logprobs": []}]}
    whole = {"choices": [{"index": 0, "message": {"content": "<CREDIT_CARD>"}, "logprobs": tokens}]}
    openai_up.handler = lambda _r: json_answer(whole)
    r = client.post(
        "/v1/chat/completions", json={"model": "llama3-8b", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 502, r.text
    err = r.json()["error"]
    assert err["code"] == "upstream_bad_response" and "choices[0].logprobs" in err["message"]
    assert "4111" not in r.text and "52, 49" not in r.text
    # Null, as vLLM sends when none were asked for, is no answer text.
    openai_up.handler = lambda _r: json_answer(
        {"choices": [{"index": 0, "message": {"content": "ok"}, "logprobs": None}]}
    )
    r = client.post(
        "/v1/chat/completions", json={"model": "llama3-8b", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok", r.text

    first = {"choices": [{"index": 0, "delta": {"content": "ok "}, "logprobs": None}]}
    second = {"choices": [{"index": 0, "delta": {"content": "4111"}, "logprobs": tokens}]}
    events = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in (first, second)] + [b"data: [DONE]\n\n"]
    openai_up.handler = lambda _r: streamed(events, gap_s=0.05)
    received = b""
    body = {"model": "llama3-8b", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(httpx.HTTPError), client.stream("POST", "/v1/chat/completions", json=body) as r:  # noqa: PT012
        assert r.status_code == 200
        for chunk in r.iter_raw():
            received += chunk
    assert b"logprobs" not in received.replace(b'"logprobs":null', b"") and b"4111" not in received


# An upstream's extra answer headers: a debug echo of the prompt (holding a card number the body
# may not carry), a cookie, a redirect, CORS grants. None is the client's business.
_UPSTREAM_EXTRA = {
    "x-debug-prompt": "card 4111 1111 1111 1111",
    "set-cookie": "upstream_session=1",
    "location": "http://10.0.0.5/internal",
    "access-control-allow-origin": "*",
    "x-vllm-version": "0.11.0",
}


def test_only_protocol_headers_of_an_answer_reach_the_client(
    client: httpx.Client, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream
) -> None:
    def whole(_r: object) -> web.Response:
        resp = json_answer({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})
        resp.headers.update({**_UPSTREAM_EXTRA, "retry-after": "3", "cache-control": "no-store"})
        return resp

    openai_up.handler = whole
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": False})
    assert r.status_code == 200, r.text
    assert not set(_UPSTREAM_EXTRA) & set(r.headers), r.headers
    assert r.headers["retry-after"] == "3" and r.headers["cache-control"] == "no-store"
    assert not [h for h in r.headers if h.startswith("x-envoy-")]  # no upstream timing either

    events = [b'data: {"model_name": "echo", "text_output": "ok"}\n\n']
    kserve_up.handler = lambda _r: streamed(events, headers=_UPSTREAM_EXTRA)
    with client.stream("POST", "/v2/models/echo/generate_stream", json={"text_input": "x"}) as s:
        body = s.read()
    assert s.status_code == 200 and b'"ok"' in body
    assert not set(_UPSTREAM_EXTRA) & set(s.headers), s.headers
    assert s.headers["content-type"].startswith("text/event-stream") and "x-request-id" in s.headers
