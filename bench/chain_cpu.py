"""CPU of the gateway's own Python per request, without gRPC (figures, not a test).

`bench.latency` measures whole worker processes behind real Envoy, so its CPU figures include
grpc.aio's per-message cost (its `grpc floor` row). This drives `ExtProcServer.process`, the
code every ext_proc stream runs, in one process with the messages Envoy would send (request
headers and body, then answer headers and body for the set-ups that read answers), and reads
the process's CPU time per request: protobuf parse and serialize, the server, the chain, the
filters, metrics and the request's JSON log line (written to /dev/null). What is left of the
worker CPU in `bench.latency` is gRPC's.

    .venv/bin/python -m bench.chain_cpu [--requests 5000] [--rounds 3] [--evict MB] [--no-copies]

In a tight loop every request finds the code and data of the one before in the CPU's caches.
Behind Envoy at concurrency 1 it does not: Envoy, the load generator and the other workers run
between two requests of a worker. `--evict MB` touches every cache line of a buffer that size
before each request (not counted), so the figures show what a request costs when it starts with
cold caches.

`--no-copies` sets `review_cache_s` and `block_cache_s` to 0: risk and auth_guard then ask Redis
on every request instead of answering from the worker's copies (gateway.redis_copies).

The set-ups are bench.latency's, and `+ guard+risk+audit` (auth_guard first, as the shipped
policy has it; the request carries the client address Envoy would add). Those with risk or
auth_guard need Redis on ZTGATE_REDIS_URL, default
127.0.0.1:6379; its keys use a prefix of this run's own and are deleted at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvloop
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench.latency import ANSWER, BODY, KEY
from filters.chain import BuildEnv
from filters.principal import digest
from gateway.extproc import convert as cv
from gateway.extproc.server import ExtProcServer
from gateway.metrics import Metrics
from gateway.observability import setup_logging
from gateway.policy import source_for
from gateway.registry import Registry
from gateway.settings import Settings

# (name, filters, ext_proc messages per request: what the chain asks Envoy for)
CONFIGS = (
    ("no-op chain", "static_route", 1),
    ("full chain", "principal,protocol,route", 2),
    ("+ answers", "principal,protocol,route,read_answers", 4),
    ("chain + pii", "principal,protocol,route,pii", 4),
    ("+ risk+audit", "principal,risk,protocol,route,pii,audit", 4),
    ("+ guard+risk+audit", "auth_guard,principal,risk,protocol,route,pii,audit", 4),
)
_NO_COPIES = {"risk": {"review_cache_s": 0}, "auth_guard": {"block_cache_s": 0}}


def _headers(pairs: list[tuple[str, str]]) -> Any:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])


def _messages() -> list[bytes]:
    """Envoy's four messages for one buffered chat completion, as bytes on the wire."""
    request_headers = [
        (":authority", "127.0.0.1:8080"),
        (":path", "/v1/chat/completions"),
        (":method", "POST"),
        (":scheme", "http"),
        ("authorization", f"Bearer {KEY}"),
        ("content-type", "application/json"),
        ("content-length", str(len(BODY))),
        ("user-agent", "bench"),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "7d4c5a1e-2b9f-4c3d-8e6f-0a1b2c3d4e5f"),
        ("x-envoy-external-address", "192.0.2.1"),
    ]
    answer_headers = [
        (":status", "200"),
        ("content-type", "application/json"),
        ("content-length", str(len(ANSWER))),
        ("date", "Wed, 02 Dec 2026 04:00:00 GMT"),
        ("server", "envoy"),
        ("x-envoy-upstream-service-time", "0"),
    ]
    msgs = [
        cv.ProcessingRequest(request_headers=pb.HttpHeaders(headers=_headers(request_headers))),
        cv.ProcessingRequest(request_body=pb.HttpBody(body=BODY.encode(), end_of_stream=True)),
        cv.ProcessingRequest(response_headers=pb.HttpHeaders(headers=_headers(answer_headers))),
        cv.ProcessingRequest(response_body=pb.HttpBody(body=ANSWER.encode(), end_of_stream=True)),
    ]
    return [m.SerializeToString() for m in msgs]


async def _requests(wire: list[bytes]) -> AsyncIterator[Any]:
    for raw in wire:
        yield cv.ProcessingRequest.FromString(raw)


async def _one(server: ExtProcServer, wire: list[bytes]) -> int:
    """One request's stream; the number of answers (one per message unless the chain refused)."""
    answers = 0
    async for resp in server.process(_requests(wire), None):
        cv.ProcessingResponse.SerializeToString(resp)
        answers += 1
    return answers


async def _timed(server: ExtProcServer, wire: list[bytes], requests: int, evict: bytearray) -> float:
    """CPU seconds of `requests` requests, each after touching `evict` (if any; not counted)."""
    spent = 0.0
    for _ in range(requests):
        if evict:
            evict[::64]  # touches every cache line of the buffer
        t0 = time.process_time()
        await _one(server, wire)
        spent += time.process_time() - t0
    t0 = time.process_time()
    await server.drain()
    return spent + time.process_time() - t0


async def _measure(  # noqa: PLR0917 - a benchmark helper, called in one place
    tmp: Path,
    name: str,
    filters: str,
    messages: int,
    requests: int,
    rounds: int,
    evict: bytearray,
    no_copies: bool,
) -> list[float]:
    d = tmp / name.replace(" ", "-").replace("+", "p")
    d.mkdir()
    reg = {
        "upstreams": {"bench": {"protocol": "openai", "host": "127.0.0.1", "port": 9}},
        "models": {"bench": {"latest": "1", "versions": {"1": {"upstream": "bench"}}}},
    }
    (d / "registry.yaml").write_text(yaml.safe_dump(reg))
    (d / "keys.yaml").write_text(
        yaml.safe_dump({"keys": [{"id": "b", "sha256": digest(KEY), "user": "bench", "tenant": "bench"}]})
    )
    prefix = f"ztgate-chain-cpu-{os.getpid()}:"
    chain = [{"filter": f, **(_NO_COPIES.get(f, {}) if no_copies else {})} for f in filters.split(",")]
    (d / "policy.yaml").write_text(yaml.safe_dump({"version": 1, "chain": chain}))
    s = Settings.from_env(
        {
            **os.environ,
            "ZTGATE_FILTERS": "",
            "ZTGATE_POLICY_FILE": str(d / "policy.yaml"),
            "ZTGATE_STATIC_UPSTREAM": "bench",
            "ZTGATE_FILTER_MODULES": "bench.answer_reader",
            "ZTGATE_REGISTRY_FILE": str(d / "registry.yaml"),
            "ZTGATE_KEYS_FILE": str(d / "keys.yaml"),
            "ZTGATE_STATE_DIR": str(d / "state"),
            "ZTGATE_AUDIT_DIR": str(d / "audit"),
            "ZTGATE_REDIS_PREFIX": prefix,
        }
    )
    env = BuildEnv(s, instance="w1")
    metrics = Metrics()
    registry = Registry.load(s.registry_file)
    policy = source_for(env, metrics.record)
    server = ExtProcServer(lambda: policy.current, lambda: registry, s.phase_budget_s, metrics)
    wire = _messages()[:messages]
    try:
        for _ in range(300):  # warm-up: caches, first-use imports, Redis connections
            if await _one(server, wire) != messages:
                raise RuntimeError(f"{name}: the chain refused the benchmark request")
        return [await _timed(server, wire, requests, evict) / requests * 1e6 for _ in range(rounds)]
    finally:
        if {"risk", "auth_guard"} & set(filters.split(",")):
            await _drop_keys(env, prefix)
        await env.close()


async def _drop_keys(env: BuildEnv, prefix: str) -> None:
    """Delete this run's Redis keys (the bench user's risk graph, the bench network's failures)."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(env.settings.redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--evict", type=int, default=0, metavar="MB", help="touch MB of memory before each request"
    )
    ap.add_argument("--no-copies", action="store_true", help="risk and auth_guard ask Redis on every request")
    args = ap.parse_args()
    evict = bytearray(args.evict * 1024 * 1024)
    results = []
    with tempfile.TemporaryDirectory() as tmpdir, open(os.devnull, "w") as null:
        for name, filters, messages in CONFIGS:
            # The request log lines go to /dev/null: their formatting counts, a terminal would not.
            with contextlib.redirect_stderr(null):
                setup_logging("info")
                rounds = uvloop.run(
                    _measure(
                        Path(tmpdir),
                        name,
                        filters,
                        messages,
                        args.requests,
                        args.rounds,
                        evict,
                        args.no_copies,
                    )
                )
            results.append((name, messages, rounds))
    print(
        f"\nztgate in-process CPU per request (no gRPC), {args.requests} requests x {args.rounds} rounds, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores"
        + (f", every cache line of {args.evict} MB touched before each request" if args.evict else "")
        + (", risk and auth_guard asking Redis every request (--no-copies)" if args.no_copies else "")
        + "\n"
    )
    print(f"{'config':<18} {'messages':>8} {'µs per request (each round)':>30}")
    for name, phases, rounds in results:
        print(f"{name:<18} {phases:>8} {' '.join(f'{r:8.0f}' for r in rounds):>30}")


if __name__ == "__main__":
    main()
