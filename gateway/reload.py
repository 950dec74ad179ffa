"""Files that hot-reload with last-good semantics.

A `Reloadable` holds the current parsed value of a file. `check()` (called about once a second)
re-reads the file only when its modification time or size changed, parses it, and swaps the value
by one reference assignment, so each request sees one whole version. A file that fails to parse
changes nothing: the last good value stays in force and the error is kept for the admin endpoint.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from gateway.config_yaml import ConfigError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Status:
    """What the admin endpoint shows for one file."""

    path: str
    revision: str
    loaded_at: float
    last_error: str | None
    last_error_at: float | None


class Reloadable(Generic[T]):
    """The current value of a file, replaced atomically when the file changes and parses."""

    def __init__(self, path: Path, parse: Callable[[Path], T]) -> None:
        self.path = path
        self._parse = parse
        self.current: T = parse(path)  # start-up: a broken file is an error, never a default
        self.revision = _digest(path)
        self.loaded_at = time.time()
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self._stamp = file_stamp(path)

    def check(self) -> bool:
        """Reload if the file changed; True if a new value is now in force."""
        commit = self.prepare()
        if commit is None:
            return False
        commit()
        return True

    def prepare(self) -> Callable[[], None] | None:
        """Re-read and parse a changed file (safe in a thread); what puts it in force, or None.

        The swap is left to the caller, so a watcher on an event loop makes it there, together
        with whatever must happen before any request sees the new value (its audit record).
        """
        stamp = file_stamp(self.path)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        revision = _digest(self.path)
        if revision == self.revision:
            return None
        try:
            value = self._parse(self.path)
        except ConfigError as exc:
            self.last_error, self.last_error_at = str(exc), time.time()
            return None
        except OSError as exc:
            self.last_error, self.last_error_at = (
                f"{self.path}: cannot read the file: {exc.strerror}",
                time.time(),
            )
            return None

        def commit() -> None:
            self.current, self.revision, self.loaded_at = value, revision, time.time()
            self.last_error = self.last_error_at = None

        return commit

    def status(self) -> Status:
        """Revision in force and the last error, if the latest edit was refused."""
        return Status(str(self.path), self.revision, self.loaded_at, self.last_error, self.last_error_at)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a file changed without reading it: inode (a rename or a symlink swap, even of a
    file with the same time and size), modification time, size; None if it cannot be seen."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError:
        return "unreadable"


async def watch(
    files: list[Reloadable[Any]],
    on_change: Callable[[Reloadable[Any]], None],
    on_refused: Callable[[Reloadable[Any]], None],
    interval_s: float = 0.5,
) -> None:
    """Poll the files until cancelled (a stat per file per interval)."""
    while True:
        await asyncio.sleep(interval_s)
        for f in files:
            seen = f.last_error_at
            commit = await asyncio.to_thread(f.prepare)
            if commit is not None:
                # On the loop, with no await between: no request sees the new value before
                # on_change has recorded it.
                commit()
                on_change(f)
            elif f.last_error_at != seen:
                on_refused(f)
