"""Child processes started in dependency order, checked for readiness, stopped cleanly.

Used by `ztgate up` and by the test environments, so both start things the same way.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (tests: never fixed ports)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    """True if something accepts TCP connections there."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True if GET url answers 200. Anything else there, an answer that is no HTTP among them
    (another process's HTTP/2 server on a port taken before ours bound it), is not ready."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - our own loopback URLs
            return bool(r.status == 200)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return False


class StartError(RuntimeError):
    """A child did not become ready; the message includes the tail of its log."""


@dataclass
class Proc:
    """One child process with its log file."""

    name: str
    cmd: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> Proc:
        """Start it (its own process group, output to the log file)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = self.log_path.open("ab")
        try:
            self.popen = subprocess.Popen(
                list(self.cmd),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            logf.close()
        return self

    @property
    def alive(self) -> bool:
        """Still running."""
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The end of its log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        """Poll `check` until true; StartError if it exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise StartError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            if check():
                return
            time.sleep(0.05)
        raise StartError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, term_timeout: float = 15.0) -> None:
        """SIGTERM the group, then SIGKILL it if it has not exited in time."""
        p = self.popen
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(term_timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def stop_all(procs: Sequence[Proc], term_timeout: float = 15.0) -> None:
    """Stop in reverse start order."""
    for p in reversed(procs):
        p.stop(term_timeout)
