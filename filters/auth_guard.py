"""Failed API keys per source network, and a block once there are too many (gateway.auth_guard).

Listed before `principal`: every request's source network is checked first, so a blocked network
gets 429 `too_many_auth_failures` whatever key it sends, a right one included (else a guesser
would still learn which of its guesses is right). At SETTLE a request that principal refused for
its key (`invalid_api_key`, `expired_api_key`, `disabled_api_key`; `missing_api_key` too if
`count_missing`) counts one failure for its network; the `failures`-th in `window_s` blocks the
network for `block_s`. It counts in an all-networks counter too: while that holds
`surge_failures` in `window_s` (a botnet spreads its tries over many networks, each under its
own limit), `surge_network_failures` of them block a network. Counts and blocks live in Redis, shared by every worker and replica.

The source is `x-envoy-external-address`, the client address as Envoy saw it (it overwrites a
client's copy): with proxies in front of Envoy, that is the nearest one's unless
`ZTGATE_TRUSTED_PROXIES` names them, and then the address their `x-forwarded-for` names. IPv4
addresses count one by one (`ipv4_prefix` 32); IPv6 ones per /64 (`ipv6_prefix`), since one host
commonly holds a whole /64.
Networks under `exempt` are neither counted nor blocked. No source address (an Envoy set up
otherwise): refused, 500, never let through unchecked.

Whether a network is blocked is answered from a worker-local copy when it can (`block_cache_s`,
gateway.redis_copies: Redis tells every worker of every block set or lifted; without that link
every request asks Redis).

Redis down or slow: `fail_mode.redis` decides, `deny` (503 `auth_guard_unavailable`, the default)
or `allow_with_flag`. In `monitor` mode a blocked network's requests go through with a
`monitor:deny` verdict. The address is never written into verdicts or the audit record; the log
names a network once, when it is blocked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from typing import ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from filters.base import CONTINUE, BaseFilter, Decision, Deny, Phase, RequestContext, Verdict, fail_mode
from filters.chain import BuildEnv, register
from gateway.auth_guard import AuthFailStore, block_copies
from gateway.errors import ErrorCode
from gateway.observability import log
from gateway.redis_copies import RedisCopies, read_through

SOURCE_HEADER = "x-envoy-external-address"
_UNSEEN: Final = "\x00unseen"
_NETWORKS_KEPT = 4096
_COUNTED = frozenset({ErrorCode.INVALID_API_KEY, ErrorCode.EXPIRED_API_KEY, ErrorCode.DISABLED_API_KEY})


class AuthGuardParams(BaseModel):
    """Parameters of the auth_guard filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    failures: int = Field(
        default=10, ge=1, le=10_000, description="Refused keys from one source network that block it."
    )
    window_s: int = Field(default=300, ge=1, le=86_400, description="...within this many seconds (sliding).")
    block_s: int = Field(
        default=900, ge=1, le=7 * 86_400, description="How long a blocked network is refused, seconds."
    )
    surge_failures: int = Field(
        default=200,
        ge=0,
        le=10_000_000,
        description="Refused keys from all networks together within window_s that make a surge (many "
        "networks failing at once: a botnet, each network under its own limit); 0: never.",
    )
    surge_network_failures: int = Field(
        default=2,
        ge=1,
        le=10_000,
        description="During a surge, refused keys from one network that block it (at most failures).",
    )
    count_missing: bool = Field(
        default=False,
        description="Count requests without any key too (by default only keys that were refused).",
    )
    ipv4_prefix: int = Field(
        default=32, ge=8, le=32, description="IPv4 addresses count per network of this prefix."
    )
    ipv6_prefix: int = Field(
        default=64, ge=16, le=128, description="IPv6 addresses count per network of this prefix."
    )
    exempt: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Networks (CIDR, e.g. 10.20.0.0/16) never counted nor blocked: a health checker, "
        "a NAT that many users share.",
    )
    mode: Literal["enforce", "monitor"] = Field(
        default="enforce",
        description="monitor: count and block, but let a blocked network's requests through, marked.",
    )
    timeout_s: float = Field(default=0.25, gt=0.0, le=5.0, description="Time budget of one Redis call.")
    block_cache_s: float = Field(
        default=10.0,
        ge=0.0,
        le=300.0,
        description="How long a worker may reuse a network's block lookup, seconds (a block's copy "
        "lasts as long as the block), and only while Redis tells it of every block set or lifted "
        "(client-side caching: a change reaches every worker within milliseconds; without that link "
        "every request asks Redis). 0: ask Redis on every request.",
    )

    @field_validator("exempt")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for net in v:
            try:
                ipaddress.ip_network(net, strict=True)
            except ValueError as exc:
                raise ValueError(f"{net!r} is not a network: {exc}") from None
        return v


_UNAVAILABLE = Deny(
    503, ErrorCode.AUTH_GUARD_UNAVAILABLE, "the authentication guard is unavailable; try again later"
)
_NO_SOURCE = Deny(500, ErrorCode.INTERNAL, "internal gateway error")


class AuthGuard(BaseFilter):
    """Refuse requests from blocked source networks; count refused keys per network."""

    name: ClassVar[str] = "auth_guard"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.SETTLE
    precedes: ClassVar[tuple[str, ...]] = ("principal",)

    def __init__(
        self, store: AuthFailStore, params: AuthGuardParams, cache: RedisCopies[float] | None = None
    ) -> None:
        self.store = store
        self.params = params
        self.cache = cache if params.block_cache_s > 0 else None
        self._networks: dict[str, str | None] = {}
        self.exempt = tuple(ipaddress.ip_network(n) for n in params.exempt)
        self.counted = (_COUNTED | {ErrorCode.MISSING_API_KEY}) if params.count_missing else _COUNTED

    def network(self, address: str) -> str | None:
        """The network `address` counts in (None: exempt). ValueError if it is no address."""
        net = self._networks.get(address, _UNSEEN)
        if net is _UNSEEN:
            if len(self._networks) >= _NETWORKS_KEPT:  # a bounded memo: ipaddress parsing costs ~30 µs
                self._networks.clear()
            net = self._networks[address] = self._network(address)
        return net

    def _network(self, address: str) -> str | None:
        ip = ipaddress.ip_address(address.strip().removeprefix("[").removesuffix("]"))
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in n for n in self.exempt):
            return None
        prefix = self.params.ipv4_prefix if ip.version == 4 else self.params.ipv6_prefix
        return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        try:
            net = self.network(ctx.headers.get(SOURCE_HEADER, ""))
        except ValueError:
            log().error("auth_guard_no_source", request_id=ctx.request_id, header=SOURCE_HEADER)
            ctx.verdicts.append(Verdict(self.name, "check", "deny", 0.0, "no_source_address"))
            return _NO_SOURCE
        if net is None:
            return CONTINUE
        ctx.state[self.name] = net
        try:
            ends = await read_through(
                self.cache, self.store.block_key(net), self._block_ends, self.params.timeout_s, self._keep_s
            )
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            return fail_mode(ctx, self.name, "redis", type(exc).__name__, _UNAVAILABLE)
        left = math.ceil((ends - time.monotonic()) * 1000) if ends else 0
        if left <= 0:
            return CONTINUE
        detail = f"blocked,retry_after_ms={left}"
        if self.params.mode == "monitor":
            ctx.verdicts.append(Verdict(self.name, "check", "monitor:deny", 0.0, detail))
            return CONTINUE
        ctx.verdicts.append(Verdict(self.name, "check", "deny", 0.0, detail))
        retry_s = math.ceil(left / 1000)
        return Deny(
            429,
            ErrorCode.TOO_MANY_AUTH_FAILURES,
            f"too many failed authentications from this network; retry in {retry_s} s",
            (("retry-after", str(retry_s)), ("retry-after-ms", str(left))),
        )

    async def _block_ends(self, key: str) -> float:
        """When the block under `key` ends (time.monotonic()), 0.0 if there is none."""
        left = await self.store.blocked_ms_at(key)
        return time.monotonic() + left / 1000 if left > 0 else 0.0

    def _keep_s(self, ends: float) -> float:
        # A block's copy ends with the block; "not blocked" is kept for block_cache_s.
        return ends - time.monotonic() if ends else self.params.block_cache_s

    async def on_settle(self, ctx: RequestContext) -> Decision:
        net = ctx.state.get(self.name)
        if not isinstance(net, str) or ctx.error_code not in self.counted:
            return CONTINUE
        p = self.params
        limit, everywhere = p.failures, 0
        try:
            async with asyncio.timeout(p.timeout_s):
                if p.surge_failures:
                    everywhere = await self.store.count_surge(p.window_s)
                    if everywhere >= p.surge_failures:
                        limit = min(p.failures, p.surge_network_failures)
                got = await self.store.fail(net, p.window_s, limit, p.block_s)
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            log().error("auth_failure_not_recorded", request_id=ctx.request_id)
            return fail_mode(ctx, self.name, "redis", type(exc).__name__, _UNAVAILABLE)
        if everywhere == p.surge_failures and everywhere:  # the failure that starts a surge: once
            ctx.verdicts.append(Verdict(self.name, "failure", "surge", 0.0, f"failures={everywhere}"))
            log().warning(
                "auth_guard_surge",
                request_id=ctx.request_id,
                failures=everywhere,
                window_s=p.window_s,
                network_failures=limit,
            )
        if got.failures == 0:  # blocked meanwhile (by a request of the same network): not counted
            return CONTINUE
        surge = ",surge" if limit < p.failures else ""
        ctx.verdicts.append(
            Verdict(self.name, "failure", "count", 0.0, f"failures={got.failures}/{limit}{surge}")
        )
        if got.blocked_ms:
            if self.cache is not None:
                self.cache.drop(self.store.block_key(net))
            ctx.verdicts.append(Verdict(self.name, "failure", "block", 0.0, f"block_ms={got.blocked_ms}"))
            log().warning(
                "auth_guard_blocked",
                request_id=ctx.request_id,
                source=net,
                failures=got.failures,
                block_s=p.block_s,
                mode=p.mode,
            )
        return CONTINUE


def guard_event(v: Verdict) -> str | None:
    """What `v` says auth_guard did (metrics): failure, block, surge, refused or monitor; else None."""
    if v.filter != AuthGuard.name:
        return None
    if v.phase == "failure":
        return {"count": "failure", "surge": "surge"}.get(v.action, "block")
    if v.phase == "check" and v.detail.startswith("blocked"):
        return "refused" if v.action == "deny" else "monitor"
    return None


@register("auth_guard", AuthGuardParams)
def _build(env: BuildEnv, params: AuthGuardParams) -> AuthGuard:
    s = env.settings
    # One pool per process and timeout, shared by every policy revision's chain.
    store = env.engine(
        f"auth_guard:{params.timeout_s}",
        lambda: AuthFailStore.from_url(s.redis_url, s.redis_prefix, params.timeout_s),
    )
    # One invalidation link per process, shared like the pool; used when the policy allows copies.
    cache = env.engine(
        "auth_guard:block-copies", lambda: block_copies(s.redis_url, s.redis_prefix, params.timeout_s)
    )
    return AuthGuard(store, params, cache)
