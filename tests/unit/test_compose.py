"""compose.yaml: valid by the Compose Specification's schema, and what the schema cannot see."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT.parent / "shared" / "schemas" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def test_valid_against_compose_spec(compose: dict[str, Any]) -> None:
    # The schema names draft-07 by a URL jsonschema does not recognise ("https", no "#"): say it.
    jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).validate(compose)


def test_required_services(compose: dict[str, Any]) -> None:
    assert {"envoy", "gateway", "redis", "consul", "triton", "vllm"} <= set(compose["services"])
    assert compose["services"]["vllm"]["profiles"] == ["gpu"]


def test_images_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc["image"]
        tag = image.rsplit(":", 1)[-1] if ":" in image.split("/")[-1] else ""
        assert re.match(r"^v?\d+\.\d+(\.\d+)?", tag) or "@sha256:" in image, f"{name}: {image} is not pinned"


def test_healthchecks_and_healthy_dependencies(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}"


def test_only_the_client_listener_is_published(compose: dict[str, Any]) -> None:
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == {"envoy": ["8080:8080"]}


def test_one_envoy_config_source(compose: dict[str, Any]) -> None:
    # Envoy runs under `ztgate up`, which renders its bootstrap as local runs do (and, with the
    # Consul registry, supervises the cluster feed beside it).
    envoy = compose["services"]["envoy"]
    assert envoy["command"] == ["up", "--no-demo", "--no-workers"]
    assert "entrypoint" not in envoy  # the image's: ztgate
    assert 'ENTRYPOINT ["ztgate"]' in (ROOT / "Dockerfile").read_text()
    assert not list(ROOT.glob("deploy/**/envoy*.y*ml"))


def test_registry_comes_from_consul_seeded_once(compose: dict[str, Any]) -> None:
    for name in ("envoy", "gateway"):
        env = compose["services"][name]["environment"]
        assert env["ZTGATE_REGISTRY_SOURCE"] == "consul"
        assert env["ZTGATE_CONSUL_URL"] == "http://consul:8500"
    gw = compose["services"]["gateway"]
    assert gw["depends_on"]["consul"] == {"condition": "service_healthy"}
    assert "ztgate registry push --if-absent /etc/ztgate/registry.yaml && exec ztgate up" in gw["command"][0]


def test_compose_registry_is_valid() -> None:
    from gateway.registry import Registry

    reg = Registry.load(ROOT / "deploy" / "registry.yaml")
    assert {u.host for u in reg.spec.upstreams.values()} <= set(
        yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    )


def test_gateway_reaches_redis_and_keeps_its_audit_chains(compose: dict[str, Any]) -> None:
    gw = compose["services"]["gateway"]
    env = gw["environment"]
    assert env["ZTGATE_REDIS_URL"].startswith("redis://redis:")
    assert env["ZTGATE_AUDIT_DIR"].startswith(env["ZTGATE_STATE_DIR"])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in gw["volumes"]}
    assert mounts[env["ZTGATE_STATE_DIR"]] in compose["volumes"]  # a named volume, not the image
    assert gw["hostname"]  # stable audit chain names across container restarts


def _seconds(duration: str) -> float:
    """A Compose duration such as `45s`, `1m30s` or `500ms`, in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_envoy_gets_time_to_drain_before_docker_kills_it(compose: dict[str, Any]) -> None:
    envoy = compose["services"]["envoy"]
    drain = float(envoy["environment"].get("ZTGATE_DRAIN_S", Settings().drain_s))
    assert _seconds(envoy["stop_grace_period"]) >= drain + 10
