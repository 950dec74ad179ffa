"""Triton / KServe v2 HTTP: path parsing, request validation and answer extraction.

Handles the binary tensor extension (`Inference-Header-Content-Length`), which `tritonclient`
uses by default, and Triton's quirks: `generate_stream` sends no `[DONE]`, errors can arrive
with status 200 as `{"error": ...}`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from filters._protocols import (
    Answer,
    Prompt,
    ProtocolError,
    Segment,
    Slot,
    StreamEvent,
    bad,
    check_text,
    compact_json,
    strict_json,
)
from filters._sse import SSEParser
from gateway.errors import ErrorCode
from gateway.registry import Protocol

SERVER = "server_metadata"
HEALTH = "health"
MODEL_METADATA = "model_metadata"
MODEL_READY = "model_ready"
MODEL_CONFIG = "model_config"
INFER = "infer"
GENERATE = "generate"
GENERATE_STREAM = "generate_stream"

_POST_OPS = frozenset({INFER, GENERATE, GENERATE_STREAM})
_MODEL_SUFFIX = {
    "": MODEL_METADATA,
    "ready": MODEL_READY,
    "config": MODEL_CONFIG,
    "infer": INFER,
    "generate": GENERATE,
    "generate_stream": GENERATE_STREAM,
}
# Administrative Triton APIs are never exposed through the gateway.
_FORBIDDEN_PREFIXES = (
    "/v2/repository",
    "/v2/systemsharedmemory",
    "/v2/cudasharedmemory",
    "/v2/logging",
    "/v2/trace",
)
HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True, slots=True)
class KPath:
    """A parsed KServe v2 path."""

    op: str
    model_ref: str | None = None


def parse_path(method: str, path: str) -> KPath:
    """Classify a /v2 path; ProtocolError for unknown, forbidden or wrong-method calls."""
    if path.startswith(_FORBIDDEN_PREFIXES):
        raise bad("this API is not available through the gateway", ErrorCode.FORBIDDEN_PATH, 403)
    parts = path.split("/")[1:]
    kp: KPath | None = None
    if parts == ["v2"]:
        kp = KPath(SERVER)
    elif parts in (["v2", "health", "live"], ["v2", "health", "ready"]):
        kp = KPath(HEALTH)
    elif len(parts) >= 3 and parts[:2] == ["v2", "models"] and parts[2]:
        name = unquote(parts[2])
        rest = parts[3:]
        if len(rest) >= 2 and rest[0] == "versions" and rest[1]:
            if "@" in name:
                raise bad("give the version either as name@version or as /versions/, not both")
            name = f"{name}@{unquote(rest[1])}"
            rest = rest[2:]
        suffix = "/".join(rest)
        if suffix in _MODEL_SUFFIX:
            kp = KPath(_MODEL_SUFFIX[suffix], name)
    if kp is None:
        raise bad("unknown path", ErrorCode.UNKNOWN_PATH, 404)
    want = "POST" if kp.op in _POST_OPS else "GET"
    if method != want:
        raise bad(f"{path} takes {want}", ErrorCode.METHOD_NOT_ALLOWED, 405)
    return kp


def upstream_path(kp: KPath, model: str, version: str | None) -> str:
    """The path to send upstream for a model call, with the registry's name and version."""
    base = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    suffix = {
        MODEL_METADATA: "",
        MODEL_READY: "/ready",
        MODEL_CONFIG: "/config",
        INFER: "/infer",
        GENERATE: "/generate",
        GENERATE_STREAM: "/generate_stream",
    }[kp.op]
    return base + suffix


def split_binary(body: bytes, header_length: str | None, what: str) -> tuple[bytes, bytes]:
    """Split a body into its JSON part and the binary tensor data after it."""
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        raise bad(f"{HEADER_LENGTH} must be an integer") from None
    if n < 0 or n > len(body):
        raise bad(f"{HEADER_LENGTH} is larger than the {what}")
    return body[:n], body[n:]


def decode_bytes_tensor(raw: bytes, where: str) -> list[str]:
    """Decode a BYTES tensor in the binary extension: repeated (uint32 LE length, bytes)."""
    out: list[str] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise bad(f"{where}: truncated BYTES element")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise bad(f"{where}: truncated BYTES element")
        try:
            out.append(raw[pos : pos + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise ProtocolError(400, ErrorCode.INVALID_ENCODING, f"{where} is not valid UTF-8") from None
        pos += n
    return out


def _flatten_strings(data: Any, where: str) -> list[str]:
    if isinstance(data, str):
        return [check_text(data, where)]
    if isinstance(data, list):
        out: list[str] = []
        for item in data:
            out += _flatten_strings(item, where)
        return out
    raise bad(f"{where}: BYTES data must be strings")


def _tensors(
    entries: Any, binary: bytes, where: str, *, strict: bool
) -> tuple[list[tuple[str, list[str]]], int]:
    """(name, strings) for each BYTES tensor, and how many binary bytes were consumed."""
    if not isinstance(entries, list):
        raise bad(f"'{where}' must be an array")
    out: list[tuple[str, list[str]]] = []
    pos = 0
    for i, t in enumerate(entries):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise bad(f"{where}[{i}] must be an object with a string 'name'")
        if t.get("datatype") != "BYTES" and strict:
            # Non-text tensors (token ids, embeddings) cannot be checked: refuse them.
            raise bad(f"{where}[{i}]: only BYTES (text) tensors are accepted", ErrorCode.UNSUPPORTED_CONTENT)
        params = t.get("parameters") or {}
        if not isinstance(params, dict):
            raise bad(f"{where}[{i}].parameters must be an object")
        if strict and any(k.startswith("shared_memory") for k in params):
            raise bad(f"{where}[{i}]: {_SHM}", ErrorCode.UNSUPPORTED_CONTENT)
        size = params.get("binary_data_size")
        if t.get("datatype") != "BYTES":
            # Not text, but its binary data still takes its place in the body.
            if size is not None:
                if not isinstance(size, int) or size < 0 or pos + size > len(binary):
                    raise bad(f"{where}[{i}]: binary_data_size does not match the body")
                pos += size
            continue
        if size is not None:
            if not isinstance(size, int) or size < 0 or pos + size > len(binary):
                raise bad(f"{where}[{i}]: binary_data_size does not match the body")
            out.append((t["name"], decode_bytes_tensor(binary[pos : pos + size], f"{where}[{i}]")))
            pos += size
        else:
            out.append((t["name"], _flatten_strings(t.get("data"), f"{where}[{i}].data")))
    return out, pos


_SHM = "shared-memory tensors cannot be checked by the gateway"


def _requested_outputs(outputs: Any) -> None:
    """An infer request's `outputs`: an answer written to shared memory would never pass the
    gateway's answer checks, so it is refused."""
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise bad("'outputs' must be an array")
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise bad(f"outputs[{i}] must be an object with a string 'name'")
        params = o.get("parameters") or {}
        if not isinstance(params, dict):
            raise bad(f"outputs[{i}].parameters must be an object")
        if any(k.startswith("shared_memory") for k in params):
            raise bad(f"outputs[{i}]: {_SHM}", ErrorCode.UNSUPPORTED_CONTENT)


def _parameter_segments(doc: dict[str, Any]) -> list[Segment]:
    """Request-level `parameters`: the model server hands them to the model, so their strings
    are prompt text (role `parameter:<name>`). Values are scalars, as the protocol has them."""
    params = doc.get("parameters")
    if params is None:
        return []
    if not isinstance(params, dict):
        raise bad("'parameters' must be an object")
    if "priority" in params:
        # Triton's scheduling priority: one tenant's own would jump every other tenant's queue.
        raise bad(
            "parameters.priority is set by the model server's operator, not by a client",
            ErrorCode.UNSUPPORTED_CONTENT,
        )
    seq = params.get("sequence_id")
    if seq is not None and not (
        (isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq < 1 << 64)
        or (isinstance(seq, str) and _REQUEST_ID.fullmatch(seq))
    ):
        raise bad("parameters.sequence_id must be a number from 0 to 2^64-1 or an identifier")
    out: list[Segment] = []
    for key, value in params.items():
        if isinstance(value, str):
            out.append(Segment(f"parameter:{key}", check_text(value, f"parameters.{key}")))
        elif not isinstance(value, bool | int | float):
            raise bad(f"parameters.{key} must be a string, number or boolean")
    return out


def parameter_slots(doc: Any) -> list[Slot]:
    """The string request parameters of a validated infer/generate request, for rewriting."""
    params = doc.get("parameters") if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        return []
    return [Slot(("parameter", k), params, k) for k, v in params.items() if isinstance(v, str)]


# A request id is metadata the model server logs and echoes, never reads as text: an identifier.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{0,128}")


def non_text_outputs(doc: Any) -> list[tuple[str, str]]:
    """(name, datatype) of a validated infer answer's outputs that are not BYTES (token ids,
    scores): the gateway cannot read them as text."""
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, list):
        return []
    return [
        (t["name"], str(t.get("datatype")))
        for t in outputs
        if isinstance(t, dict) and t.get("datatype") != "BYTES"
    ]


def non_text_fields(doc: Any) -> list[tuple[str, str]]:
    """(name, kind) of a generate answer's (or stream event's) outputs that are arrays holding
    numbers or booleans (token ids, log-probabilities): the gateway cannot read them as text.
    Scalars (a sequence id, a token count, an end flag) are metadata and pass."""
    if not isinstance(doc, dict) or "error" in doc:
        return []
    return [
        (key, "an array of numbers")
        for key, value in doc.items()
        if key not in _METADATA
        and isinstance(value, list)
        and any(isinstance(v, bool | int | float) for v in value)
    ]


def parse_request(kp: KPath, body: bytes, header_length: str | None) -> Prompt:
    """Validate an infer/generate body and extract its text; ProtocolError if malformed."""
    json_part, binary = split_binary(body, header_length, "request body")
    doc = strict_json(json_part)
    if not isinstance(doc, dict):
        raise bad("request body must be a JSON object")
    rid = doc.get("id")
    if rid is not None and not (isinstance(rid, str) and _REQUEST_ID.fullmatch(rid)):
        raise bad("'id' must be an identifier: letters, digits and . _ : - (at most 128)")
    segments: list[Segment] = []
    if kp.op == INFER:
        tensors, used = _tensors(doc.get("inputs"), binary, "inputs", strict=True)
        if not tensors:
            raise bad("'inputs' must name at least one tensor")
        if used != len(binary):
            raise bad("binary data does not match the inputs' binary_data_size")
        _requested_outputs(doc.get("outputs"))
        for name, strings in tensors:
            segments += [Segment(f"input:{name}", s) for s in strings]
    else:
        if binary:
            raise bad(f"{kp.op} takes a plain JSON body")
        for key, value in doc.items():
            if key in ("parameters", "id"):
                continue
            if isinstance(value, str | list):
                segments += [Segment(f"input:{key}", s) for s in _flatten_strings(value, key)]
            elif not isinstance(value, bool | int | float) and value is not None:
                raise bad(f"'{key}' must be a string, number, boolean or array of strings")
    segments += _parameter_segments(doc)
    return Prompt(
        Protocol.KSERVE_V2, kp.op, kp.model_ref, kp.op == GENERATE_STREAM, tuple(segments), doc, binary
    )


def _generate_fields(doc: Any, answer: Answer, index: int) -> None:
    if not isinstance(doc, dict):
        raise ProtocolError(502, ErrorCode.UPSTREAM_BAD_RESPONSE, "upstream answer is not a JSON object")
    if "error" in doc:
        answer.upstream_error = True
        return
    # Every string output is answer text; the model's name/version/id are metadata.
    for key, value in doc.items():
        if key in ("model_name", "model_version", "id", "parameters"):
            continue
        if isinstance(value, str):
            answer.add(index, value, key)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            answer.add(index, "".join(value), key)
        elif isinstance(value, dict) or (
            isinstance(value, list) and any(isinstance(v, dict | list) for v in value)
        ):
            # Outputs are scalars or flat arrays; text nested deeper would escape the checks.
            raise ProtocolError(
                502, ErrorCode.UPSTREAM_BAD_RESPONSE, f"upstream answer: {key!r} is nested too deeply"
            )


def answer_from_body(op: str, body: bytes, header_length: str | None, answer: Answer) -> None:
    """Fill `answer` from a whole infer/generate response body."""
    if op == INFER:
        json_part, binary = split_binary(body, header_length, "upstream answer")
        doc = strict_json(json_part, "upstream answer")
        answer.document, answer.binary = doc, binary
        if isinstance(doc, dict) and "error" in doc:
            answer.upstream_error = True
            return
        if not isinstance(doc, dict):
            raise ProtocolError(502, ErrorCode.UPSTREAM_BAD_RESPONSE, "upstream answer is not a JSON object")
        try:
            tensors, _ = _tensors(doc.get("outputs", []), binary, "outputs", strict=False)
        except ProtocolError as exc:
            raise ProtocolError(
                502, ErrorCode.UPSTREAM_BAD_RESPONSE, f"upstream answer: {exc.message}"
            ) from None
        for i, (_, strings) in enumerate(tensors):
            answer.add(i, "\n".join(strings))
    elif op == GENERATE:
        answer.document = strict_json(body, "upstream answer")
        _generate_fields(answer.document, answer, 0)
    answer.done = True


def answer_from_sse(parser: SSEParser, chunk: bytes, end: bool, answer: Answer) -> None:
    """Feed one `generate_stream` chunk; each event carries the next piece of the outputs."""
    events = parser.feed(chunk)
    if end:
        events += parser.close()
        answer.done = True
    answer.chunk_events = []
    for ev in events:
        answer.events += 1
        doc = strict_json(ev.data.encode(), "upstream stream event")
        _generate_fields(doc, answer, 0)
        answer.chunk_events.append(StreamEvent(ev.event, doc))


_METADATA = frozenset({"model_name", "model_version", "id", "parameters"})


def generate_slots(doc: Any) -> list[Slot]:
    """The texts of a generate request or answer (every string field but metadata), keyed by field."""
    out: list[Slot] = []
    if not isinstance(doc, dict) or "error" in doc:
        return out
    for key, value in doc.items():
        if key in _METADATA:
            continue
        if isinstance(value, str):
            out.append(Slot(key, doc, key))
        elif isinstance(value, list):
            out += [Slot((key, i), value, i) for i, v in enumerate(value) if isinstance(v, str)]
    return out


def _json_strings(data: Any) -> list[Slot]:
    if isinstance(data, list):
        out: list[Slot] = []
        for i, item in enumerate(data):
            out += [Slot(i, data, i)] if isinstance(item, str) else _json_strings(item)
        return out
    return []


def _encode_bytes_tensor(strings: list[str]) -> bytes:
    out = bytearray()
    for s in strings:
        raw = s.encode("utf-8")
        out += struct.pack("<I", len(raw)) + raw
    return bytes(out)


def rewrite_tensors(entries: Any, binary: bytes, fix: Callable[[str], str]) -> bytes:
    """Rewrite every string of the BYTES tensors in `entries` (inputs or outputs) with `fix`,
    in JSON `data` or in the binary extension; returns the new binary data (other tensors'
    bytes copied through) and updates each `binary_data_size`. Entries were validated already."""
    out = bytearray()
    pos = 0
    for t in entries if isinstance(entries, list) else ():
        params = t.get("parameters") or {}
        size = params.get("binary_data_size")
        if size is None:
            if t.get("datatype") == "BYTES":
                for slot in _json_strings(t.get("data")):
                    slot.set(fix(slot.get()))
            continue
        raw = binary[pos : pos + size]
        pos += size
        if t.get("datatype") == "BYTES":
            raw = _encode_bytes_tensor([fix(s) for s in decode_bytes_tensor(raw, "tensor")])
            params["binary_data_size"] = len(raw)
        out += raw
    return bytes(out)


def body_with_binary(doc: Any, binary: bytes) -> tuple[bytes, str | None]:
    """Serialize a (rewritten) document with its binary data; and the new header length, if any."""
    json_part = compact_json(doc)
    return json_part + binary, (str(len(json_part)) if binary else None)
