"""Structured JSON logs.

Logs carry request ids, decisions and timings, never prompt or answer text, and never exception
messages (which could quote input): only the exception type and where it happened.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

import structlog


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
