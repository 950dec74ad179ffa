"""The audit log: one tamper-evident hash chain of records per worker process, and its verifier.

A chain is a JSON Lines file. Each line is the canonical JSON of one record (keys sorted, no
spaces, UTF-8): the record's fields, `seq` (0, 1, 2 …), `prev` (the previous record's `hash`,
64 zeros for the first) and `hash`, the SHA-256 of the canonical JSON of everything else in
the record. Changing, inserting, removing or reordering a line breaks the chain at that line; the
verifier says where. Cutting records off the end leaves a shorter valid chain, so anchor the head
elsewhere: the verifier prints it, and workers log it (`audit_head`) once a minute and when they
stop; `verify(anchors=...)` checks a chain against such heads.

A chain is appended to by exactly one process (files are named by instance and worker port), so
no locking is needed; a restarted worker continues its file after checking the last record.

Segments: once the live file `<chain>.jsonl` reaches the writer's segment size, the next record
first renames it to `<chain>.seg<NNNNNN>.jsonl` (numbered from 1) and starts a new live file that
goes on with the same chain (its first record's `prev` is the last segment's last hash). The
verifier reads a chain's segments in order, then its live file, as one chain: a missing, cut or
reordered segment breaks it where the next one no longer links. Old segments may be archived and
pruned; a chain that then starts after seq 0 verifies only when asked to (`pruned_ok`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
# The process's one ChainWriter, among the BuildEnv engines (shared by every policy revision).
WRITER_ENGINE = "audit:writer"
_CHAINED = ("seq", "prev", "hash")
_SEGMENT = re.compile(r"^(?P<chain>.+)\.seg(?P<n>\d{6,})\.jsonl$")


def segments(live: Path) -> list[Path]:
    """The closed segments of the chain whose live file is `live`, oldest first."""
    found = []
    for p in live.parent.glob(f"{glob_escape(live.stem)}.seg*.jsonl"):
        m = _SEGMENT.match(p.name)
        if m is not None and m["chain"] == live.stem:
            found.append((int(m["n"]), p))
    return [p for _, p in sorted(found)]


def glob_escape(name: str) -> str:
    """`name` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


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
    """Appends records to one chain file; opened on the first append (or `open`).

    With `segment_bytes`, a live file that has reached that size is closed as a segment before
    the next record (never between a record and its sync, which covers the file it went to).
    """

    path: Path
    segment_bytes: int = 0  # 0: one file, never segmented
    _fd: int | None = field(default=None, repr=False)
    _size: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    seq: int = 0
    head: str = GENESIS

    def open(self) -> int:
        """Open the live file and continue after the chain's last record, which must verify (the
        live file's, or the last segment's when the live file is new)."""
        if self._fd is not None:
            return self._fd
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tail = self.path
            last = _last_line(self.path)
            if last is None and (closed := segments(self.path)):
                tail = closed[-1]
                last = _last_line(tail)
            if last is not None:
                rec = _parse(last)
                if rec is None or rec.get("hash") != record_hash(rec) or canonical(rec) != last:
                    raise AuditError(
                        f"{tail} ends with a damaged record; run `ztgate audit verify {self.path}`, "
                        "keep the file as evidence, move it aside and restart"
                    )
                self.seq, self.head = int(rec["seq"]) + 1, str(rec["hash"])
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise AuditError(f"cannot open audit chain {self.path}: {exc.strerror}") from None
        return self._fd

    def _close_segment(self) -> None:
        """Sync and close the full live file, rename it to the next segment; the next open starts
        a new one. Synced first: a `sync` in flight for a record in it may find the file closed."""
        closed = segments(self.path)
        n = int(_SEGMENT.match(closed[-1].name)["n"]) + 1 if closed else 1  # type: ignore[index]
        try:
            with self._lock:
                if self._fd is not None:
                    os.fsync(self._fd)
                    os.close(self._fd)
                    self._fd = None
            os.rename(self.path, self.path.with_name(f"{self.path.stem}.seg{n:06d}.jsonl"))
        except OSError as exc:
            raise AuditError(f"cannot close audit segment {self.path}: {exc.strerror}") from None

    def append(self, record: dict[str, Any]) -> str:
        """Chain and write one record (one write call); returns its hash."""
        fd = self.open()
        if self.segment_bytes and self._size >= self.segment_bytes:
            self._close_segment()
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
        self._size += written
        return str(rec["hash"])

    def sync(self) -> None:
        """Flush what was written to disk (blocking: call it off the event loop, from a thread).

        Under the lock that closing a segment takes, so the file is not closed under it; if it
        was closed since the record was written, closing synced it.
        """
        try:
            with self._lock:
                if self._fd is not None:
                    os.fsync(self._fd)
        except OSError as exc:
            raise AuditError(f"cannot sync audit chain {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        """Close the file."""
        with self._lock:
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
    """What the verifier found in one chain (its segments and live file)."""

    path: Path
    records: int  # intact records, from the first (all of them when ok)
    head: str
    problem: str | None  # None: intact; else `[segment file ]line N: what is wrong`
    kept: tuple[dict[str, Any], ...] = ()  # the intact records themselves, if asked for
    starts_at: int = 0  # seq of the first record present (> 0 only for a pruned chain)
    files: int = 1  # segments read, and the live file if there is one

    @property
    def ok(self) -> bool:
        """The chain is intact."""
        return self.problem is None


def verify(
    path: Path, *, keep: bool = False, pruned_ok: bool = False, anchors: Mapping[int, str] | None = None
) -> Verified:
    """Check a chain line by line, its segments first, then its live file `path`; stops at the
    first problem. `keep`: also return the intact records (one read and parse serves checking and
    reading). `pruned_ok`: the chain may start after seq 0 (its oldest segments archived away);
    its first record is then taken on trust, and `starts_at` says where it starts. `anchors`:
    heads kept outside the chain (seq → hash, from the workers' `audit_head` log lines): each must
    be the hash of the chain's record of that seq, so records cut off its end show too."""
    anchors = anchors or {}
    closed = segments(path)
    files = [*closed, path] if path.exists() or not closed else closed
    prev, start = GENESIS, 0
    kept: list[dict[str, Any]] = []
    count = 0

    def result(problem: str | None, where: Path | None = None) -> Verified:
        if problem is not None and closed and where is not None:
            problem = f"{where.name} {problem}"
        return Verified(path, count, prev, problem, tuple(kept) if keep else (), start, len(files))

    for f in files:
        try:
            data = f.read_bytes()
        except OSError as exc:
            return result(f"cannot read: {exc.strerror}", f)
        *lines, torn = data.split(b"\n")
        for i, raw in enumerate(lines, start=1):
            try:
                line = raw.decode()
            except UnicodeDecodeError:
                return result(f"line {i}: not UTF-8", f)
            rec = _parse(line)
            if rec is None:
                return result(f"line {i}: not an audit record", f)
            if canonical(rec) != line:
                return result(f"line {i}: not in canonical form (edited)", f)
            if count == 0 and pruned_ok and isinstance(rec["seq"], int) and rec["seq"] > 0:
                start, prev = rec["seq"], rec["prev"]  # a pruned chain: its first record on trust
            if rec["seq"] != start + count:
                return result(
                    f"line {i}: seq {rec['seq']!r}, expected {start + count} (removed or reordered)", f
                )
            if rec["prev"] != prev:
                before = (
                    f"line {i - 1}'s hash"
                    if i > 1
                    else "the previous segment's last hash"
                    if count
                    else "the start of a chain (64 zeros)"
                )
                return result(f"line {i}: prev does not match {before}", f)
            if rec["hash"] != record_hash(rec):
                return result(f"line {i}: hash does not match its content (edited)", f)
            if anchors.get(rec["seq"], rec["hash"]) != rec["hash"]:
                return result(f"line {i}: seq {rec['seq']} is not the record anchored for it (rewritten)", f)
            prev = rec["hash"]
            count += 1
            if keep:
                kept.append(rec)
        if torn:
            return result(f"line {len(lines) + 1}: incomplete (no final newline)", f)
    beyond = [seq for seq in anchors if seq >= start + count]
    if beyond:
        return result(
            f"end: seq {max(beyond)} was anchored (head {anchors[max(beyond)][:12]}…) but the chain ends "
            f"before it, at seq {start + count - 1} (records cut off its end)"
        )
    return result(None)


def logged_heads(lines: Iterable[str]) -> dict[str, dict[int, str]]:
    """The heads workers logged (`audit_head` JSON log lines), by chain file name: seq → hash.

    Other lines are skipped; a head of an empty chain anchors nothing.
    """
    out: dict[str, dict[int, str]] = {}
    for line in lines:
        if '"audit_head"' not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("event") != "audit_head":
            continue
        records, head, where = doc.get("records"), doc.get("head"), doc.get("path")
        if isinstance(records, int) and records > 0 and isinstance(head, str) and isinstance(where, str):
            out.setdefault(Path(where).name, {})[records - 1] = head
    return out


def chain_files(target: Path) -> list[Path]:
    """The chains at `target`, each named by its live file: the chain a file belongs to, or every
    chain in a directory (a chain whose live file is not there yet is named by it all the same)."""
    if not target.is_dir():
        m = _SEGMENT.match(target.name)
        return [target.with_name(f"{m['chain']}.jsonl") if m else target]
    live = {p for p in target.glob("*.jsonl") if not _SEGMENT.match(p.name)}
    live |= {
        p.with_name(f"{m['chain']}.jsonl")
        for p in target.glob("*.seg*.jsonl")
        if (m := _SEGMENT.match(p.name))
    }
    return sorted(live)
