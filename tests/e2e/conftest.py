"""E2E tier: real Triton and real llama.cpp behind real Envoy and the real chain, with real clients."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.procs import free_port
from tests.conftest import forget, remember
from tests.harness import KEY, GatewayEnv, registry_for, start_gateway

pytestmark = pytest.mark.e2e

Sdk = Callable[..., openai.OpenAI]


def demo_registry(triton_port: int, llama_port: int) -> dict[str, Any]:
    return registry_for(
        {"triton-demo": ("kserve_v2", triton_port), "llama-demo": ("openai", llama_port)},
        {
            "tiny-llama": {
                "latest": "v1",
                "versions": {"v1": {"upstream": "llama-demo", "upstream_model": "tiny-llama"}},
            },
            "echo": {
                "latest": "2",
                "versions": {
                    "1": {"upstream": "triton-demo", "upstream_version": "1"},
                    "2": {"upstream": "triton-demo", "upstream_version": "2"},
                },
            },
            "echo_stream": {
                "latest": "1",
                "versions": {"1": {"upstream": "triton-demo", "upstream_version": "1"}},
            },
        },
        {"kserve_v2": "triton-demo"},
    )


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayEnv]:
    env = remember(
        start_gateway(
            Path(tmp_path_factory.mktemp("e2e")), demo_registry(free_port(), free_port()), demo_upstreams=True
        )
    )
    yield env
    forget(env)
    env.stop()


@pytest.fixture(autouse=True)
def _leaks_show_in_their_own_test() -> Iterator[None]:
    """Collect cycles after each e2e test, so a client socket left open fails the test that left it.

    Without this the ResourceWarning surfaced wherever the garbage collector next ran, failing an
    unrelated unit test at random (tritonclient's clients hold reference cycles).
    """
    yield
    gc.collect()


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    """`sdk(env, key=KEY, **options)`: an `openai` client for a gateway, closed when the test ends.

    A client left open keeps its pooled sockets until the collector finds it, and the
    ResourceWarning then fails the test above, or not, as the timing falls (seen: the quota test's
    client, after a 429 had the server close one connection).
    """
    made: list[openai.OpenAI] = []

    def make(env: GatewayEnv, key: str = KEY, **options: Any) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=f"{env.url}/v1", api_key=key, max_retries=0, **options))
        return made[-1]

    yield make
    for client in made:
        client.close()
