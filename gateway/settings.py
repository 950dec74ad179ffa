"""Process settings, read from the environment once into a frozen object.

Only policy hot-reloads; everything here is fixed for the life of a process.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

N = TypeVar("N", int, float)

_PACKAGE_DEFAULTS = Path(__file__).resolve().parent / "defaults"


def _num(env: Mapping[str, str], name: str, default: N) -> N:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return type(default)(raw)
    except ValueError as exc:
        kind = "an integer" if isinstance(default, int) else "a number"
        raise ValueError(f"{name} must be {kind}, got {raw!r}") from exc


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name)
    return Path(raw) if raw else None


def _list(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


@dataclass(frozen=True)
class Settings:
    """Everything a gateway process needs to know that is not policy."""

    listen_address: str = "127.0.0.1"
    listen_port: int = 8080
    admin_address: str = "127.0.0.1"
    admin_port: int = 9901
    envoy_admin_port: int = 9902
    worker_host: str = "127.0.0.1"
    worker_ports: tuple[int, ...] = (50051, 50052)
    registry_file: Path = _PACKAGE_DEFAULTS / "registry.yaml"
    # Where the registry comes from: `file` (registry_file, the embedded default) or `consul` (the
    # document under consul_key in Consul's KV store, followed with blocking queries). Past
    # consul_stale_s without an answer from Consul, `fail_mode.consul` decides (gateway/consul.py).
    registry_source: str = "file"
    consul_url: str = "http://127.0.0.1:8500"
    consul_key: str = "ztgate/registry"
    consul_token_file: Path | None = None
    consul_stale_s: float = 15.0
    keys_file: Path = _PACKAGE_DEFAULTS / "keys.yaml"
    # Per-phase budget for the Python chain, and Envoy's message_timeout above it.
    phase_budget_s: float = 1.0
    message_timeout_s: float = 2.0
    upstream_timeout_s: float = 300.0
    # At a stop, how long requests in flight (long streamed answers too) get to finish.
    drain_s: float = 30.0
    max_request_body_bytes: int = 4 * 1024 * 1024
    buffer_limit_bytes: int = 8 * 1024 * 1024
    state_dir: Path = Path(".cache/ztgate")
    log_level: str = "info"
    # The policy file (hot-reloaded). ZTGATE_FILTERS, when set, replaces it with a plain chain of
    # those filters and no rules (benchmarks, experiments).
    policy_file: Path = _PACKAGE_DEFAULTS.parent.parent / "policies" / "default.yaml"
    filters: tuple[str, ...] = ()
    static_upstream: str = ""
    # Extra modules that register filters (`@register`), imported before the chain is built.
    filter_modules: tuple[str, ...] = ()
    # Key of the `hash` PII replacement (default: <state_dir>/pii-hash.key, made on first use).
    # Share it between replicas so one value gets one token everywhere.
    pii_key_file: Path | None = None
    # Where workers write their metric snapshots for the admin endpoint (set by `ztgate up`).
    metrics_dir: Path | None = None
    # The risk store shared by every replica, and the prefix of ztgate's keys in it.
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "ztgate:"
    # Audit: one hash chain per worker process, `<audit_dir>/<instance>-<port>.jsonl`; the key of
    # the keyed fingerprints (default <state_dir>/audit.key, made on first use; share it between
    # replicas so one prompt has one fingerprint everywhere). `instance` names this host.
    audit_dir: Path | None = None
    audit_key_file: Path | None = None
    # A chain's live file is closed as a segment once it reaches this size (0: never).
    audit_segment_bytes: int = 64 * 1024 * 1024
    instance: str = field(default_factory=socket.gethostname)
    # TLS on the client listener (Envoy reads the PEM files at start): certificate chain and key,
    # and optionally the CA that client certificates must chain to (then every client needs one).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # Mutual TLS between Envoy and the ext_proc workers (every prompt and answer crosses it): one
    # certificate for both sides (it needs serverAuth and clientAuth), the CA both check, and the
    # name Envoy requires in the workers' certificate (default: worker_host, as Envoy dials it).
    extproc_tls_cert_file: Path | None = None
    extproc_tls_key_file: Path | None = None
    extproc_tls_ca_file: Path | None = None
    extproc_tls_name: str = ""
    # Proxies in front of Envoy (load balancers) trusted to name the client in `x-forwarded-for`:
    # a request whose connection comes from one of these networks is the rightmost address of its
    # x-forwarded-for outside them. Empty: every client is the connection's own address, whatever
    # x-forwarded-for says (docs/operations.md, "Behind a load balancer").
    trusted_proxies: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ZTGATE_* variables; unknown values are errors, not defaults."""
        e = os.environ if env is None else env
        ports_raw = e.get("ZTGATE_WORKER_PORTS", "")
        try:
            ports = tuple(int(p) for p in ports_raw.split(",") if p.strip()) or cls.worker_ports
        except ValueError as exc:
            raise ValueError(f"ZTGATE_WORKER_PORTS must be comma-separated ports, got {ports_raw!r}") from exc
        s = cls(
            listen_address=e.get("ZTGATE_LISTEN_ADDRESS", cls.listen_address),
            listen_port=_num(e, "ZTGATE_LISTEN_PORT", cls.listen_port),
            admin_address=e.get("ZTGATE_ADMIN_ADDRESS", cls.admin_address),
            admin_port=_num(e, "ZTGATE_ADMIN_PORT", cls.admin_port),
            envoy_admin_port=_num(e, "ZTGATE_ENVOY_ADMIN_PORT", cls.envoy_admin_port),
            worker_host=e.get("ZTGATE_WORKER_HOST", cls.worker_host),
            worker_ports=ports,
            registry_file=Path(e.get("ZTGATE_REGISTRY_FILE", str(cls.registry_file))),
            registry_source=e.get("ZTGATE_REGISTRY_SOURCE", cls.registry_source),
            consul_url=e.get("ZTGATE_CONSUL_URL", cls.consul_url),
            consul_key=e.get("ZTGATE_CONSUL_KEY", cls.consul_key),
            consul_token_file=Path(e["ZTGATE_CONSUL_TOKEN_FILE"])
            if e.get("ZTGATE_CONSUL_TOKEN_FILE")
            else None,
            consul_stale_s=_num(e, "ZTGATE_CONSUL_STALE_S", cls.consul_stale_s),
            keys_file=Path(e.get("ZTGATE_KEYS_FILE", str(cls.keys_file))),
            phase_budget_s=_num(e, "ZTGATE_PHASE_BUDGET_S", cls.phase_budget_s),
            message_timeout_s=_num(e, "ZTGATE_MESSAGE_TIMEOUT_S", cls.message_timeout_s),
            upstream_timeout_s=_num(e, "ZTGATE_UPSTREAM_TIMEOUT_S", cls.upstream_timeout_s),
            drain_s=_num(e, "ZTGATE_DRAIN_S", cls.drain_s),
            max_request_body_bytes=_num(e, "ZTGATE_MAX_REQUEST_BODY_BYTES", cls.max_request_body_bytes),
            buffer_limit_bytes=_num(e, "ZTGATE_BUFFER_LIMIT_BYTES", cls.buffer_limit_bytes),
            state_dir=Path(e.get("ZTGATE_STATE_DIR", str(cls.state_dir))),
            log_level=e.get("ZTGATE_LOG_LEVEL", cls.log_level),
            filters=_list(e.get("ZTGATE_FILTERS", "")),
            policy_file=Path(e.get("ZTGATE_POLICY_FILE", str(cls.policy_file))),
            static_upstream=e.get("ZTGATE_STATIC_UPSTREAM", ""),
            filter_modules=_list(e.get("ZTGATE_FILTER_MODULES", "")),
            pii_key_file=Path(e["ZTGATE_PII_KEY_FILE"]) if e.get("ZTGATE_PII_KEY_FILE") else None,
            metrics_dir=Path(e["ZTGATE_METRICS_DIR"]) if e.get("ZTGATE_METRICS_DIR") else None,
            redis_url=e.get("ZTGATE_REDIS_URL", cls.redis_url),
            redis_prefix=e.get("ZTGATE_REDIS_PREFIX", cls.redis_prefix),
            audit_dir=Path(e["ZTGATE_AUDIT_DIR"]) if e.get("ZTGATE_AUDIT_DIR") else None,
            audit_key_file=Path(e["ZTGATE_AUDIT_KEY_FILE"]) if e.get("ZTGATE_AUDIT_KEY_FILE") else None,
            audit_segment_bytes=_num(e, "ZTGATE_AUDIT_SEGMENT_BYTES", cls.audit_segment_bytes),
            instance=e.get("ZTGATE_INSTANCE") or socket.gethostname(),
            tls_cert_file=_path(e, "ZTGATE_TLS_CERT_FILE"),
            tls_key_file=_path(e, "ZTGATE_TLS_KEY_FILE"),
            tls_client_ca_file=_path(e, "ZTGATE_TLS_CLIENT_CA_FILE"),
            extproc_tls_cert_file=_path(e, "ZTGATE_EXTPROC_TLS_CERT_FILE"),
            extproc_tls_key_file=_path(e, "ZTGATE_EXTPROC_TLS_KEY_FILE"),
            extproc_tls_ca_file=_path(e, "ZTGATE_EXTPROC_TLS_CA_FILE"),
            extproc_tls_name=e.get("ZTGATE_EXTPROC_TLS_NAME", ""),
            trusted_proxies=_list(e.get("ZTGATE_TRUSTED_PROXIES", "")),
        )
        s.check()
        return s

    @property
    def trusted_proxy_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """`trusted_proxies` as networks (a bare address is a network of one)."""
        return [ipaddress.ip_network(p) for p in self.trusted_proxies]

    @property
    def scheme(self) -> str:
        """How clients reach the listener: https when it terminates TLS."""
        return "https" if self.tls_cert_file is not None else "http"

    @property
    def extproc_tls(self) -> bool:
        """Whether Envoy and the workers speak mutual TLS."""
        return self.extproc_tls_cert_file is not None

    @property
    def pii_key_path(self) -> Path:
        """Where the PII hash-replacement key lives (made on first use)."""
        return self.pii_key_file or self.state_dir / "pii-hash.key"

    @property
    def audit_path(self) -> Path:
        """The directory of the audit chains."""
        return self.audit_dir or self.state_dir / "audit"

    @property
    def audit_key_path(self) -> Path:
        """Where the audit fingerprint key lives (made on first use)."""
        return self.audit_key_file or self.state_dir / "audit.key"

    @property
    def consul_token(self) -> str | None:
        """The Consul ACL token, read from its file (None without one)."""
        if self.consul_token_file is None:
            return None
        return self.consul_token_file.read_text(encoding="utf-8").strip() or None

    def check(self) -> None:
        """Refuse combinations that would make the gateway fail open or misbehave."""
        if self.registry_source not in ("file", "consul"):
            raise ValueError(f"ZTGATE_REGISTRY_SOURCE must be file or consul, got {self.registry_source!r}")
        if not re.fullmatch(r"https?://[^/?#\s]+", self.consul_url):
            raise ValueError(f"ZTGATE_CONSUL_URL must be http(s)://host:port, got {self.consul_url!r}")
        if not re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", self.consul_key):
            raise ValueError(f"ZTGATE_CONSUL_KEY must be a plain KV path, got {self.consul_key!r}")
        if self.consul_stale_s <= 0:
            raise ValueError("ZTGATE_CONSUL_STALE_S must be positive")
        if self.consul_token_file is not None and not self.consul_token_file.is_file():
            raise ValueError(f"ZTGATE_CONSUL_TOKEN_FILE names no file: {self.consul_token_file}")
        if self.message_timeout_s <= self.phase_budget_s:
            raise ValueError("message timeout must exceed the per-phase budget, or Envoy answers first")
        if not 0 <= self.drain_s <= 3600:
            raise ValueError("ZTGATE_DRAIN_S must be between 0 (stop at once) and 3600 seconds")
        if self.max_request_body_bytes > self.buffer_limit_bytes:
            raise ValueError("max request body must not exceed Envoy's buffer limit")
        if self.audit_segment_bytes < 0:
            raise ValueError("ZTGATE_AUDIT_SEGMENT_BYTES must be 0 (never segment) or a size in bytes")
        if not self.worker_ports:
            raise ValueError("at least one worker port is needed")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("ZTGATE_TLS_CERT_FILE and ZTGATE_TLS_KEY_FILE go together: set both or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                "ZTGATE_TLS_CLIENT_CA_FILE needs the listener's TLS: set ZTGATE_TLS_CERT_FILE and _KEY_FILE"
            )
        extproc = (self.extproc_tls_cert_file, self.extproc_tls_key_file, self.extproc_tls_ca_file)
        if any(f is None for f in extproc) and any(f is not None for f in extproc):
            raise ValueError(
                "ZTGATE_EXTPROC_TLS_CERT_FILE, _KEY_FILE and _CA_FILE go together: set all three or none"
            )
        for name, tls_file in (
            ("ZTGATE_TLS_CERT_FILE", self.tls_cert_file),
            ("ZTGATE_TLS_KEY_FILE", self.tls_key_file),
            ("ZTGATE_TLS_CLIENT_CA_FILE", self.tls_client_ca_file),
            ("ZTGATE_EXTPROC_TLS_CERT_FILE", self.extproc_tls_cert_file),
            ("ZTGATE_EXTPROC_TLS_KEY_FILE", self.extproc_tls_key_file),
            ("ZTGATE_EXTPROC_TLS_CA_FILE", self.extproc_tls_ca_file),
        ):
            if tls_file is not None and not tls_file.is_file():
                raise ValueError(f"{name} names no file: {tls_file}")
        for proxy in self.trusted_proxies:
            try:
                net = ipaddress.ip_network(proxy)
            except ValueError as exc:
                raise ValueError(
                    f"ZTGATE_TRUSTED_PROXIES: {proxy!r} is not an address or a network such as 10.0.0.0/8 ({exc})"
                ) from exc
            if net.prefixlen == 0:
                raise ValueError(
                    f"ZTGATE_TRUSTED_PROXIES: {proxy!r} trusts every address, so any client could claim"
                    " to be any other: name the proxies' own networks"
                )
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", self.instance):
            raise ValueError(f"ZTGATE_INSTANCE must be a plain host name, got {self.instance!r}")
