"""Shared fixtures: log dumps on failure only."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

_ENVS: list[Any] = []


def remember(env: Any) -> Any:
    """Register a running environment so its logs are shown if a test fails."""
    _ENVS.append(env)
    return env


def forget(env: Any) -> None:
    """Stop showing an environment's logs."""
    if env in _ENVS:
        _ENVS.remove(env)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _ENVS:
        report.sections.append(("gateway logs", "\n".join(e.logs() for e in _ENVS)))
