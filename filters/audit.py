"""The five-tuple audit: Prompt, Response, TraceID, ModelHash, PolicyDecision, one record per call.

Written at SETTLE, before the client has the answer: a request whose record cannot be written is
refused (`fail_mode.audit: deny`, the default) or let through flagged (`allow_with_flag`). Every
request that reached the chain gets exactly one record, refusals and malformed requests included.

Privacy: by default the prompt and the answer are keyed fingerprints (HMAC-SHA256 with the audit
key) and lengths, never text; `mode: raw` stores the text as received (the client's prompt, the
upstream's answer). Redaction is recorded as entity types and counts per side, never values.
Tamper evidence: records form one hash chain per worker process (gateway.audit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from filters.base import (
    CONTINUE,
    BaseFilter,
    Decision,
    Deny,
    Phase,
    RequestContext,
    fail_mode,
    fail_mode_fired,
)
from filters.chain import BuildEnv, register
from gateway.audit import WRITER_ENGINE, AuditError, ChainWriter, fingerprint, now
from gateway.errors import ErrorCode
from gateway.observability import log

RECORD_VERSION = 1


class AuditParams(BaseModel):
    """Parameters of the audit filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    mode: Literal["fingerprint", "raw"] = Field(
        default="fingerprint",
        description="fingerprint: keyed HMAC-SHA256 and length of the prompt and answer, no text; "
        "raw: the text itself (as received, PII included).",
    )
    fsync: bool = Field(
        default=False,
        description="Flush every record to disk before the answer leaves (survives power loss; costs "
        "a disk sync per request).",
    )


_UNAVAILABLE = Deny(503, ErrorCode.AUDIT_UNAVAILABLE, "the audit log is unavailable; try again later")


class Audit(BaseFilter):
    """Write one chained audit record per request."""

    name: ClassVar[str] = "audit"
    # The answer is read (its fingerprint is part of the record); the protocol filter parses it.
    phases: ClassVar[Phase] = Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY | Phase.SETTLE
    needs: ClassVar[tuple[str, ...]] = ("protocol",)

    def __init__(self, writer: ChainWriter, key: bytes, params: AuditParams) -> None:
        self.writer = writer
        self.key = key
        self.params = params

    async def on_settle(self, ctx: RequestContext) -> Decision:
        record = self.record(ctx)
        try:
            self.writer.append(record)
            if self.params.fsync:
                # Off the loop: other requests go on meanwhile; a sync covers every earlier write.
                await asyncio.to_thread(self.writer.sync)
        except AuditError as exc:
            # The record is lost; say so where operators look (no request text is in the error).
            log().error("audit_write_failed", request_id=ctx.request_id, error=str(exc))
            return fail_mode(ctx, self.name, "audit", "AuditError", _UNAVAILABLE)
        return CONTINUE

    def _text(self, text: str) -> dict[str, Any]:
        if self.params.mode == "raw":
            return {"chars": len(text), "text": text}
        return {"chars": len(text), "fingerprint": fingerprint(self.key, text)}

    def record(self, ctx: RequestContext) -> dict[str, Any]:
        """The record of one request (before chaining)."""
        p, a, r, who = ctx.prompt, ctx.answer, ctx.route, ctx.principal
        prompt = None
        if p is not None:
            prompt = self._text(p.received_text if p.received_text is not None else p.text)
            prompt["roles"] = sorted({s.role for s in p.segments})
        response = None
        if a is not None and (a.parts or a.done):
            response = self._text("\n\n".join(a.text(i) for i in a.choices))
            response["finish"] = {str(k): v for k, v in sorted(a.finish.items())}
        redacted: list[dict[str, Any]] = []
        fail_modes: list[dict[str, str]] = []
        verdicts: list[dict[str, Any]] = []
        for v in ctx.verdicts:
            if v.action == "continue":
                continue
            verdicts.append({"filter": v.filter, "phase": v.phase, "action": v.action, "detail": v.detail})
            if v.filter == "pii":
                for kind, n in v.counts:
                    side, _, entity = kind.partition(":")
                    redacted.append({"side": side, "entity": entity, "count": n, "action": v.action})
            fired = fail_mode_fired(v)
            if fired is not None:
                fail_modes.append(dataclasses.asdict(fired))
        policy = ctx.policy
        return {
            "v": RECORD_VERSION,
            "kind": "request",
            "time": now(),
            "trace_id": ctx.request_id,
            "traceparent": _traceparent(ctx.headers.get("traceparent")),
            "principal": {"tenant": who.tenant, "user": who.user, "key_id": who.key_id} if who else None,
            "request": {
                "method": ctx.method,
                "path": ctx.path,
                "protocol": p.protocol.value if p else None,
                "operation": p.operation if p else None,
                "stream": p.stream if p else None,
            },
            "prompt": prompt,
            "response": response,
            "model": (
                {
                    "ref": f"{r.model}@{r.version}",
                    "hash": r.model_hash,
                    "upstream": r.cluster,
                    "registry": ctx.registry.revision,
                }
                if r
                else None
            ),
            "decision": {
                "outcome": ctx.outcome,
                "status": ctx.status,
                "code": ctx.error_code or None,
                "upstream_error": ctx.upstream_error,
                "policy": policy.revision if policy else None,
                "verdicts": verdicts,
                "fail_modes": fail_modes,
            },
            "redacted": redacted,
        }


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _traceparent(value: str | None) -> str | None:
    """A W3C trace context header as the client sent it, if well formed; nothing else is kept."""
    return value if value is not None and _TRACEPARENT.fullmatch(value) else None


@register("audit", AuditParams)
def _build(env: BuildEnv, params: AuditParams) -> Audit:
    s = env.settings
    # One writer per process, shared by every policy revision's chain: one unbroken hash chain.
    writer = env.engine(
        WRITER_ENGINE,
        lambda: ChainWriter(s.audit_path / f"{s.instance}-{env.instance}.jsonl", s.audit_segment_bytes),
    )
    return Audit(writer, env.audit_key(), params)
