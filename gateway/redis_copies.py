"""Copies of Redis keys a worker reuses while Redis tells it of every change (client-side caching).

The risk filter asks on every request whether its user is under review, auth_guard whether its
source network is blocked: both answers change rarely and must never be stale for long. These
copies remove that Redis call from the request path without letting a change go unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Literal, TypeVar

import redis.asyncio as aioredis

from gateway.observability import log

V = TypeVar("V")


class Miss(enum.Enum):
    """`RedisCopies.get` found nothing reusable: ask Redis."""

    MISS = 0


MISS: Literal[Miss.MISS] = Miss.MISS
_CHANNEL = "__redis__:invalidate"


class RedisCopies(Generic[V]):
    """What a worker read from Redis keys, reused while Redis tells it of every change to them.

    One connection turns on Redis's server-assisted client-side caching in broadcast mode for the
    keys starting with `key_prefix` (`CLIENT TRACKING on REDIRECT <itself> BCAST PREFIX …`, Redis
    6+) and subscribes to `__redis__:invalidate`. Any write to such a key, whoever makes it (a
    replica, a `ztgate` command, redis-cli, an expiry, a flush), reaches every worker as a message
    naming the key, within a millisecond here, and the worker drops its copy if the key ends with
    `suffix` (the others change on every request: their messages are ignored).

    A copy is reused only while that connection is known to be up: before it has subscribed, once
    it fails, or when it leaves a ping unanswered for `timeout_s` after `heartbeat_s` of silence,
    every copy is dropped and every lookup asks Redis, as without copies. A lookup that was in
    flight when any followed key changed is not kept (`begin`/`put`: the change could be its own and
    its message could come before the answer). Copies also expire (`put`'s `ttl_s`), and at most
    `max_entries` are kept (least recently used go first).
    """

    def __init__(
        self,
        url: str,
        key_prefix: str,
        suffix: str,
        timeout_s: float,
        *,
        heartbeat_s: float = 1.0,
        max_entries: int = 65536,
    ) -> None:
        self.url = url
        self.prefix = key_prefix
        self.suffix = suffix
        # What operators see in CLIENT LIST (a name holds no spaces).
        self.client_name = "ztgate-copies@" + "".join(
            c if c.isprintable() and c != " " else "_" for c in key_prefix + "*" + suffix
        )
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.max_entries = max_entries
        self.live = False  # subscribed, and the last ping was answered in time
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._seq = 0  # moves on every change of a followed key and whenever the copies are dropped
        self._task: asyncio.Task[None] | None = None
        self.client_id: int | None = None  # the tracking connection's, for operators (CLIENT LIST)
        self._told = False  # a link that never came up is logged once, not every retry

    def get(self, key: str) -> V | Literal[Miss.MISS]:
        """The value kept for `key`, or MISS. Starts following Redis on first use."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.client_name)
        hit = self._entries.get(key)
        if hit is None or hit[0] < time.monotonic():
            return MISS
        self._entries.move_to_end(key)
        return hit[1]

    def begin(self) -> int | None:
        """A token for a lookup about to ask Redis (None: nothing it finds may be kept)."""
        return self._seq if self.live else None

    def put(self, key: str, token: int | None, value: V, ttl_s: float) -> None:
        """Keep what a lookup found for `ttl_s`, unless a followed key changed (or the link failed) meanwhile."""
        if token is None or token != self._seq or not self.live:
            return
        self._entries[key] = (time.monotonic() + ttl_s, value)
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def drop(self, key: str) -> None:
        """Forget `key` now (this worker changed it; the message from Redis follows)."""
        self._seq += 1
        self._entries.pop(key, None)

    def _changed(self, keys: Any) -> None:
        if keys is None:  # FLUSHDB / FLUSHALL
            self._down_to_empty()
            return
        for k in keys:
            if isinstance(k, str) and k.endswith(self.suffix):
                self.drop(k)

    def _down_to_empty(self) -> None:
        self._seq += 1
        self._entries.clear()

    async def _run(self) -> None:
        pause = 0.1
        while True:
            pool = aioredis.ConnectionPool.from_url(
                # RESP2: invalidations then come as plain pub/sub messages on this connection.
                self.url,
                decode_responses=True,
                protocol=2,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                client_name=self.client_name,
            )
            # The pool picks TCP, TLS or a unix socket from the URL; redis-py leaves this untyped.
            conn = pool.make_connection()  # type: ignore[no-untyped-call]
            try:
                await self._follow(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: no copies until resubscribed
                if self.live:
                    pause = 0.1  # a link that was up is retried at once, then less and less often
                if self.live or not self._told:
                    log().warning(
                        "redis_copies_down", keys=self.client_name, why=type(exc).__name__, lookups="redis"
                    )
                    self._told = True
            finally:
                self.live = False
                self._down_to_empty()
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                with contextlib.suppress(Exception):
                    await pool.aclose()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def _follow(self, conn: Any) -> None:
        await conn.connect()
        await conn.send_command("CLIENT", "ID")
        self.client_id = int(await conn.read_response())
        await conn.send_command(
            "CLIENT", "TRACKING", "ON", "REDIRECT", self.client_id, "BCAST", "PREFIX", self.prefix
        )
        if await conn.read_response() != "OK":
            raise ConnectionError("CLIENT TRACKING refused")
        await conn.send_command("SUBSCRIBE", _CHANNEL)
        if (await conn.read_response())[:2] != ["subscribe", _CHANNEL]:
            raise ConnectionError("SUBSCRIBE refused")
        self._down_to_empty()  # nothing read before this point may be kept
        self.live = True
        self._told = False
        log().info("redis_copies_live", keys=self.client_name, client_id=self.client_id)
        while True:
            msg = await conn.read_response(timeout=self.heartbeat_s)
            if msg is None:  # quiet: the link must prove it is up
                await conn.send_command("PING")
                msg = await conn.read_response(timeout=self.timeout_s)
                if msg is None:
                    raise TimeoutError("ping unanswered")
            if isinstance(msg, list) and msg[:2] == ["message", _CHANNEL]:
                self._changed(msg[2])
            elif not (isinstance(msg, list) and msg[:1] == ["pong"]):
                raise ConnectionError("unexpected message on the invalidation channel")

    async def aclose(self) -> None:
        """Stop following Redis."""
        self.live = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None


async def read_through(
    copies: RedisCopies[V] | None,
    key: str,
    fetch: Callable[[str], Awaitable[V]],
    timeout_s: float,
    keep_s: Callable[[V], float],
) -> V:
    """`key`'s value: the worker's copy if it has one, else `fetch` within `timeout_s` (any error
    or timeout is raised: the caller's fail mode decides), kept for `keep_s(value)` seconds."""
    token = None
    if copies is not None:
        hit = copies.get(key)
        if hit is not MISS:
            return hit
        token = copies.begin()
    async with asyncio.timeout(timeout_s):
        value = await fetch(key)
    if copies is not None:
        copies.put(key, token, value, keep_s(value))
    return value
