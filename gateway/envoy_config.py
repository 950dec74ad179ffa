"""Render envoy/envoy.yaml: fill ${NAME} placeholders and append the generated clusters.

With the file registry, every upstream's cluster is in the bootstrap. With the Consul registry,
upstreams come and go while Envoy runs: their clusters are in a CDS file next to the bootstrap
(`path_config_source`), rewritten by one atomic rename whenever the registry or a service's
passing instances change (`write_clusters`); Envoy picks each version up by itself.

Certificates, keys and CAs reach Envoy as SDS secrets in files of their own (`sds/NAME.json`
beside the bootstrap), each naming the PEM files and the directory that holds them: Envoy
re-reads a secret when a file is renamed into that directory, so certificates rotate without a
restart (a pair that does not match, or a file that does not parse, is refused and the last good
one kept: Envoy counts it in `sds.NAME.key_rotation_failed`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import ssl
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config_yaml import ConfigError, Problem
from gateway.registry import Registry, UpstreamTLS, cluster_name
from gateway.settings import Settings

TEMPLATE = Path(__file__).resolve().parent.parent / "envoy" / "envoy.yaml"
EXTPROC_CLUSTER = "ztgate_extproc"
CDS_FILE = "clusters.json"
SDS_DIR = "sds"
_CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
_SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"  # noqa: S105 - a type URL


@dataclass
class Secrets:
    """The SDS secrets a rendered config refers to, collected as they are referred to, then written."""

    directory: Path
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _ref(self, name: str, secret: dict[str, Any]) -> dict[str, Any]:
        self.secrets[name] = {"name": name, **secret}
        source = {"path": str(self.directory / f"{name}.json")}
        return {"name": name, "sds_config": {"resource_api_version": "V3", "path_config_source": source}}

    def certificate(self, name: str, cert: str, key: str) -> dict[str, Any]:
        """A certificate and its key, re-read when either is renamed into the certificate's directory."""
        return self._ref(
            name,
            {
                "tls_certificate": {
                    "certificate_chain": {"filename": cert},
                    "private_key": {"filename": key},
                    "watched_directory": {"path": str(Path(cert).parent)},
                }
            },
        )

    def ca(self, name: str, ca: str) -> dict[str, Any]:
        """CA certificates to verify peers with, re-read when the file is renamed into its directory."""
        return self._ref(
            name,
            {
                "validation_context": {
                    "trusted_ca": {"filename": ca},
                    "watched_directory": {"path": str(Path(ca).parent)},
                }
            },
        )

    def problems(self) -> list[Problem]:
        """The secrets whose PEM files do not load (unparseable, or a key not the certificate's)."""
        out = []
        for name, secret in sorted(self.secrets.items()):
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            try:
                if "tls_certificate" in secret:
                    pair = secret["tls_certificate"]
                    source = pair["certificate_chain"]["filename"]
                    what = "the certificate and its key do not load together"
                    ctx.load_cert_chain(source, pair["private_key"]["filename"])
                else:
                    source = secret["validation_context"]["trusted_ca"]["filename"]
                    what = "the CA certificates do not load"
                    ctx.load_verify_locations(source)
            except (OSError, ssl.SSLError) as exc:
                reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
                out.append(
                    Problem(
                        source,
                        1,
                        1,
                        f"{name}: {what} ({reason})",
                        "write PEM files; the key must be the certificate's",
                    )
                )
        return out

    def write(self) -> None:
        """Each secret's file, renamed into place; a file whose content is unchanged is left alone."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, secret in sorted(self.secrets.items()):
            path = self.directory / f"{name}.json"
            text = json.dumps(
                {"version_info": "1", "resources": [{"@type": _SECRET_TYPE, **secret}]}, indent=1
            )
            if path.exists() and path.read_text(encoding="utf-8") == text:
                continue
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def _endpoint(host: str, port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def _upstream_tls(
    tls: UpstreamTLS, name: str, secrets: Secrets, secret: str, alpn: tuple[str, ...] = ()
) -> dict[str, Any]:
    """TLS to a model server (or the workers): chain verified against its CA, and `name` required
    in its SANs (Envoy checks no name unless told: a certificate for any host the CA signed would do).
    The CA and the client certificate are the SDS secrets `secret`-ca and `secret`-cert."""
    san_type = "IP_ADDRESS" if _is_ip(name) else "DNS"
    common: dict[str, Any] = {
        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
        "combined_validation_context": {
            "default_validation_context": {
                "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": name}}],
            },
            "validation_context_sds_secret_config": secrets.ca(f"{secret}-ca", tls.ca_file),
        },
    }
    if alpn:
        common["alpn_protocols"] = list(alpn)
    if tls.cert_file is not None and tls.key_file is not None:
        common["tls_certificate_sds_secret_configs"] = [
            secrets.certificate(f"{secret}-cert", tls.cert_file, tls.key_file)
        ]
    ctx: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common,
    }
    if san_type == "DNS":
        ctx["sni"] = name
    return {"name": "envoy.transport_sockets.tls", "typed_config": ctx}


def _extproc_tls(settings: Settings, secrets: Secrets) -> dict[str, Any] | None:
    """Mutual TLS to the workers: Envoy shows the shared certificate and requires it of them,
    under the name it dials them by (gRPC: HTTP/2 by ALPN)."""
    s = settings
    if s.extproc_tls_cert_file is None or s.extproc_tls_key_file is None or s.extproc_tls_ca_file is None:
        return None
    tls = UpstreamTLS(
        ca_file=str(s.extproc_tls_ca_file),
        cert_file=str(s.extproc_tls_cert_file),
        key_file=str(s.extproc_tls_key_file),
    )
    return _upstream_tls(tls, s.extproc_tls_name or s.worker_host, secrets, "extproc", alpn=("h2",))


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _cluster(
    name: str,
    endpoints: list[tuple[str, int]],
    *,
    http2: bool,
    buffer_limit: int,
    tls: dict[str, Any] | None = None,
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
    if tls is not None:
        c["transport_socket"] = tls
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


@dataclass(frozen=True)
class _LocalReply:
    """One kind of Envoy-generated reply: how it is matched, and what the client gets instead."""

    code: str  # user-safe, stable (docs/errors.md)
    message: str  # a fixed text (a '%' would be read as an Envoy format command)
    status: int | None = None  # match on Envoy's status
    details: tuple[str, ...] = ()  # or on its response code details (a trailing '.' is a prefix)
    new_status: int | None = None  # the status the client gets (default: Envoy's)
    # Refused while Envoy read the request, before the request id was generated: the reply says
    # so rather than carry an id that names nothing in the logs (the access log has the details).
    before_request_id: bool = False


# Matched in order; anything else ≥ 400 is gateway_error.
_LOCAL_REPLIES: tuple[_LocalReply, ...] = (
    _LocalReply(
        "invalid_path",
        "the path holds an escaped slash or backslash, or cannot be normalized",
        details=("path_normalization_failed",),
        before_request_id=True,
    ),
    _LocalReply(
        "headers_too_large",
        "the request headers are too large",
        status=431,
        before_request_id=True,
    ),
    _LocalReply(
        "http_version_unsupported",
        "HTTP/1.0 and HTTP/0.9 are not accepted: use HTTP/1.1 or HTTP/2",
        details=("low_version",),
        before_request_id=True,
    ),
    # Not valid HTTP: the codec's own refusals (a bad header name, Content-Length with chunked
    # encoding, garbage), or no Host.
    _LocalReply(
        "malformed_request",
        "the request is not valid HTTP",
        details=("http1.", "http2.", "missing_host_header"),
        before_request_id=True,
    ),
    # A request target that is no path (`OPTIONS *`), or none at all.
    _LocalReply(
        "unknown_path",
        "unknown path",
        details=("absolute_path_rejected", "missing_path_rejected"),
        before_request_id=True,
    ),
    _LocalReply(
        "upgrade_not_supported",
        "protocol upgrades (WebSocket, h2c) are not accepted",
        details=("upgrade_failed",),
    ),
    # A whole answer that outgrew the buffer it is checked in: the model server's fault, as when
    # the chain refuses one whose content-length says so (filters/protocol.py).
    _LocalReply(
        "answer_too_large",
        "the model server's answer is too large to check",
        details=("response_payload_too_large",),
        new_status=502,
    ),
    _LocalReply("body_too_large", "the request body is too large", status=413),
    _LocalReply("upstream_unavailable", "the model server is unavailable", status=503),
    _LocalReply("gateway_timeout", "the gateway timed out", status=504),
    _LocalReply("gateway_error", "the gateway could not complete the request"),
)


def _details_condition(details: tuple[str, ...]) -> str:
    one = [
        f"response.code_details.startsWith('{d}')" if d.endswith(".") else f"response.code_details == '{d}'"
        for d in details
    ]
    return one[0] if len(one) == 1 else "(" + " || ".join(one) + ")"


def _local_reply_mappers() -> list[dict[str, Any]]:
    mappers: list[dict[str, Any]] = []
    for reply in _LOCAL_REPLIES:
        suffix = (
            "(refused before a request id was assigned)"
            if reply.before_request_id
            else "(request id %REQ(X-REQUEST-ID)%)"
        )
        message = f"{reply.message} {suffix}"
        for kserve in (True, False):
            cond = ["!response.code_details.startsWith('ztgate_')"]
            if reply.details:
                cond.append(_details_condition(reply.details))
            cond.append(f"response.code == {reply.status}" if reply.status else "response.code >= 400")
            if kserve:
                # A codec error has no path: such a reply takes the OpenAI shape.
                cond.append("request.path.startsWith('/v2')")
                body: dict[str, Any] = {"error": message, "code": reply.code}
            else:
                body = {
                    "error": {
                        "message": message,
                        "type": "gateway_error",
                        "param": None,
                        "code": reply.code,
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
                    **({"status_code": reply.new_status} if reply.new_status else {}),
                }
            )
    return mappers


def _downstream_tls(settings: Settings, secrets: Secrets) -> dict[str, Any]:
    """The listener's TLS: TLS 1.2 or later, HTTP/2 or HTTP/1.1 by ALPN, and, with a client CA,
    a certificate required of every client (no certificate or another CA: the handshake fails)."""
    common: dict[str, Any] = {
        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
        "alpn_protocols": ["h2", "http/1.1"],
        "tls_certificate_sds_secret_configs": [
            secrets.certificate("listener-cert", str(settings.tls_cert_file), str(settings.tls_key_file))
        ],
    }
    tls: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": common,
    }
    if settings.tls_client_ca_file is not None:
        common["validation_context_sds_secret_config"] = secrets.ca(
            "listener-client-ca", str(settings.tls_client_ca_file)
        )
        tls["require_client_certificate"] = True
    return {"name": "envoy.transport_sockets.tls", "typed_config": tls}


def _trust_proxies(hcm: dict[str, Any], settings: Settings) -> None:
    """Behind trusted proxies: the client is the rightmost `x-forwarded-for` address outside their
    networks when the connection comes from one of them, and the connection's own address when it
    does not (a client that reaches Envoy directly cannot claim another address).

    Envoy's XFF extension cannot be combined with `use_remote_address`, and without it Envoy no
    longer treats requests as coming from the edge: it keeps a client's x-request-id, x-envoy-* and
    x-forwarded-proto headers. They are removed first (early header mutation, before Envoy assigns
    the request id and reads x-forwarded-for), and `x-envoy-external-address`, which the chain
    reads the source from (auth_guard), is written from the address the extension found, ahead
    of ext_proc. Measured with Envoy 1.40 (tests/dataplane/test_trusted_proxies.py)."""
    cidrs = [
        {"address_prefix": str(net.network_address), "prefix_len": net.prefixlen}
        for net in settings.trusted_proxy_networks
    ]
    hcm["use_remote_address"] = False
    hcm["original_ip_detection_extensions"] = [
        {
            "name": "envoy.http.original_ip_detection.xff",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.original_ip_detection.xff.v3.XffConfig",
                "xff_trusted_cidrs": {"cidrs": cidrs},
            },
        }
    ]
    remove: list[dict[str, Any]] = [{"remove_on_match": {"key_matcher": {"prefix": "x-envoy-"}}}]
    remove += [{"remove": h} for h in ("x-request-id", "x-forwarded-proto", "x-forwarded-port")]
    hcm["early_header_mutation_extensions"] = [
        {
            "name": "envoy.http.early_header_mutation.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
                "mutations": remove,
            },
        }
    ]
    external = {
        "header": {"key": "x-envoy-external-address", "value": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
    hcm["http_filters"].insert(
        0,
        {
            "name": "envoy.filters.http.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": external}]},
            },
        },
    )


def render(
    settings: Settings,
    registry: Registry,
    template: Path = TEMPLATE,
    cds: Path | None = None,
    secrets: Secrets | None = None,
) -> dict[str, Any]:
    """The complete Envoy bootstrap as a dict (upstream clusters from `cds` when it is given).

    The SDS secrets it refers to are collected in `secrets` (default: files under `sds/`)."""
    secrets = secrets if secrets is not None else Secrets(Path(SDS_DIR))
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
            tls=_extproc_tls(settings, secrets),
        )
    ]
    if cds is None:
        fixed = {n: [(u.host or "", u.port or 0)] for n, u in registry.spec.upstreams.items()}
        clusters += upstream_clusters(settings, registry, fixed, secrets)
    else:
        doc["dynamic_resources"] = {
            "cds_config": {
                "resource_api_version": "V3",
                "path_config_source": {"path": str(cds), "watched_directory": {"path": str(cds.parent)}},
            }
        }
    doc["static_resources"]["clusters"] = clusters
    chain = doc["static_resources"]["listeners"][0]["filter_chains"][0]
    if settings.tls_cert_file is not None:
        chain["transport_socket"] = _downstream_tls(settings, secrets)
    hcm = chain["filters"][0]["typed_config"]
    hcm["local_reply_config"]["mappers"] = _local_reply_mappers()
    if settings.trusted_proxies:
        _trust_proxies(hcm, settings)
    return doc


def upstream_clusters(
    settings: Settings, registry: Registry, endpoints: dict[str, list[tuple[str, int]]], secrets: Secrets
) -> list[dict[str, Any]]:
    """One cluster per upstream, with its endpoints (none: Envoy answers 503, nothing is reached);
    the TLS secrets they refer to are collected in `secrets`."""
    out = []
    for name, eps in sorted(endpoints.items()):
        spec = registry.spec.upstreams[name]
        tls = None
        if spec.tls is not None and spec.tls_name:
            tls = _upstream_tls(spec.tls, spec.tls_name, secrets, f"upstream-{name}")
        out.append(
            _cluster(cluster_name(name), eps, http2=False, buffer_limit=settings.buffer_limit_bytes, tls=tls)
        )
    return out


def tls_problems(settings: Settings, registry: Registry, *, envoy: bool = True) -> list[Problem]:
    """The certificate, key and CA files the rendered config names that do not load (a file
    that does not parse, a key that is not the certificate's). Envoy itself would start on such
    a secret and reset every connection it guards, so `ztgate up` refuses to start instead.
    Without Envoy (`envoy=False`: the workers run alone), only the workers' own files count."""
    secrets = Secrets(Path(SDS_DIR))
    cds = Path(CDS_FILE) if settings.registry_source == "consul" else None
    render(settings, registry, cds=cds, secrets=secrets)
    if not envoy:
        secrets.secrets = {n: v for n, v in secrets.secrets.items() if n.startswith("extproc-")}
    return secrets.problems()


def check_tls(settings: Settings, registry: Registry, *, envoy: bool = True) -> None:
    """ConfigError listing `tls_problems`, if any."""
    problems = tls_problems(settings, registry, envoy=envoy)
    if problems:
        raise ConfigError(problems)


def write(settings: Settings, registry: Registry, out: Path) -> Path:
    """Render to a file (JSON is valid YAML for Envoy); with the Consul registry, the CDS file beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cds = out.parent / CDS_FILE if settings.registry_source == "consul" else None
    secrets = Secrets(out.parent / SDS_DIR)
    doc = render(settings, registry, cds=cds, secrets=secrets)
    secrets.write()  # before the bootstrap: Envoy reads every secret it names at start
    out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
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
