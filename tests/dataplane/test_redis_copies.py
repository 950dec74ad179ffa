"""Worker-local copies of Redis keys (review records, network blocks) against real Redis.

The promise is that a copy is reused only while Redis is telling the worker of every change to
those keys. These scenarios change the keys the ways operators and replicas do, break the link
(killed, silent, flushed) and check what a lookup then gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis

from gateway.auth_guard import AuthFailStore, block_copies
from gateway.procs import free_port
from gateway.redis_copies import MISS, RedisCopies, read_through
from gateway.risk import RiskStore, review_copies
from tests.harness import KEY, ScriptedUpstream, registry_for, running_policy

REDIS = "redis://127.0.0.1:6379/0"
POLICY = """\
version: 1
chain:
  - filter: auth_guard
  - filter: principal
  - filter: risk
  - filter: protocol
  - filter: route
"""


async def _until(cond: Callable[[], bool], what: str, within_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _cache(
    url: str = REDIS, **kw: float
) -> AsyncIterator[tuple[RedisCopies[dict[str, Any] | None], RiskStore]]:
    prefix = f"ztgate-test-cache-{os.getpid()}-{free_port()}:"
    cache = review_copies(url, prefix, kw.pop("timeout_s", 0.5), **kw)
    store = RiskStore.from_url(REDIS, prefix, 2.0)
    try:
        assert cache.get("warm-up") is MISS  # the first lookup starts the link
        await _until(lambda: cache.live, "the cache subscribed")
        yield cache, store
    finally:
        keys = [k async for k in store.client.scan_iter(match=f"{prefix}*")]
        if keys:
            await store.client.delete(*keys)
        await cache.aclose()
        await store.aclose()


async def _look(cache: RedisCopies[dict[str, Any] | None], store: RiskStore, key: str) -> object:
    """What the risk filter does: the copy, else Redis (kept if nothing changed meanwhile)."""
    return await read_through(cache, key, store.review_at, 2.0, lambda _: 10.0)


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_a_change_by_anyone_reaches_every_copy_at_once() -> None:
    async def scenario() -> None:
        async with _cache() as (cache, store):
            key = store.keys("acme", "alice")[2]
            assert await _look(cache, store, key) is None
            assert cache.get(key) is None  # kept: the next request does not ask Redis
            # Another replica escalates (the Lua script), then an operator clears (DEL).
            rec = await store.record("acme", "alice", [], window_s=60, threshold=1, escalate="rule:x")
            assert rec.escalated
            await _until(lambda: cache.get(key) is MISS, "the escalation reached the copy")
            review = await _look(cache, store, key)
            assert isinstance(review, dict) and review["reason"] == "rule:x"
            assert cache.get(key) == review
            assert await store.clear("acme", "alice")
            await _until(lambda: cache.get(key) is MISS, "the release reached the copy")
            assert await _look(cache, store, key) is None
            # Writes to other risk keys (every recorded event) leave review copies alone.
            await store.record("acme", "alice", [], window_s=60, threshold=99)
            await asyncio.sleep(0.05)
            assert cache.get(key) is None

    _run(scenario)


def test_a_lookup_that_raced_a_change_is_not_kept() -> None:
    async def scenario() -> None:
        async with _cache() as (cache, store):
            key = store.keys("acme", "alice")[2]
            token = cache.begin()
            found = await store.review_at(key)
            # Before its answer is kept, a review key changes (here another user's).
            await store.client.set(store.keys("acme", "bob")[2], '{"reason": "rule:y"}')
            await _until(lambda: cache.begin() != token, "the change arrived")
            cache.put(key, token, found, 10.0)
            assert cache.get(key) is MISS

    _run(scenario)


def test_a_killed_link_drops_every_copy_until_it_is_back() -> None:
    async def scenario() -> None:
        async with _cache() as (cache, store):
            key = store.keys("acme", "alice")[2]
            await _look(cache, store, key)
            assert cache.get(key) is None
            assert cache.client_id is not None
            first = cache.client_id
            await store.client.client_kill_filter(_id=str(first))
            await _until(lambda: not cache.live, "the cache saw its link die")
            assert cache.get(key) is MISS
            assert cache.begin() is None  # what Redis says now is not kept
            # Changes while the link is down are not missed: the copies are gone.
            await store.client.set(key, '{"reason": "rule:z"}')
            await _until(lambda: cache.live, "the cache subscribed again")
            assert cache.client_id != first
            review = await _look(cache, store, key)
            assert isinstance(review, dict) and review["reason"] == "rule:z"

    _run(scenario)


class _Relay:
    """A TCP relay to Redis that can go silent, as a broken network does, keeping the connection."""

    def __init__(self) -> None:
        self.silent = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", 6379)
        self.writers += [w, uw]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if self.silent.is_set():
                    continue  # swallowed: neither side hears of it
                dst.write(data)
                await dst.drain()

        with contextlib.suppress(Exception):
            await asyncio.gather(pipe(r, uw), pipe(ur, w))

    async def close(self) -> None:
        for w in self.writers:
            w.close()
            with contextlib.suppress(Exception):
                await w.wait_closed()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_a_silent_link_is_found_by_its_ping() -> None:
    async def scenario() -> None:
        relay = _Relay()
        port = await relay.start()
        try:
            async with _cache(f"redis://127.0.0.1:{port}/0", timeout_s=0.2, heartbeat_s=0.2) as (
                cache,
                store,
            ):
                key = store.keys("acme", "alice")[2]
                await _look(cache, store, key)
                assert cache.get(key) is None
                relay.silent.set()
                # A change the worker can no longer hear of: the copy must not outlive the link.
                await store.client.set(key, '{"reason": "rule:w"}')
                await _until(lambda: not cache.live, "the unanswered ping took the copies down", 2.0)
                assert cache.get(key) is MISS
        finally:
            await relay.close()

    _run(scenario)


def test_a_flushed_database_drops_every_copy() -> None:
    async def scenario() -> None:
        async with _cache() as (cache, store):
            key = store.keys("acme", "alice")[2]
            await _look(cache, store, key)
            assert cache.get(key) is None
            spare = aioredis.Redis.from_url("redis://127.0.0.1:6379/13")
            try:
                await spare.flushdb()  # any flush: Redis says "everything changed"
            finally:
                await spare.aclose()
            await _until(lambda: cache.get(key) is MISS, "the flush reached the copies")

    _run(scenario)


def test_a_block_copy_lasts_as_long_as_the_block_and_a_lifted_block_reaches_it() -> None:
    async def scenario() -> None:
        prefix = f"ztgate-test-blocks-{os.getpid()}-{free_port()}:"
        cache = block_copies(REDIS, prefix, 0.5)
        store = AuthFailStore.from_url(REDIS, prefix, 2.0)
        try:
            net = "192.0.2.7/32"
            key = store.block_key(net)
            assert cache.get(key) is MISS
            await _until(lambda: cache.live, "the cache subscribed")
            token = cache.begin()
            assert await store.blocked_ms_at(key) == 0
            cache.put(key, token, 0.0, 10.0)
            assert cache.get(key) == 0.0
            # Another replica blocks the network (its second failure): the copy goes at once.
            await store.fail(net, 60, 2, 60)
            assert (await store.fail(net, 60, 2, 60)).blocked_ms == 60_000
            await _until(lambda: cache.get(key) is MISS, "the block reached the copy")
            # The operator lifts it: the copy of the block goes too.
            token = cache.begin()
            cache.put(key, token, 1e12, await store.blocked_ms_at(key) / 1000)
            assert cache.get(key) == 1e12
            assert await store.clear(net) == 1
            await _until(lambda: cache.get(key) is MISS, "the lifted block reached the copy")
            # A copy never outlives its block, even with no message at all.
            cache.put(key, cache.begin(), 1.0, 0.05)
            await asyncio.sleep(0.1)
            assert cache.get(key) is MISS
        finally:
            await store.clear()
            await cache.aclose()
            await store.aclose()

    _run(scenario)


def _calls(command: str) -> int:
    stats = redis.Redis.from_url(REDIS).info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_workers_answer_the_block_and_review_checks_from_their_copies(
    tmp_path: Path, chat_up: ScriptedUpstream
) -> None:
    reg = registry_for(
        {"v": ("openai", chat_up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    auth = {"authorization": f"Bearer {KEY}"}
    with running_policy(tmp_path, reg, POLICY, workers=2) as env:
        prefix = env.settings.redis_prefix
        names = {f"ztgate-copies@{prefix}risk:*:review", f"ztgate-copies@{prefix}authfail:*:block"}
        with httpx.Client(base_url=env.url, headers=auth, timeout=10) as client:
            for _ in range(4):  # both workers start their links
                assert client.post("/v1/chat/completions", json=body).status_code == 200

            def linked() -> int:
                listed = redis.Redis.from_url(REDIS, decode_responses=True).client_list()
                return sum(1 for c in listed if c["name"] in names and "t" in c["flags"] and c["sub"] == "1")

            asyncio.run(_until(lambda: linked() == 4, "both workers follow the review and block keys"))
            for _ in range(2):  # each worker keeps its copies
                assert client.post("/v1/chat/completions", json=body).status_code == 200
            gets, pttls = _calls("get"), _calls("pttl")
            assert [client.post("/v1/chat/completions", json=body).status_code for _ in range(10)] == [
                200
            ] * 10
            assert _calls("get") - gets <= 2 and _calls("pttl") - pttls <= 2
            # The CLI's change reaches both workers' copies: held at once, released at once.
            redis.Redis.from_url(REDIS).set(f"{prefix}risk:{{acme/alice}}:review", '{"reason": "rule:ops"}')
            held = [client.post("/v1/chat/completions", json=body) for _ in range(4)]
            assert {r.status_code for r in held} == {403}
            out = env.cli("risk", "clear", "--tenant", "acme", "--user", "alice")
            assert out.returncode == 0, out.stderr
            assert [client.post("/v1/chat/completions", json=body).status_code for _ in range(4)] == [200] * 4
            # A block set behind the gateway's back (as another replica would) reaches both workers.
            redis.Redis.from_url(REDIS).set(f"{prefix}authfail:{{127.0.0.1%2F32}}:block", 3, px=60_000)
            blocked = [client.post("/v1/chat/completions", json=body) for _ in range(4)]
            assert {r.status_code for r in blocked} == {429}
            assert env.cli("auth-guard", "clear", "--all").returncode == 0
            assert [client.post("/v1/chat/completions", json=body).status_code for _ in range(4)] == [200] * 4
