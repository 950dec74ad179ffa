"""Request-rate and token quotas through the real gateway: two workers, one Redis, the `openai` SDK.

What is proved is what the client got (status, error shape, retry headers), what reached the
upstream, and what the audit record says, with the count shared by both workers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.procs import free_port
from tests.harness import (
    KEY,
    OTHER_TENANT_KEY,
    GatewayEnv,
    ScriptedUpstream,
    chat_registry,
    json_answer,
    running_policy,
    streamed,
)

pytestmark = pytest.mark.dataplane

POLICY = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: quota
    limits:
{limits}
  - filter: route
  - filter: audit
default_action: allow
fail_mode: {{redis: {redis_mode}}}
"""


def _answer(total_tokens: int | None) -> Any:
    doc: dict[str, Any] = {
        "id": "x", "object": "chat.completion", "created": 0, "model": "chat",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }  # fmt: skip
    if total_tokens is not None:
        doc["usage"] = {
            "prompt_tokens": total_tokens - 1,
            "completion_tokens": 1,
            "total_tokens": total_tokens,
        }
    return json_answer(doc)


@pytest.fixture(scope="module")
def up() -> Iterator[ScriptedUpstream]:
    u = ScriptedUpstream("openai").start()
    u.handler = lambda _r: _answer(20)
    yield u
    u.stop()


def _gateway(tmp: Path, port: int, limits: str, redis_mode: str = "deny", **env: str) -> Any:
    return running_policy(tmp, chat_registry(port), POLICY.format(limits=limits, redis_mode=redis_mode), env)


def _client(env: GatewayEnv, key: str = KEY, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{env.url}/v1", api_key=key, max_retries=retries, timeout=10)


def _shown(env: GatewayEnv) -> Any:
    """alice's counters, as `ztgate quota show` prints them."""
    return json.loads(env.cli("quota", "show", "--tenant", "acme", "--user", "alice").stdout)


def _ask(client: openai.OpenAI) -> str:
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hello"}])
    return r.choices[0].message.content or ""


def test_requests_over_a_user_limit_are_refused_with_retry_after_on_every_worker(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    limits = "      - {name: per-user-minute, per: user, requests: 3, window_s: 60}"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        alice = _client(env)
        assert [_ask(alice) for _ in range(3)] == ["ok"] * 3  # Envoy spreads them over both workers
        with pytest.raises(openai.RateLimitError) as info:
            _ask(alice)
        resp = info.value.response
        err = resp.json()["error"]
        assert resp.status_code == 429 and err["code"] == "rate_limit_exceeded", resp.text
        assert err["type"] == "rate_limit_error"
        assert err["message"].startswith("rate limit 'per-user-minute' reached (3 requests per 60 s)")
        assert 1 <= int(resp.headers["retry-after"]) <= 60
        assert 0 < int(resp.headers["retry-after-ms"]) <= 60_000
        assert resp.headers["x-ratelimit-limit-requests"] == "3"
        assert resp.headers["x-ratelimit-remaining-requests"] == "0"
        assert len(up.requests) == 3  # the refused one never reached the model
        env.await_metric('ztgate_quota_refusals_total{limit="per-user-minute",mode="enforce"} 1.0')
        refused = env.audit_for(resp.headers["x-request-id"])
        assert refused["decision"]["outcome"] == "denied"
        (v,) = [
            v for v in refused["decision"]["verdicts"] if v["filter"] == "quota" and v["phase"] == "admit"
        ]
        assert v["action"] == "deny" and v["detail"].startswith("limit=per-user-minute,retry_after_ms=")
        # Another user's counter is their own; the refused user stays refused (a refusal is not
        # counted, so retrying early does not push the window on, and does not free it either).
        assert _ask(_client(env, OTHER_TENANT_KEY)) == "ok"
        with pytest.raises(openai.RateLimitError):
            _ask(alice)
        admitted = [
            r
            for r in env.audit()
            if r["decision"]["outcome"] == "allowed" and r["principal"]["tenant"] == "acme"
        ]
        details = sorted(
            v["detail"]
            for r in admitted
            for v in r["decision"]["verdicts"]
            if (v["filter"], v["phase"]) == ("quota", "admit")
        )
        assert details == [f"per-user-minute={n}/3" for n in (1, 2, 3)]
        # An operator sees the counter and lifts the throttle; alice gets through again.
        shown = env.cli("quota", "show", "--tenant", "acme", "--user", "alice")
        assert shown.returncode == 0, shown.stderr
        (counter,) = json.loads(shown.stdout)
        assert (counter["per"], counter["who"], counter["limit"], counter["used"]) == (
            "user",
            "alice",
            "per-user-minute",
            3,
        )
        assert 0 < counter["expires_in_ms"] <= 60_000
        cleared = env.cli("quota", "clear", "--tenant", "acme", "--user", "alice")
        assert cleared.stdout.strip() == "acme: 1 counter(s) cleared", cleared.stderr
        assert _ask(alice) == "ok"


def test_the_openai_sdk_waits_out_retry_after_and_gets_through(tmp_path: Path, up: ScriptedUpstream) -> None:
    limits = "      - {name: burst, per: key, requests: 1, window_s: 2}"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        client = _client(env, retries=2)
        assert _ask(client) == "ok"
        started = time.monotonic()
        assert _ask(client) == "ok"  # refused once, retried after retry-after-ms by the SDK itself
        waited = time.monotonic() - started
        assert 0.5 < waited < 6, waited
        assert len(up.requests) == 2
        refusals = [r for r in env.audit() if r["decision"]["outcome"] == "denied"]
        assert len(refusals) >= 1 and all(r["decision"]["status"] == 429 for r in refusals)


def test_a_tenant_token_quota_counts_usage_and_estimates_streams_without_it(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    # Each whole answer reports 20 tokens; globex may use 50 per minute, across its users. With no
    # max_tokens each request reserves 2 ("hello", estimated) + reserve_tokens 8 while in flight.
    limits = "      - {name: tenant-tokens, per: tenant, tokens: 50, window_s: 60}\n    reserve_tokens: 8"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        globex = _client(env, OTHER_TENANT_KEY)
        assert [_ask(globex) for _ in range(2)] == ["ok", "ok"]  # 0, then 20 used: 10 more fit
        # a stream without usage: its tokens are estimated from the prompt and the answer text
        up.handler = lambda _r: streamed(
            [
                b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"chat",'
                b'"choices":[{"index":0,"delta":{"content":"' + b"y" * 40 + b'"},"finish_reason":null}]}\n\n',
                b"data: [DONE]\n\n",
            ]
        )
        try:
            stream = globex.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hello"}], stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "y" * 40
        finally:
            up.handler = lambda _r: _answer(20)
        with pytest.raises(openai.RateLimitError) as info:
            _ask(globex)  # 40 + 10 fitted the stream; 20 + 20 + 12 = 52 used: over 50
        resp = info.value.response
        assert resp.json()["error"]["code"] == "token_quota_exceeded", resp.text
        assert resp.headers["x-ratelimit-limit-tokens"] == "50"
        assert len(up.requests) == 3
        counted = sorted(
            v["detail"]
            for r in env.await_audit(4)  # the stream's record is written after its last chunk
            for v in r["decision"]["verdicts"]
            if v["filter"] == "quota" and v["phase"] == "tokens"
        )
        # "hello" (5 bytes) + 40 bytes of answer = 45 bytes: 12 tokens estimated
        assert counted == ["tokens=12,source=estimate", "tokens=20,source=usage", "tokens=20,source=usage"]
        m = env.await_metric('ztgate_quota_tokens_total{source="usage"} 40.0')
        assert 'ztgate_quota_tokens_total{source="estimate"} 12.0' in m
        assert _ask(_client(env, KEY)) == "ok"  # acme's quota is its own


def _chunk(content: str | None, usage: int | None = None, asked: bool = False) -> bytes:
    doc: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "chat"}
    if asked:
        doc["usage"] = None  # as OpenAI writes every chunk of a stream that asked for usage
    if content is None:  # the usage chunk, as vLLM and llama.cpp send it
        doc |= {
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": usage, "total_tokens": 3 + (usage or 0)},
        }
    else:
        doc["choices"] = [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _usage_streamed(r: Any) -> Any:
    """A stream that sends the usage chunk only when asked, split mid-event as a server may."""
    asked = (json.loads(r.body).get("stream_options") or {}).get("include_usage") is True
    body = (
        _chunk("Call 13812345678 now", asked=asked)
        + (_chunk(None, 9) if asked else b"")
        + b"data: [DONE]\n\n"
    )
    cut = body.rindex(b'"usage"') if asked else len(body) // 2  # inside the usage chunk
    return streamed([body[:cut], body[cut:]])


@pytest.mark.parametrize("with_pii", [False, True], ids=["quota", "quota+pii"])
def test_a_stream_is_counted_by_the_servers_usage_which_the_client_gets_only_if_it_asked(
    tmp_path: Path, up: ScriptedUpstream, with_pii: bool
) -> None:
    policy = POLICY.format(
        limits="      - {name: tpm, per: user, tokens: 10000, window_s: 60}\n    reserve_tokens: 64",
        redis_mode="deny",
    )
    if with_pii:  # it rewrites the stream's events too: the usage chunk stays out
        policy = policy.replace("  - filter: audit", "  - filter: pii\n    response: true\n  - filter: audit")
    up.handler = _usage_streamed
    try:
        with running_policy(tmp_path, chat_registry(up.port), policy) as env, _client(env) as client:
            up.requests.clear()
            messages: Any = [{"role": "user", "content": "hi"}]
            unasked = list(client.chat.completions.create(model="chat", messages=messages, stream=True))
            asked = list(
                client.chat.completions.create(
                    model="chat", messages=messages, stream=True, stream_options={"include_usage": True}
                )
            )
            raw = httpx.post(
                f"{env.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {KEY}"},
                json={"model": "chat", "messages": messages, "stream": True},
                timeout=10,
            )
            records = env.await_audit(3)
    finally:
        up.handler = lambda _r: _answer(20)
    sent = [json.loads(r.body).get("stream_options") for r in up.requests]
    assert sent == [{"include_usage": True}] * 3, sent
    text = "".join(c.choices[0].delta.content or "" for c in unasked if c.choices)
    assert text == ("Call <CN_MOBILE> now" if with_pii else "Call 13812345678 now")
    # the client that did not ask gets no usage chunk; the one that asked gets its own
    assert unasked and all(c.usage is None and c.choices for c in unasked), unasked
    assert [c.usage.total_tokens for c in asked if c.usage] == [12] and not asked[-1].choices
    assert (
        raw.status_code == 200 and b'"usage"' not in raw.content and raw.content.endswith(b"data: [DONE]\n\n")
    )
    assert "content-length" not in raw.headers or int(raw.headers["content-length"]) == len(raw.content)
    counted = [v["detail"] for r in records for v in r["decision"]["verdicts"] if v["phase"] == "tokens"]
    assert counted == ["tokens=12,source=usage"] * 3, counted
    reserved = sorted(
        v["detail"] for r in records for v in r["decision"]["verdicts"] if v["phase"] == "reserve"
    )
    assert [d.endswith(",usage=asked") for d in reserved].count(True) == 2, reserved


def test_requests_in_flight_reserve_their_tokens_so_a_burst_cannot_spend_one_windows_room(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    # 50 tokens a minute; each request may use 2 ("hello", estimated) + max_tokens 20 = 22.
    gate = threading.Event()

    async def held(_r: Any) -> Any:
        await asyncio.to_thread(gate.wait, 30)
        return _answer(20)

    def chat(model: str = "chat") -> httpx.Response:
        return httpx.post(
            f"{env.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {KEY}"},
            json={"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hello"}]},
            timeout=30,
        )

    def reserved() -> int:
        shown = _shown(env)
        return sum(c["reserved"] for c in shown if c["kind"] == "tokens")

    limits = "      - {name: tpm, per: user, tokens: 50, window_s: 60}"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        up.handler = held
        got: list[httpx.Response] = []
        burst = [threading.Thread(target=lambda: got.append(chat())) for _ in range(5)]
        try:
            for t in burst:
                t.start()
            deadline = time.monotonic() + 10
            while len(got) < 3 or len(up.requests) < 2:
                assert time.monotonic() < deadline, (len(got), len(up.requests))
                time.sleep(0.02)
            # 22 more fitted in 50 with 0 and 22 held: two forwarded and held; the other three
            # found no room among the reservations and were refused, told to retry soon.
            time.sleep(0.3)
            assert len(up.requests) == 2 and len(got) == 3
            for r in got:
                assert r.status_code == 429 and r.json()["error"]["code"] == "token_quota_exceeded", r.text
                assert r.headers["retry-after"] == "1"
                assert "has no room for this request's 22 tokens" in r.json()["error"]["message"]
            assert reserved() == 44
        finally:
            gate.set()
            up.handler = lambda _r: _answer(20)
        for t in burst:
            t.join(10)
        assert sorted(r.status_code for r in got) == [200, 200, 429, 429, 429]
        # Each answer's 20 tokens replaced its reservation: 40 used, nothing reserved, and the
        # next request (22 more) waits for the window to slide, not for a request in flight.
        assert reserved() == 0
        r = chat()
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 50, r.text
        assert len(up.requests) == 2
        details = sorted(
            v["detail"]
            for rec in env.audit()
            for v in rec["decision"]["verdicts"]
            if v["filter"] == "quota" and v["phase"] in ("reserve", "tokens")
        )
        assert details == [
            "tokens=20,source=usage", "tokens=20,source=usage",
            "tokens=22,tpm=0/50", "tokens=22,tpm=22/50",
        ]  # fmt: skip


def test_a_request_refused_after_its_reservation_gives_it_back(tmp_path: Path, up: ScriptedUpstream) -> None:
    limits = "      - {name: tpm, per: user, tokens: 30, window_s: 60}\n    reserve_tokens: 8"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()

        def chat(model: str) -> httpx.Response:
            return httpx.post(
                f"{env.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {KEY}"},
                json={"model": model, "messages": [{"role": "user", "content": "hello"}]},
                timeout=10,
            )

        # No max_tokens: 2 + the policy's reserve_tokens (8) held while in flight. A model the
        # registry does not know is refused by `route`, after quota reserved: nothing was used.
        for _ in range(3):
            r = chat("no-such-model")
            assert r.status_code == 404, r.text
        shown = _shown(env)
        assert [(c["used"], c["reserved"]) for c in shown if c["kind"] == "tokens"] in ([], [(0, 0)]), shown
        assert chat("chat").status_code == 200 and len(up.requests) == 1
        shown = _shown(env)
        assert [(c["used"], c["reserved"]) for c in shown if c["kind"] == "tokens"] == [(20, 0)], shown


def test_an_answer_without_a_cap_is_capped_at_its_reservation_and_a_cap_that_is_no_number_is_refused(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    limits = "      - {name: tpm, per: user, tokens: 100000, window_s: 60}\n    reserve_tokens: 256"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        client = _client(env)
        messages: Any = [{"role": "user", "content": "hello"}]
        client.chat.completions.create(model="chat", messages=messages)
        client.chat.completions.create(model="chat", messages=messages, max_tokens=12)
        # what the upstream got: the gateway's cap where the client set none, the client's own
        sent = [json.loads(r.body) for r in up.requests]
        assert [(d["model"], d.get("max_tokens")) for d in sent] == [("chat", 256), ("chat", 12)], sent
        assert sent[0]["messages"] == messages
        # a cap a model server might read as a number the quota did not count: refused unsent
        for bad in ("5e4", '"50000"', "true"):
            r = httpx.post(
                f"{env.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
                content=f'{{"model": "chat", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": {bad}}}',
                timeout=10,
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "invalid_request", r.text
            assert "'max_tokens' must be a whole number >= 0" in r.json()["error"]["message"]
            assert r.headers["x-request-id"]
        assert len(up.requests) == 2
        reserved = sorted(
            v["detail"]
            for rec in env.audit()
            for v in rec["decision"]["verdicts"]
            if v["filter"] == "quota" and v["phase"] == "reserve"
        )
        # "hello" is 2 tokens estimated; the first reserved what the gateway capped it at
        assert reserved == ["tokens=14,tpm=20/100000", "tokens=258,tpm=0/100000,capped=256"], reserved
        shown = _shown(env)
        assert [(c["used"], c["reserved"]) for c in shown if c["kind"] == "tokens"] == [(40, 0)], shown


def test_a_request_whose_reservation_does_not_fit_is_refused_even_in_an_empty_window(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    limits = "      - {name: tpm, per: user, tokens: 2000, window_s: 60}"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        client = _client(env)
        messages: Any = [{"role": "user", "content": "hello"}]
        # one answer of up to 100,000 tokens could take a 2,000-token quota 50 times over
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="chat", messages=messages, max_tokens=100_000)
        err = info.value.response.json()["error"]
        assert err["code"] == "token_quota_exceeded" and "may use 100002 tokens" in err["message"], err
        assert "retry-after" not in info.value.response.headers  # waiting would not help
        assert info.value.response.headers["x-ratelimit-limit-tokens"] == "2000"
        assert up.requests == []
        assert [(c["used"], c["reserved"]) for c in _shown(env) if c["kind"] == "tokens"] in ([], [(0, 0)])
        # the most that fits goes through
        client.chat.completions.create(model="chat", messages=messages, max_tokens=1998)
        assert len(up.requests) == 1


def test_a_concurrency_limit_holds_requests_in_flight_and_gives_leases_back_when_they_end(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    gate = threading.Event()

    async def held_if_asked(r: Any) -> Any:
        if b"hold" in r.body:
            await asyncio.to_thread(gate.wait, 30)
        return _answer(20)

    def chat(key: str, text: str, timeout: float = 10) -> httpx.Response:
        return httpx.post(
            f"{env.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": "chat", "messages": [{"role": "user", "content": text}]},
            timeout=timeout,
        )

    limits = "      - {name: in-flight, per: user, concurrent: 2}\n      - {name: rpm, requests: 100, window_s: 60}"
    with _gateway(tmp_path, up.port, limits) as env:
        up.requests.clear()
        up.handler = held_if_asked
        results: dict[str, Any] = {}

        def send(name: str, timeout: float) -> None:
            try:
                results[name] = chat(KEY, "hold", timeout).status_code
            except httpx.TimeoutException as exc:
                results[name] = type(exc).__name__

        try:
            held = threading.Thread(target=send, args=("held", 30))
            gives_up = threading.Thread(target=send, args=("gives_up", 1.5))
            held.start()
            gives_up.start()
            deadline = time.monotonic() + 5
            while len(up.requests) < 2:
                assert time.monotonic() < deadline, "the held requests did not reach the upstream"
                time.sleep(0.02)
            # alice has two requests in flight: a third is refused before anything is forwarded.
            r = chat(KEY, "hello")
            assert r.status_code == 429 and r.json()["error"]["code"] == "concurrency_limit_exceeded", r.text
            assert r.json()["error"]["message"].startswith(
                "concurrency limit 'in-flight' reached (2 requests at once)"
            )
            assert (r.headers["retry-after"], r.headers["x-ratelimit-limit-concurrent"]) == ("1", "2")
            assert len(up.requests) == 2
            assert chat(OTHER_TENANT_KEY, "hello").status_code == 200  # bob's requests are his own
            # The client that gave up ended its stream: its lease is back, so alice gets one slot.
            gives_up.join(10)
            assert results["gives_up"] == "ReadTimeout"
            deadline = time.monotonic() + 5
            while (got := chat(KEY, "hello")).status_code != 200:
                assert got.status_code == 429 and time.monotonic() < deadline, got.text
                time.sleep(0.1)
            shown = _shown(env)
            assert {(c["limit"], c["kind"], c["used"]) for c in shown} >= {("in-flight", "concurrent", 1)}
        finally:
            gate.set()
            up.handler = lambda _r: _answer(20)
        held.join(10)
        assert results["held"] == 200
        # Every lease given back: two at once again.
        assert [chat(KEY, "hello").status_code for _ in range(2)] == [200, 200]
        shown = _shown(env)
        # (a set whose last lease went is gone from Redis)
        assert [c["used"] for c in shown if c["kind"] == "concurrent"] in ([], [0]), shown
        leases = [
            v["detail"]
            for rec in env.audit()
            for v in rec["decision"]["verdicts"]
            if (v["filter"], v["phase"]) == ("quota", "lease")
        ]
        assert "in-flight=2/2" in leases and "in-flight=1/2" in leases, leases


def test_redis_down_refuses_by_default_and_flags_when_the_policy_says_so(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    limits = "      - {name: per-user, requests: 100, window_s: 60}"
    with _gateway(tmp_path / "deny", up.port, limits, ZTGATE_REDIS_URL=dead) as env:
        up.requests.clear()
        r = httpx.post(
            f"{env.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {KEY}"},
            json={"model": "chat", "messages": [{"role": "user", "content": "hello"}]},
            timeout=10,
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "quota_unavailable", r.text
        assert up.requests == []
    with _gateway(tmp_path / "flag", up.port, limits, "allow_with_flag", ZTGATE_REDIS_URL=dead) as env:
        r = httpx.post(
            f"{env.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {KEY}"},
            json={"model": "chat", "messages": [{"role": "user", "content": "hello"}]},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        modes = env.audit_for(r.headers["x-request-id"])["decision"]["fail_modes"]
        assert modes == [{"dependency": "redis", "mode": "allow_with_flag", "why": "ConnectionError"}]


def test_an_override_gives_one_tenant_a_token_quota_the_chain_entry_does_not_have(
    tmp_path: Path, up: ScriptedUpstream
) -> None:
    # The chain entry has a request limit only (it would not read answers); globex's override
    # adds a token quota, so for globex's requests, and only theirs, answers are read and counted.
    overrides = """\
overrides:
  - name: globex-tokens
    when: {tenant: [globex]}
    filter: quota
    params:
      limits:
        - {name: per-user, requests: 100, window_s: 60}
        - {name: tpm, per: tenant, tokens: 30, window_s: 60}
      reserve_tokens: 8
"""
    limits = "      - {name: per-user, requests: 100, window_s: 60}"
    text = POLICY.format(limits=limits, redis_mode="deny") + overrides
    with running_policy(tmp_path, chat_registry(up.port), text) as env:
        up.requests.clear()
        globex = _client(env, OTHER_TENANT_KEY)
        assert [_ask(globex) for _ in range(2)] == ["ok", "ok"]  # 0, then 20 tokens used
        with pytest.raises(openai.RateLimitError) as info:
            _ask(globex)  # 40 used: over 30
        assert info.value.response.json()["error"]["code"] == "token_quota_exceeded"
        alice = _client(env)
        assert [_ask(alice) for _ in range(3)] == ["ok"] * 3
        assert len(up.requests) == 5
        acme = [r for r in env.audit() if r["principal"]["tenant"] == "acme"]
        assert len(acme) == 3
        assert not [
            v for r in acme for v in r["decision"]["verdicts"] if v["phase"] in ("tokens", "override")
        ]
        globex_tokens = [
            v["detail"]
            for r in env.audit()
            if r["principal"]["tenant"] == "globex"
            for v in r["decision"]["verdicts"]
            if v["filter"] == "quota" and v["phase"] == "tokens"
        ]
        assert globex_tokens == ["tokens=20,source=usage"] * 2
