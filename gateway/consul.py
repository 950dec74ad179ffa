"""The Consul registry backend: the model registry from Consul's KV store, endpoints from its health API.

The registry document (the same YAML as the registry file) lives under one KV key; an upstream
may name a Consul service instead of a host and port, and then its endpoints are that service's
instances whose health checks pass. Both are followed with blocking queries (`?index=&wait=`,
`X-Consul-Index`), so a change reaches the gateway within a round trip, not a poll interval.

Consul's rules for blocking queries are kept (api-docs/features/blocking, "Implementation
details"): a return is no promise of a change, so values are compared, not counted; an index that
goes backwards (a snapshot restore, a new leader) starts over with a full read; an index that is
not positive is an error; errors back off, with jitter, so a down Consul is not hammered.

Fail mode: a registry document that does not validate changes nothing (the last good one stays in
force, and the error is shown and audited). When Consul cannot be read for longer than
`ZTGATE_CONSUL_STALE_S`, the snapshot in force is marked stale and `fail_mode.consul` decides:
deny (503 registry_unavailable, the default) or route on the last good snapshot, flagged. Before
any document was read there is nothing to route on: every request is refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import quote

import aiohttp

from gateway.observability import log
from gateway.registry import NO_REGISTRY, Registry, RegistryError

T = TypeVar("T")
Endpoint = tuple[str, int]

# How long one blocking query may hang. Consul adds up to wait/16 of jitter; the client's own
# timeout leaves room for that and for a slow network.
WAIT_S = 30.0
_CLIENT_SLACK_S = 10.0
_BACKOFF_FIRST_S = 0.25
_BACKOFF_MAX_S = 2.0


class ConsulError(Exception):
    """Consul could not be read or written; the message names the call, never a token."""


@dataclass(frozen=True, slots=True)
class Read(Generic[T]):
    """One answer of a blocking endpoint: its value and the `X-Consul-Index` it came with."""

    value: T
    index: int


class Consul:
    """A small client for the parts of Consul's HTTP API the gateway uses."""

    def __init__(self, url: str, token: str | None = None, *, wait_s: float = WAIT_S) -> None:
        self.url = url.rstrip("/")
        self._headers = {"X-Consul-Token": token} if token else {}
        self.wait_s = wait_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop that will use it.
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(
        self, method: str, path: str, params: dict[str, str], body: bytes | None = None, *, block: bool
    ) -> tuple[int, bytes, int | None]:
        timeout = aiohttp.ClientTimeout(total=(self.wait_s if block else 0) + _CLIENT_SLACK_S)
        try:
            async with self._client().request(
                method, self.url + path, params=params, data=body, timeout=timeout
            ) as resp:
                data = await resp.read()
                raw_index = resp.headers.get("X-Consul-Index")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConsulError(f"{method} {path}: {type(exc).__name__}") from None
        index: int | None = None
        if raw_index is not None:
            try:
                index = int(raw_index)
            except ValueError:
                raise ConsulError(f"{method} {path}: X-Consul-Index is not a number") from None
        return resp.status, data, index

    def _blocking(self, index: int) -> dict[str, str]:
        return {"index": str(index), "wait": f"{self.wait_s:g}s"} if index > 0 else {}

    async def kv(self, key: str, index: int = 0) -> Read[bytes | None]:
        """The value under a key (None if there is none), waiting for a change past `index`."""
        path = f"/v1/kv/{quote(key)}"
        status, data, got = await self._call("GET", path, self._blocking(index), block=index > 0)
        if status not in (200, 404):
            raise ConsulError(f"GET {path}: HTTP {status} {_reason(data)}")
        if got is None:
            raise ConsulError(f"GET {path}: no X-Consul-Index in the answer")
        if status == 404:
            return Read(None, got)
        try:
            entries = json.loads(data)
            value = entries[0]["Value"]
            return Read(b"" if value is None else base64.b64decode(value, validate=True), got)
        except (ValueError, LookupError, TypeError, binascii.Error):
            raise ConsulError(f"GET {path}: the answer is not a KV entry") from None

    async def put(self, key: str, value: bytes, *, cas: int | None = None) -> bool:
        """Write a key; with `cas`, only if its ModifyIndex is `cas` (0: only if it does not exist)."""
        path = f"/v1/kv/{quote(key)}"
        params = {"cas": str(cas)} if cas is not None else {}
        status, data, _ = await self._call("PUT", path, params, value, block=False)
        if status != 200:
            raise ConsulError(f"PUT {path}: HTTP {status} {_reason(data)}")
        return data.strip() == b"true"

    async def passing(self, service: str, index: int = 0) -> Read[tuple[Endpoint, ...]]:
        """Address and port of every instance of a service whose health checks all pass."""
        path = f"/v1/health/service/{quote(service)}"
        params = {"passing": "true", **self._blocking(index)}
        status, data, got = await self._call("GET", path, params, block=index > 0)
        if status != 200:
            raise ConsulError(f"GET {path}: HTTP {status} {_reason(data)}")
        if got is None:
            raise ConsulError(f"GET {path}: no X-Consul-Index in the answer")
        try:
            found = [_instance(entry) for entry in json.loads(data)]
        except (ValueError, LookupError, TypeError, AttributeError):
            found = [None]
        if None in found:
            raise ConsulError(f"GET {path}: the answer is not a list of service instances")
        return Read(tuple(sorted({e for e in found if e is not None})), got)


def _instance(entry: dict[str, dict[str, object]]) -> Endpoint | None:
    """Where one health entry's service instance listens (None if the entry is malformed)."""
    svc, node = entry["Service"], entry["Node"]
    # An instance registered without its own address is reached at its node's.
    host, port = svc.get("Address") or node.get("Address"), svc.get("Port")
    if not isinstance(host, str) or not host or not isinstance(port, int) or not 0 < port < 65536:
        return None
    return (host, port)


def _reason(data: bytes) -> str:
    # Consul's error bodies are short plain text ("ACL not found", "Permission denied").
    return data[:120].decode("utf-8", "replace").strip()


async def follow(
    fetch: Callable[[int], Awaitable[Read[T]]],
    on_read: Callable[[T], None],
    on_error: Callable[[str], None],
) -> None:
    """Follow one blocking endpoint until cancelled: every answer to `on_read`, every failure to `on_error`."""
    index = 0
    delay = _BACKOFF_FIRST_S
    while True:
        try:
            got = await fetch(index)
        except ConsulError as exc:
            failure = str(exc)
        else:
            if got.index >= 1:
                delay = _BACKOFF_FIRST_S
                # Backwards: Consul's state was replaced; the next query is a full read, not a wait.
                index = 0 if got.index < index else got.index
                on_read(got.value)
                continue
            failure = f"X-Consul-Index {got.index} is not positive"
        on_error(failure)
        index = 0
        await asyncio.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not a secret
        delay = min(delay * 2, _BACKOFF_MAX_S)


_EMPTY = Registry.from_yaml("upstreams: {}\nmodels: {}\n", "<none>")


def unavailable(problem: str) -> Registry:
    """What requests see before any registry was read: nothing to route to, and why."""
    return _EMPTY.with_problem(problem, NO_REGISTRY)


class ConsulRegistry:
    """The registry in force, followed from one Consul KV key, with last-good semantics."""

    def __init__(
        self,
        consul: Consul,
        key: str,
        stale_after_s: float,
        on_change: Callable[[ConsulRegistry], None] = lambda _: None,
        on_refused: Callable[[ConsulRegistry], None] = lambda _: None,
    ) -> None:
        self.consul = consul
        self.key = key
        self.source = f"consul:{key}"
        self.stale_after_s = stale_after_s
        self._on_change = on_change
        self._on_refused = on_refused
        self._raw: bytes | object | None = _UNSEEN
        self._good: Registry | None = None
        self._stale: Registry | None = None
        self._none = unavailable(f"no registry read yet from {self.source}")
        self._failing_since: float | None = None
        self.last_error: str | None = None
        self.loaded = asyncio.Event()

    @property
    def current(self) -> Registry:
        """The snapshot a request routes on (marked with a problem when it cannot be vouched for)."""
        good = self._good
        if good is None:
            return self._none
        since = self._failing_since
        if since is not None and time.monotonic() - since > self.stale_after_s:
            if self._stale is None:
                self._stale = good.with_problem(f"consul unreachable: {self.last_error}")
            return self._stale
        return good

    @property
    def revision(self) -> str:
        """Revision of the last good document, or `none`."""
        return self._good.revision if self._good is not None else NO_REGISTRY

    @property
    def healthy(self) -> bool:
        """A document is in force and Consul answered within the staleness bound."""
        return self.current.problem is None

    async def run(self) -> None:
        """Follow the key until cancelled."""
        await follow(lambda i: self.consul.kv(self.key, i), self._read, self._error)

    def _error(self, why: str) -> None:
        if self._failing_since is None or why != self.last_error:
            log().warning("consul_unreachable", source=self.source, error=why, kept=self.revision)
        self.last_error = why
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        if self._good is None:
            self._none = unavailable(f"consul unreachable: {why}")

    def _read(self, raw: bytes | None) -> None:
        self._failing_since = None
        self._stale = None
        if raw == self._raw:
            return
        self._raw = raw
        try:
            if raw is None:
                raise RegistryError.single(self.source, f"the key {self.key!r} does not exist in Consul")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise RegistryError.single(self.source, "the document is not valid UTF-8") from None
            new = Registry.from_yaml(text, self.source)
        except RegistryError as exc:
            # Last good stays in force; before one exists, nothing routes.
            self.last_error = str(exc)
            if self._good is None:
                self._none = unavailable(f"the registry in {self.source} is invalid")
            self._on_refused(self)
            return
        self._good, self.last_error = new, None
        self.loaded.set()
        self._on_change(self)


_UNSEEN = object()


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where each upstream is, as far as Consul's health checks know: for Envoy's clusters."""

    registry: Registry
    by_service: dict[str, tuple[Endpoint, ...]]

    def of(self, upstream: str) -> tuple[Endpoint, ...]:
        """The endpoints of one upstream (a fixed host:port, or the passing instances of its service)."""
        up = self.registry.spec.upstreams[upstream]
        if up.service is None:
            return ((up.host or "", up.port or 0),)
        return self.by_service.get(up.service, ())


class EndpointFeed:
    """Follows the registry and the health of every service it names; calls back on every change."""

    def __init__(self, registry: ConsulRegistry, on_change: Callable[[Endpoints], None]) -> None:
        self.registry = registry
        self._on_change = on_change
        self._health: dict[str, tuple[Endpoint, ...]] = {}
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._last: Endpoints | None = None

    def registry_changed(self) -> None:
        """Start following services the registry now names, stop those it no longer does."""
        reg = self.registry.current
        wanted = {up.service for up in reg.spec.upstreams.values() if up.service is not None}
        for gone in set(self._watches) - wanted:
            self._watches.pop(gone).cancel()
            self._health.pop(gone, None)
        for svc in wanted - set(self._watches):
            self._watches[svc] = asyncio.create_task(self._follow(svc))
        self._publish()

    async def _follow(self, service: str) -> None:
        consul = self.registry.consul

        def read(found: tuple[Endpoint, ...]) -> None:
            self._health[service] = found
            self._publish()

        # While Consul is unreachable the last known instances stay (Envoy's own outlier
        # detection still takes a dead one out); the registry's staleness decides routing.
        await follow(lambda i: consul.passing(service, i), read, lambda _why: None)

    def _publish(self) -> None:
        reg = self.registry.current
        if reg.revision == NO_REGISTRY:
            return
        snap = Endpoints(dataclasses.replace(reg, problem=None), dict(self._health))
        if snap != self._last:
            self._last = snap
            self._on_change(snap)

    def stop(self) -> None:
        """Cancel every health watch."""
        for task in self._watches.values():
            task.cancel()
        self._watches.clear()
