"""Through real Envoy chunking and real upstreams, the chain reads exactly what the client reads."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.procs import free_port
from tests.conftest import forget, remember
from tests.e2e.conftest import Sdk, demo_registry
from tests.harness import KEY, GatewayEnv, start_gateway


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayEnv, Path]]:
    tmp = Path(tmp_path_factory.mktemp("probe"))
    probe = tmp / "probe.jsonl"
    env = remember(
        start_gateway(
            tmp,
            demo_registry(free_port(), free_port()),
            workers=1,
            demo_upstreams=True,
            env={
                "ZTGATE_FILTERS": "principal,protocol,route,probe",
                "ZTGATE_FILTER_MODULES": "tests.dataplane.probe_filter",
                "ZTGATE_TEST_PROBE_FILE": str(probe),
            },
        )
    )
    yield env, probe
    forget(env)
    env.stop()


def _record(probe: Path, request_id: str) -> dict[str, Any]:
    for _ in range(50):
        for line in probe.read_text().splitlines() if probe.exists() else []:
            rec: dict[str, Any] = json.loads(line)
            if rec["request_id"] == request_id:
                return rec
        time.sleep(0.05)
    raise AssertionError(f"no probe record for {request_id}")


@pytest.mark.parametrize("n", [1, 3])
def test_streamed_chat_answer_is_reassembled_per_choice(
    probed: tuple[GatewayEnv, Path], n: int, sdk: Sdk
) -> None:
    env, probe = probed
    client = sdk(env)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-llama",
        max_tokens=12,
        temperature=1.0,
        seed=7,
        n=n,
        stream=True,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello 世界"}],
    )
    texts: dict[int, str] = {}
    for chunk in raw.parse():
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    rec = _record(probe, raw.headers["x-request-id"])
    assert rec["prompt"] == [["system", "be brief"], ["user", "Hello 世界"]]
    assert rec["answer"] == {str(i): t for i, t in texts.items() if t}
    assert rec["done"] is True
    assert set(rec["finish"].values()) == {"length"}


def test_triton_stream_and_infer_answers(probed: tuple[GatewayEnv, Path]) -> None:
    env, probe = probed
    auth = {"authorization": f"Bearer {KEY}"}
    r = httpx.post(
        env.url + "/v2/models/echo_stream/generate_stream", json={"text_input": "a b c"}, headers=auth
    )
    assert _record(probe, r.headers["x-request-id"])["answer"] == {"0": "stream v1: a b c"}
    body = {"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES", "data": ["x", "y"]}]}
    r = httpx.post(env.url + "/v2/models/echo@1/infer", json=body, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["echo v1: x", "echo v1: y"]
    rec = _record(probe, r.headers["x-request-id"])
    assert rec["prompt"] == [["input:text_input", "x"], ["input:text_input", "y"]]
    assert rec["answer"] == {"0": "echo v1: x\necho v1: y"}
