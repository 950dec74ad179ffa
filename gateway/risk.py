"""Per-user risk graphs in Redis, shared by every gateway replica.

Per user (tenant + user) three keys, one hash slot (the braces), so a cluster keeps them together:
- `<prefix>risk:{<tenant>/<user>}:events`: a sorted set of the user's high-risk events in the
  sliding window, scored by Redis server time (ms), so replicas with skewed clocks agree;
- `…:graph`: a hash counting events by kind and by kind and model (`injection`,
  `injection|llama3-8b@v2.4`): what the user did, to what;
- `…:review`: present while the user is under manual review (JSON: since, reason, count,
  request id). It has no expiry: a person clears it (`ztgate risk clear`).

Recording is one Lua script: trim the window, add the events, count, and put the user under
review when the count reaches the threshold or a `review` rule fired, atomically across replicas.

Every request asks whether its user is under review; `ReviewCache` lets a worker answer from
memory while Redis tells it of every change to a review key (client-side caching).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import redis.asyncio as aioredis

from gateway import _redis
from gateway.observability import log

# KEYS: events, graph, review. ARGV: window ms, threshold, escalation reason ('' for none),
# request id, number of events, then (member, kind, model) per event.
_RECORD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local threshold = tonumber(ARGV[2])
local reason = ARGV[3]
local n = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
for i = 0, n - 1 do
  local member, kind, model = ARGV[6 + 3 * i], ARGV[7 + 3 * i], ARGV[8 + 3 * i]
  redis.call('ZADD', KEYS[1], now, member)
  redis.call('HINCRBY', KEYS[2], kind, 1)
  if model ~= '' then redis.call('HINCRBY', KEYS[2], kind .. '|' .. model, 1) end
end
redis.call('PEXPIRE', KEYS[1], window)
redis.call('PEXPIRE', KEYS[2], window)
local count = redis.call('ZCARD', KEYS[1])
local existing = redis.call('GET', KEYS[3])
if existing then return {count, existing, 0} end
if reason == '' and count >= threshold then reason = 'threshold' end
if reason == '' then return {count, false, 0} end
local doc = cjson.encode({since_ms = now, reason = reason, count = count, request_id = ARGV[4]})
redis.call('SET', KEYS[3], doc)
return {count, doc, 1}
"""


@dataclass(frozen=True, slots=True)
class Event:
    """One high-risk event: its kind and the model it concerned (if known)."""

    kind: str
    model: str = ""


@dataclass(frozen=True, slots=True)
class Recorded:
    """The user's state after recording."""

    count: int  # events in the window, these included
    review: dict[str, Any] | None  # the review record, if the user is under review
    escalated: bool  # this call put the user under review


class RiskStore:
    """The risk graphs of all users, in one Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._record = client.register_script(_RECORD)

    @classmethod
    def from_url(cls, url: str, prefix: str, timeout_s: float) -> RiskStore:
        """A store on a connection pool (connections are made on first use)."""
        return cls(_redis.client(url, timeout_s), prefix)

    def keys(self, tenant: str, user: str) -> tuple[str, str, str]:
        """events, graph and review keys of one user (names quoted: no ':' or braces inside)."""
        who = f"{quote(tenant, safe='')}/{quote(user, safe='')}"
        base = f"{self.prefix}risk:{{{who}}}"
        return f"{base}:events", f"{base}:graph", f"{base}:review"

    async def review(self, tenant: str, user: str) -> dict[str, Any] | None:
        """The user's review record, or None if not under review."""
        return await self.review_at(self.keys(tenant, user)[2])

    async def review_at(self, key: str) -> dict[str, Any] | None:
        """The review record under `key` (a `keys()[2]`), or None."""
        return _doc(await self.client.get(key))

    async def record(
        self,
        tenant: str,
        user: str,
        events: list[Event],
        *,
        window_s: int,
        threshold: int,
        escalate: str = "",
        request_id: str = "",
    ) -> Recorded:
        """Add events; put the user under review at `threshold` in `window_s`, or at once if `escalate`."""
        args: list[Any] = [window_s * 1000, threshold, escalate, request_id, len(events)]
        for i, e in enumerate(events):
            args += [f"{request_id}:{i}:{e.kind}", e.kind, e.model]
        count, doc, escalated = await self._record(keys=list(self.keys(tenant, user)), args=args)
        return Recorded(int(count), _doc(doc), bool(escalated))

    async def status(self, tenant: str, user: str) -> dict[str, Any]:
        """Everything the store holds on a user: events in the window, the graph, the review."""
        events, graph, review = self.keys(tenant, user)
        members: list[Any] = await self.client.zrange(events, 0, -1, withscores=True)
        return {
            "tenant": tenant,
            "user": user,
            "events": [
                {
                    "at_ms": int(score),
                    "kind": str(m).rsplit(":", 1)[-1],
                    "request_id": str(m).rsplit(":", 2)[0],
                }
                for m, score in members
            ],
            "graph": {k: int(v) for k, v in sorted((await self.client.hgetall(graph)).items())},
            "review": _doc(await self.client.get(review)),
        }

    async def clear(self, tenant: str, user: str) -> bool:
        """Release a user from review and forget their window; True if they were under review."""
        events, graph, review = self.keys(tenant, user)
        was = await self.client.delete(review)
        await self.client.delete(events, graph)
        return bool(was)

    async def ping(self) -> bool:
        """Redis answers."""
        return bool(await self.client.ping())

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()


def _doc(raw: Any) -> dict[str, Any] | None:
    if not raw:
        return None
    doc = json.loads(raw)
    return doc if isinstance(doc, dict) else None


MISS: Final = object()  # ReviewCache.get: nothing reusable, ask Redis
_CHANNEL = "__redis__:invalidate"


class ReviewCache:
    """Review lookups a worker reuses while Redis tells it of every change to a review key.

    One connection per process turns on Redis's server-assisted client-side caching in broadcast
    mode for the risk keys (`CLIENT TRACKING on REDIRECT <itself> BCAST PREFIX <prefix>risk:`, Redis
    6+) and subscribes to `__redis__:invalidate`. Any write to a review key, whoever makes it (a
    replica's escalation, `ztgate risk clear`, redis-cli), reaches every worker as a message naming
    the key, within a millisecond here, and the worker drops its copy.

    A copy is reused only while that connection is known to be up: before it has subscribed, once
    it fails, or when it leaves a ping unanswered for `timeout_s` after `heartbeat_s` of silence,
    every copy is dropped and every request asks Redis, as without the cache. A lookup that was in
    flight when any review key changed is not kept (`begin`/`put`: the change could be its own and
    its message could come before the answer). Copies also expire after the policy's
    `review_cache_s`, and at most `max_entries` are kept (least recently used go first).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        timeout_s: float,
        *,
        heartbeat_s: float = 1.0,
        max_entries: int = 65536,
    ) -> None:
        self.url = url
        self.prefix = f"{prefix}risk:"
        # What operators see in CLIENT LIST (a name holds no spaces).
        self.client_name = "ztgate-review-cache@" + "".join(
            c if c.isprintable() and c != " " else "_" for c in prefix
        )
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.max_entries = max_entries
        self.live = False  # subscribed, and the last ping was answered in time
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()
        self._seq = 0  # moves on every change of a review key and whenever the copies are dropped
        self._task: asyncio.Task[None] | None = None
        self.client_id: int | None = None  # the tracking connection's, for operators (CLIENT LIST)
        self._told = False  # a link that never came up is logged once, not every retry

    def get(self, key: str) -> Any:
        """The review record (or None) kept for `key`, or MISS. Starts the subscriber on first use."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="review-cache")
        hit = self._entries.get(key)
        if hit is None or hit[0] < time.monotonic():
            self.misses += 1
            return MISS
        self._entries.move_to_end(key)
        self.hits += 1
        return hit[1]

    def begin(self) -> int | None:
        """A token for a lookup about to ask Redis (None: nothing it finds may be kept)."""
        return self._seq if self.live else None

    def put(self, key: str, token: int | None, doc: dict[str, Any] | None, ttl_s: float) -> None:
        """Keep what a lookup found, unless a review key changed (or the link failed) meanwhile."""
        if token is None or token != self._seq or not self.live:
            return
        self._entries[key] = (time.monotonic() + ttl_s, doc)
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
            if isinstance(k, str) and k.endswith(":review"):
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
                if self.live or not self._told:
                    log().warning("review_cache_down", why=type(exc).__name__, lookups="redis")
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
        log().info("review_cache_live", client_id=self.client_id)
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
