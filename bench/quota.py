"""What the quota and auth_guard filters cost per request (figures, not a test).

    .venv/bin/python -m bench.quota [--redis redis://127.0.0.1:6379/0] [--calls 3000]

Against a real Redis, in-process (one event loop, as a worker runs it), the filter's own hooks on
real request contexts: a request limit's admission (`Quota.on_request_headers`: one Lua script
per request, two limits), and a token limit's check at request headers, its reservation at the
request body and its count in place of the reservation at SETTLE (`TokenQuota`); a concurrency limit's lease at request headers and its release when the stream
ends; auth_guard's check of the source network at request headers (every request),
and that check plus the count of a refused key at SETTLE (with the all-networks surge count, and
without it: `surge_failures: 0`). Prints p50/p99 wall time per request and the process's CPU per request
(`time.process_time`: the filter, redis-py's asyncio client and the event loop together). The
counters live under a prefix of their own and are deleted at the end.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

import uvloop

from filters._protocols import Answer, Prompt, Segment
from filters.auth_guard import AuthGuard, AuthGuardParams
from filters.base import Principal, RequestContext
from filters.quota import Quota, QuotaParams, TokenQuota
from gateway.auth_guard import AuthFailStore
from gateway.quota import QuotaStore
from gateway.registry import Protocol, Registry

REGISTRY = Registry.from_yaml("upstreams: {}\nmodels: {}\n")


def _ctx(i: int) -> RequestContext:
    source = {"x-envoy-external-address": f"198.51.100.{i % 200}"}
    ctx = RequestContext(f"r{i}", "POST", "/v1/chat/completions", source, REGISTRY)
    ctx.principal = Principal("k1", f"user{i % 50}", "acme")
    ctx.prompt = Prompt(Protocol.OPENAI, "chat", "m", segments=(Segment("user", "hello " * 60),), document={})
    ctx.answer = Answer(usage={"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100})
    return ctx


async def _timed(calls: int, work: Callable[[int], Awaitable[object]]) -> tuple[float, float, float]:
    times: list[float] = []
    cpu0 = time.process_time()
    for i in range(calls):
        t = time.perf_counter()
        await work(i)
        times.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu0) / calls
    q = statistics.quantiles(times, n=100)
    return q[49] * 1e3, q[98] * 1e3, cpu * 1e6


async def run(url: str, calls: int) -> None:
    prefix = f"ztgate-bench-{secrets.token_hex(4)}:"
    store = QuotaStore.from_url(url, prefix, 1.0)
    requests = Quota(
        store,
        QuotaParams.model_validate(
            {
                "limits": [
                    {"name": "per-user", "per": "user", "requests": 100_000, "window_s": 60},
                    {"name": "per-tenant", "per": "tenant", "requests": 100_000, "window_s": 60},
                ]
            }
        ),
    )
    tokens = TokenQuota(
        store,
        QuotaParams.model_validate(
            {"limits": [{"name": "tpm", "per": "tenant", "tokens": 10**12, "window_s": 3600}]}
        ),
    )

    in_flight = Quota(
        store,
        QuotaParams.model_validate({"limits": [{"name": "in-flight", "per": "user", "concurrent": 100_000}]}),
    )

    async def lease_and_release(i: int) -> None:
        ctx = _ctx(i)
        await in_flight.on_request_headers(ctx)
        await in_flight.on_end(ctx)

    # the all-networks count on, with a surge threshold no run reaches; and off
    guard = AuthGuard(
        AuthFailStore(store.client, prefix),
        AuthGuardParams(failures=10_000, window_s=60, block_s=1, surge_failures=10_000_000),
    )
    no_surge = AuthGuard(
        AuthFailStore(store.client, prefix),
        AuthGuardParams(failures=10_000, window_s=60, block_s=1, surge_failures=0),
    )

    async def guard_check(i: int) -> None:
        await guard.on_request_headers(_ctx(i))

    async def guard_check_and_count(i: int) -> None:
        ctx = _ctx(i)
        await guard.on_request_headers(ctx)
        ctx.error_code = "invalid_api_key"
        await guard.on_settle(ctx)

    async def guard_check_and_count_no_surge(i: int) -> None:
        ctx = _ctx(i)
        await no_surge.on_request_headers(ctx)
        ctx.error_code = "invalid_api_key"
        await no_surge.on_settle(ctx)

    async def admit(i: int) -> None:
        await requests.on_request_headers(_ctx(i))

    async def token_check_reserve_and_count(i: int) -> None:
        ctx = _ctx(i)
        await tokens.on_request_headers(ctx)
        await tokens.on_request_body(ctx, b"")
        await tokens.on_settle(ctx)

    try:
        await _timed(200, admit)  # warm-up: connections, script loading
        print(f"quota and auth_guard filters against {url}, {calls} requests each, one event loop")
        for name, work in (
            ("request limits (2), admit", admit),
            ("token limit, check+reserve+count", token_check_reserve_and_count),
            ("concurrency, lease + release", lease_and_release),
            ("auth_guard, check", guard_check),
            ("auth_guard, refused key", guard_check_and_count),
            ("  without the surge count", guard_check_and_count_no_surge),
        ):
            p50, p99, cpu = await _timed(calls, work)
            print(f"  {name:<32} p50 {p50:.3f} ms  p99 {p99:.3f} ms  CPU {cpu:.0f} µs per request")
    finally:
        keys = [k async for k in store.client.scan_iter(match=f"{prefix}*")]
        if keys:
            await store.client.delete(*keys)
        await store.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    uvloop.run(run(args.redis, args.calls))


if __name__ == "__main__":
    main()
