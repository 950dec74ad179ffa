"""Prefix-cache isolation: the `cache_salt` the route filter gives every OpenAI call."""

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


async def test_kserve_calls_are_left_unsalted() -> None:
    body = json.dumps({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}).encode()
    ctx = RequestContext("rid", "POST", "/v2/models/echo/infer", {}, Registry.from_yaml(REG), principal=ALICE)
    ctx.prompt = _kserve.parse_request(_kserve.parse_path("POST", "/v2/models/echo/infer"), body, None)
    d = await RegistryRoute(KEY).on_request_body(ctx, body)
    assert isinstance(d, Continue) and d.body is None


@pytest.mark.parametrize("salt", ["", "a b", "x" * 129, "ünïcode", 7, ["a"]])
def test_a_salt_that_is_not_a_short_plain_string_is_refused(salt: object) -> None:
    with pytest.raises(ProtocolError) as e:
        _openai.parse_request(_openai.CHAT, json.dumps({**CHAT, "cache_salt": salt}).encode())
    assert e.value.status == 400 and "'cache_salt' must be" in e.value.message
