"""Protocol-neutral views of prompts and answers, and strict JSON decoding.

Parsers in `_openai.py` and `_kserve.py` turn wire formats into these, so later filters see text,
not protocol.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ErrorCode
from gateway.registry import Protocol


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of prompt text and where it came from (role, input name or document)."""

    role: str
    text: str


@dataclass(slots=True)
class Prompt:
    """What a request asks, in protocol-neutral terms."""

    protocol: Protocol
    operation: str
    model_ref: str | None = None
    stream: bool = False
    segments: tuple[Segment, ...] = ()
    document: Any = None
    binary_tail: bytes = b""
    # The prompt text as the client sent it, kept by a filter that rewrites `segments` (pii).
    received_text: str | None = None
    # An OpenAI stream whose usage chunk the gateway asked for (quota), not the client: the
    # protocol filter takes that chunk out before the answer leaves.
    usage_hidden: bool = False

    @property
    def text(self) -> str:
        """All prompt text, segments separated by blank lines."""
        return "\n\n".join(s.text for s in self.segments)


@dataclass(slots=True)
class Answer:
    """The upstream's answer text, reassembled per choice (or per output tensor) and, within
    a choice, per field (content, reasoning, each tool call's arguments…)."""

    parts: dict[int, dict[Hashable, list[str]]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    done: bool = False
    upstream_error: bool = False
    events: int = 0
    # Set by the protocol filter for the filters after it: the events completed by the current
    # body chunk (streamed), or the whole parsed answer and its binary tensor data (buffered).
    chunk_events: list[StreamEvent] = field(default_factory=list)
    document: Any = None
    binary: bytes = b""

    def add(self, index: int, text: str, part: Hashable = "") -> None:
        """Append text to one field of a choice."""
        if text:
            self.parts.setdefault(index, {}).setdefault(part, []).append(text)

    def text(self, index: int = 0) -> str:
        """The text of one choice so far: its fields in the order they began, a line apart."""
        return "\n".join("".join(pieces) for pieces in self.parts.get(index, {}).values())

    @property
    def choices(self) -> list[int]:
        """Choice indexes that have text, in order."""
        return sorted(self.parts)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One parsed SSE event of an answer: its `event` field, its JSON document (None for `[DONE]`)."""

    event: str | None
    doc: Any


def sse_bytes(ev: StreamEvent) -> bytes:
    """One event as the gateway writes it into a stream it rewrites (`[DONE]` for no document)."""
    head = f"event: {ev.event}\n".encode() if ev.event else b""
    return head + b"data: " + (b"[DONE]" if ev.doc is None else compact_json(ev.doc)) + b"\n\n"


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one piece of text sits in a parsed JSON document, so a filter can rewrite it in place.

    `key` names the text stream it belongs to (a choice and field), so streamed pieces of the
    same choice are treated as one text.
    """

    key: Hashable
    container: Any  # the dict or list holding the text
    field: str | int

    def get(self) -> str:
        """The text."""
        value = self.container[self.field]
        return value if isinstance(value, str) else ""

    def set(self, text: str) -> None:
        """Replace the text."""
        self.container[self.field] = text


class ProtocolError(ValueError):
    """A request or response that does not follow its protocol; carries a user-safe code."""

    def __init__(self, status: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys are how requests get smuggled past a gateway: we would check one value and
    # the upstream's parser might use the other.
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ProtocolError(400, ErrorCode.INVALID_JSON, f"duplicate key {k!r} in JSON object")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    raise ProtocolError(400, ErrorCode.INVALID_JSON, f"{name} is not valid JSON")


def strict_json(body: bytes, what: str = "request body") -> Any:
    """Decode UTF-8 JSON strictly: no invalid UTF-8, lone surrogates, duplicate keys or NaN."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(400, ErrorCode.INVALID_ENCODING, f"{what} is not valid UTF-8") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise ProtocolError(
            400, ErrorCode.INVALID_JSON, f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise ProtocolError(400, ErrorCode.INVALID_JSON, f"{what} is nested too deeply") from None
    return doc


def compact_json(doc: Any) -> bytes:
    """A document as the gateway re-serializes it: UTF-8, no spaces."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def check_text(value: str, where: str) -> str:
    """Reject strings that cannot be re-encoded (lone surrogates from \\ud800-style escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(
            400, ErrorCode.INVALID_ENCODING, f"{where} contains an invalid character"
        ) from None
    return value


def bad(message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST, status: int = 400) -> ProtocolError:
    """A 400-class protocol error with a user-safe message."""
    return ProtocolError(status, code, message)
