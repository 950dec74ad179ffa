"""tritonclient (HTTP, binary tensors by default) and generate/generate_stream against real Triton."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.harness import KEY, GatewayEnv

# tritonclient adds its own headers to the dict it is given: pass a copy each time.
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def tc(real: GatewayEnv) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(real.url.removeprefix("http://")) as client:
        yield client


def _infer(
    tc: triton_http.InferenceServerClient, text: str, model: str, version: str = "", binary: bool = True
) -> str:
    inp = triton_http.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=np.object_), binary_data=binary)
    out = triton_http.InferRequestedOutput("text_output", binary_data=binary)
    res = tc.infer(model, [inp], model_version=version, outputs=[out], headers=dict(AUTH))
    value = res.as_numpy("text_output")[0]
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize("binary", [True, False])
def test_infer_latest_and_pinned_versions(tc: triton_http.InferenceServerClient, binary: bool) -> None:
    assert _infer(tc, "hello 世界", "echo", binary=binary) == "echo v2: hello 世界"
    assert _infer(tc, "hello", "echo", version="1", binary=binary) == "echo v1: hello"
    assert _infer(tc, "hello", "echo@1", binary=binary) == "echo v1: hello"


def test_health_and_metadata(tc: triton_http.InferenceServerClient) -> None:
    assert tc.is_server_live(headers=dict(AUTH))
    assert tc.is_server_ready(headers=dict(AUTH))
    assert tc.is_model_ready("echo", "1", headers=dict(AUTH))
    meta = tc.get_model_metadata("echo", headers=dict(AUTH))
    assert meta["name"] == "echo" and "2" in meta["versions"]


def test_tritonclient_without_key_is_refused(tc: triton_http.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="API key"):
        tc.get_model_metadata("echo")


def test_generate_routes_by_version(real: GatewayEnv) -> None:
    r1 = httpx.post(real.url + "/v2/models/echo@1/generate", json={"text_input": "hi"}, headers=dict(AUTH))
    r2 = httpx.post(real.url + "/v2/models/echo/generate", json={"text_input": "hi"}, headers=dict(AUTH))
    assert (r1.json()["text_output"], r2.json()["text_output"]) == ("echo v1: hi", "echo v2: hi")


def test_generate_stream(real: GatewayEnv) -> None:
    events = []
    with httpx.stream(
        "POST",
        real.url + "/v2/models/echo_stream/generate_stream",
        json={"text_input": "one two three"},
        headers=AUTH,
        timeout=30,
    ) as r:
        assert r.status_code == 200
        events += [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert "".join(e["text_output"] for e in events) == "stream v1: one two three"


def test_triton_errors_keep_kserve_shape(real: GatewayEnv) -> None:
    r = httpx.post(real.url + "/v2/models/echo/infer", content=b"{oops", headers=dict(AUTH))
    assert r.status_code == 400
    assert isinstance(r.json()["error"], str)
