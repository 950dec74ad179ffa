"""Prompt-injection / jailbreak screening with an ONNX sequence classifier.

Every prompt segment whose role the policy names (system, user, tool output, tool specs, KServe
inputs…) is scored; the highest score decides. Above the threshold the policy's action applies:
`deny` (the client sees a generic refusal, never the score) or `flag` (let through, counted as a
risk event); in `monitor` mode only the verdict is recorded. The score and the model's revision go
into the request's verdicts for the audit.

A text longer than the windows the model reads (`max_windows`) is refused (413 prompt_too_long)
unless the policy says `too_long: score_edges`: then its first windows and its last are scored
and the tokens between go unread, counted in the verdict.

Fail mode: if the classifier errors or exceeds its time budget, `fail_mode.classifier` decides:
`deny` (default, 503 classifier_unavailable) or `allow_with_flag` (let through, flagged).
"""

from __future__ import annotations

import asyncio
import fnmatch
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from classifiers.injection.runtime import InjectionModel, Manifest
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
from gateway.errors import ErrorCode


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
        "request parameters). Assistant turns are not scored.",
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
    phases: ClassVar[Phase] = Phase.REQUEST_BODY
    needs: ClassVar[tuple[str, ...]] = ("protocol",)

    def __init__(self, model: InjectionModel, params: InjectionParams) -> None:
        self.model = model
        self.threshold = params.threshold if params.threshold is not None else model.manifest.threshold
        self.params = params

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        p = ctx.prompt
        if p is None:
            return CONTINUE
        texts = [s.text for s in p.segments if any(fnmatch.fnmatchcase(s.role, r) for r in self.params.roles)]
        if not texts:
            return CONTINUE
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            found = await asyncio.wait_for(
                loop.run_in_executor(None, lambda: [self.model.assess(t) for t in texts]),
                self.params.timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - any failure of the classifier goes to its fail mode
            return self._failed(ctx, type(exc).__name__)
        if loop.time() - started > self.params.timeout_s:
            # wait_for returns a result that lands in the same loop turn as its deadline (a busy
            # loop sees both at once); the budget is the contract, so a late answer counts as none.
            return self._failed(ctx, "TimeoutError")
        top = max(a.score for a in found)
        unread = sum(a.unread for a in found)
        detail = f"score={top:.3f},model={self.model.revision}" + (
            f",unread_tokens={unread}" if unread else ""
        )
        if top >= self.threshold:
            return self._act(ctx, "score", self.params.action, detail)
        if unread and self.params.too_long == "deny":
            return self._act(ctx, "length", "deny", detail)
        ctx.verdicts.append(Verdict(self.name, "score", "pass", 0.0, detail))
        return CONTINUE

    def _act(self, ctx: RequestContext, phase: str, action: str, detail: str) -> Decision:
        """`action` on this request, or only its record in monitor mode."""
        if self.params.mode == "monitor":
            ctx.verdicts.append(Verdict(self.name, phase, f"monitor:{action}", 0.0, detail))
            return CONTINUE
        ctx.verdicts.append(Verdict(self.name, phase, action, 0.0, detail))
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
    return PromptInjection(model, params)
