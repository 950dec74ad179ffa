"""Compile policy text in a test and read its problems (no files, no gateway)."""

from __future__ import annotations

import pytest

from filters.chain import BuildEnv
from gateway import policy
from gateway.config_yaml import ConfigError


def compile_text(text: str, env: BuildEnv) -> policy.CompiledPolicy:
    """`text` compiled as the policy file `p.yaml`."""
    return policy.compile_policy(text, "p.yaml", env)


def problems(text: str, env: BuildEnv) -> list[str]:
    """The problems that refuse `text` (the test fails if it compiles)."""
    with pytest.raises(ConfigError) as info:
        compile_text(text, env)
    return [str(p) for p in info.value.problems]


def assert_refused_where(text: str, env: BuildEnv, message: str) -> None:
    """`text` is refused with `message` among its problems, each located in the file."""
    errors = problems(text, env)
    assert any(message in e for e in errors), errors
    assert all(e.startswith("p.yaml:") for e in errors), errors
