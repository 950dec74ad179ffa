"""Fail closed on bad input: a clear 4xx in the protocol's own error shape, the upstream never reached."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import KEY, GatewayEnv, ScriptedUpstream

CHAT_PATH = "/v1/chat/completions"
OK_MSGS = [{"role": "user", "content": "hi"}]


def _openai_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code
    rid = r.headers["x-request-id"]
    assert rid and rid in err["message"] and r.json()["request_id"] == rid


def _kserve_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    doc = r.json()
    assert isinstance(doc["error"], str) and doc["code"] == code
    assert r.headers["x-request-id"] in doc["error"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b'{"model": "llama3-8b", "messages": [', "invalid_json"),  # truncated
        (b"", "invalid_json"),
        (b"\xff\xfe{}", "invalid_encoding"),
        (
            '{"model": "llama3-8b", "messages": [{"role": "user", "content": "caf\xe9"}]}'.encode("latin-1"),
            "invalid_encoding",
        ),
        (b'{"model": "llama3-8b", "messages": [{"role": "user", "content": "\\ud800"}]}', "invalid_encoding"),
        (b'{"model": "llama3-8b", "model": "other", "messages": []}', "invalid_json"),
        (b'{"model": "llama3-8b", "messages": [{"role": "user", "content": NaN}]}', "invalid_json"),
        (b"[]", "invalid_request"),
        (json.dumps({"model": 5, "messages": OK_MSGS}).encode(), "invalid_request"),
        (json.dumps({"model": "llama3-8b", "messages": "hi"}).encode(), "invalid_request"),
        (json.dumps({"model": "llama3-8b", "messages": []}).encode(), "invalid_request"),
        (
            json.dumps({"model": "llama3-8b", "messages": [{"role": "root", "content": "x"}]}).encode(),
            "invalid_request",
        ),
        (
            json.dumps({"model": "llama3-8b", "messages": [{"role": "user", "content": 7}]}).encode(),
            "invalid_request",
        ),
        (
            json.dumps({"model": "llama3-8b", "stream": "yes", "messages": OK_MSGS}).encode(),
            "invalid_request",
        ),
        (
            json.dumps(
                {
                    "model": "llama3-8b",
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                        }
                    ],
                }
            ).encode(),
            "unsupported_content",
        ),
    ],
)
def test_bad_openai_bodies(client: httpx.Client, openai_up: ScriptedUpstream, body: bytes, code: str) -> None:
    _openai_error(
        client.post(CHAT_PATH, content=body, headers={"content-type": "application/json"}), 400, code
    )
    assert openai_up.requests == []


def test_completion_token_prompts_are_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    _openai_error(
        client.post("/v1/completions", json={"model": "llama3-8b", "prompt": [1, 2, 3]}),
        400,
        "invalid_request",
    )
    # Prompt embeddings beside a checked prompt: vLLM would run them as a prompt of their own.
    smuggled = {"model": "llama3-8b", "prompt": "hi", "prompt_embeds": "UEsDBAAAAAA="}
    _openai_error(client.post("/v1/completions", json=smuggled), 400, "unsupported_content")
    assert openai_up.requests == []


def test_engine_controls_from_a_client_are_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    # Where a decode engine fetches KV blocks from (an address of the client's choosing), and a
    # scheduling priority above every other tenant's: only the operator's own routers set these.
    steer = {"kv_transfer_params": {"remote_host": "169.254.169.254", "remote_port": 80}, "priority": -9}
    for field, value in steer.items():
        body = {"model": "llama3-8b", "messages": [{"role": "user", "content": "hi"}], field: value}
        r = client.post(CHAT_PATH, json=body)
        _openai_error(r, 400, "unsupported_content")
        assert field in r.json()["error"]["message"]
    assert openai_up.requests == []


def test_ten_megabyte_body_is_refused_before_reading(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    big = json.dumps({"model": "llama3-8b", "messages": [{"role": "user", "content": "a" * (10 << 20)}]})
    _openai_error(client.post(CHAT_PATH, content=big), 413, "body_too_large")
    assert openai_up.requests == []


def test_ten_megabyte_chunked_body_without_length_is_refused(
    client: httpx.Client, openai_up: ScriptedUpstream
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "llama3-8b", "messages": [{"role": "user", "content": "'
        for _ in range(160):
            yield b"a" * 65536
        yield b'"}]}'

    # Envoy may refuse as soon as its buffer overflows, while the client is still uploading: the
    # client then sees its upload cut off instead of the 413. Either way nothing reaches upstream.
    try:
        r = client.post(CHAT_PATH, content=chunks())
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        r = None
    if r is not None:
        _openai_error(r, 413, "body_too_large")
    assert openai_up.requests == []


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("POST", "/v1/embeddings", 404, "unknown_path"),
        ("GET", "/admin", 404, "unknown_path"),
        ("GET", "/", 404, "unknown_path"),
        ("GET", CHAT_PATH, 405, "method_not_allowed"),
        ("DELETE", "/v1/models", 405, "method_not_allowed"),
    ],
)
def test_unknown_paths_and_methods(
    client: httpx.Client, openai_up: ScriptedUpstream, method: str, path: str, status: int, code: str
) -> None:
    _openai_error(client.request(method, path), status, code)
    assert openai_up.requests == []


def test_a_body_on_a_bodyless_call_is_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    _openai_error(client.request("GET", "/v1/models", content=b"smuggled"), 400, "invalid_request")


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v2/models/echo/infer", b"{bad", 400, "invalid_json"),
        (
            "/v2/models/echo/infer",
            json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode(),
            400,
            "unsupported_content",
        ),
        ("/v2/models/echo/infer", json.dumps({"inputs": []}).encode(), 400, "invalid_request"),
        (
            "/v2/models/echo/infer",
            json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "data": [5]}]}).encode(),
            400,
            "invalid_request",
        ),
        (
            "/v2/models/echo/generate",
            json.dumps({"text_input": {"nested": 1}}).encode(),
            400,
            "invalid_request",
        ),
        (
            "/v2/models/echo/generate",
            json.dumps({"text_input": "x", "parameters": {"p": ["hidden text"]}}).encode(),
            400,
            "invalid_request",
        ),
        (
            "/v2/models/echo/infer",
            json.dumps(
                {
                    "inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["hi"]}],
                    "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out"}}],
                }
            ).encode(),
            400,
            "unsupported_content",
        ),
        ("/v2/models/ghost/generate", json.dumps({"text_input": "x"}).encode(), 404, "model_not_found"),
        ("/v2/models/echo@7/generate", json.dumps({"text_input": "x"}).encode(), 404, "model_not_found"),
        ("/v2/models/echo@1/versions/1/infer", b"{}", 400, "invalid_request"),
        ("/v2/repository/index", b"{}", 403, "forbidden_path"),
        ("/v2/models/echo/stats", b"", 404, "unknown_path"),
    ],
)
def test_bad_kserve_requests(
    client: httpx.Client, kserve_up: ScriptedUpstream, path: str, body: bytes, status: int, code: str
) -> None:
    _kserve_error(client.post(path, content=body), status, code)
    assert kserve_up.requests == []


def test_binary_tensor_sizes_must_match(client: httpx.Client, kserve_up: ScriptedUpstream) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text_input",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 50},
                }
            ]
        }
    ).encode()
    body = header + (5).to_bytes(4, "little") + b"hello"
    r = client.post(
        "/v2/models/echo/infer", content=body, headers={"inference-header-content-length": str(len(header))}
    )
    _kserve_error(r, 400, "invalid_request")
    assert kserve_up.requests == []


@pytest.mark.parametrize(
    ("auth", "code"),
    [
        (None, "missing_api_key"),
        ("Bearer nope", "invalid_api_key"),
        ("Basic dXNlcjpwdw==", "invalid_api_key"),
        ("Bearer", "invalid_api_key"),
        ("bearer  ztg-test-key-0001x", "invalid_api_key"),
    ],
)
def test_no_anonymous_traffic(
    client: httpx.Client,
    openai_up: ScriptedUpstream,
    kserve_up: ScriptedUpstream,
    auth: str | None,
    code: str,
) -> None:
    headers = {"authorization": auth} if auth is not None else {}
    with httpx.Client(base_url=str(client.base_url), headers=headers) as anon:
        _openai_error(anon.post(CHAT_PATH, json={"model": "llama3-8b", "messages": OK_MSGS}), 401, code)
        _kserve_error(anon.get("/v2/health/ready"), 401, code)
    assert openai_up.requests == [] and kserve_up.requests == []


def test_compressed_request_body_is_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    import gzip

    body = gzip.compress(json.dumps({"model": "llama3-8b", "messages": OK_MSGS}).encode())
    r = client.post(
        CHAT_PATH, content=body, headers={"content-encoding": "gzip", "content-type": "application/json"}
    )
    _openai_error(r, 415, "unsupported_content")
    assert openai_up.requests == []


def _raw_exchange(url: str, request: bytes) -> tuple[int, dict[str, Any]]:
    """Send bytes no HTTP client would send; the status and the JSON body of Envoy's reply."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request)
        data = b""
        # Read the reply whole: Envoy closes the connection after most of these refusals, not all.
        while (b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data)) and (
            chunk := s.recv(65536)
        ):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _length(reply: bytes) -> int:
    """The content-length of a reply whose head has arrived."""
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


_AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "details", "kserve"),
    [
        (
            b"POST /v1%2Fchat/completions HTTP/1.1\r\nHost: a\r\n" + _AUTH + b"Content-Length: 2\r\n\r\n{}",
            400,
            "invalid_path",
            "path_normalization_failed",
            False,
        ),
        (
            b"GET /v2%5Cmodels HTTP/1.1\r\nHost: a\r\n" + _AUTH + b"\r\n",
            400,
            "invalid_path",
            "path_normalization_failed",
            True,
        ),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
            + _AUTH
            + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            "malformed_request",
            "http1.content_length_and_chunked_not_allowed",
            False,
        ),
        (
            b"GET /v1/models HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n",
            400,
            "malformed_request",
            "http1.",
            False,
        ),
        (
            b"GET /v1/models HTTP/1.1\r\n" + _AUTH + b"\r\n",
            400,
            "malformed_request",
            "missing_host_header",
            False,
        ),
        (b"\x16\x03\x01 not http\r\n\r\n", 400, "malformed_request", "http1.codec_error", False),
        (
            b"GET /v1/models HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n",
            431,
            "headers_too_large",
            "http1.headers_too_large",
            False,
        ),
        (
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n" + _AUTH + b"\r\n",
            404,
            "unknown_path",
            "absolute_path_rejected",
            False,
        ),
        (
            b"GET /v1/models HTTP/1.0\r\nHost: a\r\n" + _AUTH + b"\r\n",
            426,
            "http_version_unsupported",
            "low_version",
            False,
        ),
    ],
    ids=[
        "escaped-slash",
        "backslash-kserve",
        "length-and-chunked",
        "bad-header-name",
        "no-host",
        "not-http",
        "huge-headers",
        "options-star",
        "http-1.0",
    ],
)
def test_requests_envoy_refuses_before_a_request_id(
    gateway: GatewayEnv,
    client: httpx.Client,
    openai_up: ScriptedUpstream,
    kserve_up: ScriptedUpstream,
    request_bytes: bytes,
    status: int,
    code: str,
    details: str,
    kserve: bool,
) -> None:
    logged = f'"details":"{details}'
    before = gateway.logs(0).count(logged)
    got, doc = _raw_exchange(gateway.url, request_bytes)
    assert got == status, doc
    # Refused while Envoy read the request: no id to give, and the reply says so rather than name
    # an id no log holds. The access log has Envoy's details for the operator.
    assert doc["request_id"] is None
    if kserve:
        assert doc["code"] == code and doc["error"].endswith("(refused before a request id was assigned)")
    else:
        err = doc["error"]
        assert err["code"] == code and err["message"].endswith("(refused before a request id was assigned)")
    deadline = time.monotonic() + 5  # Envoy flushes its access log every second
    while gateway.logs(0).count(logged) == before:
        assert time.monotonic() < deadline, "the access log has no record of the refusal"
        time.sleep(0.1)
    assert openai_up.requests == [] and kserve_up.requests == []


def test_a_protocol_upgrade_is_refused(client: httpx.Client, openai_up: ScriptedUpstream) -> None:
    """A WebSocket would carry text past the chain, frame by frame: Envoy accepts no upgrade."""
    headers = {"connection": "Upgrade", "upgrade": "websocket", "sec-websocket-version": "13"}
    headers["sec-websocket-key"] = "dGhlIHNhbXBsZSBub25jZQ=="
    _openai_error(client.get("/v1/models", headers=headers), 403, "upgrade_not_supported")
    assert openai_up.requests == []
