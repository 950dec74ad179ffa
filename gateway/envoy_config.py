"""Render envoy/envoy.yaml: fill ${NAME} placeholders and append the generated clusters.

With the file registry, every upstream's cluster is in the bootstrap. With the Consul registry,
upstreams come and go while Envoy runs: their clusters are in a CDS file next to the bootstrap
(`path_config_source`), rewritten by one atomic rename whenever the registry or a service's
passing instances change (`write_clusters`); Envoy picks each version up by itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from pathlib import Path
from typing import Any

import yaml

from gateway.registry import Registry, cluster_name
from gateway.settings import Settings

TEMPLATE = Path(__file__).resolve().parent.parent / "envoy" / "envoy.yaml"
EXTPROC_CLUSTER = "ztgate_extproc"
CDS_FILE = "clusters.json"
_CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def _endpoint(host: str, port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def _cluster(
    name: str, endpoints: list[tuple[str, int]], *, http2: bool, buffer_limit: int
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        "per_connection_buffer_limit_bytes": buffer_limit,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [_endpoint(h, p) for h, p in endpoints]}],
        },
    }
    if http2:
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
        # A dead worker is taken out of rotation (connect checks every second, and ejection after
        # consecutive failures) rather than failing every other request.
        c["health_checks"] = [
            {
                "timeout": "0.5s",
                "interval": "1s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "tcp_health_check": {},
                "no_traffic_interval": "1s",
            }
        ]
        c["outlier_detection"] = {
            "consecutive_gateway_failure": 3,
            "consecutive_local_origin_failure": 3,
            "split_external_local_origin_errors": True,
            "base_ejection_time": "2s",
            "max_ejection_percent": 50,
        }
    return c


# Envoy-generated replies, matched by status or by Envoy's response code details, → (the status
# the client gets, user-safe code, message). Anything else ≥ 400: gateway_error.
_LOCAL_REPLIES: tuple[tuple[int | None, str | None, int | None, str, str], ...] = (
    # A whole answer that outgrew the buffer it is checked in: the model server's fault, as when
    # the chain refuses one whose content-length says so (filters/protocol.py).
    (
        None,
        "response_payload_too_large",
        502,
        "answer_too_large",
        "the model server's answer is too large to check",
    ),
    (413, None, None, "body_too_large", "the request body is too large"),
    (503, None, None, "upstream_unavailable", "the model server is unavailable"),
    (504, None, None, "gateway_timeout", "the gateway timed out"),
    (None, None, None, "gateway_error", "the gateway could not complete the request"),
)


def _local_reply_mappers() -> list[dict[str, Any]]:
    mappers: list[dict[str, Any]] = []
    for status, details, new_status, code, message in _LOCAL_REPLIES:
        for kserve in (True, False):
            cond = ["!response.code_details.startsWith('ztgate_')"]
            if details:
                cond.append(f"response.code_details == '{details}'")
            cond.append(f"response.code == {status}" if status else "response.code >= 400")
            if kserve:
                cond.append("request.path.startsWith('/v2')")
                body: dict[str, Any] = {"error": f"{message} (request id %REQ(X-REQUEST-ID)%)", "code": code}
            else:
                body = {
                    "error": {
                        "message": f"{message} (request id %REQ(X-REQUEST-ID)%)",
                        "type": "gateway_error",
                        "param": None,
                        "code": code,
                    }
                }
            body["request_id"] = "%REQ(X-REQUEST-ID)%"
            mappers.append(
                {
                    "filter": {
                        "extension_filter": {
                            "name": "envoy.access_loggers.extension_filters.cel",
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                                "expression": " && ".join(cond),
                            },
                        }
                    },
                    "body_format_override": {"json_format": body},
                    **({"status_code": new_status} if new_status else {}),
                }
            )
    return mappers


def render(
    settings: Settings, registry: Registry, template: Path = TEMPLATE, cds: Path | None = None
) -> dict[str, Any]:
    """The complete Envoy bootstrap as a dict (upstream clusters from `cds` when it is given)."""
    values = {
        "ADMIN_ADDRESS": settings.admin_address,
        "ENVOY_ADMIN_PORT": settings.envoy_admin_port,
        "LISTEN_ADDRESS": settings.listen_address,
        "LISTEN_PORT": settings.listen_port,
        "BUFFER_LIMIT_BYTES": settings.buffer_limit_bytes,
        "UPSTREAM_TIMEOUT": _duration(settings.upstream_timeout_s),
        "EXTPROC_STREAM_TIMEOUT": _duration(max(settings.upstream_timeout_s, 1.0) + 60),
        "MESSAGE_TIMEOUT": _duration(settings.message_timeout_s),
        "PHASE_BUDGET": _duration(settings.phase_budget_s),
    }
    text = string.Template(template.read_text(encoding="utf-8")).substitute(values)
    doc: dict[str, Any] = yaml.safe_load(text)
    clusters = [
        _cluster(
            EXTPROC_CLUSTER,
            [(settings.worker_host, p) for p in settings.worker_ports],
            http2=True,
            buffer_limit=settings.buffer_limit_bytes * 2,
        )
    ]
    if cds is None:
        fixed = {n: [(u.host or "", u.port or 0)] for n, u in registry.spec.upstreams.items()}
        clusters += upstream_clusters(settings, fixed)
    else:
        doc["dynamic_resources"] = {
            "cds_config": {
                "resource_api_version": "V3",
                "path_config_source": {"path": str(cds), "watched_directory": {"path": str(cds.parent)}},
            }
        }
    doc["static_resources"]["clusters"] = clusters
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["local_reply_config"]["mappers"] = _local_reply_mappers()
    return doc


def upstream_clusters(
    settings: Settings, endpoints: dict[str, list[tuple[str, int]]]
) -> list[dict[str, Any]]:
    """One cluster per upstream, with its endpoints (none: Envoy answers 503, nothing is reached)."""
    return [
        _cluster(cluster_name(name), eps, http2=False, buffer_limit=settings.buffer_limit_bytes)
        for name, eps in sorted(endpoints.items())
    ]


def write(settings: Settings, registry: Registry, out: Path) -> Path:
    """Render to a file (JSON is valid YAML for Envoy); with the Consul registry, the CDS file beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cds = out.parent / CDS_FILE if settings.registry_source == "consul" else None
    out.write_text(json.dumps(render(settings, registry, cds=cds), indent=1), encoding="utf-8")
    if cds is not None and not cds.exists():
        write_clusters(cds, [])  # Envoy refuses to start on a CDS path that is not there
    return out


def write_clusters(cds: Path, clusters: list[dict[str, Any]]) -> str:
    """Publish the upstream clusters to Envoy: a whole new file, renamed into place. Returns its version."""
    body = [{"@type": _CLUSTER_TYPE, **c} for c in clusters]
    version = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    tmp = cds.with_name(f".{cds.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version_info": version, "resources": body}, indent=1), encoding="utf-8")
    os.replace(tmp, cds)  # Envoy reads only whole files: it watches for the rename
    return version
