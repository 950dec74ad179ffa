"""Request-rate and token quotas in Redis, shared by every gateway replica.

One key per limit and subject (a user, a tenant or an API key), all of a tenant's in one hash
slot (the braces), so one script can check a request against every limit that applies to it:
- `<prefix>quota:{<tenant>}:<per>:<who>:<limit>:requests`: a sorted set, one member per admitted
  request, scored by Redis server time (ms): an exact sliding window, the same on every replica
  whatever their clocks say;
- `…:<limit>:tokens`: a hash of tokens used per slice of the window (a sixtieth of it, at least
  1 ms), so the window slides a slice at a time (tokens leave it up to one slice early), and of
  tokens reserved by requests in flight per slice (`r<slice>`): the check reads at most 122
  fields.

- `…:<limit>:concurrent`: a sorted set of the requests in flight (leases), each scored by when
  its lease runs out (as long as an ext_proc stream may last): a request taken at request headers
  is released when its stream ends, and a worker that died leaves leases that run out by
  themselves.

A request is admitted only if every request limit has room; then it is counted in all of them
at once (a refused request counts nowhere, so a client retrying early does not push its own
window on). Token limits admit a request while the window's tokens are under the limit; its
body reserves what it may use (counted at once, so requests in flight hold their place), and
when it ends its tokens replace the reservation: only a request that uses more than it
reserved can take the window over its limit.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote

import redis.asyncio as aioredis

from gateway import _redis

Per = Literal["user", "tenant", "key"]
Kind = Literal["requests", "tokens", "concurrent"]

# KEYS: one sorted set per request limit. ARGV[1]: the request's member; then (window ms, limit)
# per key. Returns {0, count after, ...} when admitted, or {i, ms until the i-th limit has room}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local counts = {0}
for i, key in ipairs(KEYS) do
  local window = tonumber(ARGV[2 * i])
  local limit = tonumber(ARGV[2 * i + 1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local n = redis.call('ZCARD', key)
  if n >= limit then
    -- room comes when the (n - limit + 1)-th oldest leaves the window
    local at = redis.call('ZRANGE', key, n - limit, n - limit, 'WITHSCORES')
    return {i, math.max(1, tonumber(at[2]) + window - now)}
  end
  counts[i + 1] = n + 1
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, ARGV[1])
  redis.call('PEXPIRE', key, tonumber(ARGV[2 * i]))
end
return counts
"""

# KEYS: one sorted set per concurrency limit. ARGV[1]: the lease, ARGV[2]: its time to live (ms);
# then the limit per key. Drops leases that ran out; returns {0, in flight after, ...} when every
# limit has room (the lease then taken in all), or {i, 1000}: retry in a second.
_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local counts = {0}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local n = redis.call('ZCARD', key)
  if n >= tonumber(ARGV[i + 2]) then
    return {i, 1000}
  end
  counts[i + 1] = n + 1
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + ttl, ARGV[1])
  redis.call('PEXPIRE', key, ttl)
end
return counts
"""

# The tokens a window holds now, used (field: the slice) and reserved by requests in flight
# (field: `r` + the slice); drops slices that left it. Returns the sum and, when the sum is at
# the limit or over, the ms until it is under (else 0): while used tokens alone fill the window,
# until enough of them leave it; when reservations are what fill it, a second (a request in
# flight that ends gives its reservation back).
_TOKENS_USED = """
local function used(key, window, slice, limit, now)
  local first = math.floor((now - window) / slice) + 1
  local slices = {}
  local sum, reserved = 0, 0
  local all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local field = all[j]
    local r = string.sub(field, 1, 1) == 'r'
    local s = tonumber(r and string.sub(field, 2) or field)
    if s < first then
      redis.call('HDEL', key, field)
    else
      local n = tonumber(all[j + 1])
      if r then
        reserved = reserved + n
      else
        sum = sum + n
        slices[#slices + 1] = {s, n}
      end
    end
  end
  if sum < limit then
    return sum + reserved, (sum + reserved >= limit) and 1000 or 0
  end
  table.sort(slices, function(a, b) return a[1] < b[1] end)
  local left = sum
  for _, sn in ipairs(slices) do
    left = left - sn[2]
    if left < limit then
      return sum + reserved, math.max(1, sn[1] * slice + window - now)
    end
  end
  return sum + reserved, 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: one hash per token limit. ARGV: (window ms, slice ms, limit) per key. Returns
# {0, used, ...} or {i, ms until the i-th limit is under its tokens}.
_CHECK_TOKENS = (
    _TOKENS_USED
    + """
local out = {0}
for i, key in ipairs(KEYS) do
  local sum, wait = used(key, tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), now)
  if wait > 0 then
    return {i, wait}
  end
  out[i + 1] = sum
end
return out
"""
)

# KEYS: one hash per token limit. ARGV[1]: tokens to reserve (no more than any limit); then
# (window ms, slice ms, limit) per key. If they fit in every window (what it holds, used and
# reserved, plus them, is within its limit), they are counted in all of them now and the reply
# is {0, now ms, held before, ...}; else {i, ms until they would fit in the i-th}.
_RESERVE_TOKENS = (
    _TOKENS_USED
    + """
local out = {0, now}
local n = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  -- under limit - n + 1 is within the limit once n more are counted
  local fit = tonumber(ARGV[3 * i + 1]) - n + 1
  local sum, wait = used(key, tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), fit, now)
  if wait > 0 then
    return {i, wait}
  end
  out[i + 2] = sum
end
for i, key in ipairs(KEYS) do
  local window = tonumber(ARGV[3 * i - 1])
  local slice = tonumber(ARGV[3 * i])
  redis.call('HINCRBY', key, 'r' .. math.floor(now / slice), n)
  redis.call('PEXPIRE', key, window + slice)
end
return out
"""
)

# KEYS: one hash per token limit. ARGV[1]: tokens used; ARGV[2]: tokens reserved for them (0:
# none) and ARGV[3] when (Redis ms); then (window ms, slice ms) per key. The reservation leaves
# its slice's field (already gone if that slice left the window) and the tokens used are
# counted in the current slice.
_ADD_TOKENS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local reserved = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local window = tonumber(ARGV[2 * i + 2])
  local slice = tonumber(ARGV[2 * i + 3])
  if reserved > 0 then
    local field = 'r' .. math.floor(tonumber(ARGV[3]) / slice)
    if redis.call('HEXISTS', key, field) == 1 then
      if redis.call('HINCRBY', key, field, -reserved) <= 0 then
        redis.call('HDEL', key, field)
      end
    end
  end
  if n > 0 then
    redis.call('HINCRBY', key, tostring(math.floor(now / slice)), n)
    redis.call('PEXPIRE', key, window + slice)
  end
end
return n
"""


@dataclass(frozen=True, slots=True)
class Window:
    """One limit as the store applies it: which subject's counter, how many in how long."""

    key: str  # the counter's Redis key (QuotaStore.key)
    limit: int
    window_s: int

    @property
    def window_ms(self) -> int:
        """The window in milliseconds."""
        return self.window_s * 1000

    @property
    def slice_ms(self) -> int:
        """Token windows slide a sixtieth of the window at a time."""
        return max(1, self.window_ms // 60)


@dataclass(frozen=True, slots=True)
class Admission:
    """A check's result: admitted with each window's count, or refused by one window."""

    refused_by: int | None  # index of the window that refused, None if admitted
    retry_after_ms: int  # until that window has room (0 when admitted)
    counts: tuple[int, ...]  # per window: requests counted or tokens used (admitted only)


class QuotaStore:
    """Every subject's quota counters, in one Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._admit = client.register_script(_ADMIT)
        self._check_tokens = client.register_script(_CHECK_TOKENS)
        self._reserve_tokens = client.register_script(_RESERVE_TOKENS)
        self._add_tokens = client.register_script(_ADD_TOKENS)
        self._lease = client.register_script(_LEASE)

    @classmethod
    def from_url(cls, url: str, prefix: str, timeout_s: float) -> QuotaStore:
        """A store on a connection pool (connections are made on first use)."""
        return cls(_redis.client(url, timeout_s), prefix)

    def key(self, tenant: str, per: Per, who: str, limit: str, kind: Kind) -> str:
        """The counter of one limit for one subject (names quoted: no ':' or braces inside)."""
        subject = "" if per == "tenant" else f"{quote(who, safe='')}:"
        return (
            f"{self.prefix}quota:{{{quote(tenant, safe='')}}}:{per}:{subject}{quote(limit, safe='')}:{kind}"
        )

    async def admit(self, windows: list[Window]) -> Admission:
        """Count one request in every window if all have room; else say which refused and when."""
        args: list[Any] = [secrets.token_hex(8)]  # unique member: a client cannot make requests collide
        for w in windows:
            args += [w.window_ms, w.limit]
        return _admission(await self._admit(keys=[w.key for w in windows], args=args))

    async def check_tokens(self, windows: list[Window]) -> Admission:
        """Is every token window under its limit? (Nothing is counted.)"""
        args: list[Any] = []
        for w in windows:
            args += [w.window_ms, w.slice_ms, w.limit]
        return _admission(await self._check_tokens(keys=[w.key for w in windows], args=args))

    async def reserve_tokens(self, windows: list[Window], tokens: int) -> tuple[Admission, int]:
        """If `tokens` fit in every token window (within its limit with what it holds), count
        them in all of them now, ahead of use; the admission (with the tokens each window held
        before) and when (Redis ms; 0 if refused), which `add_tokens` needs to take the
        reservation back. `tokens` must be no more than any window's limit."""
        if any(tokens > w.limit for w in windows):
            raise ValueError(f"{tokens} tokens can never fit in a window of fewer")
        args: list[Any] = [tokens]
        for w in windows:
            args += [w.window_ms, w.slice_ms, w.limit]
        reply = await self._reserve_tokens(keys=[w.key for w in windows], args=args)
        if int(reply[0]):
            return _admission(reply), 0
        return _admission([0, *reply[2:]]), int(reply[1])

    async def add_tokens(
        self, windows: list[Window], tokens: int, reserved: int = 0, reserved_at_ms: int = 0
    ) -> None:
        """Count `tokens` in every window, in place of the `reserved` tokens counted ahead at
        `reserved_at_ms` (a reservation whose slice has left the window is gone already)."""
        args: list[Any] = [tokens, reserved, reserved_at_ms]
        for w in windows:
            args += [w.window_ms, w.slice_ms]
        await self._add_tokens(keys=[w.key for w in windows], args=args)

    async def lease(self, windows: list[Window], lease: str, ttl_ms: int) -> Admission:
        """Take `lease` in every concurrency window if all have room; else say which refused."""
        args: list[Any] = [lease, ttl_ms, *(w.limit for w in windows)]
        return _admission(await self._lease(keys=[w.key for w in windows], args=args))

    async def release(self, windows: list[Window], lease: str) -> None:
        """Give `lease` back in every window (the request ended)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for w in windows:
                pipe.zrem(w.key, lease)
            await pipe.execute()

    async def counters(self, tenant: str) -> list[dict[str, Any]]:
        """Every counter of a tenant as stored (request members not yet trimmed included: a
        counter is trimmed to its window when a request is checked against it)."""
        out = []
        async for key in self.client.scan_iter(match=f"{self.prefix}quota:{{{quote(tenant, safe='')}}}:*"):
            c = self._parse(key)
            if c["kind"] == "concurrent":
                sec, usec = await self.client.time()
                # leases that ran out (a worker gone) are not in flight
                c["used"] = int(await self.client.zcount(key, f"({sec * 1000 + usec // 1000}", "+inf"))
            elif c["kind"] == "requests":
                first = await self.client.zrange(key, 0, 0, withscores=True)
                last = await self.client.zrange(key, -1, -1, withscores=True)
                c["used"] = int(await self.client.zcard(key))
                c["oldest_ms"] = int(first[0][1]) if first else None
                c["newest_ms"] = int(last[0][1]) if last else None
            else:
                fields = await self.client.hgetall(key)  # decoded: str fields and values
                held = [(str(f).startswith("r"), int(v)) for f, v in fields.items()]
                c["used"] = sum(n for r, n in held if not r)
                c["reserved"] = sum(n for r, n in held if r)
            c["expires_in_ms"] = int(await self.client.pttl(key))
            out.append(c)
        return sorted(out, key=lambda c: (c["per"], c["who"], c["limit"], c["kind"]))

    async def clear(
        self, tenant: str, *, per: Per | None = None, who: str | None = None, limit: str | None = None
    ) -> int:
        """Forget a tenant's counters (those of one subject or one limit, if given); how many."""
        gone = [
            c["key"]
            for c in await self.counters(tenant)
            if (per is None or c["per"] == per)
            and (who is None or c["who"] == who)
            and (limit is None or c["limit"] == limit)
        ]
        return int(await self.client.delete(*gone)) if gone else 0

    def _parse(self, key: str) -> dict[str, Any]:
        rest = key[len(self.prefix) + len("quota:") :]
        tag, _, tail = rest.partition("}:")
        parts = tail.split(":")
        per, kind = parts[0], parts[-1]
        who = unquote(parts[1]) if per != "tenant" else ""
        return {
            "key": key,
            "tenant": unquote(tag[1:]),
            "per": per,
            "who": who,
            "limit": unquote(parts[-2]),
            "kind": kind,
        }

    async def ping(self) -> bool:
        """Redis answers."""
        return bool(await self.client.ping())

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()


def _admission(reply: list[Any]) -> Admission:
    first = int(reply[0])
    if first:
        return Admission(first - 1, int(reply[1]), ())
    return Admission(None, 0, tuple(int(c) for c in reply[1:]))
