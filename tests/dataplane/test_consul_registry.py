"""The Consul registry source end to end: real Envoy, real workers and cluster feed, the Consul double.

Routing follows the KV document and the passing instances of a service as they change; a
broken document changes nothing; Consul going away fails closed after the staleness bound
(or, if the policy says so, routes on the last good snapshot, flagged); no document, no start.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway import cluster_feed
from gateway.procs import StartError, free_port, http_ok
from tests.consul_double import ConsulDouble
from tests.harness import KEY, GatewayEnv, ScriptedUpstream, registry_for, running, spawn_up

KV_KEY = "ztgate/registry"
AUTH = {"authorization": f"Bearer {KEY}"}
POLICY = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: audit
fail_mode: {{consul: {mode}}}
"""


@pytest.fixture
def consul() -> Iterator[ConsulDouble]:
    d = ConsulDouble().start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def up_a() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream("a").start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def up_b() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream("b").start()
    yield up
    up.stop()


def document(a_port: int, latest: str = "v1") -> dict[str, Any]:
    """v1 on a fixed address, v2 on whatever instances of the Consul service `b-svc` pass."""
    return {
        "upstreams": {
            "a": {"protocol": "openai", "host": "127.0.0.1", "port": a_port},
            "b": {"protocol": "openai", "service": "b-svc"},
        },
        "models": {
            "m": {
                "latest": latest,
                "versions": {
                    "v1": {"upstream": "a", "hash": "aaa111"},
                    "v2": {"upstream": "b", "hash": "bbb222"},
                },
            }
        },
    }


def gateway(tmp: Path, consul: ConsulDouble, mode: str = "deny", stale_s: float = 1.0) -> Any:
    tmp.mkdir(parents=True, exist_ok=True)
    pol = tmp / "policy.yaml"
    pol.write_text(POLICY.format(mode=mode))
    env = {
        "ZTGATE_REGISTRY_SOURCE": "consul",
        "ZTGATE_CONSUL_URL": consul.url,
        "ZTGATE_CONSUL_KEY": KV_KEY,
        "ZTGATE_CONSUL_STALE_S": str(stale_s),
        "ZTGATE_POLICY_FILE": str(pol),
        "ZTGATE_AUDIT_KEY_FILE": str(tmp / "audit.key"),
    }
    # The file registry is not read in this mode; the harness still wants one.
    return running(tmp / "gw", registry_for({}, {}), workers=2, env=env)


def chat(env: GatewayEnv, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    return httpx.post(env.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=10)


def until(check: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.1)


def served_by(env: GatewayEnv, model: str, ups: list[ScriptedUpstream]) -> str | None:
    """Which upstream got this request (None: refused by the gateway or Envoy)."""
    before = [len(u.requests) for u in ups]
    r = chat(env, model)
    got = [u.name for u, n in zip(ups, before, strict=True) if len(u.requests) > n]
    assert len(got) <= 1
    if r.status_code != 200:
        assert got == [], f"{r.status_code} but the request reached {got}"
        return None
    return got[0]


def test_routing_follows_the_kv_document_and_service_health(
    tmp_path: Path, consul: ConsulDouble, up_a: ScriptedUpstream, up_b: ScriptedUpstream
) -> None:
    consul.put(KV_KEY, yaml.safe_dump(document(up_a.port)).encode())
    consul.register("b-svc", "b-1", "127.0.0.1", up_b.port)
    ups = [up_a, up_b]
    with gateway(tmp_path, consul) as env:
        assert served_by(env, "m", ups) == "a"
        until(lambda: served_by(env, "m@v2", ups) == "b", what="v2 served by b-svc's instance")

        # The instance fails its health check: Envoy's cluster loses it, nothing reaches it.
        consul.set_status("b-1", "critical")
        until(lambda: chat(env, "m@v2").status_code == 503, what="v2 refused once b-1 is critical")
        r = chat(env, "m@v2")
        assert r.json()["error"]["code"] == "upstream_unavailable"
        assert served_by(env, "m@v2", ups) is None
        consul.set_status("b-1", "passing")
        until(lambda: served_by(env, "m@v2", ups) == "b", what="v2 back once b-1 passes")

        # An operator moves `latest` to v2 with the CLI: `m` follows within a round trip.
        good = tmp_path / "v2.yaml"
        good.write_text(yaml.safe_dump(document(up_a.port, latest="v2")))
        done = env.cli("registry", "push", str(good))
        assert done.returncode == 0, done.stderr
        until(lambda: served_by(env, "m", ups) == "b", what="latest moved to v2")
        rec = env.audit_for(chat(env, "m").headers["x-request-id"])
        assert rec["model"]["ref"] == "m@v2" and rec["model"]["upstream"] == "up_b"
        revision = rec["model"]["registry"]

        # The CLI refuses a broken document before it reaches Consul...
        bad = tmp_path / "bad.yaml"
        bad.write_text("upstreams: {a: {protocol: openai, service: b-svc, port: 1}}\nmodels: {}\n")
        refused = env.cli("registry", "push", str(bad))
        assert refused.returncode == 1 and "needs either host and port, or service" in refused.stderr
        # ...and one written around it changes nothing: the last good document stays in force.
        consul.put(KV_KEY, b"models: [broken\n")
        until(lambda: len(env.audit("registry_refused")) >= 2, what="both workers refused the document")
        assert served_by(env, "m", ups) == "b"
        assert env.audit_for(chat(env, "m").headers["x-request-id"])["model"]["registry"] == revision
        loaded = {r["revision"] for r in env.audit("registry_loaded")}
        assert revision in loaded
        # The cluster feed (what /readyz reads) says the same: healthy, the kept revision, the error.
        status = cluster_feed.read_status(env.gw.run_dir / "clusters.json")
        assert status["healthy"] is True and status["revision"] == revision, (status, loaded)
        assert str(status["error"]).startswith("consul:ztgate/registry:2:1: not valid YAML"), status


def test_consul_outage_fails_closed_and_policy_may_route_on_last_good(
    tmp_path: Path, consul: ConsulDouble, up_a: ScriptedUpstream, up_b: ScriptedUpstream
) -> None:
    consul.put(KV_KEY, yaml.safe_dump(document(up_a.port)).encode())
    ups = [up_a, up_b]
    with gateway(tmp_path, consul, mode="deny", stale_s=1.0) as env:
        assert served_by(env, "m", ups) == "a"
        consul.outage()
        until(lambda: chat(env, "m").status_code == 503, what="denied once Consul is stale")
        r = chat(env, "m")
        err = r.json()["error"]
        assert err["code"] == "registry_unavailable"
        assert r.headers["x-request-id"] in err["message"]
        assert served_by(env, "m", ups) is None
        rec = env.audit_for(r.headers["x-request-id"])
        assert rec["decision"]["fail_modes"] == [{"dependency": "consul", "mode": "deny", "why": "stale"}]

        # The security team chooses availability for this outage: last good snapshot, flagged.
        (tmp_path / "policy.yaml").write_text(POLICY.format(mode="allow_with_flag"))
        # Each worker reloads on its own: wait for both before asserting on any request.
        until(
            lambda: sum(rec["path"].endswith("policy.yaml") for rec in env.audit("file_loaded")) >= 2,
            what="both workers reloaded the policy",
        )
        until(lambda: chat(env, "m").status_code == 200, what="routed on the last good registry")
        r = chat(env, "m")
        assert r.status_code == 200 and up_a.requests[-1].path == "/v1/chat/completions"
        rec = env.audit_for(r.headers["x-request-id"])
        assert rec["decision"]["fail_modes"] == [
            {"dependency": "consul", "mode": "allow_with_flag", "why": "stale"}
        ]

        consul.restore()
        until(
            lambda: env.audit_for(chat(env, "m").headers["x-request-id"])["decision"]["fail_modes"] == [],
            timeout=15,
            what="Consul answers again",
        )


def test_no_valid_registry_in_consul_refuses_to_start(tmp_path: Path, consul: ConsulDouble) -> None:
    consul.put(KV_KEY, b"upstreams: {}\nmodels: {m: {latest: v9, versions: {}}}\n")
    started = time.monotonic()
    with (
        pytest.raises(StartError, match="no valid registry in consul:ztgate/registry") as err,
        gateway(tmp_path, consul),
    ):
        pass
    assert "latest version 'v9' is not among the versions" in str(err.value)
    assert time.monotonic() - started < 25


def test_ztgate_up_readiness_follows_consul(
    tmp_path: Path, consul: ConsulDouble, up_a: ScriptedUpstream
) -> None:
    consul.put(KV_KEY, yaml.safe_dump(document(up_a.port)).encode())
    ports = {k: free_port() for k in ("LISTEN", "ADMIN", "ENVOY_ADMIN")}
    env = {
        **os.environ,
        "ZTGATE_REGISTRY_SOURCE": "consul",
        "ZTGATE_CONSUL_URL": consul.url,
        "ZTGATE_CONSUL_STALE_S": "1",
        "ZTGATE_STATE_DIR": str(tmp_path / "state"),
        "ZTGATE_WORKER_PORTS": f"{free_port()},{free_port()}",
        "ZTGATE_FILTERS": "principal,protocol,route",
        **{f"ZTGATE_{k}_PORT": str(v) for k, v in ports.items()},
    }
    out = tmp_path / "up.out"
    proc = spawn_up(env, out, "--no-demo")

    def ready() -> tuple[int, dict[str, Any]]:
        r = httpx.get(f"http://127.0.0.1:{ports['ADMIN']}/readyz", timeout=5)
        return r.status_code, r.json()

    try:
        until(
            lambda: proc.poll() is None and http_ok(f"http://127.0.0.1:{ports['ADMIN']}/readyz"),
            60,
            out.read_text(),
        )
        status, doc = ready()
        assert status == 200 and doc["checks"]["registry"] is True
        assert doc["files"]["registry"]["source"] == "consul:ztgate/registry"
        consul.outage()
        until(lambda: ready()[0] == 503, what="not ready once Consul is stale")
        status, doc = ready()
        assert status == 503 and doc["checks"] == {**doc["checks"], "registry": False, "envoy": True}
        assert "ClientConnectorError" in doc["files"]["registry"]["error"]
        consul.restore()
        until(lambda: ready()[0] == 200, what="ready again once Consul answers")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0, out.read_text()


def test_tls_upstreams_from_consul_verify_the_model_server(tmp_path: Path, consul: ConsulDouble) -> None:
    """With the registry in Consul, the cluster feed writes the upstreams' TLS secrets beside
    the clusters that name them: a model server found through Consul is verified as one in the
    file registry is (its chain and the name the document gives)."""
    import ssl

    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("vllm.internal").configure_cert(ctx)
    good = ScriptedUpstream("tls-good", tls=ctx).start()
    wrong = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("other.internal").configure_cert(wrong)
    imposter = ScriptedUpstream("tls-imposter", tls=wrong).start()
    tls = {"ca_file": str(tmp_path / "ca.crt"), "server_name": "vllm.internal"}
    (tmp_path / "broken.crt").write_text("-----BEGIN CERTIFICATE-----\nnot one\n")
    doc = {
        "upstreams": {
            "good": {"protocol": "openai", "service": "vllm", "tls": dict(tls)},
            "imposter": {"protocol": "openai", "service": "vllm-2", "tls": dict(tls)},
            # A CA file that does not load: the feed says so; Envoy refuses it, nothing is reached.
            "broken": {
                "protocol": "openai",
                "service": "vllm",
                "tls": {**tls, "ca_file": str(tmp_path / "broken.crt")},
            },
        },
        "models": {
            "m": {"latest": "1", "versions": {"1": {"upstream": "good"}}},
            "x": {"latest": "1", "versions": {"1": {"upstream": "imposter"}}},
            "b": {"latest": "1", "versions": {"1": {"upstream": "broken"}}},
        },
    }
    consul.put(KV_KEY, yaml.safe_dump(doc).encode())
    consul.register("vllm", "vllm-1", "127.0.0.1", good.port)
    consul.register("vllm-2", "vllm-2-1", "127.0.0.1", imposter.port)
    try:
        with gateway(tmp_path / "g", consul) as env:
            until(lambda: chat(env, "m").status_code == 200, what="the TLS upstream from Consul answers")
            r = chat(env, "x")  # a certificate for another name: refused, nothing received
            assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable", r.text
            assert imposter.requests == [] and len(good.requests) >= 1
            before = len(good.requests)
            r = chat(env, "b")
            assert r.status_code == 503 and len(good.requests) == before, r.text
            assert "upstream_tls_files_do_not_load" in env.logs(0) and "upstream-broken-ca" in env.logs(0)
            assert {p.name for p in (env.gw.run_dir / "sds").glob("*.json")} == {
                "upstream-good-ca.json",
                "upstream-imposter-ca.json",
                "upstream-broken-ca.json",
            }
    finally:
        good.stop()
        imposter.stop()
