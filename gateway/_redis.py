"""The asyncio Redis client the Redis-backed filters (risk, quota) share their settings through."""

from __future__ import annotations

import redis.asyncio as aioredis


def client(url: str, timeout_s: float) -> aioredis.Redis:
    """A client on a connection pool (connections are made on first use), every call within `timeout_s`."""
    return aioredis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
    )
