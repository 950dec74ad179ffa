"""Latency and CPU benchmark on loopback (figures, not a test).

Side by side in one run, against the same upstream (an Envoy direct_response, so the upstream costs
almost nothing): Envoy alone as a pass-through proxy; the gateway with a no-op chain
(`static_route`: request headers only); the gateway with the real chain (principal + protocol +
route: 2 ext_proc phases, since no filter reads the answer); the same chain with the answer read
(`bench.answer_reader`, a filter that takes the answer and does nothing: 4 phases, the answer
parsed), the chain with PII redaction of answers (4 phases, as the shipped default policy
has it), and the real chain again with Envoy's link to the workers under mutual TLS
(`full+mTLS`) and behind a trusted proxy (`full+proxies`: ZTGATE_TRUSTED_PROXIES names the load
generator, whose requests carry x-forwarded-for), and the shipped policy's chain without the
classifier (`+ risk+audit`: the Redis review check and one audit record per request;
`+ guard+risk+audit`: auth_guard's block check in front, as the shipped policy has it). For
each, at concurrency 1, 8 and 32: req/s, p50/p99 latency, the p50/p99 added over Envoy alone,
and CPU µs per request of Envoy and of the workers (from /proc). Then time to first token on a
streamed answer, Envoy alone vs the chains.

    .venv/bin/python -m bench.latency [--requests 3000] [--workers 2] [--configs 'grpc floor,+ answers']

The workers inherit the environment, so gRPC's own switches can be compared the same way (e.g.
`GRPC_EXPERIMENTS=-event_engine_callback_cq`).

The load generator is Python (asyncio + uvloop, raw HTTP/1.1 keep-alive) on the same 2 cores, so
absolute req/s are lower than a C load generator would show; the added latency is the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop
import yaml
from aiohttp import web

from filters.principal import digest
from gateway.procs import Proc, free_port, http_ok, port_open, stop_all
from gateway.registry import Registry
from gateway.settings import Settings
from gateway.supervisor import Gateway, envoy_binary

KEY = "ztg-bench-key"
ANSWER = json.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
)
BODY = json.dumps(
    {"model": "bench", "messages": [{"role": "user", "content": "Summarise the quarterly report " * 4}]}
)
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int, thread: int | None = None) -> float:
    """CPU seconds of a process (all threads), or of one of its threads."""
    where = f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat"
    fields = Path(where).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _cpu(stack: Stack) -> tuple[float, float, float]:
    """Envoy, all worker threads, and the workers' main threads (the event loop: every line of
    Python, uvloop and gRPC's callbacks; the rest is gRPC's own poller and engine threads)."""
    return (
        _cpu_s(stack.envoy_pid),
        sum(_cpu_s(p) for p in stack.worker_pids),
        sum(_cpu_s(p, p) for p in stack.worker_pids),
    )


def _upstream_envoy(port: int, admin: int, out: Path) -> Proc:
    cfg = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "up",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "up",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "direct_response": {
                                                                "status": 200,
                                                                "body": {"inline_string": ANSWER},
                                                            },
                                                            "response_headers_to_add": [
                                                                {
                                                                    "header": {
                                                                        "key": "content-type",
                                                                        "value": "application/json",
                                                                    }
                                                                }
                                                            ],
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                                                },
                                            }
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }
    path = out / "upstream-envoy.json"
    path.write_text(json.dumps(cfg))
    return Proc(
        "upstream",
        [
            envoy_binary(),
            "-c",
            str(path),
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "--log-level",
            "error",
        ],
        out / "upstream.log",
    )


def _sse_upstream(port: int) -> None:
    async def handler(req: web.Request) -> web.StreamResponse:
        await req.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(req)
        for i in range(5):
            ev = {"choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]}
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            await asyncio.sleep(0.005)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def run() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)

    threading.Thread(target=run, daemon=True).start()


@dataclass
class Stack:
    name: str
    url_port: int
    procs: list[Proc]
    envoy_pid: int
    worker_pids: list[int]


def _extproc_tls(d: Path, on: bool) -> dict[str, Path]:
    """Mutual TLS between Envoy and the workers (a throwaway trustme CA), or none."""
    names = {
        "cert": "ZTGATE_EXTPROC_TLS_CERT_FILE",
        "key": "ZTGATE_EXTPROC_TLS_KEY_FILE",
        "ca": "ZTGATE_EXTPROC_TLS_CA_FILE",
    }
    for var in names.values():
        os.environ.pop(var, None)
    if not on:
        return {}
    import trustme  # a test dependency: the benchmark runs in the dev venv

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    files = {"cert": d / "x.crt", "key": d / "x.key", "ca": d / "ca.crt"}
    files["cert"].write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    ca.cert_pem.write_to_path(str(files["ca"]))
    os.environ.update({names[k]: str(f) for k, f in files.items()})
    return files


def _start_gateway(  # noqa: PLR0917 - a benchmark helper, called in one place
    tmp: Path, name: str, filters: str, up_port: int, sse_port: int, workers: int, envoy_only: bool, mode: str
) -> Stack:
    reg = {
        "upstreams": {
            "bench": {"protocol": "openai", "host": "127.0.0.1", "port": up_port},
            "sse": {"protocol": "openai", "host": "127.0.0.1", "port": sse_port},
        },
        "models": {
            "bench": {"latest": "1", "versions": {"1": {"upstream": "bench"}}},
            "stream": {"latest": "1", "versions": {"1": {"upstream": "sse"}}},
        },
    }
    d = tmp / name
    d.mkdir()
    (d / "registry.yaml").write_text(yaml.safe_dump(reg))
    (d / "keys.yaml").write_text(
        yaml.safe_dump({"keys": [{"id": "b", "sha256": digest(KEY), "user": "bench", "tenant": "bench"}]})
    )
    os.environ.update(
        {
            "ZTGATE_FILTERS": filters,
            "ZTGATE_STATIC_UPSTREAM": "bench",
            "ZTGATE_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "info"),
            "ZTGATE_FILTER_MODULES": "bench.answer_reader",
            # risk + audit: a Redis prefix of this run's own, the chains in the run's folder.
            "ZTGATE_REDIS_PREFIX": f"ztgate-bench-{os.getpid()}:",
            "ZTGATE_AUDIT_DIR": str(d / "audit"),
            "ZTGATE_AUDIT_KEY_FILE": str(d / "audit.key"),
        }
    )
    tls_files = _extproc_tls(d, mode == "mTLS")
    s = Settings(
        extproc_tls_cert_file=tls_files.get("cert"),
        extproc_tls_key_file=tls_files.get("key"),
        extproc_tls_ca_file=tls_files.get("ca"),
        # The load generator plays the load balancer: its x-forwarded-for names the client.
        trusted_proxies=("127.0.0.1",) if mode == "proxies" else (),
        listen_port=free_port(),
        envoy_admin_port=free_port(),
        worker_ports=tuple(free_port() for _ in range(workers)),
        registry_file=d / "registry.yaml",
        keys_file=d / "keys.yaml",
        filters=tuple(filters.split(",")),
        filter_modules=("bench.answer_reader",),
        static_upstream="bench",
        log_level="warning",
    )
    gw = Gateway(s, Registry.load(s.registry_file), d / "run")
    gw.run_dir.mkdir(parents=True)
    if envoy_only:
        from gateway import envoy_config

        doc = envoy_config.render(s, gw.registry)
        hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["http_filters"] = hcm["http_filters"][1:]  # no ext_proc
        hcm["access_log"] = []
        hcm["route_config"]["virtual_hosts"][0]["routes"] = [
            {
                "match": {"prefix": "/", "headers": [{"name": "x-bench-stream", "present_match": True}]},
                "route": {"cluster": "up_sse"},
            },
            {"match": {"prefix": "/"}, "route": {"cluster": "up_bench"}},
        ]
        cfg = gw.run_dir / "envoy.json"
        cfg.write_text(json.dumps(doc))
        p = Proc(
            "envoy",
            [envoy_binary(), "-c", str(cfg), "--log-level", "warn", "--disable-hot-restart"],
            gw.run_dir / "envoy.log",
        ).start()
        p.wait_ready(lambda: http_ok(f"http://127.0.0.1:{s.envoy_admin_port}/ready"), 30)
        return Stack(name, s.listen_port, [p], p.popen.pid if p.popen else 0, [])
    bare = filters == "bare"
    if bare:
        # Envoy of the real gateway, but the bare floor server in place of each worker.
        s = dataclasses.replace(s, filters=("static_route",))
        gw = Gateway(s, gw.registry, gw.run_dir)
        os.environ["ZTGATE_FILTERS"] = "static_route"
        for port in s.worker_ports:
            p = Proc(
                f"bare-{port}",
                [sys.executable, "-m", "bench.bare_extproc", str(port), "up_bench"],
                gw.run_dir / f"bare-{port}.log",
            ).start()
            gw.procs.append(p)
            gw.workers.append(p)
            p.wait_ready(functools.partial(port_open, "127.0.0.1", port), 30)
        gw.start_gateway(with_workers=False)
    else:
        gw.start_gateway()
    if gw.envoy is None or gw.envoy.popen is None:
        raise RuntimeError("envoy did not start")
    return Stack(
        name,
        s.listen_port,
        gw.procs,
        gw.envoy.popen.pid,
        [w.popen.pid for w in gw.workers if w.popen is not None],
    )


def _request(port: int, body: str, stream: bool = False, forwarded: bool = False) -> bytes:
    b = body.encode()
    extra = "x-bench-stream: 1\r\n" if stream else ""
    extra += "x-forwarded-for: 198.51.100.7\r\n" if forwarded else ""
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(b)}\r\n{extra}\r\n"
    ).encode() + b


async def _read_response(
    reader: asyncio.StreamReader, on_first_byte: Callable[[], None] | None = None
) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    else:
        first = True
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if first and size and on_first_byte:
                on_first_byte()
                first = False
            if size == 0:
                break
            del chunk
    return status


async def _load(port: int, req: bytes, concurrency: int, total: int) -> tuple[list[float], float, int]:
    lat: list[float] = []
    errors = 0
    remaining = total

    async def conn() -> None:
        nonlocal remaining, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            writer.write(req)
            status = await _read_response(reader)
            lat.append(time.perf_counter() - t0)
            errors += status != 200
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(conn() for _ in range(concurrency)))
    return lat, time.perf_counter() - t0, errors


async def _ttft(port: int, n: int) -> list[float]:
    out: list[float] = []
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": "stream", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    req = _request(port, body, stream=True)
    for _ in range(n):
        t0 = time.perf_counter()
        first: list[float] = []
        writer.write(req)
        await _read_response(reader, functools.partial(_mark, first, t0))
        out.append(first[0])
    writer.close()
    return out


def _mark(into: list[float], t0: float) -> None:
    into.append(time.perf_counter() - t0)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def _subset(
    ap: argparse.ArgumentParser, configs: list[tuple[str, str, bool, str]], names: str
) -> list[tuple[str, str, bool, str]]:
    """The set-ups named in --configs, with envoy-only (the added columns' base)."""
    wanted = {"envoy-only", *(c.strip() for c in names.split(","))}
    unknown = wanted - {c[0] for c in configs}
    if unknown:
        ap.error(f"--configs: unknown set-ups {sorted(unknown)}; known: {[c[0] for c in configs]}")
    return [c for c in configs if c[0] in wanted]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="requests per concurrency level")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ttft", type=int, default=200, help="streamed requests for time to first token")
    ap.add_argument(
        "--configs",
        help="comma-separated subset of the set-ups, e.g. 'grpc floor,+ answers' (envoy-only always runs: "
        "the added columns are measured against it)",
    )
    args = ap.parse_args()
    configs = [
        ("envoy-only", "static_route", True, ""),
        ("grpc floor", "bare", False, ""),
        ("no-op chain", "static_route", False, ""),
        ("full chain", "principal,protocol,route", False, ""),
        # The same, with Envoy's link to the workers under mutual TLS (ZTGATE_EXTPROC_TLS_*).
        ("full+mTLS", "principal,protocol,route", False, "mTLS"),
        # The same, behind a trusted proxy (ZTGATE_TRUSTED_PROXIES) that names the client in XFF.
        ("full+proxies", "principal,protocol,route", False, "proxies"),
        ("+ answers", "principal,protocol,route,read_answers", False, ""),
        ("chain + pii", "principal,protocol,route,pii", False, ""),
        # The shipped policy's chain without the classifier: + the Redis review check per request
        # and one chained audit record (fingerprints) per request.
        ("+ risk+audit", "principal,risk,protocol,route,pii,audit", False, ""),
        # auth_guard first, as the shipped policy has it: + its block check per request.
        ("+ guard+risk+audit", "auth_guard,principal,risk,protocol,route,pii,audit", False, ""),
    ]
    if args.configs:
        configs = _subset(ap, configs, args.configs)
    results: dict[str, dict[int, dict[str, float]]] = {}
    ttft: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        up_port, sse_port = free_port(), free_port()
        upstream = _upstream_envoy(up_port, free_port(), tmp).start()
        upstream.wait_ready(lambda: port_open("127.0.0.1", up_port), 30)
        _sse_upstream(sse_port)
        try:
            for name, filters, envoy_only, mode in configs:
                stack = _start_gateway(
                    tmp, name.replace(" ", "-"), filters, up_port, sse_port, args.workers, envoy_only, mode
                )
                try:
                    req = _request(stack.url_port, BODY, forwarded=mode == "proxies")
                    asyncio.run(_load(stack.url_port, req, 8, 300))  # warm-up
                    results[name] = {}
                    for c in (1, 8, 32):
                        cpu0 = _cpu(stack)
                        lat, wall, errors = asyncio.run(_load(stack.url_port, req, c, args.requests))
                        cpu1 = _cpu(stack)
                        n = len(lat)
                        results[name][c] = {
                            "rps": n / wall,
                            "p50": _pct(lat, 0.5),
                            "p99": _pct(lat, 0.99),
                            "errors": errors,
                            "envoy_us": (cpu1[0] - cpu0[0]) / n * 1e6,
                            "workers_us": (cpu1[1] - cpu0[1]) / n * 1e6,
                            "main_us": (cpu1[2] - cpu0[2]) / n * 1e6,
                        }
                    if name in (
                        "envoy-only",
                        "full chain",
                        "full+mTLS",
                        "+ answers",
                        "chain + pii",
                        "+ risk+audit",
                        "+ guard+risk+audit",
                    ):
                        ttft[name] = asyncio.run(_ttft(stack.url_port, args.ttft))
                finally:
                    stop_all(stack.procs)
        finally:
            upstream.stop()
    print(
        f"\nztgate latency benchmark, {os.cpu_count()} cores, {args.workers} workers, "
        f"{args.requests} requests per level, Python {sys.version.split()[0]}"
    )
    print("added = this config's latency minus envoy-only's at the same concurrency")
    print("workers = all threads of the worker processes; loop = their main threads (Python, uvloop,")
    print("gRPC callbacks), the rest being gRPC's own poller and engine threads\n")
    print(
        f"{'config':<18} {'c':>3} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} "
        f"{'envoy µs':>9} {'workers µs':>11} {'loop µs':>8} {'errors':>6}"
    )
    base = results["envoy-only"]
    for name, by_c in results.items():
        for c, r in by_c.items():
            print(
                f"{name:<18} {c:>3} {r['rps']:>8.0f} {r['p50']:>8.2f} {r['p99']:>8.2f} "
                f"{r['p50'] - base[c]['p50']:>8.2f} {r['p99'] - base[c]['p99']:>8.2f} "
                f"{r['envoy_us']:>9.0f} {r['workers_us']:>11.0f} {r['main_us']:>8.0f} {r['errors']:>6.0f}"
            )
    print("\nstreamed answer, time to first content chunk (c=1):")
    for name, xs in ttft.items():
        print(f"  {name:<18} p50 {_pct(xs, 0.5):.2f} ms  p99 {_pct(xs, 0.99):.2f} ms")
    alone = ttft["envoy-only"]
    for name, xs in ttft.items():
        if name != "envoy-only":
            print(
                f"  added by {name}: p50 {_pct(xs, 0.5) - _pct(alone, 0.5):.2f} ms, "
                f"mean {(statistics.mean(xs) - statistics.mean(alone)) * 1000:.2f} ms"
            )


if __name__ == "__main__":
    uvloop.install()
    main()
