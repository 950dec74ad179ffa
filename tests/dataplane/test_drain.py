"""A stop that lets the requests in flight finish: `ztgate up` run as operators run it (a child
process, stopped by SIGTERM), real Envoy and workers, a model server that streams slowly.

Proved: a streamed answer under way when the stop begins arrives whole and is audited; /readyz
says 503 from the first moment of the stop; a request that comes in meanwhile is still served,
with `connection: close`; the wait ends at `ZTGATE_DRAIN_S`, or at a second signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from aiohttp import web

from gateway import audit
from gateway.procs import free_port, http_ok
from tests.harness import (
    KEY,
    ROOT,
    Recorded,
    ScriptedUpstream,
    chat_answer,
    chat_registry,
    spawn_up,
    streamed,
    write_keys,
)

pytestmark = pytest.mark.dataplane

POLICY = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: audit
default_action: allow
"""


def _event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def _slow(parts: int, gap_s: float) -> ScriptedUpstream:
    """A model server that streams `parts` events `gap_s` apart, and answers others at once."""

    def handle(r: Recorded) -> web.StreamResponse | object:
        if not json.loads(r.body).get("stream"):
            return chat_answer("ok")
        return streamed([*(_event(f"part{i} ") for i in range(parts)), b"data: [DONE]\n\n"], gap_s=gap_s)

    up = ScriptedUpstream("slow").start()
    up.handler = handle
    return up


@dataclass
class _Up:
    proc: subprocess.Popen[bytes]
    url: str
    admin: str
    audit_dir: Path
    out: Path

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def readyz(self) -> httpx.Response:
        return httpx.get(f"{self.admin}/readyz", timeout=5)


@pytest.fixture
def up_factory(tmp_path: Path) -> Iterator[Callable[..., _Up]]:
    started: list[_Up] = []

    def start(upstream_port: int, drain_s: float | None = None) -> _Up:
        d = tmp_path / f"gw{len(started)}"
        d.mkdir()
        (d / "registry.yaml").write_text(yaml.safe_dump(chat_registry(upstream_port)))
        (d / "policy.yaml").write_text(POLICY)
        ports = {k: free_port() for k in ("LISTEN", "ADMIN", "ENVOY_ADMIN")}
        env = {
            **os.environ,
            "ZTGATE_REGISTRY_FILE": str(d / "registry.yaml"),
            "ZTGATE_POLICY_FILE": str(d / "policy.yaml"),
            "ZTGATE_KEYS_FILE": str(write_keys(d / "keys.yaml")),
            "ZTGATE_STATE_DIR": str(ROOT / ".cache" / "ztgate"),
            "ZTGATE_AUDIT_DIR": str(d / "audit"),
            "ZTGATE_WORKER_PORTS": f"{free_port()},{free_port()}",
            "ZTGATE_REDIS_PREFIX": f"ztgate-test-{uuid.uuid4().hex[:12]}:",
            **{f"ZTGATE_{k}_PORT": str(v) for k, v in ports.items()},
            **({"ZTGATE_DRAIN_S": str(drain_s)} if drain_s is not None else {}),
        }
        out = d / "up.out"
        proc = spawn_up(env, out, "--no-demo")
        gw = _Up(
            proc,
            f"http://127.0.0.1:{ports['LISTEN']}",
            f"http://127.0.0.1:{ports['ADMIN']}",
            d / "audit",
            out,
        )
        started.append(gw)
        deadline = time.monotonic() + 60
        while not http_ok(f"{gw.admin}/readyz"):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        return gw

    yield start
    for gw in started:
        if gw.proc.poll() is None:
            os.killpg(gw.proc.pid, signal.SIGKILL)
            gw.proc.wait(10)


@dataclass
class _Stream:
    """A streamed chat request read in a thread: its events as they came, and how it ended."""

    url: str
    events: list[str] = field(default_factory=list)
    first: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    request_id: str | None = None
    error: str | None = None
    thread: threading.Thread | None = None

    def start(self) -> _Stream:
        def run() -> None:
            body = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            try:
                with (
                    httpx.Client(timeout=30) as c,
                    c.stream(
                        "POST",
                        f"{self.url}/v1/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {KEY}"},
                    ) as r,
                ):
                    self.status, self.request_id = r.status_code, r.headers.get("x-request-id")
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            self.events.append(line.removeprefix("data: "))
                            self.first.set()
            except httpx.HTTPError as exc:
                self.error = type(exc).__name__
            finally:
                self.first.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the stream did not end"


def _audited(audit_dir: Path, request_id: str) -> list[dict[str, object]]:
    chains = audit.chain_files(audit_dir)
    assert chains and all(audit.verify(c).ok for c in chains)
    return [r for c in chains for r in audit.verify(c, keep=True).kept if r.get("trace_id") == request_id]


def test_a_stop_lets_a_streamed_answer_finish_and_serves_newcomers_meanwhile(
    up_factory: Callable[..., _Up],
) -> None:
    upstream = _slow(parts=8, gap_s=0.4)  # about 3 s of answer
    try:
        gw = up_factory(upstream.port)
        s = _Stream(gw.url).start()
        assert s.first.wait(10) and s.error is None, s.error
        gw.stop()
        until = time.monotonic() + 3
        while (ready := gw.readyz()).status_code != 503:
            assert time.monotonic() < until, ready.text
            time.sleep(0.05)
        assert ready.json()["checks"]["accepting"] is False
        # A client that arrives during the drain is served, and told to close its connection.
        late = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        assert late.status_code == 200 and late.headers["connection"] == "close", late.headers
        assert gw.proc.poll() is None  # still draining: the stream is not over
        s.join(15)
        assert s.error is None and s.status == 200
        assert [json.loads(e)["choices"][0]["delta"]["content"] for e in s.events[:-1]] == [
            f"part{i} " for i in range(8)
        ]
        assert s.events[-1] == "[DONE]"
        assert gw.proc.wait(20) == 0, gw.out.read_text()
        assert s.request_id is not None
        [record] = _audited(gw.audit_dir, s.request_id)
        assert record["response"] is not None
        assert "drained" in gw.out.read_text()
    finally:
        upstream.stop()


@pytest.mark.parametrize("how", ["timeout", "second signal"])
def test_the_drain_ends_at_its_timeout_or_at_a_second_signal(
    up_factory: Callable[..., _Up], how: str
) -> None:
    upstream = _slow(parts=40, gap_s=0.5)  # 20 s of answer: longer than the drain allows
    try:
        gw = up_factory(upstream.port, drain_s=2 if how == "timeout" else 600)
        s = _Stream(gw.url).start()
        assert s.first.wait(10) and s.error is None, s.error
        t0 = time.monotonic()
        gw.stop()
        if how == "second signal":
            time.sleep(1)
            assert gw.proc.poll() is None  # draining
            gw.stop(signal.SIGINT)
        assert gw.proc.wait(30) == 0, gw.out.read_text()
        took = time.monotonic() - t0
        s.join(10)
        assert s.events[-1:] != ["[DONE]"]  # cut: the answer had not ended
        assert took < 15, took
        if how == "timeout":
            assert took >= 2, took
        assert "drain_cut_short" in gw.out.read_text()
    finally:
        upstream.stop()
