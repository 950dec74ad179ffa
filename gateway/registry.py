"""The model registry: which upstream serves which model version.

A model reference is ``name[@version][:hash]`` (e.g. ``llama3-8b@v2.4:abc123``). Without a version
it resolves to the model's ``latest``; with a hash, the hash must match the registered one, so a
client that pinned a build never silently gets another. The embedded backend is a YAML file; the
Consul backend (gateway/consul.py) reads the same document from Consul's KV store, and there an
upstream may name a Consul service whose passing instances are its endpoints.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from gateway.config_yaml import ConfigError, Marks, Problem, at, validate

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_REF = re.compile(
    rf"^(?P<name>{_NAME})(?:@(?P<version>[A-Za-z0-9._-]{{1,64}}))?(?::(?P<hash>[0-9a-fA-F]{{4,64}}))?$"
)


class Protocol(StrEnum):
    """Wire protocols the gateway understands."""

    OPENAI = "openai"
    KSERVE_V2 = "kserve_v2"


# Enums come from YAML as strings: the one lax conversion strict mode would otherwise refuse.
ProtocolField = Annotated[Protocol, Strict(False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class UpstreamTLS(_Strict):
    """TLS to a model server: its certificate is verified against `ca_file` and must name
    `server_name`; with `cert_file` and `key_file` the gateway shows its own (mutual TLS).
    Paths are read by Envoy, on Envoy's host (in compose, the envoy service)."""

    ca_file: str = Field(description="PEM CA bundle the model server's certificate must chain to.")
    server_name: str | None = Field(
        default=None,
        description="Name sent as SNI and required in the certificate's subject alternative names "
        "(a DNS name or an IP address; default: the upstream's host; required for a Consul service).",
    )
    cert_file: str | None = Field(default=None, description="PEM client certificate chain (mutual TLS).")
    key_file: str | None = Field(default=None, description="PEM private key of cert_file.")


class UpstreamSpec(_Strict):
    """One model server (a cluster in Envoy): a fixed host and port, or a Consul service."""

    protocol: ProtocolField = Field(description="Wire protocol the upstream speaks.")
    host: str | None = Field(default=None, description="Host name or IP address of the upstream.")
    port: Annotated[int | None, Field(default=None, ge=1, le=65535, description="TCP port of the upstream.")]
    service: str | None = Field(
        default=None,
        description="Consul service whose instances with passing health checks are the endpoints "
        "(Consul registry source only; instead of host and port).",
    )
    tls: UpstreamTLS | None = Field(
        default=None, description="Speak TLS to this upstream (default: plain HTTP, for a trusted network)."
    )

    @property
    def tls_name(self) -> str | None:
        """The name the upstream's certificate must carry (None without TLS)."""
        return None if self.tls is None else (self.tls.server_name or self.host)


class VersionSpec(_Strict):
    """One deployable version of a model."""

    upstream: str = Field(description="Name of the upstream (under `upstreams`) that serves it.")
    upstream_model: str | None = Field(
        default=None, description="Model name the upstream knows it by (default: the model's name)."
    )
    upstream_version: str | None = Field(
        default=None, description="Version the upstream knows it by (KServe v2 version directory)."
    )
    hash: str | None = Field(default=None, description="Content hash of the weights (hex), for pinning.")


class ModelSpec(_Strict):
    """A model name with its versions."""

    latest: str = Field(description="The version a reference without `@version` resolves to.")
    versions: dict[str, VersionSpec] = Field(description="Versions by name.")


class RegistrySpec(_Strict):
    """The registry file."""

    upstreams: dict[str, UpstreamSpec] = Field(description="Model servers by name.")
    models: dict[str, ModelSpec] = Field(description="Models by name.")
    server_default: dict[ProtocolField, str] = Field(
        default_factory=dict,
        description="Upstream that answers server-level calls (e.g. KServe `/v2/health/ready`) per protocol.",
    )


class RegistryError(ConfigError):
    """The registry file is unreadable or invalid."""

    @classmethod
    def single(cls, source: str, what: str) -> RegistryError:
        """An error about the document as a whole."""
        return cls([Problem(source, 1, 1, what)])


def _check(spec: RegistrySpec, marks: Marks, source: str, *, services: bool) -> list[Problem]:
    """Names and references across the file, each reported where it is written."""
    out: list[Problem] = [
        at(
            marks,
            source,
            ("upstreams", name, "<key>"),
            f"upstream name {name!r} is not allowed",
            "use letters, digits, '.', '_' or '-'",
        )
        for name in spec.upstreams
        if not re.fullmatch(_NAME, name)
    ]
    for name, u in spec.upstreams.items():
        fixed = u.host is not None and u.port is not None and u.service is None
        discovered = u.service is not None and u.host is None and u.port is None
        if fixed or discovered:
            continue
        out.append(
            at(
                marks,
                source,
                ("upstreams", name),
                f"upstream {name!r} needs either host and port, or service",
                "give host and port for a fixed address, or service for a Consul service",
            )
        )
    for name, u in spec.upstreams.items():
        if u.tls is not None and u.tls_name is None:
            out.append(
                at(
                    marks,
                    source,
                    ("upstreams", name, "tls"),
                    f"upstream {name!r} needs tls.server_name",
                    "name the host its certificate is for (a service has no one host)",
                )
            )
        if u.tls is not None and (u.tls.cert_file is None) != (u.tls.key_file is None):
            out.append(
                at(
                    marks,
                    source,
                    ("upstreams", name, "tls"),
                    f"upstream {name!r} has only one of tls.cert_file and tls.key_file",
                    "give both for mutual TLS, or neither",
                )
            )
    for name, u in spec.upstreams.items():
        if u.service is not None and not services:
            out.append(
                at(
                    marks,
                    source,
                    ("upstreams", name, "service"),
                    f"upstream {name!r} names a Consul service, but the registry is a file",
                    "set ZTGATE_REGISTRY_SOURCE=consul, or give host and port",
                )
            )
    for mname, model in spec.models.items():
        if not re.fullmatch(_NAME, mname):
            out.append(
                at(
                    marks,
                    source,
                    ("models", mname, "<key>"),
                    f"model name {mname!r} is not allowed",
                    "use letters, digits, '.', '_' or '-'",
                )
            )
        if model.latest not in model.versions:
            out.append(
                at(
                    marks,
                    source,
                    ("models", mname, "latest"),
                    f"latest version {model.latest!r} is not among the versions",
                    f"use one of: {', '.join(sorted(model.versions))}",
                )
            )
        for vname, v in model.versions.items():
            if v.upstream not in spec.upstreams:
                out.append(
                    at(
                        marks,
                        source,
                        ("models", mname, "versions", vname, "upstream"),
                        f"unknown upstream {v.upstream!r}",
                        _one_of(v.upstream, list(spec.upstreams)),
                    )
                )
    for proto, up in spec.server_default.items():
        where = ("server_default", str(proto))
        if up not in spec.upstreams:
            out.append(
                at(marks, source, where, f"unknown upstream {up!r}", _one_of(up, list(spec.upstreams)))
            )
        elif spec.upstreams[up].protocol != proto:
            out.append(
                at(
                    marks,
                    source,
                    where,
                    f"upstream {up!r} speaks {spec.upstreams[up].protocol}, not {proto}",
                    "name an upstream of that protocol",
                )
            )
    return out


def _one_of(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f"did you mean {close[0]!r}?" if close else f"defined upstreams: {', '.join(sorted(choices))}"


# The revision of the snapshot requests see before any registry was read (Consul source).
NO_REGISTRY = "none"


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A parsed model reference."""

    name: str
    version: str | None
    hash: str | None


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes."""

    cluster: str
    protocol: Protocol
    model: str
    version: str
    upstream_model: str
    upstream_version: str | None
    model_hash: str | None


def cluster_name(upstream: str) -> str:
    """Envoy cluster name for an upstream; the prefix keeps them apart from internal clusters."""
    return f"up_{upstream}"


def parse_ref(ref: str) -> ModelRef | None:
    """Parse ``name[@version][:hash]``; None if it is not a valid reference."""
    m = _REF.match(ref)
    if m is None:
        return None
    h = m.group("hash")
    return ModelRef(m.group("name"), m.group("version"), h.lower() if h else None)


@dataclass(frozen=True, slots=True)
class Registry:
    """An immutable, validated registry snapshot."""

    spec: RegistrySpec
    revision: str
    # Set when the snapshot cannot be vouched for (its source is unreachable, or none was ever
    # read): the route filter then applies `fail_mode.consul`.
    problem: str | None = None

    @classmethod
    def from_yaml(cls, text: str, source: str = "<registry>") -> Registry:
        """Validate registry YAML; RegistryError lists every problem as file:line:column.

        Upstreams may name a Consul service only when the source is Consul (`consul:<key>`).
        """
        try:
            spec, marks = validate(RegistrySpec, text, source)
        except ConfigError as exc:
            raise RegistryError(exc.problems) from None
        problems = _check(spec, marks, source, services=source.startswith("consul:"))
        if problems:
            raise RegistryError(problems)
        return cls(spec, hashlib.sha256(text.encode()).hexdigest()[:12])

    def with_problem(self, problem: str, revision: str | None = None) -> Registry:
        """The same snapshot, marked as not vouched for."""
        return dataclasses.replace(self, problem=problem, revision=revision or self.revision)

    @classmethod
    def load(cls, path: Path) -> Registry:
        """Read and validate a registry file."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RegistryError([Problem(str(path), 1, 1, f"cannot read the file: {exc.strerror}")]) from None
        return cls.from_yaml(text, str(path))

    def resolve(self, ref: ModelRef, protocol: Protocol) -> Route | None:
        """The route for a reference, or None if no such model/version/hash speaks this protocol."""
        model = self.spec.models.get(ref.name)
        if model is None:
            return None
        version = ref.version or model.latest
        vspec = model.versions.get(version)
        if vspec is None:
            return None
        if ref.hash is not None and (vspec.hash is None or not vspec.hash.lower().startswith(ref.hash)):
            return None
        upstream = self.spec.upstreams[vspec.upstream]
        if upstream.protocol != protocol:
            return None
        return Route(
            cluster=cluster_name(vspec.upstream),
            protocol=protocol,
            model=ref.name,
            version=version,
            upstream_model=vspec.upstream_model or ref.name,
            upstream_version=vspec.upstream_version,
            model_hash=vspec.hash,
        )

    def server_route(self, protocol: Protocol) -> str | None:
        """Cluster that answers server-level calls for a protocol, if one is configured."""
        up = self.spec.server_default.get(protocol)
        return cluster_name(up) if up else None

    def models_for(self, protocol: Protocol) -> list[tuple[str, str]]:
        """(name, version) pairs served over a protocol, each name's latest first."""
        return [
            (name, version)
            for name, model in sorted(self.spec.models.items())
            for version in [model.latest, *sorted(v for v in model.versions if v != model.latest)]
            if self.spec.upstreams[model.versions[version].upstream].protocol == protocol
        ]
