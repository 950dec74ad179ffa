"""Failed authentications per source network in Redis, shared by every gateway replica.

Two keys per source network (an address, or its /64 and the like: filters/auth_guard.py), in one
hash slot (the braces):
- `<prefix>authfail:{<network>}:failures`: a sorted set, one member per refused key, scored by
  Redis server time (ms): an exact sliding window, the same on every replica;
- `<prefix>authfail:{<network>}:block`: present while the network is blocked, expiring with the
  block. The failures are forgotten when it is set: a network counts afresh after its block.

And one key for all networks together, `<prefix>authsurge:failures`: a hash of refused keys per
slice of the window (a sixtieth of it), so that a surge of them from many networks at once (a
botnet trying leaked keys, each network under its own limit) is seen and the per-network limit
lowered while it lasts. It lies apart from the networks' keys (its own hash slot, and outside
the `authfail:` prefix whose changes Redis tells every worker: a flood of failures sends them
nothing).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import redis.asyncio as aioredis

from gateway import _redis
from gateway.redis_copies import RedisCopies

# KEYS: failures, block. ARGV: member, window ms, failures that block, block ms.
# Returns {failures in the window, ms the network is now blocked for (0: not blocked)}; a network
# already blocked counts nothing more (requests checked just before the block was set).
_FAIL = """
local left = redis.call('PTTL', KEYS[2])
if left > 0 then
  return {0, left}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZADD', KEYS[1], now, ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then
  redis.call('SET', KEYS[2], n, 'PX', tonumber(ARGV[4]))
  redis.call('DEL', KEYS[1])
  return {n, tonumber(ARGV[4])}
end
redis.call('PEXPIRE', KEYS[1], window)
return {n, 0}
"""

# KEYS: the surge counter. ARGV: window ms, slice ms. Counts one refused key (any network);
# returns the refused keys in the window, this one included.
_SURGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local slice = tonumber(ARGV[2])
local first = math.floor((now - window) / slice) + 1
redis.call('HINCRBY', KEYS[1], tostring(math.floor(now / slice)), 1)
redis.call('PEXPIRE', KEYS[1], window + slice)
local sum = 0
local all = redis.call('HGETALL', KEYS[1])
for j = 1, #all, 2 do
  if tonumber(all[j]) < first then
    redis.call('HDEL', KEYS[1], all[j])
  else
    sum = sum + tonumber(all[j + 1])
  end
end
return sum
"""


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure counted: how many in the window, and how long the network is blocked for."""

    failures: int  # 0 when the network was blocked already
    blocked_ms: int  # 0: not blocked


class AuthFailStore:
    """Every source network's failed authentications and blocks, in one Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._fail = client.register_script(_FAIL)
        self._surge = client.register_script(_SURGE)
        self.surge_key = f"{prefix}authsurge:failures"

    @classmethod
    def from_url(cls, url: str, prefix: str, timeout_s: float) -> AuthFailStore:
        """A store on a connection pool (connections are made on first use)."""
        return cls(_redis.client(url, timeout_s), prefix)

    def _key(self, network: str, what: str) -> str:
        return f"{self.prefix}authfail:{{{quote(network, safe='')}}}:{what}"

    def block_key(self, network: str) -> str:
        """The key present while `network` is blocked."""
        return self._key(network, "block")

    async def blocked_ms(self, network: str) -> int:
        """How long `network` stays blocked (0: it is not)."""
        return await self.blocked_ms_at(self.block_key(network))

    async def blocked_ms_at(self, key: str) -> int:
        """How long the block under `key` (a `block_key`) lasts (0: there is none)."""
        return max(0, int(await self.client.pttl(key)))

    async def fail(self, network: str, window_s: int, failures: int, block_s: int) -> Failure:
        """Count one failed authentication from `network`; block it at `failures` in `window_s`."""
        reply = await self._fail(
            keys=[self._key(network, "failures"), self._key(network, "block")],
            args=[secrets.token_hex(8), window_s * 1000, failures, block_s * 1000],
        )
        return Failure(int(reply[0]), int(reply[1]))

    async def count_surge(self, window_s: int) -> int:
        """Count one refused key in the all-networks counter; how many there are in `window_s`
        (failures leave it up to a sixtieth of the window early)."""
        window_ms = window_s * 1000
        return int(await self._surge(keys=[self.surge_key], args=[window_ms, max(1, window_ms // 60)]))

    async def sources(self) -> list[dict[str, Any]]:
        """Every network with failures in its window or a block, as stored (failures older than
        the window included until the network's next failure trims them)."""
        out: dict[str, dict[str, Any]] = {}
        async for key in self.client.scan_iter(match=f"{self.prefix}authfail:*"):
            tag, _, what = key[len(self.prefix) + len("authfail:") :].partition("}:")
            network = unquote(tag[1:])
            entry = out.setdefault(network, {"source": network, "failures": 0, "blocked_ms": 0})
            if what == "failures":
                entry["failures"] = int(await self.client.zcard(key))
            elif what == "block":
                entry["blocked_ms"] = max(0, int(await self.client.pttl(key)))
        return sorted(out.values(), key=lambda e: e["source"])

    async def clear(self, network: str | None = None) -> int:
        """Forget the failures and block of one network (every network: None); how many keys went."""
        if network is not None:
            return int(await self.client.delete(self._key(network, "failures"), self._key(network, "block")))
        keys = [k async for k in self.client.scan_iter(match=f"{self.prefix}authfail:*")]
        return int(await self.client.delete(*keys, self.surge_key))

    async def ping(self) -> bool:
        """Redis answers."""
        return bool(await self.client.ping())

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()


def block_copies(url: str, prefix: str, timeout_s: float, **kw: Any) -> RedisCopies[float]:
    """The worker's copies of networks' blocks (when the block ends, time.monotonic(); 0.0: none)."""
    return RedisCopies(url, f"{prefix}authfail:", ":block", timeout_s, **kw)
