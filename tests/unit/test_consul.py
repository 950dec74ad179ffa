"""The Consul registry backend against the Consul double: KV, health, blocking queries, ACLs, staleness."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import yaml

from gateway.consul import Consul, ConsulError, ConsulRegistry, EndpointFeed, Endpoints, follow
from gateway.registry import NO_REGISTRY, Protocol, Registry, RegistryError, parse_ref
from tests.consul_double import ConsulDouble

KEY = "ztgate/registry"


def doc(upstream: dict[str, object], latest: str = "v1") -> bytes:
    return yaml.safe_dump(
        {
            "upstreams": {"up-a": {"protocol": "openai", **upstream}},
            "models": {"m": {"latest": latest, "versions": {latest: {"upstream": "up-a"}}}},
        }
    ).encode()


FIXED = doc({"host": "127.0.0.1", "port": 9001})


@pytest.fixture
def consul() -> Iterator[ConsulDouble]:
    d = ConsulDouble().start()
    yield d
    d.stop()


@pytest.fixture
async def client(consul: ConsulDouble) -> AsyncIterator[Consul]:
    c = Consul(consul.url, wait_s=2)
    yield c
    await c.close()


async def until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_kv_missing_key_is_none_with_an_index(client: Consul) -> None:
    got = await client.kv(KEY)
    assert got.value is None
    assert got.index >= 1


async def test_kv_put_then_get_and_cas(client: Consul, consul: ConsulDouble) -> None:
    assert await client.put(KEY, b"one", cas=0)
    assert not await client.put(KEY, b"two", cas=0)  # only if absent: it is not
    got = await client.kv(KEY)
    assert got.value == b"one"
    assert got.index == consul.kv[KEY].modify_index


async def test_blocking_query_hangs_until_a_change(client: Consul, consul: ConsulDouble) -> None:
    first = await client.kv(KEY)
    started = time.monotonic()
    waiting = asyncio.create_task(client.kv(KEY, first.index))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing changed yet: the query hangs
    await asyncio.to_thread(consul.put, KEY, b"new")
    got = await asyncio.wait_for(waiting, 2)
    assert got.value == b"new"
    assert got.index > first.index
    assert time.monotonic() - started < 1.5  # woken by the write, not by the wait ending


async def test_blocking_query_returns_unchanged_when_the_wait_ends(
    client: Consul, consul: ConsulDouble
) -> None:
    consul.put(KEY, b"same")
    first = await client.kv(KEY)
    got = await client.kv(KEY, first.index)  # wait_s=2 (+ up to 1/16 of jitter)
    assert (got.value, got.index) == (b"same", first.index)
    assert any("index=" in c and "wait=2s" in c for c in consul.calls)


async def test_acl_token_is_sent_and_refusals_are_errors(consul: ConsulDouble) -> None:
    consul.token = "s3cret"
    for token, reason in ((None, "Permission denied"), ("wrong", "ACL not found")):
        c = Consul(consul.url, token)
        with pytest.raises(ConsulError, match=f"HTTP 403 {reason}") as err:
            await c.kv(KEY)
        assert "s3cret" not in str(err.value) and "wrong" not in str(err.value)
        await c.close()
    ok = Consul(consul.url, "s3cret")
    assert (await ok.kv(KEY)).value is None
    await ok.close()


async def test_health_lists_only_passing_instances(client: Consul, consul: ConsulDouble) -> None:
    consul.register("vllm", "vllm-1", "10.0.0.5", 8000, status="critical")
    consul.register("vllm", "vllm-2", "", 8001)  # no address of its own: its node's
    consul.register("other", "other-1", "10.0.0.9", 9000)
    got = await client.passing("vllm")
    assert got.value == (("127.0.0.1", 8001),)
    consul.set_status("vllm-1", "passing")
    assert (await client.passing("vllm", got.index)).value == (("10.0.0.5", 8000), ("127.0.0.1", 8001))


async def test_follow_starts_over_when_the_index_goes_backwards(consul: ConsulDouble) -> None:
    client = Consul(consul.url, wait_s=1)
    consul.put(KEY, b"a")
    consul.put(KEY, b"b")
    seen: list[bytes | None] = []
    task = asyncio.create_task(follow(lambda i: client.kv(KEY, i), seen.append, lambda _: None))
    try:
        await until(lambda: seen == [b"b"])
        # The blocking query from the index of that read is hanging in the double.
        await until(lambda: any("index=" in c for c in consul.calls))
        before = len(consul.calls)
        consul.reset_index(1)  # the store restored from a snapshot: indexes went down
        consul.kv[KEY].value = b"restored"
        consul.put("elsewhere", b"x")  # the index moves, but stays under the one waited for
        # The query hanging at the old index answers when its wait ends, with a lower index (and
        # may already carry the new value): the next query is a full read (no index), not a wait
        # from the old index. Wait for that query too, not only for the value.
        await until(lambda: b"restored" in seen and len(consul.calls) > before)
        later = consul.calls[before:]
        assert "index=" not in later[0], later
    finally:
        task.cancel()
        await client.close()


async def test_follow_backs_off_on_errors(consul: ConsulDouble) -> None:
    client = Consul(consul.url, wait_s=1)
    consul.outage()
    errors: list[str] = []
    task = asyncio.create_task(follow(lambda i: client.kv(KEY, i), lambda _: None, errors.append))
    await asyncio.sleep(1.5)
    task.cancel()
    await client.close()
    # Backoff 0.25 s doubling to 2 s (with jitter): a handful of tries, not a busy loop.
    assert 2 <= len(errors) <= 6, errors
    assert all("ClientConnectorError" in e for e in errors)


@contextlib.asynccontextmanager
async def following(
    consul: ConsulDouble, stale_after_s: float = 0.5
) -> AsyncIterator[tuple[ConsulRegistry, list[str]]]:
    events: list[str] = []
    src = ConsulRegistry(
        Consul(consul.url, wait_s=1),
        KEY,
        stale_after_s,
        on_change=lambda s: events.append(f"loaded {s.revision}"),
        on_refused=lambda s: events.append("refused"),
    )
    task = asyncio.create_task(src.run())
    try:
        yield src, events
    finally:
        task.cancel()
        await src.consul.close()


async def test_registry_before_any_document_refuses_everything(consul: ConsulDouble) -> None:
    async with following(consul) as (src, events):
        await until(lambda: events == ["refused"])  # the key does not exist
        assert src.current.revision == NO_REGISTRY
        assert src.current.problem is not None
        assert "does not exist" in (src.last_error or "")
        assert not src.healthy


async def test_registry_follows_changes_and_keeps_last_good(consul: ConsulDouble) -> None:
    consul.put(KEY, FIXED)
    async with following(consul) as (src, events):
        await src.loaded.wait()
        first = src.current
        assert first.problem is None
        route = first.resolve(parse_ref("m") or pytest.fail("m is a reference"), Protocol.OPENAI)
        assert route is not None and route.version == "v1"
        consul.put(KEY, doc({"host": "127.0.0.1", "port": 9001}, latest="v2"))
        await until(lambda: src.current.revision != first.revision)
        assert src.current.spec.models["m"].latest == "v2"
        consul.put(KEY, b"upstreams: [not, a, map\n")  # broken: refused, v2 stays
        await until(lambda: events[-1] == "refused")
        assert src.current.spec.models["m"].latest == "v2"
        assert src.healthy
        consul.put(KEY, b"\xff\xfe not utf-8")
        await until(lambda: "UTF-8" in (src.last_error or ""))
        assert src.current.spec.models["m"].latest == "v2"
        consul.delete(KEY)  # a deleted key is refused too: the last good one stays
        await until(lambda: "does not exist" in (src.last_error or ""))
        assert src.current.spec.models["m"].latest == "v2"


async def test_registry_goes_stale_when_consul_is_down_and_recovers(consul: ConsulDouble) -> None:
    consul.put(KEY, FIXED)
    async with following(consul, stale_after_s=0.5) as (src, _):
        await src.loaded.wait()
        consul.outage()
        await until(lambda: src.last_error is not None)
        assert src.current.problem is None  # within the staleness bound: still vouched for
        await until(lambda: src.current.problem is not None, within_s=3)
        assert "consul unreachable" in (src.current.problem or "")
        assert src.current.spec.models["m"].latest == "v1"  # the last good snapshot, marked
        consul.restore()
        await until(lambda: src.healthy, within_s=8)


async def test_endpoint_feed_follows_passing_instances(consul: ConsulDouble) -> None:
    consul.put(KEY, doc({"service": "vllm"}))
    consul.register("vllm", "vllm-1", "10.0.0.5", 8000, status="critical")
    published: list[Endpoints] = []
    src = ConsulRegistry(Consul(consul.url, wait_s=1), KEY, 5.0)
    feed = EndpointFeed(src, published.append)
    src._on_change = lambda _s: feed.registry_changed()
    task = asyncio.create_task(src.run())
    await until(lambda: bool(published))
    assert published[-1].of("up-a") == ()  # nothing passes: Envoy gets a cluster with no hosts
    consul.set_status("vllm-1", "passing")
    await until(lambda: published[-1].of("up-a") == (("10.0.0.5", 8000),))
    consul.register("vllm", "vllm-2", "10.0.0.6", 8000)
    await until(lambda: len(published[-1].of("up-a")) == 2)
    consul.deregister("vllm-1")
    await until(lambda: published[-1].of("up-a") == (("10.0.0.6", 8000),))
    consul.put(KEY, FIXED)  # the upstream became a fixed address: the service is no longer followed
    await until(lambda: published[-1].of("up-a") == (("127.0.0.1", 9001),))
    assert feed._watches == {}
    task.cancel()
    feed.stop()
    await src.consul.close()


def test_a_service_upstream_needs_the_consul_source() -> None:
    text = doc({"service": "vllm"}).decode()
    with pytest.raises(RegistryError, match="names a Consul service, but the registry is a file"):
        Registry.from_yaml(text, "registry.yaml")
    assert Registry.from_yaml(text, f"consul:{KEY}").spec.upstreams["up-a"].service == "vllm"


@pytest.mark.parametrize(
    "upstream",
    [{"service": "vllm", "host": "127.0.0.1", "port": 1}, {"host": "127.0.0.1"}, {"port": 1}, {}],
)
def test_an_upstream_is_an_address_or_a_service(upstream: dict[str, object]) -> None:
    with pytest.raises(RegistryError, match="needs either host and port, or service"):
        Registry.from_yaml(doc(upstream).decode(), f"consul:{KEY}")
