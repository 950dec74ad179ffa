"""The README's run command, as a newcomer runs it: `ztgate up` in the foreground, ready, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from gateway import audit
from gateway.procs import free_port, http_ok, port_open
from gateway.supervisor import DEMO_KEY
from tests.e2e.conftest import demo_registry
from tests.harness import ROOT, spawn_up


def test_ztgate_up_serves_the_demo_and_stops_cleanly(tmp_path: Path) -> None:
    reg = demo_registry(free_port(), free_port())
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(reg))
    ports = {k: free_port() for k in ("LISTEN", "ADMIN", "ENVOY_ADMIN")}
    env = {
        **os.environ,
        "ZTGATE_REGISTRY_FILE": str(tmp_path / "registry.yaml"),
        "ZTGATE_STATE_DIR": str(tmp_path / "state"),
        "ZTGATE_WORKER_PORTS": f"{free_port()},{free_port()}",
        "ZTGATE_REDIS_PREFIX": f"ztgate-test-{uuid.uuid4().hex[:12]}:",
        **{f"ZTGATE_{k}_PORT": str(v) for k, v in ports.items()},
    }
    # The demo key file is the embedded default: the printed key must work.
    env.pop("ZTGATE_KEYS_FILE", None)
    out = tmp_path / "up.out"
    proc = spawn_up(env, out)
    try:
        deadline = time.monotonic() + 90
        while not http_ok(f"http://127.0.0.1:{ports['ADMIN']}/readyz"):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        ready = httpx.get(f"http://127.0.0.1:{ports['ADMIN']}/readyz").json()
        assert ready["checks"]["redis"] is True  # the shipped policy counts risk in Redis
        files = ready["files"]
        assert files["keys"]["last_error"] is None and files["keys"]["revision"]
        # The demo keys do not expire: nothing to rotate.
        assert (files["keys"]["expired"], files["keys"]["expiring"], files["keys"]["disabled"]) == (
            [],
            [],
            [],
        )
        assert files["registry"]["revision"]
        text = out.read_text()
        assert DEMO_KEY in text and "openai" in text and "curl" in text
        r = httpx.post(
            f"http://127.0.0.1:{ports['LISTEN']}/v1/chat/completions",
            headers={"authorization": f"Bearer {DEMO_KEY}"},
            json={"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        # ...and audits every call: one chained record, a fingerprint and no text.
        chains = audit.chain_files(tmp_path / "state" / "audit")
        assert chains and all(audit.verify(c).ok for c in chains)
        records = [rec for c in chains for rec in audit.verify(c, keep=True).kept]
        mine = [rec for rec in records if rec.get("trace_id") == r.headers["x-request-id"]]
        assert len(mine) == 1 and mine[0]["model"]["ref"] == "tiny-llama@v1"
        assert mine[0]["prompt"]["fingerprint"].startswith("hmac-sha256:") and "text" not in mine[0]["prompt"]
        # The shipped policy redacts answers: Triton echoes a mobile number, the client gets a placeholder.
        r = httpx.post(
            f"http://127.0.0.1:{ports['LISTEN']}/v2/models/echo/generate",
            headers={"authorization": f"Bearer {DEMO_KEY}"},
            json={"text_input": "手机13800138000"},
        )
        assert r.status_code == 200 and r.json()["text_output"].endswith("手机<CN_MOBILE>"), r.text
        # Workers publish their metrics once a second.
        until = time.monotonic() + 10
        while 'kind="response:CN_MOBILE"' not in (
            metrics := httpx.get(f"http://127.0.0.1:{ports['ADMIN']}/metrics").text
        ):
            assert time.monotonic() < until, metrics
            time.sleep(0.2)
        assert 'ztgate_findings_total{filter="pii",action="redact",kind="response:CN_MOBILE"} 1.0' in metrics
        assert 'ztgate_filter_seconds_count{filter="principal",phase="request_headers"}' in metrics
        assert 'ztgate_requests_total{outcome="allowed"}' in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, out.read_text()
    for port in (
        ports["LISTEN"],
        reg["upstreams"]["triton-demo"]["port"],
        reg["upstreams"]["llama-demo"]["port"],
    ):
        assert not port_open("127.0.0.1", port), f"port {port} still served after stop"


@pytest.mark.parametrize(
    ("variable", "text", "message"),
    [
        (
            "ZTGATE_REGISTRY_FILE",
            "upstreams:\n  a: {protocol: openai, host: x, prot: 1}\nmodels: {}\n",
            "2:34: unknown key 'prot': did you mean 'port'?",
        ),
        (
            "ZTGATE_POLICY_FILE",
            "version: 1\nchain:\n  - filter: principle\n",
            "3:13: unknown filter 'principle': did you mean 'principal'?",
        ),
    ],
)
def test_ztgate_up_refuses_broken_files_with_located_problems(
    tmp_path: Path, variable: str, text: str, message: str
) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text(text)
    env = {**os.environ, variable: str(bad), "ZTGATE_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "up"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2
    assert f"{bad}:{message}" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
