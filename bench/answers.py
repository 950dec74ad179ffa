"""What remembering delivered answers costs (figures, not a test).

    .venv/bin/python -m bench.answers [--redis redis://127.0.0.1:6379/0] [--calls 2000]

Against a real Redis, in-process (one event loop, as a worker runs it): the SETTLE write of one
chat answer (`AnswerLedger.remember`, one text), and the request-side lookup of a conversation's
assistant turns (`AnswerLedger.known`), cold (each turn asked of Redis: a worker that did not
deliver the answer) and warm (known to this worker's cache). Prints p50/p99 per call. Its keys
live under a prefix of their own and are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

from gateway.answers import AnswerLedger


async def _timed(calls: int, work: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    times: list[float] = []
    for i in range(calls):
        t = time.perf_counter()
        await work(i)
        times.append(time.perf_counter() - t)
    q = statistics.quantiles(times, n=100)
    return q[49] * 1e3, q[98] * 1e3


async def run(url: str, calls: int) -> None:
    prefix = f"ztgate-bench-{secrets.token_hex(4)}:"
    ledger = AnswerLedger.from_url(url, prefix, secrets.token_bytes(32), 1.0)
    answer = "The capital of France is Paris. It has been the capital since the 10th century. " * 4

    def text(i: int) -> str:
        return f"{i}: {answer}"

    try:
        p50, p99 = await _timed(calls, lambda i: ledger.remember("acme", "alice", [text(i)], 3600))
        print(f"remember 1 answer                       p50 {p50:.3f} ms  p99 {p99:.3f} ms")
        for turns in (1, 4, 16):
            ledger._known.clear()  # every lookup goes to Redis

            async def cold(i: int, turns: int = turns) -> object:
                ledger._known.clear()
                return await ledger.known("acme", "alice", [text(i + j) for j in range(turns)], 3600)

            p50, p99 = await _timed(calls, cold)
            print(f"known, {turns:2d} turns, asked of Redis         p50 {p50:.3f} ms  p99 {p99:.3f} ms")
            history = [text(j) for j in range(turns)]
            await ledger.known("acme", "alice", history, 3600)

            async def warm(_i: int, history: list[str] = history) -> object:
                return await ledger.known("acme", "alice", history, 3600)

            p50, p99 = await _timed(calls, warm)
            print(f"known, {turns:2d} turns, this worker's cache    p50 {p50:.3f} ms  p99 {p99:.3f} ms")
    finally:
        keys = [k async for k in ledger.client.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await ledger.client.delete(*keys[i : i + 500])
        await ledger.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    asyncio.run(run(args.redis, args.calls))


if __name__ == "__main__":
    main()
