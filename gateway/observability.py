"""Metrics (Prometheus, shared across worker processes) and structured JSON logs.

Logs carry request ids, decisions and timings, never prompt or answer text, and never exception
messages (which could quote input): only the exception type and where it happened.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

import structlog

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def setup_logging(level: str = "info") -> None:
    """JSON lines on stderr."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def log() -> Any:
    """The process logger."""
    return structlog.get_logger("ztgate")


def where(exc: BaseException) -> str:
    """`file:line in function` of the innermost frame: enough to find a bug, no values."""
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return "?"
    f = tb[-1]
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"


class Metrics:
    """The gateway's Prometheus metrics. Import-time of prometheus_client decides multiprocess mode."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.filter_seconds = Histogram(
            "ztgate_filter_seconds", "Time spent in one filter hook", ["filter", "phase"], buckets=_BUCKETS
        )
        self.decisions = Counter(
            "ztgate_filter_decisions_total", "Filter decisions by action", ["filter", "phase", "action"]
        )
        self.phase_seconds = Histogram(
            "ztgate_phase_seconds", "Time the whole chain took for one phase", ["phase"], buckets=_BUCKETS
        )
        self.requests = Counter("ztgate_requests_total", "Requests by final outcome", ["outcome"])
        self.failures = Counter("ztgate_chain_failures_total", "Chain errors and timeouts (denied)", ["kind"])
        # labels() costs ~8 µs per call; the label sets are few and fixed, so keep the children.
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def record(self, filter_name: str, phase: str, action: str, seconds: float) -> None:
        """Chain recorder callback: latency always; decisions that stop a request (deny/respond)."""
        self._child(self.filter_seconds, filter_name, phase).observe(seconds)
        if action in ("deny", "respond"):
            self._child(self.decisions, filter_name, phase, action).inc()

    def phase(self, phase: str, seconds: float) -> None:
        """One whole phase of the chain took this long."""
        self._child(self.phase_seconds, phase).observe(seconds)

    def outcome(self, outcome: str) -> None:
        """A request ended with this outcome."""
        self._child(self.requests, outcome).inc()
