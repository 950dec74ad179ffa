"""Test environments: real Envoy + real ext_proc workers (+ real or scripted upstreams), random ports.

Everything starts in dependency order through the same code `ztgate up` uses; logs are dumped only
when a test fails (see conftest).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from gateway.procs import free_port
from gateway.registry import Registry
from gateway.settings import Settings
from gateway.supervisor import Gateway

if TYPE_CHECKING:
    import trustme

ROOT = Path(__file__).resolve().parent.parent
KEY = "ztg-test-key-0001"
OTHER_TENANT_KEY = "ztg-test-key-0002"


def write_keys(path: Path) -> Path:
    """A key file with two test principals."""
    from filters.principal import digest

    path.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"id": "k1", "sha256": digest(KEY), "user": "alice", "tenant": "acme", "groups": ["dev"]},
                    {
                        "id": "k2",
                        "sha256": digest(OTHER_TENANT_KEY),
                        "user": "bob",
                        "tenant": "globex",
                        "groups": [],
                    },
                ]
            }
        )
    )
    return path


@dataclass
class Recorded:
    """One request a scripted upstream received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Recorded], web.StreamResponse | Any]


@dataclass
class ScriptedUpstream:
    """An HTTP upstream in a background thread that records what arrived and answers by script.

    It exists to prove what the gateway sent (or did not send) upstream.
    """

    name: str
    port: int = field(default_factory=free_port)
    requests: list[Recorded] = field(default_factory=list)
    handler: Handler | None = None
    tls: ssl.SSLContext | None = None  # serve HTTPS with this context
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None

    async def _handle(self, req: web.Request) -> web.StreamResponse:
        rec = Recorded(
            req.method, req.path_qs, {k.lower(): v for k, v in req.headers.items()}, await req.read()
        )
        self.requests.append(rec)
        if self.handler is None:
            return web.json_response({"upstream": self.name, "path": req.path})
        result = self.handler(rec)
        if asyncio.iscoroutine(result):
            result = await result
        if isinstance(result, _Streamed):
            resp = web.StreamResponse(headers={"content-type": result.content_type, **result.headers})
            await resp.prepare(req)
            for chunk in result.chunks:
                await resp.write(chunk)
                await asyncio.sleep(result.gap_s)
            await resp.write_eof()
            return resp
        assert isinstance(result, web.StreamResponse)
        return result

    def start(self) -> ScriptedUpstream:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(
                web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls).start()
            )
            ready.set()
            loop.run_forever()
            loop.close()

        threading.Thread(target=run, daemon=True, name=f"upstream-{self.name}").start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop and self._runner:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)


@dataclass
class _Streamed:
    chunks: list[bytes]
    content_type: str = "text/event-stream"
    gap_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def streamed(
    chunks: list[bytes],
    content_type: str = "text/event-stream",
    gap_s: float = 0.0,
    headers: dict[str, str] | None = None,
) -> _Streamed:
    """A scripted answer sent as these exact body chunks (with these extra headers)."""
    return _Streamed(chunks, content_type, gap_s, headers or {})


def json_answer(doc: Any, status: int = 200) -> web.Response:
    """A scripted JSON answer."""
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type="application/json")


@dataclass
class GatewayEnv:
    """A running gateway for tests."""

    gw: Gateway
    url: str

    @property
    def settings(self) -> Settings:
        return self.gw.settings

    def logs(self, lines: int = 60) -> str:
        """The last `lines` of every child's log (0: all of it)."""
        return "\n".join(
            f"===== {p.name} ({p.log_path}) =====\n{p.log_tail(lines or 10**9)}" for p in self.gw.procs
        )

    def stop(self) -> None:
        from gateway.procs import stop_all

        stop_all(self.gw.procs)
        self._forget_redis_keys()

    def _forget_redis_keys(self) -> None:
        """Drop this gateway's risk keys from the shared Redis (review records never expire)."""
        import redis

        client = redis.Redis.from_url(self.settings.redis_url, socket_timeout=1, socket_connect_timeout=1)
        try:
            keys = list(client.scan_iter(match=f"{self.settings.redis_prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        except redis.RedisError:
            pass  # a test that pointed the gateway at a dead Redis left nothing there
        finally:
            client.close()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `ztgate ARGS` as an operator would, against this gateway's Redis keys, audit chains and Consul."""
        s = self.settings
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "ZTGATE_REDIS_PREFIX": s.redis_prefix,
            "ZTGATE_AUDIT_DIR": str(s.audit_path),
            "ZTGATE_AUDIT_KEY_FILE": str(s.audit_key_path),
            "ZTGATE_CONSUL_URL": s.consul_url,
            "ZTGATE_CONSUL_KEY": s.consul_key,
        }
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", *args],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
            env=env,
        )

    def audit(self, kind: str = "request") -> list[dict[str, Any]]:
        """The audit records of this kind so far, all workers' chains, each chain verified first."""
        from gateway import audit

        out: list[dict[str, Any]] = []
        for path in audit.chain_files(self.settings.audit_path):
            checked = audit.verify(path, keep=True)
            assert checked.ok, checked.problem
            out += [r for r in checked.kept if r["kind"] == kind]
        return out

    def await_audit(self, records: int) -> list[dict[str, Any]]:
        """The request audit records once there are `records` of them (up to 10 s): a stream's
        record is written after its last chunk reached the client."""
        until = time.monotonic() + 10
        while len(found := self.audit()) < records:
            assert time.monotonic() < until, f"{len(found)} audit records, not {records}"
            time.sleep(0.1)
        return found

    def metrics(self) -> str:
        """The metrics page, as /metrics renders it from every worker's counts."""
        from gateway import metrics

        return metrics.render(metrics.read_dir(self.gw.run_dir / "metrics"))

    def await_metric(self, line: str) -> str:
        """The metrics page once it shows `line` (workers write their counts once a second)."""
        until = time.monotonic() + 10
        while line not in (m := self.metrics()):
            assert time.monotonic() < until, m
            time.sleep(0.2)
        return m

    def audit_for(self, request_id: str) -> dict[str, Any]:
        """The one audit record of a request."""
        found = [r for r in self.audit() if r["trace_id"] == request_id]
        assert len(found) == 1, f"{len(found)} audit records for {request_id}"
        return found[0]


def start_gateway(
    tmp: Path,
    registry: dict[str, Any],
    *,
    workers: int = 2,
    env: dict[str, str] | None = None,
    demo_upstreams: bool = False,
) -> GatewayEnv:
    """Start workers and Envoy (and the demo upstreams if asked) on random loopback ports.

    A port picked as free can be taken by some client's ephemeral port before we bind it; such a
    start is retried with fresh ports (twice at most), any other failure is raised at once.
    """
    from gateway.procs import StartError

    for attempt in range(3):
        try:
            return _start_once(tmp / f"try{attempt}", registry, workers, env or {}, demo_upstreams)
        except StartError as exc:
            if attempt == 2 or not _port_clash(str(exc)):
                raise
    raise AssertionError("unreachable")


def spawn_up(env: dict[str, str], out: Path, *args: str) -> subprocess.Popen[bytes]:
    """`ztgate up ARGS` as operators run it: a child process in its own session, its output in `out`."""
    with out.open("wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "up", *args],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def running(tmp: Path, registry: dict[str, Any], **kw: Any) -> Iterator[GatewayEnv]:
    """A gateway for one test: its logs shown if the test fails, stopped afterwards."""
    from tests.conftest import forget, remember

    env = remember(start_gateway(tmp, registry, **kw))
    try:
        yield env
    finally:
        forget(env)
        env.stop()


def running_policy(
    tmp: Path, registry: dict[str, Any], policy_text: str, env: dict[str, str] | None = None, **kw: Any
) -> contextlib.AbstractContextManager[GatewayEnv]:
    """`running`, enforcing `policy_text` (written to tmp/policy.yaml; the gateway in tmp/gw)."""
    tmp.mkdir(exist_ok=True)
    pol = tmp / "policy.yaml"
    pol.write_text(policy_text)
    return running(tmp / "gw", registry, env={"ZTGATE_POLICY_FILE": str(pol), **(env or {})}, **kw)


def _port_clash(message: str) -> bool:
    m = message.lower()
    return "address already in use" in m or "cannot bind" in m or "already taken" in m


def _start_once(
    tmp: Path, registry: dict[str, Any], workers: int, env: dict[str, str], demo_upstreams: bool
) -> GatewayEnv:
    """Start workers and Envoy (and the demo upstreams if asked) on random loopback ports."""
    tmp.mkdir(parents=True, exist_ok=True)
    reg_path = tmp / "registry.yaml"
    reg_path.write_text(yaml.safe_dump(registry))
    extra = {
        "ZTGATE_REGISTRY_FILE": str(reg_path),
        "ZTGATE_KEYS_FILE": str(write_keys(tmp / "keys.yaml")),
        "ZTGATE_LISTEN_PORT": str(free_port()),
        "ZTGATE_ADMIN_PORT": str(free_port()),
        "ZTGATE_ENVOY_ADMIN_PORT": str(free_port()),
        "ZTGATE_WORKER_PORTS": ",".join(str(free_port()) for _ in range(workers)),
        "ZTGATE_STATE_DIR": str(ROOT / ".cache" / "ztgate"),
        # Each gateway its own risk keys in the shared Redis and its own audit chains.
        "ZTGATE_REDIS_PREFIX": f"ztgate-test-{uuid.uuid4().hex[:12]}:",
        "ZTGATE_AUDIT_DIR": str(tmp / "audit"),
        "PYTHONPATH": str(ROOT),
        **env,
    }
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        settings = Settings.from_env()
        gw = Gateway(settings, Registry.load(reg_path), tmp / "run")
        gw.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            if demo_upstreams:
                gw.start_demo_upstreams()
            gw.start_gateway()
        except BaseException:
            from gateway.procs import stop_all

            stop_all(gw.procs)
            raise
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return GatewayEnv(gw, f"{settings.scheme}://127.0.0.1:{settings.listen_port}")


def chat_answer(content: str) -> web.Response:
    """A whole OpenAI chat completion saying `content`, as a model server answers it."""
    return json_answer(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "chat",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    )  # fmt: skip


def chat_registry(port: int) -> dict[str, Any]:
    """A registry with one OpenAI upstream on `port` serving model `chat` (version 1)."""
    return registry_for(
        {"v": ("openai", port)}, {"chat": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )


def registry_for(
    upstreams: dict[str, tuple[str, int]],
    models: dict[str, Any],
    server_default: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A registry document from (protocol, port) upstreams and model specs."""
    return {
        "upstreams": {
            n: {"protocol": p, "host": "127.0.0.1", "port": port} for n, (p, port) in upstreams.items()
        },
        "models": models,
        "server_default": server_default or {},
    }


def tls_listener_files(tmp: Path, ca: trustme.CA) -> dict[str, str]:
    """A certificate for 127.0.0.1 from `ca`, written under tmp, as the listener's TLS settings."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(tmp / "server.key"))
    (tmp / "server.crt").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    return {"ZTGATE_TLS_CERT_FILE": str(tmp / "server.crt"), "ZTGATE_TLS_KEY_FILE": str(tmp / "server.key")}
