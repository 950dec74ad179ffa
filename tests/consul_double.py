"""A faithful double of the parts of Consul's HTTP API the gateway uses, on a random loopback port.

No Consul binary can be installed here, so the Consul backend is tested against this double
(compose.yaml runs the real one). What it keeps of Consul (api-docs: kv, health, agent/service,
agent/check, features/blocking, acl):
- one Raft-like index for the whole store, bumped by every write; a key's `X-Consul-Index` is its
  ModifyIndex, a missing key's is the KV table's last write; a service's is its last change;
- blocking queries: `?index=N&wait=D` hang until the answer's index moves past N or the wait ends
  (plus up to wait/16 of jitter, as Consul adds), and then answer as they stand;
- KV GET as a JSON list of entries with base64 `Value`, `?raw`, 404 for a missing key (with the
  index header), PUT with `?cas=` (0: only if absent) answering `true`/`false`, DELETE;
- services registered through `/v1/agent/service/register` with TTL checks that start critical,
  moved by `/v1/agent/check/{pass,warn,fail}/service:<id>`; `/v1/health/service/<name>` with
  `?passing` keeping instances whose checks all pass;
- ACLs: with a token configured, a request without it gets 403 "Permission denied" and one with
  another token 403 "ACL not found".
Test controls beyond the API: `outage()` (the port refuses connections) and `restore()`, and
`reset_index(n)` (the store's index jumps back, as after a snapshot restore).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.procs import free_port

_WAIT = re.compile(r"^(\d+)(ms|s|m)?$")


@dataclass
class _Entry:
    value: bytes
    create_index: int
    modify_index: int


@dataclass
class _Instance:
    id: str
    name: str
    address: str
    port: int
    status: str  # passing, warning, critical
    modify_index: int


@dataclass
class ConsulDouble:
    """Consul's KV, health and agent endpoints in a background thread (see the module docstring)."""

    token: str | None = None
    port: int = field(default_factory=free_port)
    node_address: str = "127.0.0.1"
    index: int = 1
    kv: dict[str, _Entry] = field(default_factory=dict)
    kv_index: int = 1
    services: dict[str, _Instance] = field(default_factory=dict)
    service_index: dict[str, int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None
    _changed: asyncio.Condition | None = None
    _down: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- the store -------------------------------------------------------------------------------

    def _bump(self) -> int:
        self.index += 1
        return self.index

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    def _kv_read(self, key: str) -> tuple[int, _Entry | None]:
        e = self.kv.get(key)
        return (e.modify_index if e else self.kv_index), e

    def _health_read(self, name: str, passing: bool) -> tuple[int, list[dict[str, Any]]]:
        out = []
        for inst in sorted(self.services.values(), key=lambda i: i.id):
            if inst.name != name or (passing and inst.status != "passing"):
                continue
            out.append(
                {
                    "Node": {
                        "ID": "node-1",
                        "Node": "node-1",
                        "Address": self.node_address,
                        "Datacenter": "dc1",
                    },
                    "Service": {
                        "ID": inst.id,
                        "Service": inst.name,
                        "Tags": [],
                        "Address": inst.address,
                        "Port": inst.port,
                    },
                    "Checks": [
                        {
                            "Node": "node-1",
                            "CheckID": f"service:{inst.id}",
                            "Name": f"Service '{inst.name}' check",
                            "Status": inst.status,
                            "ServiceID": inst.id,
                            "ServiceName": inst.name,
                        }
                    ],
                }
            )
        return self.service_index.get(name, 1), out

    # -- HTTP ------------------------------------------------------------------------------------

    def _denied(self, req: web.Request) -> web.Response | None:
        if self.token is None:
            return None
        got = req.headers.get("X-Consul-Token") or req.query.get("token")
        if got == self.token:
            return None
        return web.Response(status=403, text="Permission denied" if not got else "ACL not found")

    async def _block(self, req: web.Request, read: Any) -> tuple[int, Any]:
        """Answer now, or hang until the index moves past `?index=` or the wait ends."""
        raw_index = req.query.get("index")
        index, result = read()
        if raw_index is None:
            return index, result
        want = int(raw_index)
        m = _WAIT.match(req.query.get("wait", "5m"))
        if m is None:
            raise web.HTTPBadRequest(text="Invalid wait time")
        n, unit = int(m.group(1)), m.group(2) or "s"
        wait_s = min(n / 1000 if unit == "ms" else n * (60 if unit == "m" else 1), 600.0)
        wait_s += random.uniform(0, wait_s / 16)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        assert self._changed is not None
        while index <= want:
            left = deadline - loop.time()
            if left <= 0:
                break
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
            if self._down:
                # The agent died under a hanging query: the connection drops, no answer comes.
                if req.transport is not None:
                    req.transport.close()
                raise web.HTTPServiceUnavailable
            index, result = read()
        return index, result

    def _headers(self, index: int) -> dict[str, str]:
        return {"X-Consul-Index": str(index), "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"}

    async def _kv(self, req: web.Request) -> web.StreamResponse:
        self.calls.append(f"{req.method} {req.path_qs}")
        if (denied := self._denied(req)) is not None:
            return denied
        key = req.match_info["key"]
        if req.method == "GET":
            index, entry = await self._block(req, lambda: self._kv_read(key))
            if entry is None:
                return web.Response(status=404, headers=self._headers(index))
            if "raw" in req.query:
                return web.Response(body=entry.value, headers=self._headers(index))
            doc = [
                {
                    "LockIndex": 0,
                    "Key": key,
                    "Flags": 0,
                    "Value": base64.b64encode(entry.value).decode() if entry.value else None,
                    "CreateIndex": entry.create_index,
                    "ModifyIndex": entry.modify_index,
                }
            ]
            return web.json_response(doc, headers=self._headers(index))
        if req.method == "PUT":
            body = await req.read()
            cas = req.query.get("cas")
            current = self.kv.get(key)
            if cas is not None and (
                (int(cas) == 0 and current is not None)
                or (int(cas) != 0 and (current is None or current.modify_index != int(cas)))
            ):
                return web.Response(text="false", content_type="application/json")
            self.put(key, body)
            await self._notify()
            return web.Response(text="true", content_type="application/json")
        if req.method == "DELETE":
            self.delete(key)
            await self._notify()
            return web.Response(text="true", content_type="application/json")
        return web.Response(status=405)

    async def _health(self, req: web.Request) -> web.StreamResponse:
        self.calls.append(f"{req.method} {req.path_qs}")
        if (denied := self._denied(req)) is not None:
            return denied
        name = req.match_info["name"]
        passing = "passing" in req.query and req.query["passing"] in ("", "true", "1")
        index, doc = await self._block(req, lambda: self._health_read(name, passing))
        return web.json_response(doc, headers=self._headers(index))

    async def _register(self, req: web.Request) -> web.StreamResponse:
        if (denied := self._denied(req)) is not None:
            return denied
        doc = await req.json()
        check = doc.get("Check") or {}
        self.register(
            doc["Name"],
            doc.get("ID") or doc["Name"],
            doc.get("Address", ""),
            int(doc["Port"]),
            # A TTL check is critical until its first pass, as in Consul.
            status=check.get("Status", "critical") if check else "passing",
        )
        await self._notify()
        return web.Response()

    async def _deregister(self, req: web.Request) -> web.StreamResponse:
        if (denied := self._denied(req)) is not None:
            return denied
        if not self.deregister(req.match_info["id"]):
            return web.Response(status=404, text="Unknown service ID")
        await self._notify()
        return web.Response()

    async def _check(self, req: web.Request) -> web.StreamResponse:
        if (denied := self._denied(req)) is not None:
            return denied
        status = {"pass": "passing", "warn": "warning", "fail": "critical"}[req.match_info["verb"]]
        check_id = req.match_info["id"]
        sid = check_id.removeprefix("service:")
        if sid not in self.services or not check_id.startswith("service:"):
            return web.Response(status=404, text=f'Unknown check ID "{check_id}"')
        self.set_status(sid, status)
        await self._notify()
        return web.Response()

    # -- direct controls (run on the test's thread; they wake blocked queries) ------------------

    def put(self, key: str, value: bytes) -> int:
        i = self._bump()
        old = self.kv.get(key)
        self.kv[key] = _Entry(value, old.create_index if old else i, i)
        self.kv_index = i
        self._wake()
        return i

    def delete(self, key: str) -> None:
        if self.kv.pop(key, None) is not None:
            self.kv_index = self._bump()
            self._wake()

    def register(self, name: str, sid: str, address: str, port: int, status: str = "passing") -> None:
        i = self._bump()
        self.services[sid] = _Instance(sid, name, address, port, status, i)
        self.service_index[name] = i
        self._wake()

    def deregister(self, sid: str) -> bool:
        inst = self.services.pop(sid, None)
        if inst is None:
            return False
        self.service_index[inst.name] = self._bump()
        self._wake()
        return True

    def set_status(self, sid: str, status: str) -> None:
        inst = self.services[sid]
        inst.status = status
        inst.modify_index = self.service_index[inst.name] = self._bump()
        self._wake()

    def reset_index(self, to: int) -> None:
        """The store's indexes jump back (a snapshot restore): every answer's index goes down."""
        self.index = to
        for e in self.kv.values():
            e.modify_index = min(e.modify_index, to)
        self.kv_index = min(self.kv_index, to)
        for name in self.service_index:
            self.service_index[name] = min(self.service_index[name], to)
        self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if (
            loop is not None
            and self._changed is not None
            and threading.current_thread().name != "consul-double"
        ):
            asyncio.run_coroutine_threadsafe(self._notify(), loop).result(5)

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> ConsulDouble:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._changed = asyncio.Condition()
            app = web.Application()
            app.router.add_route("*", "/v1/kv/{key:.+}", self._kv)
            app.router.add_get("/v1/health/service/{name}", self._health)
            app.router.add_put("/v1/agent/service/register", self._register)
            app.router.add_put("/v1/agent/service/deregister/{id}", self._deregister)
            app.router.add_put("/v1/agent/check/{verb:pass|warn|fail}/{id}", self._check)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            self._loop = loop
            loop.run_until_complete(self._listen())
            ready.set()
            loop.run_forever()
            loop.close()

        threading.Thread(target=run, daemon=True, name="consul-double").start()
        assert ready.wait(10), "the Consul double did not start"
        return self

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()

    async def _close_site(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None
        # Hanging blocking queries are cut too, as when the agent dies.
        self._down = True
        await self._notify()

    async def _reopen(self) -> None:
        self._down = False
        await self._listen()

    def outage(self) -> None:
        """Stop listening: every connection is refused until `restore()`."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._close_site(), self._loop).result(10)

    def restore(self) -> None:
        """Listen again on the same port, with the same state."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._reopen(), self._loop).result(10)

    def stop(self) -> None:
        if self._loop and self._runner:
            asyncio.run_coroutine_threadsafe(self._close_site(), self._loop).result(10)
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
