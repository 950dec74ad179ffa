"""The ext_proc gRPC server: one stream per HTTP request, one RequestContext per stream.

Fail closed everywhere: a filter exception, a phase over its time budget, or a message we did not
ask for becomes a deny with the request id. The stream is never ended before every message got an
answer (Envoy would then continue without us).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from filters.auth_guard import guard_event
from filters.base import (
    CONTINUE,
    Continue,
    Decision,
    Deny,
    Phase,
    RequestContext,
    Respond,
    fail_mode_fired,
)
from filters.chain import Chain, merge
from filters.quota import counted_tokens, over_limit
from gateway.errors import ErrorCode
from gateway.extproc import convert as cv
from gateway.extproc._budget import within
from gateway.metrics import Metrics
from gateway.observability import log, where
from gateway.policy import CompiledPolicy
from gateway.registry import Registry
from gateway.reload import file_stamp

T = TypeVar("T")
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
OWNED_PREFIX = "x-ztgate-"


# Read-only and reused: gRPC serializes it afresh for every stream.
_PASS_RESPONSE_CHUNK = cv.ProcessingResponse(response_body=cv.BodyResponse(response=cv.CommonResponse()))


@dataclass(slots=True)
class _Stream:
    ctx: RequestContext | None = None
    kserve: bool = False
    request_body_mode: int = cv.NONE
    response_headers_mode: int = cv.SKIP
    response_body_mode: int = cv.NONE
    chain: Chain | None = None
    outcome: str = "allowed"
    status: int = 0
    code: str = ""
    settling: asyncio.Future[Decision] | None = None


class ExtProcServer:
    """Runs the chain for each ext_proc stream."""

    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        registry: Callable[[], Registry],
        budget_s: float,
        metrics: Metrics,
    ) -> None:
        self._policy = policy
        self._registry = registry
        self._budget = budget_s
        self._metrics = metrics
        self._log = log()
        self._finishing: set[asyncio.Future[None]] = set()  # kept referenced until they end

    async def drain(self) -> None:
        """Wait for the streams still being recorded (at shutdown, before engines close)."""
        if self._finishing:
            await asyncio.wait(set(self._finishing), timeout=self._budget * 2)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """Method handlers of /envoy.service.ext_proc.v3.ExternalProcessor (just Process)."""
        return {
            "Process": grpc.stream_stream_rpc_method_handler(
                self.process,
                request_deserializer=cv.ProcessingRequest.FromString,
                response_serializer=cv.ProcessingResponse.SerializeToString,
            )
        }

    async def process(
        self, requests: AsyncIterator[cv.Message], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cv.Message]:
        """One HTTP request's conversation with Envoy."""
        st = _Stream()
        try:
            async for req in requests:
                t0 = time.perf_counter()
                kind = req.WhichOneof("request")
                out = await self._guarded(st, kind, self._handle(kind, req, st))
                resp = self._deny(st, out) if isinstance(out, Deny) else out
                if st.settling is None and self._terminal(kind, req, st, resp):
                    resp = await self._settle(st, resp)
                self._metrics.phase(kind or "unknown", time.perf_counter() - t0)
                yield resp
                if resp.HasField("immediate_response"):
                    return
        finally:
            # gRPC cancels this handler once Envoy drops the stream (a client that left
            # mid-answer): the recording and the request's log line run in a task of their own,
            # which that cancellation cannot cut short.
            done = asyncio.ensure_future(self._finish(st))
            self._finishing.add(done)
            done.add_done_callback(self._finishing.discard)
            await asyncio.shield(done)

    def _rid(self, st: _Stream) -> str:
        return st.ctx.request_id if st.ctx else "-"

    def _deny(self, st: _Stream, d: Deny | Respond) -> cv.Message:
        st.outcome = "denied" if isinstance(d, Deny) else "responded"
        st.status = d.status
        st.code = str(d.code) if isinstance(d, Deny) else ""
        return cv.immediate(d, self._rid(st), st.kserve)

    @staticmethod
    def _terminal(kind: str | None, req: cv.Message, st: _Stream, resp: cv.Message) -> bool:
        """Is `resp` the last thing the gateway says about this request?"""
        if resp.HasField("immediate_response"):
            return True
        answer_phases = st.response_headers_mode != cv.SKIP
        if kind == "request_headers":
            return not answer_phases and bool(st.request_body_mode == cv.NONE)
        if kind == "request_body":
            return not answer_phases
        if kind == "response_headers":
            return bool(st.response_body_mode == cv.NONE)
        if kind != "response_body":
            return False
        # An OpenAI stream is whole at [DONE]. A client may send its next turn the moment it
        # reads it, before the upstream ends the stream: SETTLE (the audit record, the answer
        # remembered as delivered) runs before the chunk that holds [DONE] leaves.
        answer = st.ctx.answer if st.ctx is not None else None
        return bool(req.response_body.end_of_stream) or (answer is not None and answer.done)

    def _settling(self, st: _Stream, *, aborted: bool) -> asyncio.Future[Decision] | None:
        """SETTLE for this request, started once (None: nothing in the chain settles).

        It runs as its own task: a stream reset while it writes neither cuts the audit record
        short nor loses it (`_finish` waits for it). `aborted`: the stream ended first.
        """
        ctx, chain = st.ctx, st.chain
        if ctx is None or chain is None or not chain.settles:
            return None
        if st.settling is None:
            # A client that stops reading at the answer's end ([DONE]: the openai SDK) can leave
            # before Envoy's last, empty body chunk: it had the whole answer, so it was allowed.
            whole = ctx.answer is not None and ctx.answer.done
            ctx.outcome = "aborted" if aborted and st.outcome == "allowed" and not whole else st.outcome
            ctx.status, ctx.error_code = st.status or ctx.response_status or 0, st.code
            st.settling = asyncio.ensure_future(self._guarded(st, "settle", chain.settle(ctx)))
        return st.settling

    async def _settle(self, st: _Stream, resp: cv.Message) -> cv.Message:
        """SETTLE before `resp` leaves; a refusal there replaces a response that let it through."""
        settling = self._settling(st, aborted=False)
        if settling is None:
            return resp
        d = await asyncio.shield(settling)
        if isinstance(d, Deny) and st.outcome != "denied":
            return self._deny(st, d)
        return resp

    async def _guarded(self, st: _Stream, phase: str | None, work: Coroutine[Any, Any, T]) -> T | Deny:
        """`work` within the phase budget; a timeout or any exception is a Deny (fail closed),
        logged with the request id and without values."""
        try:
            return await within(self._budget, work)
        except TimeoutError:
            self._metrics.failure("timeout")
            self._log.warning("phase_timeout", request_id=self._rid(st), phase=phase)
            return Deny(504, ErrorCode.GATEWAY_TIMEOUT, "the gateway took too long")
        except Exception as exc:  # noqa: BLE001 - any bug denies (fail closed), logged without values
            self._metrics.failure("error")
            self._log.error(
                "chain_error",
                request_id=self._rid(st),
                phase=phase,
                error_type=type(exc).__name__,
                at=where(exc),
            )
            return Deny(500, ErrorCode.INTERNAL, "internal gateway error")

    async def _handle(self, kind: str | None, req: cv.Message, st: _Stream) -> cv.Message:
        if kind == "request_headers":
            return await self._request_headers(req.request_headers, st)
        ctx, chain = st.ctx, st.chain
        if ctx is None or chain is None:
            return self._deny(st, Deny(500, ErrorCode.INTERNAL, "internal gateway error"))
        if kind == "request_body":
            d = await chain.request_body(ctx, req.request_body.body)
            return self._after(
                st,
                d,
                lambda c: cv.ProcessingResponse(request_body=cv.BodyResponse(response=c)),
                buffered=True,
            )
        if kind == "response_headers":
            return await self._response_headers(req, st, ctx, chain)
        if kind == "response_body":
            d = await chain.response_chunk(ctx, req.response_body.body, req.response_body.end_of_stream)
            if d is CONTINUE:
                return _PASS_RESPONSE_CHUNK  # the usual streamed chunk: nothing to build
            return self._after(
                st,
                d,
                lambda c: cv.ProcessingResponse(response_body=cv.BodyResponse(response=c)),
                buffered=st.response_body_mode == cv.BUFFERED,
            )
        # Trailers or anything newer: we never asked for it, so we do not pass it.
        return self._deny(st, Deny(500, ErrorCode.INTERNAL, "internal gateway error"))

    def _after(
        self,
        st: _Stream,
        d: Decision,
        wrap: Callable[[cv.Message], cv.Message],
        extra_remove: tuple[str, ...] = (),
        *,
        buffered: bool = False,
    ) -> cv.Message:
        match d:
            case Deny() | Respond():
                return self._deny(st, d)
            case Continue():
                return wrap(cv.common(d, extra_remove, buffered=buffered))

    async def _request_headers(self, msg: cv.Message, st: _Stream) -> cv.Message:
        headers = cv.headers_to_dict(msg.headers)
        raw_path = headers.get(":path", "/")
        path, sep, query = raw_path.partition("?")
        # One policy for the whole request, however many reloads happen meanwhile.
        policy = self._policy()
        # Gateway-owned headers are never taken from the client: drop them before any filter looks.
        spoofed = tuple(k for k in headers if k.startswith(OWNED_PREFIX))
        for k in spoofed:
            del headers[k]
        ctx = RequestContext(
            request_id=headers.get("x-request-id") or str(uuid.uuid4()),
            method=headers.get(":method", ""),
            path=path,
            headers=headers,
            registry=self._registry(),
            policy=policy,
            query=sep + query,
        )
        st.ctx = ctx
        st.chain = chain = policy.chain
        st.kserve = path.startswith("/v2")
        d = await chain.request_headers(ctx)
        wants_body = bool(chain.phases & Phase.REQUEST_BODY)
        if isinstance(d, Continue) and wants_body and msg.end_of_stream:
            # No body will come: the body checks run now, on an empty body.
            d2 = await chain.request_body(ctx, b"")
            # A headers response carries no body mutation.
            d = dataclasses.replace(merge(d, d2), body=None) if isinstance(d2, Continue) else d2
        st.request_body_mode = cv.BUFFERED if wants_body and not msg.end_of_stream else cv.NONE
        st.response_headers_mode = (
            cv.SEND if chain.phases & (Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY) else cv.SKIP
        )

        # Answer bodies the chain reads are BUFFERED from here on, not only once the answer's
        # headers are back from the chain (which may make them STREAMED): body data arriving
        # while those headers are with ext_proc is then buffered without flow-control
        # watermarks, so an answer over the buffer limit is refused at once instead of
        # stalling the client (the request side's envoy#39345, on the way back).
        answer_body = cv.BUFFERED if chain.phases & Phase.RESPONSE_BODY else cv.NONE

        def wrap(c: cv.Message) -> cv.Message:
            return cv.ProcessingResponse(
                request_headers=cv.HeadersResponse(response=c),
                mode_override=cv.mode(st.request_body_mode, st.response_headers_mode, answer_body),
            )

        return self._after(st, d, wrap, spoofed)

    async def _response_headers(
        self, req: cv.Message, st: _Stream, ctx: RequestContext, chain: Chain
    ) -> cv.Message:
        msg = req.response_headers
        details = cv.code_details(req)
        if details is not None and details != cv.VIA_UPSTREAM:
            # The policy let it through, but the model server never answered: Envoy did.
            ctx.upstream_error = details
            if st.outcome == "allowed":
                st.outcome = "upstream_error"
        headers = cv.headers_to_dict(msg.headers)
        try:
            ctx.response_status = int(headers.get(":status", "0"))
        except ValueError:
            ctx.response_status = 0
        ctx.response_headers = headers
        d = await chain.response_headers(ctx)
        body_mode = cv.NONE
        if chain.phases & Phase.RESPONSE_BODY:
            if msg.end_of_stream:
                if isinstance(d, Continue):
                    d2 = await chain.response_chunk(ctx, b"", True)
                    d = d2 if not isinstance(d2, Continue) else d
            else:
                body_mode = (
                    cv.STREAMED
                    if headers.get("content-type", "").startswith("text/event-stream")
                    else cv.BUFFERED
                )
        st.response_body_mode = body_mode

        def wrap(c: cv.Message) -> cv.Message:
            return cv.ProcessingResponse(
                response_headers=cv.HeadersResponse(response=c),
                mode_override=cv.mode(st.request_body_mode, st.response_headers_mode, body_mode),
            )

        return self._after(st, d, wrap)

    async def _finish(self, st: _Stream) -> None:
        ctx, chain = st.ctx, st.chain
        if ctx is None or chain is None:
            return
        # A stream that ended before its last response (client gone, upstream reset, Envoy
        # timeout) is still recorded, though nothing can be refused any more; one whose recording
        # was under way when it was cut waits for it.
        settling = self._settling(st, aborted=True)
        if settling is not None:
            await settling
        try:
            await chain.end(ctx)
        except Exception as exc:  # noqa: BLE001 - the response is gone; record the bug and move on
            self._log.error(
                "chain_end_error", request_id=ctx.request_id, error_type=type(exc).__name__, at=where(exc)
            )
        status = st.status or ctx.response_status or 0
        self._metrics.outcome(st.outcome)
        for v in ctx.verdicts:
            if v.counts:
                self._metrics.found(v.filter, v.action, v.counts)
            fired = fail_mode_fired(v)
            if fired is not None:
                self._metrics.fail_mode(fired.dependency, fired.mode)
            elif v.filter == "risk" and v.action == "escalate":
                self._metrics.escalation("rule" if "reason=rule" in v.detail else "threshold")
            elif (over := over_limit(v)) is not None:
                self._metrics.quota_refused(*over)
            elif (tokens := counted_tokens(v)) is not None:
                self._metrics.quota_counted(*tokens)
            elif (event := guard_event(v)) is not None:
                self._metrics.guarded(event)
        route = ctx.route
        self._log.info(
            "request",
            request_id=ctx.request_id,
            method=ctx.method,
            path=ctx.path,
            status=status,
            outcome=st.outcome,
            upstream_error=ctx.upstream_error,
            user=ctx.principal.user if ctx.principal else None,
            tenant=ctx.principal.tenant if ctx.principal else None,
            model=f"{route.model}@{route.version}" if route else None,
            policy=chain.revision,
            # Details are rule names and entity counts, never request text.
            verdicts=[
                f"{v.filter}:{v.phase}:{v.action}" + (f":{v.detail}" if v.detail else "")
                for v in ctx.verdicts
                if v.action != "continue"
            ],
            chain_ms=round(sum(v.elapsed_s for v in ctx.verdicts) * 1000, 3),
            duration_ms=round((time.perf_counter() - ctx.started) * 1000, 3),
        )


def _certificates(cert: Path, key: Path, ca: Path) -> grpc.ServerCertificateConfiguration:
    """The three files as gRPC's certificate configuration, refused unless they parse and the key
    belongs to the certificate (checked on the very bytes that are served)."""
    cert_pem, key_pem, ca_pem = cert.read_bytes(), key.read_bytes(), ca.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        c, k = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        c.write_bytes(cert_pem)
        k.write_bytes(key_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(c, k)
        ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
    return grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)], root_certificates=ca_pem)


def mutual_tls(
    cert: Path, key: Path, ca: Path, reloaded: Callable[[str], None] | None = None
) -> grpc.ServerCredentials:
    """Server credentials that also require the peer's certificate, from the same CA (Envoy's).

    The files are read again when they change, as Envoy re-reads its own copy (rotation without a
    restart): gRPC asks at each new connection, and a change is taken only if the certificate, key
    and CA parse and match; otherwise the last good ones stay and the refusal is logged once.
    `reloaded` hears each outcome ("reloaded", "refused"), e.g. for metrics.
    """
    files = (cert, key, ca)

    def stamp() -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(file_stamp(f) for f in files)

    seen = [stamp()]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            now = stamp()
            if now == seen[0]:
                return None
            seen[0] = now
            config = _certificates(cert, key, ca)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log().warning("extproc_tls_not_reloaded", error=type(exc).__name__, detail=str(exc)[:200])
            if reloaded is not None:
                reloaded("refused")
            return None
        log().info("extproc_tls_reloaded", cert=str(cert))
        if reloaded is not None:
            reloaded("reloaded")
        return config

    return grpc.dynamic_ssl_server_credentials(
        _certificates(cert, key, ca), fetch, require_client_authentication=True
    )


async def serve(
    server_impl: ExtProcServer,
    host: str,
    port: int,
    ready: asyncio.Event | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> None:
    """Serve until cancelled (over mutual TLS with `credentials`)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ]
    )
    # Registered (not generic) handlers: gRPC matches the method in C, per stream.
    server.add_registered_method_handlers(SERVICE, server_impl.handlers())
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind ext_proc port {host}:{port}")
    await server.start()
    if ready is not None:
        ready.set()
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=2)
