"""Readiness checks of child processes (gateway.procs)."""

from __future__ import annotations

import socket
import threading

from gateway.procs import http_ok


def test_a_port_that_answers_no_http_is_not_ready() -> None:
    """A port picked as free can be taken by another process's HTTP/2 server before Envoy binds
    it: its answer (binary frames) is no HTTP status line, which reads as not ready, not a crash."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x04\x00\x3f\xff\xff\r\n")

        t = threading.Thread(target=answer)
        t.start()
        assert http_ok(f"http://127.0.0.1:{port}/ready") is False
        t.join(5)
