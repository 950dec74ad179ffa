"""The audit log: one tamper-evident hash chain of records per worker process, and its verifier.

A chain is a JSON Lines file. Each line is the canonical JSON of one record (keys sorted, no
spaces, UTF-8): the record's fields, `seq` (0, 1, 2 …), `prev` (the previous record's `hash`,
64 zeros for the first) and `hash`, the SHA-256 of the canonical JSON of everything else in
the record. Changing, inserting, removing or reordering a line breaks the chain at that line; the
verifier says where. Cutting records off the end leaves a shorter valid chain, so anchor the head
elsewhere: the verifier prints it, and workers log it (`audit_head`) when they stop.

A chain is appended to by exactly one process (files are named by instance and worker port), so
no locking is needed; a restarted worker continues its file after checking the last record.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
# The process's one ChainWriter, among the BuildEnv engines (shared by every policy revision).
WRITER_ENGINE = "audit:writer"
_CHAINED = ("seq", "prev", "hash")


def now() -> str:
    """UTC time as records carry it (milliseconds)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def canonical(doc: Any) -> str:
    """The one serialization a record is hashed and stored in."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of a record without its own `hash`."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def fingerprint(key: bytes, text: str) -> str:
    """Keyed fingerprint of a text (HMAC-SHA256): equal texts match, the text cannot be read back.

    Without the key nobody can test a guess against the log, so short or predictable prompts do
    not leak through it.
    """
    return "hmac-sha256:" + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class AuditError(RuntimeError):
    """The chain cannot be continued or written (a damaged tail, an unwritable directory)."""


@dataclass
class ChainWriter:
    """Appends records to one chain file; opened on the first append (or `open`)."""

    path: Path
    _fd: int | None = field(default=None, repr=False)
    seq: int = 0
    head: str = GENESIS

    def open(self) -> int:
        """Open the file and continue after its last record, which must verify."""
        if self._fd is not None:
            return self._fd
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            last = _last_line(self.path)
            if last is not None:
                rec = _parse(last)
                if rec is None or rec.get("hash") != record_hash(rec) or canonical(rec) != last:
                    raise AuditError(
                        f"{self.path} ends with a damaged record; run `ztgate audit verify {self.path}`, "
                        "keep the file as evidence, move it aside and restart"
                    )
                self.seq, self.head = int(rec["seq"]) + 1, str(rec["hash"])
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise AuditError(f"cannot open audit chain {self.path}: {exc.strerror}") from None
        return self._fd

    def append(self, record: dict[str, Any]) -> str:
        """Chain and write one record (one write call); returns its hash."""
        fd = self.open()
        rec = {**record, "seq": self.seq, "prev": self.head}
        rec["hash"] = record_hash(rec)
        line = (canonical(rec) + "\n").encode()
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise AuditError(f"short write to {self.path} ({written} of {len(line)} bytes)")
        except OSError as exc:
            raise AuditError(f"cannot write audit chain {self.path}: {exc.strerror}") from None
        self.seq, self.head = self.seq + 1, rec["hash"]
        return str(rec["hash"])

    def sync(self) -> None:
        """Flush what was written to disk (blocking: call it off the event loop)."""
        try:
            os.fsync(self.open())
        except OSError as exc:
            raise AuditError(f"cannot sync audit chain {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _last_line(path: Path) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with path.open("rb") as f:
        step = 1 << 16
        pos, tail = size, b""
        while pos > 0:
            pos = max(0, pos - step)
            f.seek(pos)
            tail = f.read(size - pos)
            if tail.rstrip(b"\n").rfind(b"\n") >= 0 or pos == 0:
                break
    if not tail.endswith(b"\n"):
        return "<no final newline>"  # a torn write: never valid
    lines = tail.rstrip(b"\n").split(b"\n")
    try:
        return lines[-1].decode()
    except UnicodeDecodeError:
        return "<invalid UTF-8>"


def _parse(line: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not all(k in doc for k in _CHAINED):
        return None
    return doc


@dataclass(frozen=True)
class Verified:
    """What the verifier found in one chain file."""

    path: Path
    records: int  # intact records, from the first (all of them when ok)
    head: str
    problem: str | None  # None: intact; else `line N: what is wrong`
    kept: tuple[dict[str, Any], ...] = ()  # the intact records themselves, if asked for

    @property
    def ok(self) -> bool:
        """The chain is intact."""
        return self.problem is None


def verify(path: Path, *, keep: bool = False) -> Verified:
    """Check a chain file line by line; stops at the first problem. `keep`: also return the
    intact records (one read and parse serves checking and reading)."""
    prev = GENESIS
    kept: list[dict[str, Any]] = []

    def result(problem: str | None) -> Verified:
        return Verified(path, len(kept), prev, problem, tuple(kept) if keep else ())

    try:
        data = path.read_bytes()
    except OSError as exc:
        return result(f"cannot read: {exc.strerror}")
    *lines, torn = data.split(b"\n")
    for i, raw in enumerate(lines, start=1):
        n = len(kept)
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            return result(f"line {i}: not UTF-8")
        rec = _parse(line)
        if rec is None:
            return result(f"line {i}: not an audit record")
        if canonical(rec) != line:
            return result(f"line {i}: not in canonical form (edited)")
        if rec["seq"] != n:
            return result(f"line {i}: seq {rec['seq']!r}, expected {n} (removed or reordered)")
        if rec["prev"] != prev:
            return result(f"line {i}: prev does not match line {i - 1}'s hash")
        if rec["hash"] != record_hash(rec):
            return result(f"line {i}: hash does not match its content (edited)")
        prev = rec["hash"]
        kept.append(rec)
    if torn:
        return result(f"line {len(kept) + 1}: incomplete (no final newline)")
    return result(None)


def chain_files(target: Path) -> list[Path]:
    """The chain files at `target`: the file itself, or every `*.jsonl` in a directory."""
    return sorted(target.glob("*.jsonl")) if target.is_dir() else [target]
