"""Registry resolution, key store, chain folding, settings and Envoy config rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from filters.base import CONTINUE, BaseFilter, Continue, Decision, Deny, Phase, RequestContext
from filters.chain import BuildEnv, Chain, available, build
from filters.principal import ApiKeyPrincipal, KeyFileError, KeyStore, digest, new_key
from gateway import envoy_config
from gateway.registry import Protocol, Registry, RegistryError, parse_ref
from gateway.settings import Settings

REG = """
upstreams:
  a: {protocol: openai, host: 127.0.0.1, port: 1000}
  t: {protocol: kserve_v2, host: 127.0.0.1, port: 2000}
models:
  llama3-8b:
    latest: v2.4
    versions:
      v2.4: {upstream: a, hash: abc123ff}
      v2.3: {upstream: a, upstream_model: old}
  echo:
    latest: "2"
    versions: {"1": {upstream: t, upstream_version: "1"}, "2": {upstream: t, upstream_version: "2"}}
"""


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        ("llama3-8b@v2.4:abc123", ("llama3-8b", "v2.4", "abc123")),
        ("m", ("m", None, None)),
        ("m@1", ("m", "1", None)),
        ("m:ABCD", ("m", None, "abcd")),
    ],
)
def test_parse_ref(ref: str, parsed: tuple[str, str | None, str | None]) -> None:
    r = parse_ref(ref)
    assert r is not None and (r.name, r.version, r.hash) == parsed


@pytest.mark.parametrize("ref", ["", "@1", "m@", "m:xyz", "a b", "m@1@2", "../x"])
def test_parse_ref_rejects(ref: str) -> None:
    assert parse_ref(ref) is None


@pytest.mark.parametrize(
    ("ref", "proto", "expect"),
    [
        ("llama3-8b", Protocol.OPENAI, ("up_a", "v2.4", "llama3-8b")),
        ("llama3-8b@v2.3", Protocol.OPENAI, ("up_a", "v2.3", "old")),
        ("llama3-8b:abc1", Protocol.OPENAI, ("up_a", "v2.4", "llama3-8b")),
        ("llama3-8b@v2.3:abc1", Protocol.OPENAI, None),  # no hash registered for v2.3
        ("llama3-8b:dead", Protocol.OPENAI, None),
        ("llama3-8b", Protocol.KSERVE_V2, None),
        ("echo", Protocol.KSERVE_V2, ("up_t", "2", "echo")),
        ("ghost", Protocol.OPENAI, None),
    ],
)
def test_resolve(ref: str, proto: Protocol, expect: tuple[str, str, str] | None) -> None:
    reg = Registry.from_yaml(REG)
    pr = parse_ref(ref)
    assert pr is not None
    route = reg.resolve(pr, proto)
    assert (None if route is None else (route.cluster, route.version, route.upstream_model)) == expect


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["models"]["echo"].update(latest="9"), "latest version '9'"),
        (lambda d: d["models"]["echo"]["versions"]["1"].update(upstream="nope"), "unknown upstream 'nope'"),
        (lambda d: d["upstreams"]["a"].update(port=70000), "upstreams.a.port"),
        (lambda d: d["upstreams"]["a"].update(protocol="grpc"), "upstreams.a.protocol"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d.update(server_default={"kserve_v2": "a"}), "speaks openai"),
    ],
)
def test_invalid_registries(mutate: object, message: str) -> None:
    doc = yaml.safe_load(REG)
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(RegistryError, match=message):
        Registry.from_yaml(yaml.safe_dump(doc))


def test_registry_yaml_error_is_readable() -> None:
    with pytest.raises(RegistryError, match="not valid YAML"):
        Registry.from_yaml("a: [")


def _ctx(headers: dict[str, str]) -> RequestContext:
    return RequestContext("rid", "POST", "/v1/chat/completions", headers, Registry.from_yaml(REG))


async def test_principal_from_hashed_keys(tmp_path: Path) -> None:
    key = new_key()
    f = tmp_path / "keys.yaml"
    f.write_text(
        yaml.safe_dump(
            {"keys": [{"id": "k", "sha256": digest(key), "user": "u", "tenant": "t", "groups": ["g"]}]}
        )
    )
    filt = ApiKeyPrincipal(KeyStore.load(f))
    ctx = _ctx({"authorization": f"Bearer {key}"})
    d = await filt.on_request_headers(ctx)
    assert d == Continue(remove_headers=("authorization",))
    assert ctx.principal is not None and (ctx.principal.user, ctx.principal.tenant) == ("u", "t")
    denied = await filt.on_request_headers(_ctx({"authorization": f"Bearer {key}x"}))
    assert isinstance(denied, Deny) and denied.status == 401
    assert key not in f.read_text()


@pytest.mark.parametrize(
    "keys",
    [
        {"keys": [{"id": "k", "sha256": "ABC", "user": "u", "tenant": "t"}]},
        {"keys": [{"id": "k", "sha256": "a" * 64, "user": "u", "tenant": "t", "admin": True}]},
        {"keys": [{"id": "k", "sha256": "a" * 64, "user": "u", "tenant": "t"}] * 2},
    ],
)
def test_bad_key_files(tmp_path: Path, keys: object) -> None:
    f = tmp_path / "k.yaml"
    f.write_text(yaml.safe_dump(keys))
    with pytest.raises(KeyFileError):
        KeyStore.load(f)


async def test_expired_and_disabled_keys_are_refused_by_id(tmp_path: Path) -> None:
    import time

    live, old, off = new_key(), new_key(), new_key()
    f = tmp_path / "keys.yaml"
    f.write_text(
        "keys:\n"
        f"  - {{id: live, sha256: {digest(live)}, user: u, tenant: t, expires: 2999-01-01T00:00:00+08:00}}\n"
        f"  - {{id: old, sha256: {digest(old)}, user: u, tenant: t, expires: '2020-01-01T00:00:00Z'}}\n"
        f"  - {{id: k-off, sha256: {digest(off)}, user: u, tenant: t, disabled: true}}\n"
    )
    store = KeyStore.load(f)
    filt = ApiKeyPrincipal(store)
    assert isinstance(await filt.on_request_headers(_ctx({"authorization": f"Bearer {live}"})), Continue)
    for key, code, message in (
        (old, "expired_api_key", "the API key has expired"),
        (off, "disabled_api_key", "the API key is disabled"),
    ):
        ctx = _ctx({"authorization": f"Bearer {key}"})
        d = await filt.on_request_headers(ctx)
        assert isinstance(d, Deny) and (d.status, str(d.code), d.message) == (401, code, message)
        assert ctx.principal is None  # nothing downstream acts for a refused key
        [v] = ctx.verdicts
        assert v.detail == f"key={'old' if key == old else 'k-off'},{code.split('_')[0]}"
    # Expiry is read at each request: the same store refuses a key once its time has come.
    assert store.check(live, time.time())[1] is None
    assert store.check(live, store.expires[digest(live)])[1] == "expired"
    assert store.expiring(time.time(), 14 * 86400) == {
        "expired": ["old"],
        "expiring": [],
        "disabled": ["k-off"],
    }
    soon = store.expires[digest(live)] - 86400
    assert store.expiring(soon, 14 * 86400)["expiring"] == ["live"]


@pytest.mark.parametrize(
    ("expires", "message"),
    [
        ("2027-01-01", "write a time with its zone"),
        ("2027-01-01T00:00:00", "write the time zone too"),
        ("'next tuesday'", "not an ISO 8601 time"),
        ("1767225600", "write a time with its zone"),
    ],
)
def test_a_key_s_expiry_must_be_a_time_with_its_zone(tmp_path: Path, expires: str, message: str) -> None:
    f = tmp_path / "keys.yaml"
    f.write_text(f"keys:\n  - {{id: k, sha256: {'a' * 64}, user: u, tenant: t, expires: {expires}}}\n")
    with pytest.raises(KeyFileError) as e:
        KeyStore.load(f)
    assert message in str(e.value) and f"{f}:2:" in str(e.value), str(e.value)


class _Set(BaseFilter):
    name = "set"
    phases = Phase.REQUEST_HEADERS | Phase.REQUEST_BODY

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        return Continue(set_headers=(("x-a", "1"),))

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        return Continue(body=body.upper())


class _Deny(BaseFilter):
    name = "deny"
    phases = Phase.REQUEST_BODY

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        return Deny(403, "x", "no") if b"BAD" in body else CONTINUE


class _Never(BaseFilter):
    name = "never"
    phases = Phase.REQUEST_BODY

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        raise AssertionError("must not run after a deny")


async def test_chain_folds_in_order_and_stops_at_deny() -> None:
    chain = Chain([_Set(), _Deny(), _Never()])
    ctx = _ctx({})
    assert await chain.request_headers(ctx) == Continue(set_headers=(("x-a", "1"),))
    assert await chain.request_body(ctx, b"bad") == Deny(403, "x", "no")
    assert [(v.filter, v.action) for v in ctx.verdicts] == [
        ("set", "mutate"),
        ("set", "mutate"),
        ("deny", "deny"),
    ]


class _Reader(BaseFilter):
    name = "reader"
    phases = Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY
    needs: ClassVar[tuple[str, ...]] = ("protocol",)

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        assert ctx.answer is not None  # the protocol filter parsed it first
        return CONTINUE


async def test_answers_are_asked_for_only_when_a_filter_reads_them() -> None:
    env = BuildEnv(Settings())
    lean = build(["protocol"], env)
    # No filter reads answers: Envoy is asked for the request only (2 ext_proc messages).
    assert lean.phases == Phase.REQUEST_HEADERS | Phase.REQUEST_BODY
    ctx = _ctx({})
    ctx.response_headers = {"content-type": "application/json"}
    await lean.response_headers(ctx)
    assert ctx.verdicts == []  # no filter runs in a phase the chain did not ask for
    full = Chain([*lean.filters, _Reader()])
    assert (
        full.phases
        == Phase.REQUEST_HEADERS | Phase.REQUEST_BODY | Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY
    )
    ctx = _ctx({})
    assert await full.request_headers(ctx) is CONTINUE
    ctx.response_status, ctx.response_headers = 200, {"content-type": "application/json"}
    assert await full.response_headers(ctx) is CONTINUE
    body = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}'
    assert await full.response_chunk(ctx, body, True) is CONTINUE
    assert [(v.filter, v.phase) for v in ctx.verdicts[1:]] == [
        ("protocol", "response_headers"),
        ("reader", "response_headers"),
        ("protocol", "response_body"),
        ("reader", "response_body"),
    ]


def test_unknown_filter_is_an_error() -> None:
    assert {"principal", "protocol", "route", "static_route"} <= set(available())
    with pytest.raises(ValueError, match="unknown filter 'nope'"):
        build(["nope"], BuildEnv(Settings()))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ZTGATE_PHASE_BUDGET_S": "3", "ZTGATE_MESSAGE_TIMEOUT_S": "2"}, "message timeout"),
        ({"ZTGATE_LISTEN_PORT": "eighty"}, "integer"),
        ({"ZTGATE_MAX_REQUEST_BODY_BYTES": str(64 << 20)}, "buffer limit"),
        ({"ZTGATE_REGISTRY_SOURCE": "etcd"}, "must be file or consul"),
        ({"ZTGATE_CONSUL_URL": "consul:8500"}, "must be http"),
        ({"ZTGATE_CONSUL_KEY": "/ztgate/../registry?x"}, "plain KV path"),
        ({"ZTGATE_CONSUL_STALE_S": "0"}, "must be positive"),
        ({"ZTGATE_CONSUL_TOKEN_FILE": "/nonexistent/token"}, "names no file"),
        ({"ZTGATE_TLS_CERT_FILE": __file__}, "set both or neither"),
        ({"ZTGATE_TLS_KEY_FILE": __file__}, "set both or neither"),
        ({"ZTGATE_TLS_CLIENT_CA_FILE": __file__}, "needs the listener's TLS"),
        ({"ZTGATE_TRUSTED_PROXIES": "10.0.0.1/8"}, "not an address or a network"),
        ({"ZTGATE_TRUSTED_PROXIES": "lb.internal"}, "not an address or a network"),
        ({"ZTGATE_TRUSTED_PROXIES": "10.0.0.0/8, ::/0"}, "trusts every address"),
        ({"ZTGATE_DRAIN_S": "-1"}, "ZTGATE_DRAIN_S must be between"),
        ({"ZTGATE_DRAIN_S": "nan"}, "ZTGATE_DRAIN_S must be between"),
        ({"ZTGATE_DRAIN_S": "3601"}, "ZTGATE_DRAIN_S must be between"),
        ({"ZTGATE_DRAIN_S": "soon"}, "must be a number"),
        ({"ZTGATE_TLS_CERT_FILE": "/nonexistent.crt", "ZTGATE_TLS_KEY_FILE": __file__}, "names no file"),
        (
            {"ZTGATE_EXTPROC_TLS_CERT_FILE": __file__, "ZTGATE_EXTPROC_TLS_KEY_FILE": __file__},
            "all three or none",
        ),
        (
            {f"ZTGATE_EXTPROC_TLS_{k}_FILE": __file__ for k in ("CERT", "KEY")}
            | {"ZTGATE_EXTPROC_TLS_CA_FILE": "/no.pem"},
            "names no file",
        ),
    ],
)
def test_settings_refuse_unsafe_combinations(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)


def test_tls_is_rendered_only_when_asked(tmp_path: Path) -> None:
    reg = Registry.from_yaml(REG)
    plain = envoy_config.render(Settings(), reg)["static_resources"]["listeners"][0]["filter_chains"][0]
    assert "transport_socket" not in plain
    cert = Path(__file__)
    s = Settings(tls_cert_file=cert, tls_key_file=cert, tls_client_ca_file=cert)
    secrets = envoy_config.Secrets(tmp_path / "sds")
    chain = envoy_config.render(s, reg, secrets=secrets)["static_resources"]["listeners"][0]["filter_chains"][
        0
    ]
    tls = chain["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    common = tls["common_tls_context"]
    assert common["tls_params"]["tls_minimum_protocol_version"] == "TLSv1_2"
    # Certificates and CAs are SDS secrets in files of their own, watched for renames.
    ca_ref = common["validation_context_sds_secret_config"]
    assert ca_ref["sds_config"]["path_config_source"]["path"] == str(
        tmp_path / "sds" / "listener-client-ca.json"
    )
    assert secrets.secrets["listener-client-ca"]["validation_context"] == {
        "trusted_ca": {"filename": str(cert)},
        "watched_directory": {"path": str(cert.parent)},
    }
    assert [r["name"] for r in common["tls_certificate_sds_secret_configs"]] == ["listener-cert"]
    secrets.write()
    written = json.loads((tmp_path / "sds" / "listener-cert.json").read_text())
    [res] = written["resources"]
    assert res["@type"].endswith("tls.v3.Secret") and res["name"] == "listener-cert"
    assert res["tls_certificate"]["private_key"] == {"filename": str(cert)}
    before = (tmp_path / "sds" / "listener-cert.json").stat().st_mtime_ns
    secrets.write()  # unchanged: not rewritten (Envoy would re-read it)
    assert (tmp_path / "sds" / "listener-cert.json").stat().st_mtime_ns == before
    assert s.scheme == "https" and Settings().scheme == "http"
    # The workers' link: the ext_proc cluster speaks TLS (h2) and checks the name it dials.
    assert "transport_socket" not in envoy_config.render(Settings(), reg)["static_resources"]["clusters"][0]
    m = Settings(
        extproc_tls_cert_file=cert, extproc_tls_key_file=cert, extproc_tls_ca_file=cert, worker_host="gateway"
    )
    ext_secrets = envoy_config.Secrets(tmp_path / "sds")
    [ext] = [
        c
        for c in envoy_config.render(m, reg, secrets=ext_secrets)["static_resources"]["clusters"]
        if c["name"] == "ztgate_extproc"
    ]
    up = ext["transport_socket"]["typed_config"]
    assert up["sni"] == "gateway" and up["common_tls_context"]["alpn_protocols"] == ["h2"]
    validation = up["common_tls_context"]["combined_validation_context"]
    assert validation["default_validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "gateway"}}
    ]
    assert validation["validation_context_sds_secret_config"]["name"] == "extproc-ca"
    assert sorted(ext_secrets.secrets) == ["extproc-ca", "extproc-cert"]
    assert ext_secrets.secrets["extproc-cert"]["tls_certificate"]["certificate_chain"] == {
        "filename": str(cert)
    }


def test_envoy_config_is_fail_closed_and_lists_every_worker() -> None:
    s = Settings(worker_ports=(1, 2, 3))
    doc = envoy_config.render(s, Registry.from_yaml(REG))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext = hcm["http_filters"][0]["typed_config"]
    assert ext["failure_mode_allow"] is False
    assert float(ext["message_timeout"].rstrip("s")) > s.phase_budget_s
    assert ext["allow_mode_override"] is True
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    assert set(clusters) == {"ztgate_extproc", "up_a", "up_t"}
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in clusters["ztgate_extproc"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert ports == [1, 2, 3]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[-1]["direct_response"]["status"] == 403


def test_header_conversion_lowercases_and_joins_repeats() -> None:
    from envoy.config.core.v3 import base_pb2

    from gateway.extproc.convert import headers_to_dict

    def hm(pairs: list[tuple[str, bytes]]) -> object:
        return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in pairs])

    assert headers_to_dict(hm([(":path", b"/x"), ("a", b"1")])) == {":path": "/x", "a": "1"}
    assert headers_to_dict(hm([("X-1", b"1"), ("a", b"2"), ("a", b"3")])) == {"x-1": "1", "a": "2, 3"}
    assert headers_to_dict(hm([("x-ztgate-upstream", b"\xff")])) == {"x-ztgate-upstream": "\ufffd"}


def test_code_details_read_from_envoys_attributes() -> None:
    from google.protobuf import struct_pb2

    from gateway.extproc import convert as cv

    def req(**fields: object) -> object:
        s = struct_pb2.Struct()
        s.update(fields)
        return cv.ProcessingRequest(attributes={"envoy.filters.http.ext_proc": s})

    assert cv.code_details(req(**{"response.code_details": "via_upstream"})) == cv.VIA_UPSTREAM
    assert cv.code_details(req(**{"response.code_details": "no_healthy_upstream"})) == "no_healthy_upstream"
    # Not asked for, or not a string: unknown, so the outcome stays what the chain decided.
    assert cv.code_details(cv.ProcessingRequest()) is None
    assert cv.code_details(req(**{"response.code_details": 3})) is None
    assert cv.code_details(req(other="x")) is None
    # The bootstrap asks Envoy for it with every answer's headers.
    ext = envoy_config.render(Settings(worker_ports=(1,)), Registry.from_yaml(REG))
    hcm = ext["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["http_filters"][0]["typed_config"]["response_attributes"] == [cv.CODE_DETAILS]


def test_envoys_own_replies_have_a_code_each_and_the_catch_all_comes_last() -> None:
    doc = envoy_config.render(Settings(worker_ports=(1,)), Registry.from_yaml(REG))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    mappers = hcm["local_reply_config"]["mappers"]

    def code(m: dict[str, Any]) -> str:
        body = m["body_format_override"]["json_format"]
        return str(body["code"] if isinstance(body["error"], str) else body["error"]["code"])

    def message(m: dict[str, Any]) -> str:
        body = m["body_format_override"]["json_format"]
        return str(body["error"] if isinstance(body["error"], str) else body["error"]["message"])

    def expr(m: dict[str, Any]) -> str:
        return str(m["filter"]["extension_filter"]["typed_config"]["expression"])

    codes = [code(m) for m in mappers]
    # One KServe-shaped and one OpenAI-shaped mapper per reply, the KServe one first (it is narrower).
    assert codes[::2] == codes[1::2]
    assert all("request.path.startsWith('/v2')" in expr(m) for m in mappers[::2])
    assert not any("/v2" in expr(m) for m in mappers[1::2])
    assert codes[-1] == "gateway_error" and codes.count("gateway_error") == 2
    assert "code_details" not in expr(mappers[-1]).replace("!response.code_details.startsWith('ztgate_')", "")
    # The chain's own denials already carry their JSON: no mapper rewrites them.
    assert all(expr(m).startswith("!response.code_details.startsWith('ztgate_') && ") for m in mappers)
    # Refusals while Envoy still reads the request say there is no id; the others name it.
    early = {
        "invalid_path",
        "malformed_request",
        "unknown_path",
        "headers_too_large",
        "http_version_unsupported",
    }
    for m in mappers:
        body = m["body_format_override"]["json_format"]
        assert body["request_id"] == "%REQ(X-REQUEST-ID)%"
        if code(m) in early:
            assert message(m).endswith("(refused before a request id was assigned)")
            assert "%" not in message(m)
        else:
            assert message(m).endswith("(request id %REQ(X-REQUEST-ID)%)")
            assert message(m).count("%") == 2
    by_code = {code(m): expr(m) for m in mappers[1::2]}
    assert "response.code_details.startsWith('http1.')" in by_code["malformed_request"]
    assert "response.code_details == 'missing_host_header'" in by_code["malformed_request"]
    assert "response.code == 431" in by_code["headers_too_large"]
    assert "response.code_details == 'low_version'" in by_code["http_version_unsupported"]
    assert "response.code_details == 'absolute_path_rejected'" in by_code["unknown_path"]
    assert "response.code_details == 'upgrade_failed'" in by_code["upgrade_not_supported"]
    assert mappers[codes.index("answer_too_large")]["status_code"] == 502


def test_tls_files_that_do_not_load_refuse_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Envoy would start on them and reset every connection: `ztgate up` refuses before anything runs.
    import trustme

    from gateway import supervisor

    ca = trustme.CA()
    one, two = ca.issue_cert("127.0.0.1"), ca.issue_cert("127.0.0.1")
    (tmp_path / "c.crt").write_bytes(one.cert_chain_pems[0].bytes())
    (tmp_path / "k.key").write_bytes(one.private_key_pem.bytes())
    (tmp_path / "other.key").write_bytes(two.private_key_pem.bytes())
    (tmp_path / "bad.pem").write_text("-----BEGIN CERTIFICATE-----\nnot one\n")
    reg = Registry.from_yaml(REG)
    good = Settings(tls_cert_file=tmp_path / "c.crt", tls_key_file=tmp_path / "k.key")
    assert envoy_config.tls_problems(good, reg) == []
    mismatched = Settings(tls_cert_file=tmp_path / "c.crt", tls_key_file=tmp_path / "other.key")
    [p] = envoy_config.tls_problems(mismatched, reg)
    assert str(p).startswith(
        f"{tmp_path / 'c.crt'}:1:1: listener-cert: the certificate and its key do not load together ("
    )
    broken_ca = Settings(
        tls_cert_file=tmp_path / "c.crt",
        tls_key_file=tmp_path / "k.key",
        tls_client_ca_file=tmp_path / "bad.pem",
    )
    [p] = envoy_config.tls_problems(broken_ca, reg)
    assert (
        p.source == str(tmp_path / "bad.pem")
        and "listener-client-ca: the CA certificates do not load" in p.what
    )
    # The workers alone (Envoy in its own container) read only their own files.
    assert envoy_config.tls_problems(mismatched, reg, envoy=False) == []
    workers = Settings(
        extproc_tls_cert_file=tmp_path / "c.crt",
        extproc_tls_key_file=tmp_path / "other.key",
        extproc_tls_ca_file=tmp_path / "c.crt",
    )
    [p] = envoy_config.tls_problems(workers, reg, envoy=False)
    assert p.what.startswith("extproc-cert: the certificate and its key do not load together")
    assert supervisor.up(mismatched, demo=False) == 2
    err = capsys.readouterr().err
    assert "cannot start, configuration has problems" in err and "do not load together" in err
