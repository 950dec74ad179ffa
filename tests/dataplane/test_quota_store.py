"""The quota store's scripts against the real Redis: atomic admission across clients, waits, slides."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from filters._protocols import Prompt, Segment
from filters.base import CONTINUE, Principal, RequestContext
from filters.quota import Quota, QuotaParams, TokenQuota
from gateway.quota import QuotaStore, Window
from gateway.registry import Protocol, Registry

pytestmark = pytest.mark.dataplane

REDIS = "redis://127.0.0.1:6379/0"


def _ctx(request_id: str) -> RequestContext:
    """A chat request's context, before any filter ran."""
    return RequestContext(
        request_id, "POST", "/v1/chat/completions", {}, Registry.from_yaml("upstreams: {}\nmodels: {}\n")
    )


@pytest_asyncio.fixture
async def stores() -> AsyncIterator[tuple[QuotaStore, QuotaStore]]:
    """Two stores on their own pools, as two replicas have, under a prefix of this test's own."""
    prefix = f"ztgate-test-{uuid.uuid4().hex[:12]}:"
    a, b = QuotaStore.from_url(REDIS, prefix, 2.0), QuotaStore.from_url(REDIS, prefix, 2.0)
    yield a, b
    keys = [k async for k in a.client.scan_iter(match=f"{prefix}*")]
    if keys:
        await a.client.delete(*keys)
    await a.aclose()
    await b.aclose()


async def test_concurrent_requests_from_two_replicas_take_exactly_the_limit(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, b = stores
    per_user = Window(a.key("acme", "user", "ann", "rpm", "requests"), 10, 60)
    per_tenant = Window(a.key("acme", "tenant", "", "tenant-rpm", "requests"), 15, 60)
    results = await asyncio.gather(*(s.admit([per_user, per_tenant]) for _ in range(20) for s in (a, b)))
    admitted = [r for r in results if r.refused_by is None]
    assert len(admitted) == 10
    assert sorted(r.counts[0] for r in admitted) == list(range(1, 11))
    assert all(
        r.refused_by == 0 and 59_000 < r.retry_after_ms <= 60_000 for r in results if r not in admitted
    )
    # refusals counted nowhere: the tenant's window holds only the 10 admitted, so bob gets 5 more
    bob = Window(a.key("acme", "user", "bob", "rpm", "requests"), 10, 60)
    more = [await b.admit([bob, per_tenant]) for _ in range(6)]
    assert [r.refused_by for r in more] == [None] * 5 + [1]


async def test_a_request_window_slides_and_says_when_it_will_have_room(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, _ = stores
    w = Window(a.key("acme", "key", "k1", "burst", "requests"), 2, 1)
    assert (await a.admit([w])).refused_by is None
    await asyncio.sleep(0.3)
    assert (await a.admit([w])).refused_by is None
    refused = await a.admit([w])
    # room when the first admitted leaves the 1 s window: about 0.7 s from now
    assert refused.refused_by == 0 and 500 < refused.retry_after_ms <= 750, refused
    await asyncio.sleep(refused.retry_after_ms / 1000 + 0.05)
    assert (await a.admit([w])).refused_by is None  # the oldest left; the second still counts
    assert (await a.admit([w])).refused_by == 0


async def test_tokens_are_checked_before_and_counted_after_and_leave_with_the_window(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, b = stores
    w = Window(a.key("globex", "tenant", "", "tpm", "tokens"), 100, 2)
    assert (await a.check_tokens([w])).counts == (0,)
    await a.add_tokens([w], 60)
    await b.add_tokens([w], 30)
    assert (await b.check_tokens([w])).counts == (90,)  # under the limit: admitted, even if it goes over
    await a.add_tokens([w], 30)
    refused = await b.check_tokens([w])
    assert refused.refused_by == 0 and 0 < refused.retry_after_ms <= 2000, refused
    started = time.monotonic()
    while (await a.check_tokens([w])).refused_by is not None:
        assert time.monotonic() - started < 3, "the window did not slide"
        await asyncio.sleep(0.05)
    # the slices leave as the window slides past them, not all at once past the last one
    assert time.monotonic() - started <= refused.retry_after_ms / 1000 + 0.2


async def test_reservations_from_two_replicas_hold_their_place_until_replaced_by_what_was_used(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, b = stores
    w = Window(a.key("acme", "user", "ann", "tpm", "tokens"), 100, 60)
    got = await asyncio.gather(*(s.reserve_tokens([w], 30) for _ in range(5) for s in (a, b)))
    taken = [(g, at) for g, at in got if g.refused_by is None]
    # admitted while 30 more fit in 100: at 0, 30 and 60 held; the rest found reservations filling it
    assert sorted(g.counts[0] for g, _ in taken) == [0, 30, 60]
    assert all(g.refused_by == 0 and g.retry_after_ms == 1000 and at == 0 for g, at in got if g.refused_by)
    assert (await a.check_tokens([w])).counts == (90,)  # under the limit, yet 30 more do not fit
    assert (await a.reserve_tokens([w], 11))[0].refused_by == 0
    # one used 5 of its 30: 60 held + 5 used, room for 35 again in every replica's view
    await b.add_tokens([w], 5, 30, taken[0][1])
    assert (await a.check_tokens([w])).counts == (65,)
    ((shown,),) = [[c for c in await a.counters("acme") if c["kind"] == "tokens"]]
    assert (shown["used"], shown["reserved"]) == (5, 60)
    with pytest.raises(ValueError, match="can never fit"):
        await a.reserve_tokens([w], 101)
    # the others were never forwarded: they give theirs back and count nothing
    for _, at in taken[1:]:
        await a.add_tokens([w], 0, 30, at)
    assert (await b.check_tokens([w])).counts == (5,)
    # used tokens alone over the limit: the wait is the window's, not a second
    await a.add_tokens([w], 200)
    full = await b.reserve_tokens([w], 1)
    assert full[0].refused_by == 0 and full[0].retry_after_ms > 50_000, full


async def test_a_reservation_that_outlived_its_window_is_gone_and_its_use_still_counts(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, _ = stores
    w = Window(a.key("acme", "user", "ann", "tps", "tokens"), 100, 1)
    held, at = await a.reserve_tokens([w], 80)
    assert held.counts == (0,) and at > 0
    await asyncio.sleep(1.1)  # the request lasted longer than the window: its reservation left it
    assert (await a.check_tokens([w])).counts == (0,)
    await a.add_tokens([w], 10, 80, at)
    assert (await a.check_tokens([w])).counts == (10,)
    fields = await a.client.hgetall(w.key)
    assert all(int(v) > 0 for v in fields.values()), fields  # no negative leftover of the reservation


async def test_names_with_separators_do_not_share_a_counter(stores: tuple[QuotaStore, QuotaStore]) -> None:
    a, _ = stores
    one = Window(a.key("a:b", "user", "c", "rpm", "requests"), 1, 60)
    two = Window(a.key("a", "user", "b:c", "rpm", "requests"), 1, 60)
    three = Window(a.key("a", "user", "b}c", "rpm", "requests"), 1, 60)
    assert len({one.key, two.key, three.key}) == 3
    assert [(await a.admit([w])).refused_by for w in (one, two, three)] == [None, None, None]


async def test_monitor_mode_lets_a_request_over_the_limit_through_marked(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, _ = stores
    quota = Quota(
        a,
        QuotaParams.model_validate(
            {"limits": [{"name": "rpm", "requests": 1, "window_s": 60}], "mode": "monitor"}
        ),
    )

    def ctx() -> RequestContext:
        c = _ctx("r")
        c.principal = Principal("k1", "ann", "acme")
        return c

    first, second = ctx(), ctx()
    assert await quota.on_request_headers(first) is CONTINUE
    assert await quota.on_request_headers(second) is CONTINUE
    assert [(v.action, v.detail) for v in first.verdicts] == [("count", "rpm=1/1")]
    ((action, detail),) = [(v.action, v.detail) for v in second.verdicts]
    assert action == "monitor:deny" and detail.startswith("limit=rpm,retry_after_ms=")


async def test_in_monitor_mode_a_request_over_its_token_limit_still_counts_in_its_request_limits(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, _ = stores
    params = {
        "limits": [
            {"name": "rpm", "requests": 5, "window_s": 60},
            {"name": "tpm", "tokens": 10, "window_s": 60},
        ],
        "mode": "monitor",
        "reserve_tokens": 4,
    }
    quota = TokenQuota(a, QuotaParams.model_validate(params))
    who = Principal("k1", "ann", "acme")
    await a.add_tokens(quota.windows(who, quota.tokens), 50)  # the token limit is used up
    c = _ctx("r")
    c.principal = who
    assert await quota.on_request_headers(c) is CONTINUE
    assert [(v.action, v.detail.split(",")[0]) for v in c.verdicts] == [
        ("monitor:deny", "limit=tpm"),
        ("count", "rpm=1/5"),
    ]
    # its reservation is refused too, but the request is marked over the limit once, not twice
    c.prompt = Prompt(Protocol.OPENAI, "chat", "m", segments=(Segment("user", "hello"),), document={})
    assert await quota.on_request_body(c, b"") is CONTINUE
    assert len(c.verdicts) == 2
    # under the limit in monitor mode, a request reserves as it would when enforced
    fresh = _ctx("r2")
    fresh.principal, fresh.prompt = Principal("k2", "bo", "acme"), c.prompt
    assert await quota.on_request_headers(fresh) is CONTINUE
    assert await quota.on_request_body(fresh, b"") is CONTINUE
    assert [(v.phase, v.action, v.detail) for v in fresh.verdicts][-1] == (
        "reserve",
        "count",
        "tokens=6,tpm=0/10",
    )
    # one that could never fit is marked, and goes through unreserved
    big = _ctx("r3")
    big.principal = Principal("k3", "cy", "acme")
    big.prompt = Prompt(
        Protocol.OPENAI, "chat", "m", segments=(Segment("user", "hello"),), document={"max_tokens": 9}
    )
    assert await quota.on_request_headers(big) is CONTINUE
    assert await quota.on_request_body(big, b"") is CONTINUE
    assert [(v.phase, v.action, v.detail) for v in big.verdicts][-1] == (
        "admit",
        "monitor:deny",
        "limit=tpm,needs=11",
    )


async def test_concurrent_leases_from_two_replicas_take_exactly_the_limit_and_run_out(
    stores: tuple[QuotaStore, QuotaStore],
) -> None:
    a, b = stores
    w = Window(a.key("acme", "user", "ann", "in-flight", "concurrent"), 5, 0)
    got = await asyncio.gather(
        *(s.lease([w], f"l{i}-{n}", 60_000) for i in range(6) for n, s in enumerate((a, b)))
    )
    taken = [g for g in got if g.refused_by is None]
    assert sorted(g.counts[0] for g in taken) == [1, 2, 3, 4, 5]
    assert all(g.retry_after_ms == 1000 for g in got if g.refused_by == 0)
    # Given back: room again, in every replica's view.
    held = [
        f"l{i}-{n}"
        for (i, n), g in zip(((i, n) for i in range(6) for n in range(2)), got, strict=True)
        if g.refused_by is None
    ]
    await a.release([w], held[0])
    assert (await b.lease([w], "again", 60_000)).counts == (5,)
    assert (await a.lease([w], "over", 60_000)).refused_by == 0
    # A lease nobody gives back (its worker died) runs out by itself.
    short = Window(a.key("acme", "user", "bo", "in-flight", "concurrent"), 1, 0)
    assert (await a.lease([short], "lost", 200)).refused_by is None
    assert (await b.lease([short], "next", 200)).refused_by == 0
    await asyncio.sleep(0.3)
    assert (await b.lease([short], "next", 200)).refused_by is None
