"""Tenant isolation in what the model server shares: the prefix-cache salt the route filter gives
every OpenAI call, and the namespace it gives Triton sequence ids."""

from __future__ import annotations

import json
import re

import pytest

from filters import _kserve, _openai
from filters._protocols import ProtocolError, compact_json
from filters.base import Continue, Principal, RequestContext
from filters.route import CacheScope, RegistryRoute
from gateway.registry import Registry

REG = """
upstreams:
  a: {protocol: openai, host: 127.0.0.1, port: 1000}
  t: {protocol: kserve_v2, host: 127.0.0.1, port: 2000}
models:
  m:
    latest: "1"
    versions: {"1": {upstream: a}, "2": {upstream: a, upstream_model: m-two}}
  echo:
    latest: "1"
    versions: {"1": {upstream: t}}
"""
KEY = b"k" * 32
ALICE = Principal("k1", "alice", "acme")
CAROL = Principal("k3", "carol", "acme")
BOB = Principal("k2", "bob", "globex")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _salt(
    scope: CacheScope, who: Principal | None, client: str | None = None, key: bytes = KEY
) -> str | None:
    return RegistryRoute(key, scope).cache_salt(who, client)


def test_a_tenant_shares_its_cache_and_no_other_tenant_does() -> None:
    salt = _salt("tenant", ALICE)
    assert salt is not None and re.fullmatch(r"[0-9a-f]{32}", salt)
    assert _salt("tenant", CAROL) == salt  # same tenant, another user
    assert _salt("tenant", BOB) != salt
    assert _salt("tenant", None) not in (salt, _salt("tenant", BOB), None)  # anonymous: a scope of its own
    assert _salt("tenant", ALICE, key=b"x" * 32) != salt  # keyed: another deployment, other salts


def test_user_scope_gives_each_user_a_cache_of_their_own() -> None:
    assert _salt("user", ALICE) != _salt("user", CAROL)
    assert _salt("user", ALICE) != _salt("tenant", ALICE)
    assert _salt("user", ALICE) == _salt("user", ALICE)


def test_a_client_salt_narrows_the_scope_and_never_widens_it() -> None:
    own = _salt("tenant", ALICE, "session-1")
    assert own not in (_salt("tenant", ALICE), _salt("tenant", ALICE, "session-2"), "session-1")
    # Another tenant sending the same salt still gets a cache apart.
    assert _salt("tenant", BOB, "session-1") != own
    # Shared: no salt unless the client asks for one, and then never the client's value.
    assert _salt("shared", ALICE) is None and _salt("shared", None) is None
    shared = _salt("shared", ALICE, "session-1")
    assert shared is not None and shared != "session-1" and shared == _salt("shared", BOB, "session-1")


async def _forwarded(doc: dict[str, object], who: Principal | None, raw: bytes | None = None) -> bytes | None:
    body = raw if raw is not None else json.dumps(doc).encode()
    ctx = RequestContext("rid", "POST", "/v1/chat/completions", {}, Registry.from_yaml(REG), principal=who)
    ctx.prompt = _openai.parse_request(_openai.CHAT, body)
    d = await RegistryRoute(KEY).on_request_body(ctx, body)
    assert isinstance(d, Continue) and d.reroute
    # What the upstream gets is what later filters start from.
    if d.body is not None:
        assert json.loads(d.body) == ctx.prompt.document
    return d.body


@pytest.mark.parametrize(
    ("doc", "raw"),
    [
        (CHAT, None),
        (CHAT, b'\n  {"model" : "m", "messages": [{"role": "user", "content": "hello"}]}  '),
        ({**CHAT, "model": "m@2"}, None),  # the model renamed too
        ({**CHAT, "cache_salt": "victims-salt"}, None),  # the client's own salt replaced
        ({**CHAT, "cache_salt": None}, None),  # a null one too, not left for a reader to take last
    ],
)
async def test_every_chat_reaches_the_upstream_with_the_tenant_salt(
    doc: dict[str, object], raw: bytes | None
) -> None:
    body = await _forwarded(doc, ALICE, raw)
    assert body is not None
    sent = json.loads(body)
    client = doc.get("cache_salt")
    assert sent["cache_salt"] == _salt("tenant", ALICE, client if isinstance(client, str) else None)
    assert sent["model"] == ("m-two" if doc["model"] == "m@2" else "m")
    assert {k: v for k, v in sent.items() if k not in ("cache_salt", "model")} == {
        k: v for k, v in doc.items() if k not in ("cache_salt", "model")
    }


async def test_the_salt_is_added_without_serializing_the_body_again() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"caf\\u00e9 \\" }"}]}'
    body = await _forwarded({}, ALICE, raw)
    assert body == b'{"cache_salt":"%s",' % str(_salt("tenant", ALICE)).encode() + raw[1:]
    assert body != compact_json(json.loads(body))  # the client's escapes are kept as sent


async def _kserve_call(
    op: str, doc: dict[str, object], who: Principal | None, binary: bytes = b""
) -> Continue:
    body = json.dumps(doc).encode()
    length = str(len(body)) if binary else None
    path = f"/v2/models/echo/{op}"
    ctx = RequestContext("rid", "POST", path, {}, Registry.from_yaml(REG), principal=who)
    ctx.prompt = _kserve.parse_request(_kserve.parse_path("POST", path), body + binary, length)
    d = await RegistryRoute(KEY).on_request_body(ctx, body + binary)
    assert isinstance(d, Continue) and d.reroute
    return d


TENSOR = {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]}


async def test_kserve_calls_without_a_sequence_go_as_sent() -> None:
    for params in ({}, {"parameters": {"sequence_id": 0}}, {"parameters": {"sequence_id": ""}}):
        d = await _kserve_call("infer", {"inputs": [TENSOR], **params}, ALICE)
        assert d.body is None  # no salt either: the protocol has no such field


def _sequence(d: Continue) -> object:
    assert d.body is not None
    return json.loads(d.body)["parameters"]["sequence_id"]


@pytest.mark.parametrize("seq", [7, "session-7"])
async def test_each_tenant_has_sequences_of_its_own(seq: int | str) -> None:
    doc: dict[str, object] = {"text_input": "hi", "parameters": {"sequence_id": seq, "sequence_start": True}}
    alice, carol, bob = [_sequence(await _kserve_call("generate", doc, who)) for who in (ALICE, CAROL, BOB)]
    assert alice == carol != bob  # one tenant's users share its sequences
    assert alice != seq and type(alice) is type(seq)
    if isinstance(alice, int):
        assert 0 < alice < 1 << 63
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", str(alice))
    other = _sequence(await _kserve_call("generate", {**doc, "parameters": {"sequence_id": 8}}, ALICE))
    assert other not in (alice, 8)


async def test_a_binary_infer_keeps_its_tensors_and_gets_its_new_header_length() -> None:
    raw = b"\x03\x00\x00\x00abc"
    tensor = {"name": "t", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    d = await _kserve_call("infer", {"inputs": [tensor], "parameters": {"sequence_id": 42}}, BOB, raw)
    assert d.body is not None and d.body.endswith(raw)
    length = dict(d.set_headers)[_kserve.HEADER_LENGTH]
    doc = json.loads(d.body[: int(length)])
    assert doc["inputs"] == [tensor] and doc["parameters"]["sequence_id"] == _sequence_of(BOB, 42)


def _sequence_of(who: Principal, seq: int | str) -> int | str:
    return RegistryRoute(KEY).sequence_id(who, seq)


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"priority": 1}, "unsupported_content"),  # a tenant's own would jump every queue
        ({"sequence_id": -1}, "invalid_request"),
        ({"sequence_id": 1 << 64}, "invalid_request"),
        ({"sequence_id": True}, "invalid_request"),
        ({"sequence_id": "a b"}, "invalid_request"),
    ],
)
def test_kserve_scheduling_parameters_a_client_may_not_set(params: dict[str, object], code: str) -> None:
    body = json.dumps({"text_input": "hi", "parameters": params}).encode()
    with pytest.raises(ProtocolError) as e:
        _kserve.parse_request(_kserve.parse_path("POST", "/v2/models/echo/generate"), body, None)
    assert (e.value.status, e.value.code.value) == (400, code)


@pytest.mark.parametrize("salt", ["", "a b", "x" * 129, "ünïcode", 7, ["a"]])
def test_a_salt_that_is_not_a_short_plain_string_is_refused(salt: object) -> None:
    with pytest.raises(ProtocolError) as e:
        _openai.parse_request(_openai.CHAT, json.dumps({**CHAT, "cache_salt": salt}).encode())
    assert e.value.status == 400 and "'cache_salt' must be" in e.value.message
