"""Protobuf ⇄ plain Python, in both directions. Nothing outside gateway/extproc imports Envoy types."""

from __future__ import annotations

from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from filters.base import Continue, Deny, Respond
from gateway.errors import error_body

# upb classes carry no static types: messages are `Message` (Any) past this line.
Message: TypeAlias = Any
ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse
HeadersResponse = pb.HeadersResponse
BodyResponse = pb.BodyResponse
CommonResponse = pb.CommonResponse

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_PM = processing_mode_pb2.ProcessingMode
SEND = _PM.SEND
SKIP = _PM.SKIP
NONE = _PM.NONE
STREAMED = _PM.STREAMED
BUFFERED = _PM.BUFFERED


def headers_to_dict(hm: Message) -> dict[str, str]:
    """Envoy's header map as lower-case name → value (repeated headers joined with ', ')."""
    pairs = [(h.key, h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value) for h in hm.headers]
    out = dict(pairs)
    if len(out) == len(pairs) and all(k.islower() for k in out):
        return out  # the common case: Envoy sends lower-case names, each once
    out = {}
    for key, value in pairs:
        k = key.lower()
        out[k] = f"{out[k]}, {value}" if k in out else value
    return out


_ATTRIBUTES_OF = "envoy.filters.http.ext_proc"
CODE_DETAILS = "response.code_details"
VIA_UPSTREAM = "via_upstream"


def code_details(req: Message) -> str | None:
    """Envoy's `response.code_details` for a response_headers message (envoy/envoy.yaml asks for
    it): "via_upstream" when the model server answered, else why Envoy answered itself."""
    attrs = req.attributes.get(_ATTRIBUTES_OF)
    if attrs is None or CODE_DETAILS not in attrs.fields:
        return None
    value = attrs.fields[CODE_DETAILS]
    return value.string_value if value.WhichOneof("kind") == "string_value" else None


def mode(request_body: int, response_headers: int, response_body: int = NONE) -> Message:
    """A full processing mode (headers always sent, trailers never)."""
    return _PM(
        request_header_mode=SEND,
        response_header_mode=response_headers,
        request_body_mode=request_body,
        response_body_mode=response_body,
        request_trailer_mode=SKIP,
        response_trailer_mode=SKIP,
    )


def common(c: Continue, extra_remove: tuple[str, ...] = (), *, buffered: bool = False) -> Message:
    """A CommonResponse carrying a Continue's mutations.

    A replaced buffered body gets its content-length set (Envoy refuses a mismatch); streamed
    chunks travel chunked and carry none.
    """
    cr = pb.CommonResponse()
    if c.body is not None and buffered:
        c = Continue(
            (*c.set_headers, ("content-length", str(len(c.body)))), c.remove_headers, c.body, c.reroute
        )
    set_names = {k for k, _ in c.set_headers}
    removes = [h for h in (*extra_remove, *c.remove_headers) if h not in set_names]
    if c.set_headers or removes:
        hm = cr.header_mutation
        for k, v in c.set_headers:
            hm.set_headers.append(
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
                )
            )
        hm.remove_headers.extend(dict.fromkeys(removes))
    if c.body is not None:
        cr.body_mutation.body = c.body
    if c.reroute:
        cr.clear_route_cache = True
    return cr


def immediate(decision: Deny | Respond, request_id: str, kserve: bool) -> Message:
    """An ImmediateResponse: the chain's deny in the protocol's error shape, or its own answer."""
    if isinstance(decision, Deny):
        status, details = decision.status, f"ztgate_{decision.code}"
        body = error_body(kserve, decision.status, decision.code, decision.message, request_id)
        ctype = "application/json"
    else:
        status, details, body, ctype = decision.status, "ztgate_respond", decision.body, decision.content_type
    ir = pb.ImmediateResponse(status=http_status_pb2.HttpStatus(code=status), body=body, details=details)
    extra = decision.headers if isinstance(decision, Deny) else ()
    for k, v in (("content-type", ctype), *extra):
        ir.headers.set_headers.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
            )
        )
    return pb.ProcessingResponse(immediate_response=ir)
