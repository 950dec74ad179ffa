"""Protocol parsing: turn OpenAI and KServe v2 traffic into Prompt and Answer values.

Requests are validated strictly (bad JSON, wrong types, invalid UTF-8, oversized or unknown calls
get a clear 4xx and never reach an upstream). Answers are reassembled per choice, streamed or
not, so later filters read text, not protocol. An answer that cannot be parsed is refused (502):
what cannot be checked is not forwarded. Answers are read only when a later filter reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from filters import _kserve, _openai
from filters._protocols import Answer, Prompt, ProtocolError, sse_bytes
from filters._sse import SSEError, SSEParser
from filters.base import CONTINUE, BaseFilter, Continue, Decision, Deny, Phase, RequestContext
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode
from gateway.registry import Protocol

_BODYLESS_OPS = frozenset(
    {
        _openai.MODELS,
        _openai.MODEL,
        _kserve.SERVER,
        _kserve.HEALTH,
        _kserve.MODEL_METADATA,
        _kserve.MODEL_READY,
        _kserve.MODEL_CONFIG,
    }
)


@dataclass(slots=True)
class _State:
    protocol: Protocol
    op: str
    kpath: _kserve.KPath | None = None
    sse: SSEParser | None = None
    buffered: bytearray | None = None


def protocol_of(path: str) -> Protocol | None:
    """Which protocol a path belongs to (None: neither)."""
    if path == "/v1" or path.startswith("/v1/"):
        return Protocol.OPENAI
    if path == "/v2" or path.startswith("/v2/"):
        return Protocol.KSERVE_V2
    return None


# Client headers the model server is sent: what the two protocols need, and nothing the client
# could use to reach past the checks (cookies, other credentials, forwarding claims, vendor
# extensions the chain does not read). `accept-encoding` is not among them: answers must come
# back readable. Pseudo-headers and `host` are Envoy's; `x-envoy-*` ones Envoy sanitizes itself
# (and ext_proc may not touch). `x-request-id` and `x-forwarded-proto` are Envoy's own values.
_FORWARDED = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "accept",
        "user-agent",
        "x-request-id",
        "x-forwarded-proto",
        _kserve.HEADER_LENGTH,
    }
)
# Model-server answer headers the client is sent, when the chain reads answers (the body is then
# checked, so a header must not carry what the body may not: a debug echo of the prompt, a cookie).
_ANSWERED = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "date",
        "cache-control",
        "retry-after",
        "retry-after-ms",
        "x-request-id",
        _kserve.HEADER_LENGTH,
    }
)
# Names a policy may not add to the forwarded ones: the gateway's key, its own headers, and what
# would make an answer unreadable.
_NEVER_FORWARDED = frozenset({"authorization", "proxy-authorization", "accept-encoding", "host"})
_TOKEN = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")


# A stream whose usage chunk is taken out changes length: it travels chunked.
_ANSWERED_CHUNKED = _ANSWERED - {"content-length"}


def _dropped(headers: dict[str, str], kept: frozenset[str], extra: frozenset[str]) -> Decision:
    """Remove every header but the kept ones, the policy's extra ones and Envoy's own."""
    gone = tuple(
        h for h in headers if not (h in kept or h in extra or h == "host" or h.startswith((":", "x-envoy-")))
    )
    return Continue(remove_headers=gone) if gone else CONTINUE


def _encoded(headers: dict[str, str]) -> bool:
    """A body with a content-encoding (gzip, br…): not text the checks can read as sent."""
    return headers.get("content-encoding", "identity").strip().lower() != "identity"


def _state(ctx: RequestContext) -> _State | None:
    st = ctx.state.get(ProtocolParser.name)
    return st if isinstance(st, _State) else None


class ProtocolParser(BaseFilter):
    """Validate requests and extract prompt and answer text for OpenAI and KServe v2."""

    name: ClassVar[str] = "protocol"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.REQUEST_BODY | Phase.RESPONSE_BODY
    # Answers are parsed for the filters that read them (pii, later audit); with none in the
    # chain, Envoy is not asked for the answer at all (two ext_proc messages fewer per request).
    on_behalf: ClassVar[Phase] = Phase.RESPONSE_BODY

    def __init__(
        self,
        max_body_bytes: int,
        max_answer_bytes: int,
        forward_headers: frozenset[str] = frozenset(),
        answer_headers: frozenset[str] = frozenset(),
    ) -> None:
        self._max_body = max_body_bytes
        self._extra = forward_headers
        self._extra_answer = answer_headers
        self._max_answer = max_answer_bytes  # Envoy's buffer: a larger buffered answer cannot be checked

    def _deny(self, exc: ProtocolError) -> Deny:
        return Deny(exc.status, exc.code, exc.message)

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        proto = protocol_of(ctx.path)
        try:
            if proto is Protocol.OPENAI:
                op = _openai.operation_for(ctx.method, ctx.path)
                st = _State(proto, op)
            elif proto is Protocol.KSERVE_V2:
                kp = _kserve.parse_path(ctx.method, ctx.path)
                st = _State(proto, kp.op, kp)
            else:
                return Deny(404, ErrorCode.UNKNOWN_PATH, "unknown path")
        except ProtocolError as exc:
            return self._deny(exc)
        length = ctx.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self._max_body):
            return Deny(413, ErrorCode.BODY_TOO_LARGE, f"request body exceeds {self._max_body} bytes")
        if _encoded(ctx.headers):
            # A compressed body cannot be checked as sent; refusing is simpler than inflating it.
            return Deny(415, ErrorCode.UNSUPPORTED_CONTENT, "compressed request bodies are not accepted")
        ctx.state[self.name] = st
        if st.op in _BODYLESS_OPS:
            if (length or "0") != "0" or "transfer-encoding" in ctx.headers:
                return Deny(400, ErrorCode.INVALID_REQUEST, "this call takes no request body")
            model = (
                st.kpath.model_ref
                if st.kpath
                else (ctx.path.split("/", 3)[3] if st.op == _openai.MODEL else None)
            )
            ctx.prompt = Prompt(proto, st.op, model)
        # Only the headers the protocol needs go on; so answers come back uncompressed (readable).
        return _dropped(ctx.headers, _FORWARDED, self._extra)

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        st = _state(ctx)
        if st is None:
            return Deny(500, ErrorCode.INTERNAL, "internal error")
        if st.op in _BODYLESS_OPS:
            if body:
                return Deny(400, ErrorCode.INVALID_REQUEST, "this call takes no request body")
            return CONTINUE
        if len(body) > self._max_body:
            return Deny(413, ErrorCode.BODY_TOO_LARGE, f"request body exceeds {self._max_body} bytes")
        try:
            if st.protocol is Protocol.OPENAI:
                ctx.prompt = _openai.parse_request(st.op, body)
            elif st.kpath is not None:
                ctx.prompt = _kserve.parse_request(st.kpath, body, ctx.headers.get(_kserve.HEADER_LENGTH))
            else:
                return Deny(500, ErrorCode.INTERNAL, "internal error")
        except ProtocolError as exc:
            return self._deny(exc)
        return CONTINUE

    async def on_response_headers(self, ctx: RequestContext) -> Decision:
        st = _state(ctx)
        if st is None:
            return Deny(500, ErrorCode.INTERNAL, "internal error")
        if _encoded(ctx.response_headers):
            return Deny(
                502, ErrorCode.UPSTREAM_BAD_RESPONSE, "the upstream sent an encoding the gateway cannot read"
            )
        ctype = ctx.response_headers.get("content-type", "")
        ctx.answer = Answer()
        if ctype.startswith("text/event-stream"):
            st.sse = SSEParser()
            hidden = ctx.prompt is not None and ctx.prompt.usage_hidden
            return _dropped(
                ctx.response_headers, _ANSWERED_CHUNKED if hidden else _ANSWERED, self._extra_answer
            )
        headers = _dropped(ctx.response_headers, _ANSWERED, self._extra_answer)
        length = ctx.response_headers.get("content-length", "0")
        if not length.isdigit() or int(length) > self._max_answer:
            # Refused before a byte of it is read: it would not fit the buffer it is checked in.
            return Deny(
                502, ErrorCode.ANSWER_TOO_LARGE, f"the model server's answer exceeds {self._max_answer} bytes"
            )
        st.buffered = bytearray()
        return headers

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        st = _state(ctx)
        if st is None or ctx.answer is None:
            return Deny(500, ErrorCode.INTERNAL, "internal error")
        status = ctx.response_status or 0
        try:
            if st.sse is not None:
                if st.protocol is Protocol.OPENAI:
                    _openai.answer_from_sse(st.op, st.sse, chunk, end, ctx.answer)
                    if ctx.prompt is not None and ctx.prompt.usage_hidden:
                        return self._without_usage(ctx.answer)
                else:
                    _kserve.answer_from_sse(st.sse, chunk, end, ctx.answer)
            elif st.buffered is not None:
                st.buffered += chunk
                if end and 200 <= status < 300 and st.op not in _BODYLESS_OPS:
                    body = bytes(st.buffered)
                    if st.protocol is Protocol.OPENAI:
                        _openai.answer_from_json(st.op, body, ctx.answer)
                    else:
                        _kserve.answer_from_body(
                            st.op, body, ctx.response_headers.get(_kserve.HEADER_LENGTH), ctx.answer
                        )
        except (ProtocolError, SSEError):
            return Deny(
                502, ErrorCode.UPSTREAM_BAD_RESPONSE, "the upstream sent an answer the gateway cannot read"
            )
        return CONTINUE

    @staticmethod
    def _without_usage(answer: Answer) -> Decision:
        # The usage was read into the answer (quota counts it); the client, who did not ask for
        # it, gets the stream without the chunk, and without the `usage` that some servers put
        # in every chunk once it is asked for (null, or running counts with vLLM's
        # continuous_usage_stats). Whole events only, so none is split or lost.
        events = [ev for ev in answer.chunk_events if not _openai.usage_only(ev.doc)]
        for ev in events:
            if isinstance(ev.doc, dict):
                ev.doc.pop("usage", None)
        answer.chunk_events = events
        return Continue(body=b"".join(sse_bytes(ev) for ev in events))


class ProtocolParams(BaseModel):
    """Parameters of the protocol filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    max_body_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Largest request body accepted (default: ZTGATE_MAX_REQUEST_BODY_BYTES, and never above it).",
    )
    forward_headers: list[str] = Field(
        default=[],
        description=(
            "Client request headers forwarded to the model server besides those the protocols need "
            "(content-type, content-length, transfer-encoding, accept, user-agent, "
            "inference-header-content-length; Envoy's x-request-id and x-forwarded-proto); "
            "e.g. traceparent. Every other client header is dropped. Lower-case names; never "
            "authorization, proxy-authorization, accept-encoding, host or an x-ztgate-/x-envoy- header."
        ),
    )

    answer_headers: list[str] = Field(
        default=[],
        description=(
            "Model-server answer headers sent on to the client besides content-type, content-length, "
            "transfer-encoding, date, cache-control, retry-after, retry-after-ms, x-request-id and "
            "inference-header-content-length, when the chain reads answers (pii, prompt_injection, audit): every other "
            "one is dropped (with no filter reading answers, answers and their headers pass as sent). "
            "Lower-case names; never content-encoding or an x-ztgate-/x-envoy- header."
        ),
    )

    @field_validator("forward_headers")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        return _header_names(names, _NEVER_FORWARDED, "forwarded to a model server")

    @field_validator("answer_headers")
    @classmethod
    def _answer_names(cls, names: list[str]) -> list[str]:
        return _header_names(names, frozenset({"content-encoding"}), "sent on to a client")


def _header_names(names: list[str], never: frozenset[str], what: str) -> list[str]:
    for n in names:
        if not _TOKEN.fullmatch(n):
            raise ValueError(f"{n!r} is not a lower-case header name")
        if n in never or n.startswith(("x-ztgate-", "x-envoy-")):
            raise ValueError(f"{n!r} is never {what}")
    return names


@register("protocol", ProtocolParams)
def _build(env: BuildEnv, params: ProtocolParams) -> ProtocolParser:
    bound = env.settings.max_request_body_bytes
    return ProtocolParser(
        min(params.max_body_bytes or bound, bound),
        env.settings.buffer_limit_bytes,
        frozenset(params.forward_headers),
        frozenset(params.answer_headers),
    )
