"""Dataplane tier: real Envoy + real ext_proc workers + scripted upstreams that record what arrived."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import forget, remember
from tests.harness import KEY, GatewayEnv, ScriptedUpstream, chat_answer, registry_for, start_gateway

pytestmark = pytest.mark.dataplane


@pytest.fixture(scope="module")
def openai_up() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream("openai").start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def chat_up() -> Iterator[ScriptedUpstream]:
    """An OpenAI upstream whose every chat completion says "ok"."""
    up = ScriptedUpstream("openai").start()
    up.handler = lambda _r: chat_answer("ok")
    yield up
    up.stop()


@pytest.fixture(scope="module")
def kserve_up() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream("kserve").start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream
) -> Iterator[GatewayEnv]:
    reg = registry_for(
        {"vllm": ("openai", openai_up.port), "triton": ("kserve_v2", kserve_up.port)},
        {
            "llama3-8b": {
                "latest": "v2.4",
                "versions": {
                    "v2.3": {"upstream": "vllm", "upstream_model": "llama3-8b-v23", "hash": "abc999"},
                    "v2.4": {"upstream": "vllm", "upstream_model": "meta/llama3-8b", "hash": "abc123def"},
                },
            },
            "echo": {
                "latest": "2",
                "versions": {
                    "1": {"upstream": "triton", "upstream_version": "1"},
                    "2": {"upstream": "triton", "upstream_version": "2"},
                },
            },
        },
        {"kserve_v2": "triton"},
    )
    env = remember(start_gateway(Path(tmp_path_factory.mktemp("gw")), reg))
    yield env
    forget(env)
    env.stop()


@pytest.fixture
def client(
    gateway: GatewayEnv, openai_up: ScriptedUpstream, kserve_up: ScriptedUpstream
) -> Iterator[httpx.Client]:
    openai_up.requests.clear()
    kserve_up.requests.clear()
    openai_up.handler = None
    kserve_up.handler = None
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30) as c:
        yield c
