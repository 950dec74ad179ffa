"""Risk graphs in real Redis and the five-tuple audit, through real Envoy and two real workers.

Scenarios read like policy: a policy, a user, requests, the expected decision, and what the
upstream, Redis and the audit chains then hold.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway import audit
from gateway.keyfile import load_or_create
from gateway.procs import free_port
from gateway.risk import Event, RiskStore
from tests.harness import (
    KEY,
    OTHER_TENANT_KEY,
    GatewayEnv,
    Recorded,
    ScriptedUpstream,
    registry_for,
    running,
    streamed,
)

AUTH = {"authorization": f"Bearer {KEY}"}
REDIS = "redis://127.0.0.1:6379/0"

POLICY = """\
version: 1
chain:
  - filter: principal
  - filter: risk
    window_s: 3600
    threshold: 3
  - filter: protocol
  - filter: route
  - filter: access
  - filter: audit
    mode: {mode}
fail_mode: {{redis: {redis_mode}}}
rules:
  - {{name: risky-model-counts, when: {{model: ["risky@*"]}}, action: flag}}
  - {{name: secret-is-refused, when: {{model: ["secret@*"]}}, action: deny}}
  - {{name: research-needs-review, when: {{tenant: [globex], model: ["research@*"]}}, action: review}}
"""


def _chat_answer(rec: Recorded) -> web.StreamResponse:
    doc = json.loads(rec.body)
    if doc.get("stream"):
        events = [
            {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": t}}]}
            for t in ("stre", "amed ", "answer")
        ]
        raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return streamed([raw[:7], raw[7:50], raw[50:]])  # type: ignore[return-value]
    return web.json_response(
        {
            "id": "c",
            "object": "chat.completion",
            "model": doc["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "the answer"},
                    "finish_reason": "stop",
                }
            ],
        }
    )


@pytest.fixture(scope="module")
def chat_up() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream("openai", handler=_chat_answer).start()
    yield up
    up.stop()


def _registry(port: int) -> dict[str, Any]:
    models = {
        m: {"latest": "1", "versions": {"1": {"upstream": "v", "hash": "abc123"}}}
        for m in ("open", "risky", "secret", "research")
    }
    # A model whose server is down: nothing listens on its port.
    models["down"] = {"latest": "1", "versions": {"1": {"upstream": "gone", "hash": "def456"}}}
    return registry_for({"v": ("openai", port), "gone": ("openai", free_port())}, models)


def _gateway(tmp: Path, port: int, *, mode: str = "fingerprint", redis_mode: str = "deny", **env: str) -> Any:
    pol = tmp / "policy.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
    pol.write_text(POLICY.format(mode=mode, redis_mode=redis_mode))
    extra = {"ZTGATE_POLICY_FILE": str(pol), "ZTGATE_AUDIT_KEY_FILE": str(tmp / "audit.key"), **env}
    return running(tmp / "gw", _registry(port), workers=2, env=extra)


def _chat(env: GatewayEnv, model: str, key: str = KEY, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "what is the rate today?"}], **extra}
    return httpx.post(
        env.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=10
    )


def _store(env: GatewayEnv) -> RiskStore:
    return RiskStore.from_url(REDIS, env.settings.redis_prefix, 2.0)


def _status(env: GatewayEnv, tenant: str, user: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        store = _store(env)
        try:
            return await store.status(tenant, user)
        finally:
            await store.aclose()

    return asyncio.run(run())


def test_five_tuple_for_whole_and_streamed_answers_without_text(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    with _gateway(tmp_path, chat_up.port) as env:
        whole = _chat(env, "open")
        stream = _chat(env, "open", stream=True)
        assert (whole.status_code, stream.status_code) == (200, 200)
        key = load_or_create(tmp_path / "audit.key")
        rec = env.audit_for(whole.headers["x-request-id"])
        assert rec["prompt"] == {
            "chars": 23,
            "fingerprint": audit.fingerprint(key, "what is the rate today?"),
            "roles": ["user"],
        }
        assert rec["response"]["fingerprint"] == audit.fingerprint(key, "the answer")
        assert rec["model"] == {
            "ref": "open@1",
            "hash": "abc123",
            "upstream": "up_v",
            "registry": env.gw.registry.revision,
        }
        assert rec["principal"] == {"tenant": "acme", "user": "alice", "key_id": "k1"}
        assert rec["decision"]["outcome"] == "allowed" and rec["decision"]["status"] == 200
        assert rec["decision"]["upstream_error"] is None
        assert len(rec["decision"]["policy"]) == 12
        srec = env.audit_for(stream.headers["x-request-id"])
        assert srec["response"]["fingerprint"] == audit.fingerprint(key, "streamed answer")
        assert srec["request"]["stream"] is True
        # Privacy: no prompt or answer text anywhere in the chains.
        blob = "".join(p.read_text() for p in audit.chain_files(env.settings.audit_path))
        assert "rate today" not in blob and "the answer" not in blob
        # Two workers, two chains, each verified by the CLI.
        # An investigator holding a text finds who sent it, without the log holding the text.
        (tmp_path / "asked.txt").write_text("what is the rate today?")
        found = env.cli("audit", "find", "--text-file", str(tmp_path / "asked.txt"))
        hits = [json.loads(line) for line in found.stdout.splitlines()]
        assert sorted(h["trace_id"] for h in hits) == sorted(
            r.headers["x-request-id"] for r in (whole, stream)
        ), found.stderr
        one = env.cli("audit", "find", "--trace-id", whole.headers["x-request-id"])
        assert [json.loads(line)["response"]["chars"] for line in one.stdout.splitlines()] == [10]
        (tmp_path / "other.txt").write_text("what is the rate today")
        assert env.cli("audit", "find", "--text-file", str(tmp_path / "other.txt")).returncode == 1
        out = env.cli("audit", "verify", str(env.settings.audit_path))
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.count(": ok,") == len(audit.chain_files(env.settings.audit_path)) >= 1
    # Stopped workers log each chain's head: the anchor that shows records cut off the end.
    heads = {audit.verify(p).head for p in audit.chain_files(env.settings.audit_path)}
    logged = {json.loads(line)["head"] for line in env.logs(lines=0).splitlines() if '"audit_head"' in line}
    assert heads <= logged
    # Records cut off a chain's end leave a valid, shorter chain; the workers' logs show it.
    chain = max(audit.chain_files(env.settings.audit_path), key=lambda p: audit.verify(p).records)
    lines = chain.read_bytes().splitlines(keepends=True)
    chain.write_bytes(b"".join(lines[:-1]))
    assert env.cli("audit", "verify", str(chain)).returncode == 0
    worker_logs = [str(p.log_path) for p in env.gw.procs if p.name.startswith("worker")]
    cut = env.cli("audit", "verify", str(env.settings.audit_path), *(f"--heads={w}" for w in worker_logs))
    assert cut.returncode == 1, cut.stdout + cut.stderr
    assert f"{chain}: BROKEN at end: seq {len(lines) - 1} was anchored" in cut.stdout, cut.stdout
    assert cut.stdout.count(": ok,") == len(audit.chain_files(env.settings.audit_path)) - 1


def test_refusals_and_bad_input_are_audited_too(tmp_path: Path, chat_up: ScriptedUpstream) -> None:
    with _gateway(tmp_path, chat_up.port, mode="raw") as env:
        before = len(chat_up.requests)
        bad = httpx.post(env.url + "/v1/chat/completions", content=b'{"model": "open", ', headers=AUTH)
        nokey = httpx.post(env.url + "/v1/chat/completions", json={"model": "open"})
        denied = _chat(env, "secret")
        assert (bad.status_code, nokey.status_code, denied.status_code) == (400, 401, 403)
        assert len(chat_up.requests) == before
        d = {
            r.headers["x-request-id"]: env.audit_for(r.headers["x-request-id"]) for r in (bad, nokey, denied)
        }
        assert d[bad.headers["x-request-id"]]["decision"]["code"] == "invalid_json"
        assert d[bad.headers["x-request-id"]]["prompt"] is None
        assert d[nokey.headers["x-request-id"]]["principal"] is None
        assert d[nokey.headers["x-request-id"]]["decision"]["code"] == "missing_api_key"
        refused = d[denied.headers["x-request-id"]]
        assert (refused["decision"]["outcome"], refused["decision"]["code"]) == ("denied", "policy_denied")
        assert refused["prompt"]["text"] == "what is the rate today?"  # raw mode keeps the text


def test_an_answer_envoy_gave_for_a_down_model_server_is_not_recorded_as_allowed(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    with _gateway(tmp_path, chat_up.port) as env:
        before = len(chat_up.requests)
        r = _chat(env, "down")
        assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable", r.text
        assert len(chat_up.requests) == before
        rid = r.headers["x-request-id"]
        rec = env.audit_for(rid)
        assert rec["model"]["ref"] == "down@1"
        d = rec["decision"]
        assert (d["outcome"], d["status"], d["code"]) == ("upstream_error", 503, None)
        assert "connection_failure" in d["upstream_error"], d
        # The request's log line and the outcome metric say the same.
        env.await_metric('ztgate_requests_total{outcome="upstream_error"} 1.0')
        lines = [json.loads(ln) for ln in env.logs(0).splitlines() if f'"request_id": "{rid}"' in ln]
        logged = [ln for ln in lines if ln["event"] == "request"]
        assert [(ln["outcome"], ln["upstream_error"]) for ln in logged] == [
            ("upstream_error", d["upstream_error"])
        ]


def test_flags_put_a_user_under_review_across_workers_until_cleared(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    with _gateway(tmp_path, chat_up.port) as env:
        assert [_chat(env, "risky").status_code for _ in range(3)] == [200, 200, 200]
        state = _status(env, "acme", "alice")
        assert [e["kind"] for e in state["events"]] == ["policy_flag"] * 3
        assert state["graph"] == {"policy_flag": 3, "policy_flag|risky@1": 3}
        assert state["review"]["reason"] == "threshold" and state["review"]["count"] == 3
        before = len(chat_up.requests)
        held = [_chat(env, "open") for _ in range(4)]  # both workers see it: the state is in Redis
        assert {r.status_code for r in held} == {403}
        assert held[0].json()["error"]["code"] == "user_under_review"
        assert len(chat_up.requests) == before
        assert _chat(env, "open", key=OTHER_TENANT_KEY).status_code == 200  # only alice is held
        rec = env.audit_for(held[0].headers["x-request-id"])
        assert rec["decision"]["code"] == "user_under_review"

        out = env.cli("risk", "clear", "--tenant", "acme", "--user", "alice")
        assert out.returncode == 0 and "released from review" in out.stdout, out.stderr
        assert _chat(env, "open").status_code == 200


def test_a_review_rule_escalates_at_once_and_denies_count(tmp_path: Path, chat_up: ScriptedUpstream) -> None:
    with _gateway(tmp_path, chat_up.port) as env:
        assert _chat(env, "secret").status_code == 403
        assert _status(env, "acme", "alice")["graph"]["policy_deny"] == 1
        assert _chat(env, "research", key=OTHER_TENANT_KEY).status_code == 200
        review = _status(env, "globex", "bob")["review"]
        assert review["reason"] == "rule:research-needs-review"
        assert _chat(env, "open", key=OTHER_TENANT_KEY).status_code == 403
        # Operators see it: escalations by reason, fail modes by dependency (none fired here).
        m = env.await_metric('ztgate_risk_escalations_total{reason="rule"} 1.0')
        assert "ztgate_fail_mode_total{" not in m


def test_redis_down_denies_by_default(tmp_path: Path, chat_up: ScriptedUpstream) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with _gateway(tmp_path, chat_up.port, ZTGATE_REDIS_URL=dead) as env:
        before = len(chat_up.requests)
        r = _chat(env, "open")
        assert r.status_code == 503 and r.json()["error"]["code"] == "risk_unavailable"
        assert len(chat_up.requests) == before
        env.await_metric('ztgate_fail_mode_total{dependency="redis",mode="deny"} 1.0')
        rec = env.audit_for(r.headers["x-request-id"])
        assert rec["decision"]["fail_modes"] == [
            {"dependency": "redis", "mode": "deny", "why": "ConnectionError"}
        ]


def test_redis_down_with_allow_with_flag_lets_through_and_says_so(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with _gateway(tmp_path, chat_up.port, redis_mode="allow_with_flag", ZTGATE_REDIS_URL=dead) as env:
        r = _chat(env, "risky")  # checked (failed open, flagged) and its event could not be counted
        assert r.status_code == 200
        modes = env.audit_for(r.headers["x-request-id"])["decision"]["fail_modes"]
        assert [(m["dependency"], m["mode"]) for m in modes] == [
            ("redis", "allow_with_flag"),
            ("redis", "allow_with_flag"),
        ]


def test_an_unwritable_audit_log_withholds_the_answer(tmp_path: Path, chat_up: ScriptedUpstream) -> None:
    ports = [free_port(), free_port()]
    adir = tmp_path / "audit"
    adir.mkdir()
    for p in ports:  # every write to these chains fails (ENOSPC), as on a full disk
        (adir / f"testhost-w{p}.jsonl").symlink_to("/dev/full")
    env_vars = {
        "ZTGATE_AUDIT_DIR": str(adir),
        "ZTGATE_INSTANCE": "testhost",
        "ZTGATE_WORKER_PORTS": ",".join(map(str, ports)),
    }
    with _gateway(tmp_path, chat_up.port, **env_vars) as env:
        r = _chat(env, "open")
        assert r.status_code == 503 and r.json()["error"]["code"] == "audit_unavailable"
        assert "the answer" not in r.text
        assert "audit_write_failed" in env.logs(lines=0)


def test_store_window_and_threshold_in_real_redis() -> None:
    async def run() -> None:
        import uuid

        store = RiskStore.from_url(REDIS, f"ztgate-test-{uuid.uuid4().hex[:8]}:", 2.0)
        try:
            a = await store.record(
                "t", "u:1", [Event("injection", "m@1")], window_s=1, threshold=2, request_id="r1"
            )
            assert (a.count, a.review, a.escalated) == (1, None, False)
            await asyncio.sleep(1.1)  # the first event leaves the 1 s window
            b = await store.record("t", "u:1", [Event("injection")], window_s=1, threshold=2, request_id="r2")
            assert (b.count, b.escalated) == (1, False)
            c = await store.record(
                "t",
                "u:1",
                [Event("injection"), Event("policy_flag")],
                window_s=1,
                threshold=2,
                request_id="r3",
            )
            assert (c.count, c.escalated) == (3, True) and c.review is not None
            d = await store.record("t", "u:1", [Event("injection")], window_s=1, threshold=2, request_id="r4")
            assert d.escalated is False and d.review == c.review  # escalated once
            assert "{t/u%3A1}" in store.keys("t", "u:1")[0]  # one hash slot; ':' quoted
            assert await store.clear("t", "u:1") is True
            assert await store.review("t", "u:1") is None
        finally:
            await store.aclose()

    asyncio.run(run())


def _counting_stream(n: int) -> list[bytes]:
    """A streamed chat answer `w0 w1 ...` of `n` words, one SSE event a chunk, then [DONE]."""
    events = [
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": f"w{i} "}}],
        }
        for i in range(n)
    ]
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def test_a_client_that_leaves_mid_stream_leaves_an_aborted_record(tmp_path: Path) -> None:
    chunks = _counting_stream(40)
    up = ScriptedUpstream("slow", handler=lambda _: streamed(chunks, gap_s=0.05)).start()
    try:
        with _gateway(tmp_path, up.port) as env:
            body = {"model": "open", "stream": True, "messages": [{"role": "user", "content": "count"}]}
            with httpx.stream(
                "POST", env.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=10
            ) as r:
                rid = r.headers["x-request-id"]
                next(r.iter_bytes())  # the first words arrive; then the client goes away
            until = time.monotonic() + 10
            while not [x for x in env.audit() if x["trace_id"] == rid]:
                assert time.monotonic() < until, [ln for ln in env.logs(lines=0).splitlines() if rid in ln]
                time.sleep(0.1)
            rec = env.audit_for(rid)
            assert rec["decision"]["outcome"] == "aborted"
            assert 0 < rec["response"]["chars"] < len("".join(f"w{i} " for i in range(40)))
            # ...and its log line: gRPC's cancellation of the handler no longer cuts either short.
            assert any(
                f'"request_id": "{rid}"' in ln and '"event": "request"' in ln
                for ln in env.logs(0).splitlines()
            )
    finally:
        up.stop()


def test_a_client_that_leaves_at_the_answers_end_leaves_an_allowed_record(tmp_path: Path) -> None:
    """The openai SDK stops reading at [DONE] and closes, often before Envoy's last, empty body
    chunk reaches the gateway: that client had the whole answer, so the record says allowed."""
    chunks = _counting_stream(5)
    up = ScriptedUpstream("done", handler=lambda _: streamed(chunks, gap_s=0.01)).start()
    try:
        with _gateway(tmp_path, up.port) as env:
            body = {"model": "open", "stream": True, "messages": [{"role": "user", "content": "count"}]}
            rids = []
            for _ in range(3):
                with httpx.stream(
                    "POST", env.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=10
                ) as r:
                    rids.append(r.headers["x-request-id"])
                    for line in r.iter_lines():
                        if line == "data: [DONE]":
                            break  # and leave, as the SDK does
            until = time.monotonic() + 10
            while len([x for x in env.audit() if x["trace_id"] in rids]) < len(rids):
                assert time.monotonic() < until
                time.sleep(0.1)
            for rid in rids:
                rec = env.audit_for(rid)
                assert rec["decision"]["outcome"] == "allowed", rec["decision"]
                assert rec["response"]["chars"] == len("".join(f"w{i} " for i in range(5)))
    finally:
        up.stop()


def test_one_record_per_request_under_concurrent_load(tmp_path: Path, chat_up: ScriptedUpstream) -> None:
    n, concurrency = 600, 16

    async def flow(url: str) -> list[tuple[int, str]]:
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=30) as c:

            async def one(i: int) -> tuple[int, str]:
                body = {
                    "model": "open",
                    "stream": i % 3 == 0,
                    "messages": [{"role": "user", "content": f"q{i}"}],
                }
                async with sem:
                    r = await c.post(url, json=body, headers=AUTH)
                return r.status_code, r.headers["x-request-id"]

            return await asyncio.gather(*(one(i) for i in range(n)))

    # Small segments: each worker's chain is closed into several files while requests are in flight.
    with _gateway(tmp_path, chat_up.port, ZTGATE_AUDIT_SEGMENT_BYTES="65536") as env:
        results = asyncio.run(flow(env.url + "/v1/chat/completions"))
        assert {s for s, _ in results} == {200}
        records = env.audit()  # both workers' chains verified, segments and live files as one each
        assert sorted(r["trace_id"] for r in records) == sorted(rid for _, rid in results)
        chains = audit.chain_files(env.settings.audit_path)
        assert len(chains) == 2
        assert all(len(audit.segments(c)) >= 2 for c in chains), [audit.segments(c) for c in chains]
        checked = env.cli("audit", "verify", str(env.settings.audit_path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert all(" files, head " in line for line in checked.stdout.splitlines()), checked.stdout
