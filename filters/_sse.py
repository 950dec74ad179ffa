"""Incremental Server-Sent Events parsing across arbitrary body-chunk boundaries.

Bytes are kept until an event is complete (a blank line), so a multi-byte UTF-8 character or a
JSON payload split between two chunks is only decoded once whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(r"\r\n|\n|\r")


class SSEError(ValueError):
    """The stream is not valid SSE (undecodable bytes or an oversized event)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event: its `data` lines joined by newlines, and the `event` field if any."""

    data: str
    event: str | None = None


@dataclass(slots=True)
class SSEParser:
    """Feed body chunks; get complete events back in order."""

    max_event_bytes: int = 4 * 1024 * 1024
    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add a chunk; return the events it completed."""
        self._buf += chunk
        events: list[SSEEvent] = []
        start = 0
        for m in _EVENT_END.finditer(self._buf):
            raw = bytes(self._buf[start : m.start()])
            start = m.end()
            ev = _parse_event(raw)
            if ev is not None:
                events.append(ev)
        if start:
            del self._buf[:start]
        if len(self._buf) > self.max_event_bytes:
            raise SSEError("event exceeds the size limit")
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a trailing event without its blank line still counts."""
        raw = bytes(self._buf).rstrip(b"\r\n")
        self._buf.clear()
        ev = _parse_event(raw) if raw else None
        return [ev] if ev is not None else []

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete event."""
        return len(self._buf)


def _parse_event(raw: bytes) -> SSEEvent | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SSEError("event is not valid UTF-8") from None
    data: list[str] = []
    event: str | None = None
    for line in _LINE.split(text):
        if not line or line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if not data and event is None:
        return None
    return SSEEvent("\n".join(data), event)
