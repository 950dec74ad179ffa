"""Fail closed when the chain itself fails: down, slow, stuck, buggy. The upstream is never reached."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import forget, remember
from tests.harness import KEY, GatewayEnv, ScriptedUpstream, registry_for, running, start_gateway, streamed

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _registry(port: int) -> dict[str, Any]:
    """One OpenAI upstream serving model `m`."""
    return registry_for(
        {"vllm": ("openai", port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "vllm"}}}}
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream("openai").start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def faulty_gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream: ScriptedUpstream
) -> Iterator[GatewayEnv]:
    reg = _registry(upstream.port)
    env = remember(
        start_gateway(
            Path(tmp_path_factory.mktemp("faulty")),
            reg,
            workers=1,
            env={
                "ZTGATE_FILTERS": "principal,faulty,protocol,route",
                "ZTGATE_FILTER_MODULES": "tests.dataplane.faulty_filter",
                "ZTGATE_PHASE_BUDGET_S": "0.5",
                "ZTGATE_MESSAGE_TIMEOUT_S": "1.5",
            },
        )
    )
    yield env
    forget(env)
    env.stop()


def _post(env: GatewayEnv, fault: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}"}
    if fault:
        headers["x-test-fault"] = fault
    return httpx.post(env.url + "/v1/chat/completions", json=BODY, headers=headers, timeout=30)


def _assert_gateway_refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert r.headers["x-request-id"] in err["message"]


def test_healthy_request_passes(faulty_gateway: GatewayEnv, upstream: ScriptedUpstream) -> None:
    upstream.requests.clear()
    assert _post(faulty_gateway).status_code == 200
    assert len(upstream.requests) == 1


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        ("sleep", 504, "gateway_timeout"),  # over the Python per-phase budget: the chain's own deny
        ("block", 504, "gateway_timeout"),  # stuck event loop: Envoy's message_timeout fires
        ("raise", 500, "internal_error"),  # a bug in a filter
    ],
)
def test_slow_stuck_or_buggy_chain_denies(
    faulty_gateway: GatewayEnv, upstream: ScriptedUpstream, fault: str, status: int, code: str
) -> None:
    upstream.requests.clear()
    _assert_gateway_refused(_post(faulty_gateway, fault), status, code)
    assert upstream.requests == []
    # The worker is still serving afterwards.
    assert _post(faulty_gateway).status_code == 200


def test_exception_text_is_not_logged(faulty_gateway: GatewayEnv) -> None:
    _post(faulty_gateway, "raise")
    logs = faulty_gateway.logs()
    assert "chain_error" in logs and "RuntimeError" in logs
    assert "secret prompt text" not in logs


def test_error_while_checking_the_answer_replaces_it(
    faulty_gateway: GatewayEnv, upstream: ScriptedUpstream
) -> None:
    upstream.handler = lambda _r: streamed(
        [b'{"choices": [{"index": 0, "message": {"content": "SECRET"}}]}'], content_type="application/json"
    )
    try:
        r = _post(faulty_gateway, "raise-response")
    finally:
        upstream.handler = None
    _assert_gateway_refused(r, 500, "internal_error")
    assert b"SECRET" not in r.content


def test_ext_proc_down_is_a_5xx_and_upstream_untouched(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    reg = _registry(upstream.port)
    with running(tmp_path, reg, workers=1) as env:
        assert _post(env).status_code == 200
        for w in env.gw.workers:
            w.stop()
        upstream.requests.clear()
        r = _post(env)
        assert 500 <= r.status_code < 600
        assert r.json()["error"]["code"] == "gateway_error"
        assert r.json()["request_id"] == r.headers["x-request-id"]
        assert upstream.requests == []


def test_upstream_down_is_503_json(tmp_path: Path) -> None:
    from gateway.procs import free_port

    with running(tmp_path, _registry(free_port()), workers=1) as env:
        r = _post(env)
        _assert_gateway_refused(r, 503, "upstream_unavailable")
        assert json.loads(r.content)["request_id"] == r.headers["x-request-id"]


def test_a_dead_worker_is_taken_out_of_rotation(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    reg = _registry(upstream.port)
    with running(tmp_path, reg, workers=2) as env:
        env.gw.workers[0].stop()
        time.sleep(3)  # health checks run every second
        statuses = [_post(env).status_code for _ in range(20)]
        assert statuses == [200] * 20


def test_readiness_reports_each_part(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    reg = _registry(upstream.port)
    with running(tmp_path, reg, workers=2) as env:
        parts = env.gw.readiness()
        assert all(parts.values()) and "envoy" in parts and len(parts) == 4
        env.gw.workers[1].stop()
        parts = env.gw.readiness()
        assert [k for k, ok in parts.items() if not ok] == [f"worker:{env.settings.worker_ports[1]}"]


def test_logs_carry_request_ids_but_never_prompt_or_answer_text(
    faulty_gateway: GatewayEnv, upstream: ScriptedUpstream
) -> None:
    marker = "PROMPT-MARKER-7f3a"
    upstream.handler = lambda _r: streamed(
        [b'{"choices": [{"index": 0, "message": {"content": "ANSWER-MARKER-91c"}}]}'],
        content_type="application/json",
    )
    try:
        r = httpx.post(
            faulty_gateway.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": marker}]},
            headers={"authorization": f"Bearer {KEY}"},
        )
    finally:
        upstream.handler = None
    assert r.status_code == 200
    time.sleep(0.2)
    logs = faulty_gateway.logs()
    assert r.headers["x-request-id"] in logs
    assert marker not in logs and "ANSWER-MARKER" not in logs and KEY not in logs
