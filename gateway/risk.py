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

Every request asks whether its user is under review; `review_copies` lets a worker answer from
memory while Redis tells it of every change to a review key (gateway.redis_copies).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import redis.asyncio as aioredis

from gateway import _redis
from gateway.redis_copies import RedisCopies

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


def review_copies(url: str, prefix: str, timeout_s: float, **kw: Any) -> RedisCopies[dict[str, Any] | None]:
    """The worker's copies of users' review records (None: not under review), kept true by Redis."""
    return RedisCopies(url, f"{prefix}risk:", ":review", timeout_s, **kw)
