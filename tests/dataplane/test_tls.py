"""TLS with real Envoy and certificates from throwaway CAs (trustme): the client listener, model
servers, the workers' link, and certificates rotated while the gateway runs."""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
import trustme

from gateway import metrics
from gateway.metrics import render_tls
from tests.harness import KEY, ScriptedUpstream, registry_for, running, tls_listener_files

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _registry(up: ScriptedUpstream) -> dict[str, object]:
    return registry_for(
        {"v": ("openai", up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )


def _client(ca: trustme.CA, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if cert is not None:
        cert.configure_cert(ctx)
    return ctx


def test_the_listener_terminates_tls(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    ca = trustme.CA()
    env_vars = tls_listener_files(tmp_path, ca)
    openai_up.requests.clear()
    with running(tmp_path / "gw", _registry(openai_up), workers=1, env=env_vars) as env:
        assert env.url.startswith("https://")
        auth = {"authorization": f"Bearer {KEY}"}
        with httpx.Client(verify=_client(ca), timeout=10) as c:
            r = c.post(env.url + "/v1/chat/completions", json=CHAT, headers=auth)
        assert r.status_code == 200, r.text
        # HTTP/2 is offered by ALPN next to HTTP/1.1.
        with socket.create_connection(("127.0.0.1", env.settings.listen_port), timeout=5) as raw:
            ctx = _client(ca)
            ctx.set_alpn_protocols(["h2", "http/1.1"])
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.selected_alpn_protocol() == "h2"
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
        # Plain HTTP on the TLS port gets no answer, and reaches nothing.
        with pytest.raises(httpx.TransportError):
            httpx.post(
                env.url.replace("https://", "http://") + "/v1/chat/completions", json=CHAT, headers=auth
            )
        # A client that does not trust the certificate does not connect.
        with pytest.raises(httpx.ConnectError):
            httpx.post(
                env.url + "/v1/chat/completions", json=CHAT, headers=auth, verify=_client(trustme.CA())
            )
    [got] = openai_up.requests
    assert got.headers["x-forwarded-proto"] == "https"


def test_a_client_ca_makes_every_client_show_a_certificate(
    tmp_path: Path, openai_up: ScriptedUpstream
) -> None:
    ca, client_ca, stranger_ca = trustme.CA(), trustme.CA(), trustme.CA()
    env_vars = tls_listener_files(tmp_path, ca)
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.crt"))
    env_vars["ZTGATE_TLS_CLIENT_CA_FILE"] = str(tmp_path / "clients.crt")
    openai_up.requests.clear()
    with running(tmp_path / "gw", _registry(openai_up), workers=1, env=env_vars) as env:
        url, auth = env.url + "/v1/chat/completions", {"authorization": f"Bearer {KEY}"}
        for who in (None, stranger_ca.issue_cert("mallory@example.com")):
            with pytest.raises(httpx.TransportError):
                httpx.post(url, json=CHAT, headers=auth, verify=_client(ca, who), timeout=10)
        r = httpx.post(
            url, json=CHAT, headers=auth, verify=_client(ca, client_ca.issue_cert("app@acme")), timeout=10
        )
        assert r.status_code == 200, r.text
        # The certificate admits the connection; the API key still names the caller.
        r = httpx.post(url, json=CHAT, verify=_client(ca, client_ca.issue_cert("app@acme")), timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    assert len(openai_up.requests) == 1


def _tls_upstream(ca: trustme.CA, name: str, client_ca: trustme.CA | None = None) -> ScriptedUpstream:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(ctx)
    if client_ca is not None:
        client_ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ScriptedUpstream("tls", tls=ctx).start()


def _tls_registry(ups: dict[str, tuple[ScriptedUpstream, dict[str, str]]]) -> dict[str, object]:
    reg = registry_for(
        {n: ("openai", up.port) for n, (up, _) in ups.items()},
        {n: {"latest": "1", "versions": {"1": {"upstream": n}}} for n in ups},
    )
    for n, (_, tls) in ups.items():
        reg["upstreams"][n]["tls"] = tls
    return reg


def test_tls_to_model_servers_verifies_who_answers(tmp_path: Path) -> None:
    """The gateway speaks TLS to an upstream that asks for it, checks the certificate's chain and
    name, and shows its own certificate when the upstream wants mutual TLS."""
    ca, gw_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    other_ca.cert_pem.write_to_path(str(tmp_path / "other.crt"))
    me = gw_ca.issue_cert("gateway.internal")
    me.private_key_pem.write_to_path(str(tmp_path / "gw.key"))
    (tmp_path / "gw.crt").write_bytes(b"".join(pem.bytes() for pem in me.cert_chain_pems))
    ca_file, mine = (
        str(tmp_path / "ca.crt"),
        {"cert_file": str(tmp_path / "gw.crt"), "key_file": str(tmp_path / "gw.key")},
    )
    ups = {
        "good": (_tls_upstream(ca, "localhost"), {"ca_file": ca_file, "server_name": "localhost"}),
        "by-ip": (_tls_upstream(ca, "127.0.0.1"), {"ca_file": ca_file}),  # the host is the name
        "mutual": (
            _tls_upstream(ca, "localhost", gw_ca),
            {"ca_file": ca_file, "server_name": "localhost", **mine},
        ),
        # Refused: a certificate for another name, one from another CA, a client certificate missing.
        "wrong-name": (_tls_upstream(ca, "vllm.internal"), {"ca_file": ca_file, "server_name": "localhost"}),
        "wrong-ca": (
            _tls_upstream(ca, "localhost"),
            {"ca_file": str(tmp_path / "other.crt"), "server_name": "localhost"},
        ),
        "no-client-cert": (
            _tls_upstream(ca, "localhost", gw_ca),
            {"ca_file": ca_file, "server_name": "localhost"},
        ),
    }
    try:
        with running(tmp_path / "gw", _tls_registry(ups), workers=1) as env:
            auth = {"authorization": f"Bearer {KEY}"}
            status = {
                n: httpx.post(env.url + "/v1/chat/completions", json={**CHAT, "model": n}, headers=auth)
                for n in ups
            }
        for n in ("good", "by-ip", "mutual"):
            assert status[n].status_code == 200, (n, status[n].text)
            assert len(ups[n][0].requests) == 1
        for n in ("wrong-name", "wrong-ca", "no-client-cert"):
            assert status[n].status_code == 503, (n, status[n].text)
            assert status[n].json()["error"]["code"] == "upstream_unavailable"
            assert ups[n][0].requests == []
    finally:
        for up, _ in ups.values():
            up.stop()


def _process_once(port: int, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode | bytes:
    """One empty ProcessingRequest straight to a worker: its first answer, or the call's status."""
    target = f"127.0.0.1:{port}"
    with grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target) as ch:
        call = ch.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            return bytes(next(iter(call(iter([b""]), timeout=5))))
        except grpc.RpcError as exc:
            return exc.code()


def test_envoy_and_the_workers_speak_mutual_tls(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    ca, stranger = trustme.CA(), trustme.CA()
    shared = ca.issue_cert("127.0.0.1")  # the name Envoy dials the workers by
    shared.private_key_pem.write_to_path(str(tmp_path / "x.key"))
    (tmp_path / "x.crt").write_bytes(b"".join(pem.bytes() for pem in shared.cert_chain_pems))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    env_vars = {
        "ZTGATE_EXTPROC_TLS_CERT_FILE": str(tmp_path / "x.crt"),
        "ZTGATE_EXTPROC_TLS_KEY_FILE": str(tmp_path / "x.key"),
        "ZTGATE_EXTPROC_TLS_CA_FILE": str(tmp_path / "ca.crt"),
    }
    openai_up.requests.clear()
    with running(tmp_path / "gw", _registry(openai_up), workers=1, env=env_vars) as env:
        r = httpx.post(
            env.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}
        )
        assert r.status_code == 200, r.text
        port = env.settings.worker_ports[0]
        trust = ca.cert_pem.bytes()
        key, chain = shared.private_key_pem.bytes(), b"".join(p.bytes() for p in shared.cert_chain_pems)
        other = stranger.issue_cert("127.0.0.1")
        # No TLS, TLS without a certificate, a certificate from another CA: no stream is opened.
        assert _process_once(port, None) == grpc.StatusCode.UNAVAILABLE
        assert _process_once(port, grpc.ssl_channel_credentials(trust)) == grpc.StatusCode.UNAVAILABLE
        stranger_creds = grpc.ssl_channel_credentials(
            trust, other.private_key_pem.bytes(), b"".join(p.bytes() for p in other.cert_chain_pems)
        )
        assert _process_once(port, stranger_creds) == grpc.StatusCode.UNAVAILABLE
        # With the shared certificate the worker answers (here: its refusal of an empty message).
        assert not isinstance(
            _process_once(port, grpc.ssl_channel_credentials(trust, key, chain)), grpc.StatusCode
        )
    assert len(openai_up.requests) == 1
    # Envoy checks the workers' name too: told to expect another, it opens no stream, forwards nothing.
    env_vars["ZTGATE_EXTPROC_TLS_NAME"] = "workers.internal"
    with running(tmp_path / "gw2", _registry(openai_up), workers=1, env=env_vars) as env:
        r = httpx.post(
            env.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}
        )
    assert r.status_code >= 500 and r.json()["request_id"] == r.headers["x-request-id"], r.text
    assert len(openai_up.requests) == 1


def _install(directory: Path, name: str, data: bytes) -> None:
    """Put a file in place as a rotation does: written beside it, then renamed over it."""
    tmp = directory / f".{name}.new"
    tmp.write_bytes(data)
    tmp.replace(directory / name)


def _tls_files(tmp: Path, files: dict[str, bytes], variables: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A directory holding `files` (put in place as a rotation would), and the variables naming them."""
    tls = tmp / "tls"
    tls.mkdir()
    for name, data in files.items():
        _install(tls, name, data)
    return tls, {var: str(tls / name) for var, name in variables.items()}


def _pems(cert: trustme.LeafCert) -> tuple[bytes, bytes]:
    return b"".join(p.bytes() for p in cert.cert_chain_pems), cert.private_key_pem.bytes()


def _served(port: int, ca: trustme.CA, client: trustme.LeafCert | None = None) -> bytes:
    """The certificate (DER) a new TLS connection to `port` is shown."""
    ctx = _client(ca, client)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(cert: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.1)


def test_the_listener_s_certificate_and_client_ca_rotate_without_a_restart(
    tmp_path: Path, openai_up: ScriptedUpstream
) -> None:
    ca, clients_1, clients_2 = trustme.CA(), trustme.CA(), trustme.CA()
    first, second = ca.issue_cert("127.0.0.1"), ca.issue_cert("127.0.0.1")
    tls, env_vars = _tls_files(
        tmp_path,
        {
            **dict(zip(("server.crt", "server.key"), _pems(first), strict=True)),
            "clients.crt": clients_1.cert_pem.bytes(),
        },
        {
            "ZTGATE_TLS_CERT_FILE": "server.crt",
            "ZTGATE_TLS_KEY_FILE": "server.key",
            "ZTGATE_TLS_CLIENT_CA_FILE": "clients.crt",
        },
    )
    old_app, new_app = clients_1.issue_cert("app@acme"), clients_2.issue_cert("app@acme")

    def chat(who: trustme.LeafCert) -> int:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json=CHAT,
            headers={"authorization": f"Bearer {KEY}"},
            verify=_client(ca, who),
            timeout=10,
        )
        return r.status_code

    def admitted(who: trustme.LeafCert) -> bool:
        try:
            return chat(who) == 200
        except httpx.TransportError:  # a client certificate the listener does not trust
            return False

    def refusals(secret: str) -> int:
        state = env.gw.tls_state()
        assert state is not None and state["days_until_first_cert_expiring"] > 300_000  # trustme: year 3000
        return int(state["rotations_refused"][secret])

    openai_up.requests.clear()
    with running(tmp_path / "gw", _registry(openai_up), workers=1, env=env_vars) as env:
        url, port = env.url, env.settings.listen_port
        assert _served(port, ca, old_app) == _der(first) and chat(old_app) == 200
        # A new certificate renamed into place (key first) while Envoy runs, then a new client CA.
        cert_pem, key_pem = _pems(second)
        _install(tls, "server.key", key_pem)
        _install(tls, "server.crt", cert_pem)
        _until(lambda: _served(port, ca, old_app) == _der(second))
        _install(tls, "clients.crt", clients_2.cert_pem.bytes())
        _until(lambda: admitted(new_app))
        assert not admitted(old_app)  # the old client CA is no longer trusted

        # A broken file is refused and the last good certificate kept; Envoy counts the refusal
        # (so does a key renamed before its certificate is, if Envoy reads the pair in between),
        # and /readyz and /metrics show it.
        before = refusals("listener-cert")
        _install(tls, "server.crt", b"-----BEGIN CERTIFICATE-----\nnot a certificate\n")
        _until(lambda: refusals("listener-cert") == before + 1)
        text = render_tls(env.gw.tls_state())
        assert f'ztgate_tls_rotations_refused_total{{secret="listener-cert"}} {before + 1.0}' in text
        assert 'ztgate_tls_rotations_refused_total{secret="listener-client-ca"} 0.0' in text
        assert _served(port, ca, new_app) == _der(second) and chat(new_app) == 200

        # The certificate and the client CA are one TLS context: a CA renamed while the
        # certificate is broken (or its pair incomplete) is refused and counted too, and comes
        # into force with the next good certificate that differs from the last good one.
        third_app = (clients_3 := trustme.CA()).issue_cert("app@acme")
        _install(tls, "clients.crt", clients_3.cert_pem.bytes())
        _until(lambda: refusals("listener-client-ca") == 1)
        assert admitted(new_app) and not admitted(third_app)
        third = ca.issue_cert("127.0.0.1")
        cert_pem, key_pem = _pems(third)
        _install(tls, "server.key", key_pem)
        _install(tls, "server.crt", cert_pem)
        _until(lambda: admitted(third_app))
        assert not admitted(new_app) and _served(port, ca, third_app) == _der(third)
    assert len(openai_up.requests) == 5


def test_the_workers_certificate_rotates_without_a_restart(
    tmp_path: Path, openai_up: ScriptedUpstream
) -> None:
    ca = trustme.CA()
    first, second, stray = (ca.issue_cert("127.0.0.1") for _ in range(3))
    tls, env_vars = _tls_files(
        tmp_path,
        {**dict(zip(("x.crt", "x.key"), _pems(first), strict=True)), "ca.crt": ca.cert_pem.bytes()},
        {
            f"ZTGATE_EXTPROC_TLS_{k}_FILE": n
            for k, n in (("CERT", "x.crt"), ("KEY", "x.key"), ("CA", "ca.crt"))
        },
    )
    auth = {"authorization": f"Bearer {KEY}"}
    openai_up.requests.clear()
    with running(tmp_path / "gw", _registry(openai_up), workers=1, env=env_vars) as env:
        port = env.settings.worker_ports[0]
        assert httpx.post(env.url + "/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
        assert _served(port, ca, first) == _der(first)
        cert_pem, key_pem = _pems(second)
        _install(tls, "x.key", key_pem)
        _install(tls, "x.crt", cert_pem)
        # The worker reads the files again at its next new connection; Envoy re-reads its copy.
        _until(lambda: _served(port, ca, second) == _der(second))
        assert httpx.post(env.url + "/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
        # A key that is not the certificate's is refused: the worker keeps showing the last good pair.
        _install(tls, "x.key", stray.private_key_pem.bytes())
        assert _served(port, ca, second) == _der(second)
        logs = env.logs(0)
        assert "extproc_tls_reloaded" in logs and "extproc_tls_not_reloaded" in logs

        def counted(outcome: str) -> float:
            # (a connection between the two renames above would count one refusal more)
            text = metrics.render(metrics.read_dir(env.gw.run_dir / "metrics"))
            found = re.search(rf'ztgate_extproc_tls_reloads_total{{outcome="{outcome}"}} (\S+)', text)
            return float(found.group(1)) if found else 0.0

        _until(lambda: counted("refused") >= 1)
        assert counted("reloaded") >= 1
    assert len(openai_up.requests) == 2


def test_a_model_server_s_ca_rotates_without_a_restart(tmp_path: Path) -> None:
    # The model server moved to a certificate from a new CA before the gateway trusts it: refused,
    # until the new CA is renamed into the registry's ca_file.
    old_ca, new_ca = trustme.CA(), trustme.CA()
    tls, _ = _tls_files(tmp_path, {"ca.crt": old_ca.cert_pem.bytes()}, {})
    up = _tls_upstream(new_ca, "localhost")
    reg = _tls_registry({"m": (up, {"ca_file": str(tls / "ca.crt"), "server_name": "localhost"})})
    try:
        with running(tmp_path / "gw", reg, workers=1) as env:

            def chat() -> int:
                r = httpx.post(
                    env.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}
                )
                return r.status_code

            assert chat() == 503 and up.requests == []
            _install(tls, "ca.crt", new_ca.cert_pem.bytes())
            _until(lambda: chat() == 200)
        assert len(up.requests) == 1
    finally:
        up.stop()
