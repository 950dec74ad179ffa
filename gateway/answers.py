"""The answers the gateway delivered, remembered by keyed fingerprint in Redis (every replica).

A chat client resends the conversation every turn, assistant turns included, and nothing in the
protocol says those turns are the model's: a client can write them itself (a forged history, a
prefilled reply for the model to continue). The prompt_injection filter scores the assistant
turns this store does not know, so only the gateway's own answers to the same user go unscored.

One key per delivered text, `<prefix>answer:{<tenant>/<user>}:<fingerprint>`, with an expiry:
the braces keep one user's keys in one hash slot, so a lookup is one MGET in a cluster too. The
fingerprint is HMAC-SHA256 (the audit key) over the user and the text: Redis holds no answer
text, and one user's answer is not known to another.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from time import monotonic
from urllib.parse import quote

import redis.asyncio as aioredis

_CACHED = 4096  # per worker: fingerprints known to be remembered, until their expiry


class AnswerLedger:
    """Remember delivered answer texts per user; tell which of a request's texts were delivered."""

    def __init__(self, client: aioredis.Redis, prefix: str, key: bytes) -> None:
        self.client = client
        self.prefix = prefix
        self._key = key
        self._known: OrderedDict[str, float] = OrderedDict()

    @classmethod
    def from_url(cls, url: str, prefix: str, key: bytes, timeout_s: float) -> AnswerLedger:
        """A ledger on a connection pool (connections are made on first use)."""
        client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return cls(client, prefix, key)

    def fingerprint(self, tenant: str, user: str, text: str) -> str:
        """The keyed fingerprint of one text for one user (surrounding whitespace ignored)."""
        msg = b"\0".join((b"answer", tenant.encode(), user.encode(), text.strip().encode("utf-8", "replace")))
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()[:32]

    def _name(self, tenant: str, user: str, fp: str) -> str:
        return f"{self.prefix}answer:{{{quote(tenant, safe='')}/{quote(user, safe='')}}}:{fp}"

    async def remember(self, tenant: str, user: str, texts: list[str], ttl_s: int) -> None:
        """Remember these delivered texts for `ttl_s` seconds."""
        fps = {self.fingerprint(tenant, user, t) for t in texts if t.strip()}
        if not fps:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for fp in fps:
                pipe.set(self._name(tenant, user, fp), b"1", ex=ttl_s)
            await pipe.execute()
        until = monotonic() + ttl_s
        for fp in fps:
            self._cache(fp, until)

    async def known(self, tenant: str, user: str, texts: list[str], ttl_s: int) -> list[bool]:
        """For each text, whether the gateway delivered it to this user (and still remembers)."""
        fps = [self.fingerprint(tenant, user, t) for t in texts]
        now = monotonic()
        out = [self._known.get(fp, 0.0) > now for fp in fps]
        ask = [i for i, hit in enumerate(out) if not hit]
        if ask:
            found = await self.client.mget([self._name(tenant, user, fps[i]) for i in ask])
            for i, value in zip(ask, found, strict=True):
                if value is not None:
                    out[i] = True
                    # Its remaining life in Redis is not known here: cached a minute at most.
                    self._cache(fps[i], now + min(ttl_s, 60))
        return out

    def _cache(self, fp: str, until: float) -> None:
        self._known[fp] = until
        self._known.move_to_end(fp)
        while len(self._known) > _CACHED:
            self._known.popitem(last=False)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()
