"""Request-rate and token quotas per user, tenant or API key, across replicas (gateway.quota).

At request headers, before anything is parsed or forwarded, the request is checked against every
limit: a request limit with no room left, or a token limit used up, refuses it with 429 (OpenAI's
`rate_limit_exceeded` / `token_quota_exceeded` shape, or KServe's), a `retry-after` header in
seconds and `retry-after-ms` (which the `openai` SDK honours when it retries). An admitted request
is counted in every request limit at once.

Token limits admit a request while the window's tokens are under the limit. Its body then
reserves what it may use (its prompt, estimated, and its answer's cap: `max_tokens` or
`max_completion_tokens` times `n`, else the policy's `reserve_tokens`), counted at once and only
if it fits in what the window has left, so the requests in flight hold their place, a burst
cannot all pass on one window's room, and no request asks its way past the limit. A request
that sets no cap is forwarded with `max_tokens: reserve_tokens` (`cap_answers`), so it uses no more
than it reserved; a cap field that is no whole number is refused with 400. When it
ends, its tokens replace the reservation: the answer's `usage.total_tokens` (OpenAI answers and
streams: a stream that does not ask for its usage chunk is forwarded asking for it, and the
chunk is taken out before the client gets the stream, `stream_usage`), else an estimate of its
prompt and answer text (UTF-8 bytes / 4, rounded up; a KServe answer, a server that sends no
usage); a request never forwarded gives its reservation back. A chain with a token limit therefore reads answers (4
phases); one with request limits only reads request headers.

Redis down or slow: `fail_mode.redis` decides, `deny` (503 quota_unavailable, the default) or
`allow_with_flag`. In `monitor` mode a request over a limit goes through with a `monitor:deny`
verdict (so a new limit can be tried in shadow).
"""

from __future__ import annotations

import asyncio
import math
import secrets
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from filters import _kserve, _openai
from filters._protocols import Prompt, compact_json
from filters.base import (
    CONTINUE,
    BaseFilter,
    Continue,
    Decision,
    Deny,
    Phase,
    Principal,
    RequestContext,
    Verdict,
    fail_mode,
)
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode
from gateway.observability import log
from gateway.quota import Admission, Kind, Per, QuotaStore, Window
from gateway.registry import Protocol


class Limit(BaseModel):
    """One limit: at most `requests` requests, or `tokens` tokens, per subject in `window_s`; or
    at most `concurrent` requests of a subject in flight at once."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
        description="Names the counter (an override that changes the numbers keeps counting in it) "
        "and is told to the client whose request it refuses.",
    )
    per: Per = Field(
        default="user", description="Whose counter: each user (of a tenant), each tenant, or each API key."
    )
    requests: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests admitted in the window (give one of requests, tokens, concurrent).",
    )
    tokens: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Tokens (prompt and answer) used in the window, after which requests are refused "
        "until it slides.",
    )
    concurrent: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests in flight at once (from request headers until the answer ends, streams "
        "included); no window.",
    )
    window_s: int | None = Field(
        default=None, ge=1, le=31 * 86400, description="Sliding window, seconds (requests and tokens)."
    )

    @model_validator(mode="after")
    def _one_measure(self) -> Self:
        if [self.requests, self.tokens, self.concurrent].count(None) != 2:
            raise ValueError("give exactly one of requests, tokens or concurrent")
        if self.concurrent is None and self.window_s is None:
            raise ValueError(f"a limit of {self.kind} needs window_s")
        if self.concurrent is not None and self.window_s is not None:
            raise ValueError("a concurrent limit has no window: leave window_s out")
        return self

    @property
    def kind(self) -> Kind:
        """What it counts."""
        if self.concurrent is not None:
            return "concurrent"
        return "requests" if self.requests is not None else "tokens"

    @property
    def amount(self) -> int:
        """How many of them the window (or the subject, at once) holds."""
        return next(n for n in (self.requests, self.tokens, self.concurrent) if n is not None)

    @property
    def window(self) -> int:
        """The window in seconds (0: a concurrent limit has none)."""
        return self.window_s or 0


class QuotaParams(BaseModel):
    """Parameters of the quota filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    limits: list[Limit] = Field(min_length=1, max_length=16, description="The limits; every one applies.")
    mode: Literal["enforce", "monitor"] = Field(
        default="enforce", description="monitor: count, and let requests over a limit through, marked."
    )
    timeout_s: float = Field(default=0.25, gt=0.0, le=5.0, description="Time budget of one Redis call.")
    reserve_tokens: int = Field(
        default=1024,
        ge=0,
        le=10**7,
        description="Token limits: answer tokens reserved, while it is in flight, for a request that "
        "sets no max_tokens (max_completion_tokens; KServe: max_tokens).",
    )
    cap_answers: bool = Field(
        default=True,
        description="Token limits, enforce mode: a request that sets no answer cap is forwarded with "
        "max_tokens set to reserve_tokens (KServe generate: parameters.max_tokens), so it uses no "
        "more than it reserved. false: such a request may write past its reservation.",
    )
    stream_usage: bool = Field(
        default=True,
        description="Token limits, enforce mode: an OpenAI stream that does not ask for its usage "
        "chunk is forwarded with stream_options.include_usage, and the chunk is taken out before the "
        "stream reaches the client, so its tokens are the model server's count, not an estimate. "
        "false: such a stream is counted by estimate (UTF-8 bytes / 4).",
    )

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [lim.name for lim in self.limits]
        if len(set(names)) != len(names):
            raise ValueError(f"limit names must be unique: {', '.join(sorted(names))}")
        if self.cap_answers and self.reserve_tokens == 0 and any(lim.kind == "tokens" for lim in self.limits):
            raise ValueError(
                "cap_answers would cap answers at reserve_tokens: 0; set reserve_tokens, or cap_answers: false"
            )
        return self


_UNAVAILABLE = Deny(503, ErrorCode.QUOTA_UNAVAILABLE, "the quota service is unavailable; try again later")


class Quota(BaseFilter):
    """Refuse requests over their request and concurrency limits (one phase; leases are given
    back when the stream ends)."""

    name: ClassVar[str] = "quota"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS
    needs: ClassVar[tuple[str, ...]] = ("principal",)

    def __init__(self, store: QuotaStore, params: QuotaParams, lease_ttl_s: float = 360.0) -> None:
        self.store = store
        self.params = params
        self.requests = [lim for lim in params.limits if lim.kind == "requests"]
        self.tokens = [lim for lim in params.limits if lim.kind == "tokens"]
        self.concurrent = [lim for lim in params.limits if lim.kind == "concurrent"]
        # A lease outlives no request: as long as Envoy lets an ext_proc stream last.
        self.lease_ttl_ms = int(lease_ttl_s * 1000)

    def windows(self, who: Principal, limits: list[Limit]) -> list[Window]:
        """The counters of `who` for `limits`."""
        subjects = {"user": who.user, "tenant": who.tenant, "key": who.key_id}
        return [
            Window(
                self.store.key(who.tenant, lim.per, subjects[lim.per], lim.name, lim.kind),
                lim.amount,
                lim.window,
            )
            for lim in limits
        ]

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        who = ctx.principal
        if who is None:
            return CONTINUE
        enforce = self.params.mode == "enforce"
        try:
            async with asyncio.timeout(self.params.timeout_s):
                if self.tokens:
                    used = await self.store.check_tokens(self.windows(who, self.tokens))
                    if used.refused_by is not None:
                        refusal = self._refuse(ctx, self.tokens[used.refused_by], used)
                        # monitor mode lets it through, so it still counts in the other limits
                        if enforce or not (self.requests or self.concurrent):
                            return refusal
                if self.concurrent:
                    # Remembered before it is asked for: on_end gives it back, whatever happened.
                    lease = ctx.state[_LEASE] = secrets.token_hex(8)
                    taken = await self.store.lease(
                        self.windows(who, self.concurrent), lease, self.lease_ttl_ms
                    )
                    if taken.refused_by is not None:
                        refusal = self._refuse(ctx, self.concurrent[taken.refused_by], taken)
                        if enforce:
                            return refusal
                    else:
                        detail = _counts(self.concurrent, taken)
                        ctx.verdicts.append(Verdict(self.name, "lease", "count", 0.0, detail))
                if not self.requests:
                    return CONTINUE
                admitted = await self.store.admit(self.windows(who, self.requests))
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            return fail_mode(ctx, self.name, "redis", type(exc).__name__, _UNAVAILABLE)
        if admitted.refused_by is not None:
            return self._refuse(ctx, self.requests[admitted.refused_by], admitted)
        ctx.verdicts.append(Verdict(self.name, "admit", "count", 0.0, _counts(self.requests, admitted)))
        return CONTINUE

    async def on_end(self, ctx: RequestContext) -> None:
        lease = ctx.state.pop(_LEASE, None)
        who = ctx.principal
        if not isinstance(lease, str) or who is None:
            return
        try:
            async with asyncio.timeout(self.params.timeout_s):
                await self.store.release(self.windows(who, self.concurrent), lease)
        except Exception as exc:  # noqa: BLE001 - the request is over; the lease runs out by itself
            log().error(
                "quota_lease_not_released",
                request_id=ctx.request_id,
                error_type=type(exc).__name__,
                expires_in_s=self.lease_ttl_ms // 1000,
            )

    def _too_large(self, ctx: RequestContext, lim: Limit, tokens: int) -> Decision:
        detail = f"limit={lim.name},needs={tokens}"
        if self.params.mode == "monitor":
            if any(over_limit(v) for v in ctx.verdicts):
                return CONTINUE  # over at request headers already: marked once
            ctx.verdicts.append(Verdict(self.name, "admit", "monitor:deny", 0.0, detail))
            return CONTINUE
        ctx.verdicts.append(Verdict(self.name, "admit", "deny", 0.0, detail))
        return Deny(
            429,
            ErrorCode.TOKEN_QUOTA_EXCEEDED,
            f"this request may use {tokens} tokens (its prompt, estimated, and its answer's cap), more "
            f"than token quota {lim.name!r} allows ({lim.tokens} tokens per {lim.window} s); ask for "
            "a smaller max_tokens",
            (("x-ratelimit-limit-tokens", str(lim.amount)),),
        )

    def _refuse(self, ctx: RequestContext, lim: Limit, a: Admission, needs: int = 0) -> Decision:
        retry_s = math.ceil(a.retry_after_ms / 1000)
        detail = f"limit={lim.name},retry_after_ms={a.retry_after_ms}"
        if self.params.mode == "monitor":
            ctx.verdicts.append(Verdict(self.name, "admit", "monitor:deny", 0.0, detail))
            return CONTINUE
        ctx.verdicts.append(Verdict(self.name, "admit", "deny", 0.0, detail))
        headers = (
            ("retry-after", str(retry_s)),
            ("retry-after-ms", str(a.retry_after_ms)),
            (f"x-ratelimit-limit-{lim.kind}", str(lim.amount)),
            (f"x-ratelimit-remaining-{lim.kind}", "0"),
        )
        if lim.kind == "requests":
            return Deny(
                429,
                ErrorCode.RATE_LIMIT_EXCEEDED,
                f"rate limit {lim.name!r} reached ({lim.requests} requests per {lim.window} s); "
                f"retry in {retry_s} s",
                headers,
            )
        if lim.kind == "concurrent":
            return Deny(
                429,
                ErrorCode.CONCURRENCY_LIMIT_EXCEEDED,
                f"concurrency limit {lim.name!r} reached ({lim.concurrent} requests at once); "
                f"retry in {retry_s} s",
                headers,
            )
        held = f"{lim.tokens} tokens per {lim.window} s, those reserved by requests in flight included"
        if needs:
            return Deny(
                429,
                ErrorCode.TOKEN_QUOTA_EXCEEDED,
                f"token quota {lim.name!r} has no room for this request's {needs} tokens (its prompt, "
                f"estimated, and its answer's cap; {held}); retry in {retry_s} s",
                headers,
            )
        return Deny(
            429,
            ErrorCode.TOKEN_QUOTA_EXCEEDED,
            f"token quota {lim.name!r} used up ({held}); retry in {retry_s} s",
            headers,
        )


_LEASE = "quota:lease"


def _counts(limits: list[Limit], a: Admission) -> str:
    return ",".join(f"{lim.name}={n}/{lim.amount}" for lim, n in zip(limits, a.counts, strict=True))


class TokenQuota(Quota):
    """Request and token limits: also reserves tokens at the request body, reads the answer, and
    counts its tokens in place of the reservation at SETTLE."""

    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.REQUEST_BODY | Phase.RESPONSE_BODY | Phase.SETTLE
    needs: ClassVar[tuple[str, ...]] = ("principal", "protocol")

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        who, p = ctx.principal, ctx.prompt
        if who is None or p is None:
            return CONTINUE
        enforce = self.params.mode == "enforce"
        try:
            asked = answer_cap(p)
        except CapError as exc:
            if enforce:
                return Deny(400, ErrorCode.INVALID_REQUEST, str(exc))
            asked = Asked(None, 1)  # monitor mode changes no request: counted as one with no cap
        caps = asked.cap is None and self.params.cap_answers and enforce and cappable(p)
        capped = self.params.reserve_tokens if caps else None
        tokens = reservation(p, asked, self.params.reserve_tokens)
        over = next((lim for lim in self.tokens if tokens > lim.amount), None)
        if over is not None:  # never fits: refused unsent, whatever the window holds
            return self._too_large(ctx, over, tokens)
        try:
            async with asyncio.timeout(self.params.timeout_s):
                got, at_ms = await self.store.reserve_tokens(self.windows(who, self.tokens), tokens)
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            return fail_mode(ctx, self.name, "redis", type(exc).__name__, _UNAVAILABLE)
        if got.refused_by is not None:  # the window filled since request headers
            if any(over_limit(v) for v in ctx.verdicts):
                return CONTINUE  # monitor mode, over at request headers already: marked once
            return self._refuse(ctx, self.tokens[got.refused_by], got, needs=tokens)
        ctx.state[_RESERVED] = (tokens, at_ms)
        detail = f"tokens={tokens},{_counts(self.tokens, got)}"
        if capped is not None:
            cap_answer(p, capped)
            detail += f",capped={capped}"
        asks = enforce and self.params.stream_usage and ask_usage(p)
        if asks:
            detail += ",usage=asked"
        ctx.verdicts.append(Verdict(self.name, "reserve", "count", 0.0, detail))
        # Later filters that rewrite the body (pii, route) start from the rewritten document.
        return Continue(body=compact_json(p.document)) if capped is not None or asks else CONTINUE

    async def on_settle(self, ctx: RequestContext) -> Decision:
        who = ctx.principal
        held = ctx.state.pop(_RESERVED, None)
        reserved, at_ms = held if isinstance(held, tuple) else (0, 0)
        if who is None or (ctx.answer is None and not reserved):  # never forwarded: no tokens used
            return CONTINUE
        tokens, source = used_tokens(ctx) if ctx.answer is not None else (0, "none")
        try:
            async with asyncio.timeout(self.params.timeout_s):
                await self.store.add_tokens(self.windows(who, self.tokens), tokens, reserved, at_ms)
        except Exception as exc:  # noqa: BLE001 - any store failure goes to the redis fail mode
            log().error("quota_tokens_not_recorded", request_id=ctx.request_id, tokens=tokens)
            return fail_mode(ctx, self.name, "redis", type(exc).__name__, _UNAVAILABLE)
        if ctx.answer is not None:
            detail = f"tokens={tokens},source={source}"
            ctx.verdicts.append(Verdict(self.name, "tokens", "count", 0.0, detail))
        return CONTINUE


_RESERVED = "quota:reserved"


class CapError(ValueError):
    """A field that caps the answer holds no count: the request cannot be reserved for."""


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request asks of its answer: its cap per choice (None: it sets none) and its choices."""

    cap: int | None
    choices: int


# Fields that cap an OpenAI-style answer, in any server: vLLM reads max_completion_tokens, else
# max_tokens (a 0 in the first falls back to the second); llama.cpp reads n_predict before
# max_tokens. The largest one set is reserved, whichever the model server obeys.
_OPENAI_CAPS = ("max_completion_tokens", "max_tokens", "n_predict")


def answer_cap(p: Prompt) -> Asked:
    """The largest answer cap the request sets (OpenAI: max_completion_tokens, max_tokens,
    n_predict, with `n` choices; KServe: max_tokens at the top or in `parameters`). Raises
    CapError for such a field that is neither null nor a whole number >= 0: a model server may
    read "5000" or 5e3 as a number the quota would not have counted."""
    doc = p.document if isinstance(p.document, dict) else {}
    if p.protocol is Protocol.OPENAI:
        fields = [(doc.get(name), name) for name in _OPENAI_CAPS]
        choices = max(_checked(doc.get("n"), "n") or 1, 1)
    else:
        top, params = doc.get("max_tokens"), doc.get("parameters")
        # a generate request's top-level fields are the model's inputs: one value, or a list of one
        fields = [(top[0] if isinstance(top, list) and len(top) == 1 else top, "max_tokens")]
        if isinstance(params, dict):
            fields.append((params.get("max_tokens"), "parameters.max_tokens"))
        choices = 1
    caps = [c for v, said in fields if (c := _checked(v, said)) is not None]
    return Asked(max(caps, default=None), choices)


def _checked(v: Any, said: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    raise CapError(f"'{said}' must be a whole number >= 0 (a token quota counts it)")


def reservation(p: Prompt, asked: Asked, answer_default: int) -> int:
    """Tokens a request may use: its prompt, estimated (UTF-8 bytes / 4, rounded up), and its
    answer's cap times its choices, else `answer_default` times its choices."""
    answer = (asked.cap if asked.cap is not None else answer_default) * asked.choices
    return math.ceil(len(p.text.encode()) / 4) + answer


def cappable(p: Prompt) -> bool:
    """Whether the gateway can cap this request's answer: an OpenAI chat or completion, a KServe
    generate (a KServe infer request is tensors, with no field a server must read as a cap)."""
    if not isinstance(p.document, dict):
        return False
    if p.protocol is Protocol.OPENAI:
        return p.operation in (_openai.CHAT, _openai.COMPLETION)
    return p.operation in (_kserve.GENERATE, _kserve.GENERATE_STREAM)


def cap_answer(p: Prompt, cap: int) -> None:
    """Cap the request's answer at `cap` tokens (per choice) in `p.document`: `max_tokens`, for a
    KServe generate in `parameters`."""
    doc = dict(p.document)
    if p.protocol is Protocol.OPENAI:
        doc["max_tokens"] = cap
    else:
        params = doc.get("parameters")
        doc["parameters"] = {**(params if isinstance(params, dict) else {}), "max_tokens": cap}
    p.document = doc


def ask_usage(p: Prompt) -> bool:
    """If `p` is an OpenAI chat or completion stream that does not ask for its usage chunk, ask
    for it in `p.document` and mark the chunk as one the client does not get; True if so."""
    if not (p.protocol is Protocol.OPENAI and p.stream and cappable(p)):
        return False
    options = p.document.get("stream_options") or {}
    if options.get("include_usage") is True:
        return False  # the client asked: it gets the chunk, and the quota reads it
    p.document = {**p.document, "stream_options": {**options, "include_usage": True}}
    p.usage_hidden = True
    return True


def over_limit(v: Verdict) -> tuple[str, str] | None:
    """(limit, enforce|monitor) if `v` says a request was over a quota limit, else None."""
    if v.filter != Quota.name or v.phase != "admit" or v.action not in ("deny", "monitor:deny"):
        return None
    limit = v.detail.split(",", 1)[0].removeprefix("limit=")
    return limit, "monitor" if v.action == "monitor:deny" else "enforce"


def counted_tokens(v: Verdict) -> tuple[int, str] | None:
    """(tokens, usage|estimate) if `v` records a request's tokens being counted, else None."""
    if v.filter != Quota.name or v.phase != "tokens":
        return None
    fields = dict(part.split("=", 1) for part in v.detail.split(","))
    return int(fields["tokens"]), fields["source"]


def used_tokens(ctx: RequestContext) -> tuple[int, str]:
    """The request's tokens: the answer's usage if it says, else an estimate from the text."""
    usage = ctx.answer.usage if ctx.answer is not None else None
    if usage is not None:
        total = usage.get("total_tokens")
        if not isinstance(total, int) or isinstance(total, bool):
            parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
            ints = [p for p in parts if isinstance(p, int) and not isinstance(p, bool)]
            total = sum(ints) if ints else None
        if total is not None and total >= 0:
            return total, "usage"
    size = len(ctx.prompt.text.encode()) if ctx.prompt is not None else 0
    if ctx.answer is not None:
        size += sum(len(ctx.answer.text(i).encode()) for i in ctx.answer.choices)
    return math.ceil(size / 4), "estimate"


@register("quota", QuotaParams)
def _build(env: BuildEnv, params: QuotaParams) -> Quota:
    s = env.settings
    # One pool per process and timeout, shared by every policy revision's chain.
    store = env.engine(
        f"quota:{params.timeout_s}",
        lambda: QuotaStore.from_url(s.redis_url, s.redis_prefix, params.timeout_s),
    )
    cls = TokenQuota if any(lim.kind == "tokens" for lim in params.limits) else Quota
    return cls(store, params, max(s.upstream_timeout_s, 1.0) + 60)
