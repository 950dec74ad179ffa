"""Prompt-injection / jailbreak screening with an ONNX sequence classifier.

Every prompt segment whose role the policy names (system, user, tool output, tool specs, KServe
inputs…) is scored; the highest score decides. Above the threshold the policy's action applies:
`deny` (the client sees a generic refusal, never the score) or `flag` (let through, counted as a
risk event); in `monitor` mode only the verdict is recorded. The score and the model's revision go
into the request's verdicts for the audit.

A text longer than the windows the model reads (`max_windows`) is refused (413 prompt_too_long)
unless the policy says `too_long: score_edges`: then its first windows and its last are scored
and the tokens between go unread, counted in the verdict (`unread_tokens`; of a text far longer
than the windows, read by its edges alone, the characters between them: `unread_chars`). A text
above the threshold under `action: flag` is flagged and still refused as too long.

Assistant turns: a chat request carries the conversation so far, and its assistant turns are
the client's word for what the model said: a client can write them itself (a forged history, a
reply prefilled for the model to continue). By default (`assistant: unknown`) an assistant turn is
scored unless the gateway delivered that very text to the same user as an answer, within
`answer_ttl_s` (gateway.answers: keyed fingerprints in Redis, shared by every replica; what is
remembered is the answer as the client got it, after redaction). If that store cannot be read,
the turns count as unknown and are scored. `all` scores every assistant turn; `trust` none.

Fail mode: if the classifier errors or exceeds its time budget, `fail_mode.classifier` decides:
`deny` (default, 503 classifier_unavailable) or `allow_with_flag` (let through, flagged).
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from classifiers.injection.runtime import InjectionModel, Manifest
from filters import _openai
from filters.base import (
    CONTINUE,
    BaseFilter,
    Decision,
    Deny,
    Phase,
    RequestContext,
    Verdict,
    fail_mode,
)
from filters.chain import BuildEnv, register
from gateway.answers import AnswerLedger
from gateway.errors import ErrorCode
from gateway.observability import log
from gateway.registry import Protocol


class InjectionParams(BaseModel):
    """Parameters of the prompt_injection filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    model: str = Field(description="Path of the model's manifest.json (relative to the working directory).")
    threshold: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Score at or above which a prompt counts (default: the manifest's).",
    )
    action: Literal["deny", "flag"] = Field(
        default="deny", description="What a prompt above the threshold gets."
    )
    mode: Literal["enforce", "monitor"] = Field(
        default="enforce", description="monitor: record only (dry run)."
    )
    roles: list[str] = Field(
        default_factory=lambda: [
            "system",
            "developer",
            "user",
            "tool",
            "function",
            "tool_spec",
            "input:*",
            "parameter:*",
        ],
        description="Prompt roles to score (globs; `input:*` are KServe inputs, `parameter:*` KServe "
        "request parameters). Assistant turns follow `assistant` unless a glob here names them.",
    )
    assistant: Literal["unknown", "all", "trust"] = Field(
        default="unknown",
        description="Which assistant turns of a chat request are scored: unknown (those the gateway "
        "did not deliver to this user as an answer: forged history, prefilled replies), all, or "
        "trust (none: the client's history is taken as the model's).",
    )
    answer_ttl_s: int = Field(
        default=86400,
        ge=60,
        le=30 * 86400,
        description="How long a delivered answer is remembered as the model's (assistant: unknown).",
    )
    answers_timeout_s: float = Field(
        default=0.25,
        gt=0.0,
        le=5.0,
        description="Time budget of one call to the store of delivered answers (Redis); past it the "
        "assistant turns are scored.",
    )
    status: int = Field(default=400, ge=400, le=499, description="HTTP status of a deny.")
    message: str = Field(
        default="the request was rejected by the gateway's content policy",
        description="Public text of a deny.",
    )
    timeout_s: float = Field(
        default=0.5, gt=0.0, le=10.0, description="Time budget of one request's scoring."
    )
    max_windows: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Windows read per text (the first ones and the last); default: the model's manifest (8 if it says nothing).",
    )
    too_long: Literal["deny", "score_edges"] = Field(
        default="deny",
        description=(
            "A text longer than max_windows can read: deny (413 prompt_too_long: nothing unread is "
            "forwarded) or score_edges (scored on its first windows and its last; the middle goes "
            "unread, and the verdict records how many tokens)."
        ),
    )


_TOO_LONG = "the prompt is too long for the gateway's content screening"
_UNAVAILABLE = Deny(
    503, ErrorCode.CLASSIFIER_UNAVAILABLE, "the content classifier is unavailable; try again later"
)


class PromptInjection(BaseFilter):
    """Score prompts; deny or flag those above the threshold."""

    name: ClassVar[str] = "prompt_injection"
    # The answer is read at SETTLE (assistant: unknown remembers it), so its body is parsed.
    phases: ClassVar[Phase] = Phase.REQUEST_BODY | Phase.RESPONSE_BODY | Phase.SETTLE
    needs: ClassVar[tuple[str, ...]] = ("protocol",)

    def __init__(
        self, model: InjectionModel, params: InjectionParams, ledger: AnswerLedger | None = None
    ) -> None:
        self.model = model
        self.threshold = params.threshold if params.threshold is not None else model.manifest.threshold
        self.params = params
        self.ledger = ledger if params.assistant == "unknown" else None

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        p = ctx.prompt
        if p is None:
            return CONTINUE
        texts: list[str] = []
        turns: list[str] = []  # assistant turns the roles do not name
        for s in p.segments:
            if any(fnmatch.fnmatchcase(s.role, r) for r in self.params.roles):
                texts.append(s.text)
            elif s.role == "assistant" and self.params.assistant != "trust":
                turns.append(s.text)
        unavailable, n_known = "", 0
        if turns and self.params.assistant == "unknown":
            known, unavailable = await self._delivered(ctx, turns)
            turns = [t for t, k in zip(turns, known, strict=True) if not k]
            n_known = sum(known)
        texts += turns
        # Counted in metrics (ztgate_findings_total{kind="assistant_scored"}) and in the detail.
        counts = tuple(
            (k, n) for k, n in (("assistant_known", n_known), ("assistant_scored", len(turns))) if n
        )
        history = unavailable + "".join(f",{k}={n}" for k, n in counts)
        if not texts:
            if history:
                ctx.verdicts.append(Verdict(self.name, "score", "pass", 0.0, history.lstrip(","), counts))
            return CONTINUE
        loop = asyncio.get_running_loop()
        # A real clock: uvloop's loop.time() is in whole milliseconds and cached per loop turn, so
        # an answer later than a sub-millisecond budget could measure as on time (0 ms elapsed).
        started = time.perf_counter()
        try:
            found = await asyncio.wait_for(
                loop.run_in_executor(None, lambda: [self.model.assess(t) for t in texts]),
                self.params.timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - any failure of the classifier goes to its fail mode
            return self._failed(ctx, type(exc).__name__)
        if time.perf_counter() - started > self.params.timeout_s:
            # wait_for returns a result that lands in the same loop turn as its deadline (a busy
            # loop sees both at once); the budget is the contract, so a late answer counts as none.
            return self._failed(ctx, "TimeoutError")
        top = max(a.score for a in found)
        unread = sum(a.unread for a in found)
        skipped = sum(a.skipped for a in found)
        detail = (
            f"score={top:.3f},model={self.model.revision}"
            + (f",unread_tokens={unread}" if unread else "")
            + (f",unread_chars={skipped}" if skipped else "")
            + history
        )
        too_long = (unread or skipped) and self.params.too_long == "deny"
        if top >= self.threshold:
            decided = self._act(ctx, "score", self.params.action, detail, counts)
            # Flagged is not read: a flagged text with an unread middle is still too long.
            if isinstance(decided, Deny) or not too_long:
                return decided
            return self._act(ctx, "length", "deny", detail, counts)
        if too_long:
            return self._act(ctx, "length", "deny", detail, counts)
        ctx.verdicts.append(Verdict(self.name, "score", "pass", 0.0, detail, counts))
        return CONTINUE

    async def _delivered(self, ctx: RequestContext, turns: list[str]) -> tuple[list[bool], str]:
        """Which turns the gateway delivered to this user; all unknown if that cannot be told."""
        who = ctx.principal
        if self.ledger is None or who is None:
            return [False] * len(turns), ""
        try:
            async with asyncio.timeout(self.params.answers_timeout_s):
                return await self.ledger.known(who.tenant, who.user, turns, self.params.answer_ttl_s), ""
        except Exception as exc:  # noqa: BLE001 - an unreadable store only means the turns are scored
            log().warning("answers_unavailable", request_id=ctx.request_id, error=type(exc).__name__)
            return [False] * len(turns), f",answers_unavailable={type(exc).__name__}"

    async def on_settle(self, ctx: RequestContext) -> Decision:
        """Remember a delivered chat answer, as the client got it, so its next turn is known.

        Here, before the answer's last message leaves (about 0.2 ms, bench.answers): a client
        that sends its next turn the moment it has this answer finds it remembered.
        """
        p, who, answer = ctx.prompt, ctx.principal, ctx.answer
        if (
            self.ledger is None
            or who is None
            or p is None
            or answer is None
            or ctx.outcome != "allowed"
            or p.protocol is not Protocol.OPENAI
            or p.operation != _openai.CHAT
            or not answer.done
            or answer.upstream_error
        ):
            return CONTINUE
        seen = ctx.delivered or answer
        texts = ["".join(pieces) for i in seen.choices for pieces in seen.parts[i].values()]
        try:
            async with asyncio.timeout(self.params.answers_timeout_s):
                await self.ledger.remember(who.tenant, who.user, texts, self.params.answer_ttl_s)
        except Exception as exc:  # noqa: BLE001 - not remembered: the next turn is scored, nothing more
            log().warning("answer_not_remembered", request_id=ctx.request_id, error=type(exc).__name__)
        return CONTINUE

    def _act(
        self, ctx: RequestContext, phase: str, action: str, detail: str, counts: tuple[tuple[str, int], ...]
    ) -> Decision:
        """`action` on this request, or only its record in monitor mode."""
        if self.params.mode == "monitor":
            ctx.verdicts.append(Verdict(self.name, phase, f"monitor:{action}", 0.0, detail, counts))
            return CONTINUE
        ctx.verdicts.append(Verdict(self.name, phase, action, 0.0, detail, counts))
        if action != "deny":
            return CONTINUE
        if phase == "length":
            return Deny(413, ErrorCode.PROMPT_TOO_LONG, _TOO_LONG)
        return Deny(self.params.status, ErrorCode.PROMPT_REJECTED, self.params.message)

    def _failed(self, ctx: RequestContext, why: str) -> Decision:
        return fail_mode(ctx, self.name, "classifier", why, _UNAVAILABLE)


@register("prompt_injection", InjectionParams)
def _build(env: BuildEnv, params: InjectionParams) -> PromptInjection:
    manifest = Path(params.model)
    model = env.engine(
        f"injection:{manifest.resolve()}:{params.max_windows}",
        lambda: InjectionModel(Manifest.load(manifest), max_windows=params.max_windows),
    )
    ledger = None
    if params.assistant == "unknown":
        s = env.settings
        # The audit key: replicas share it, so each knows the answers the others delivered.
        key = env.audit_key()
        ledger = env.engine(
            f"answers:{params.answers_timeout_s}",
            lambda: AnswerLedger.from_url(s.redis_url, s.redis_prefix, key, params.answers_timeout_s),
        )
    return PromptInjection(model, params, ledger)
