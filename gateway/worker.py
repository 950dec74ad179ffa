"""One ext_proc worker process: the whole chain on one port (`python -m gateway.worker PORT`).

Several workers run side by side, one port each, listed as endpoints of one Envoy cluster
(Envoy multiplexes all streams on one HTTP/2 connection, so SO_REUSEPORT would not spread them).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import uvloop

from filters.chain import BuildEnv, Chain
from gateway.audit import WRITER_ENGINE, AuditError, ChainWriter, now
from gateway.config_yaml import ConfigError
from gateway.consul import Consul, ConsulRegistry
from gateway.extproc.server import ExtProcServer, mutual_tls, serve
from gateway.metrics import Metrics
from gateway.observability import log, setup_logging
from gateway.policy import source_for
from gateway.registry import Registry
from gateway.reload import Reloadable, watch
from gateway.settings import Settings


def _credentials(settings: Settings, metrics: Metrics) -> grpc.ServerCredentials | None:
    """The workers' mutual TLS, if configured; reloads counted in metrics (gRPC reports them from
    its own thread: handed to the event loop, which owns the counters)."""
    s = settings
    if s.extproc_tls_cert_file is None or s.extproc_tls_key_file is None or s.extproc_tls_ca_file is None:
        return None
    return mutual_tls(
        s.extproc_tls_cert_file, s.extproc_tls_key_file, s.extproc_tls_ca_file, metrics.tls_reload
    )


async def _main(port: int) -> None:
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    metrics = Metrics()
    env = BuildEnv(settings, instance=f"w{port}")
    policy = source_for(env, metrics.record)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: task.cancel() if task else None)
    writer = _writer(env)
    if writer is not None:
        writer.open()  # a damaged chain refuses the start, not the first request
    registry, follower = await _registry(settings, env)
    impl = ExtProcServer(lambda: policy.current, registry, settings.phase_budget_s, metrics)
    reg_revision = registry().revision
    log().info("worker_start", port=port, registry=reg_revision)
    _announce(policy.current.chain)
    # The chain proves which configuration was in force: every start, reload and refused edit.
    _audit_config(env, "worker_start", policy=policy.current.revision, registry=reg_revision, port=port)

    def reloaded(f: Reloadable[Any]) -> None:
        log().info("file_reloaded", path=str(f.path), revision=f.revision)
        extra = {"policy": policy.current.revision} if f is policy else {}
        _audit_config(env, "file_loaded", path=str(f.path), revision=f.revision, **extra)
        if f is policy:
            _announce(policy.current.chain)

    def refused(f: Reloadable[Any]) -> None:
        log().error(
            "file_refused_keeping_last_good", path=str(f.path), revision=f.revision, error=f.last_error
        )
        _audit_config(env, "file_refused", path=str(f.path), kept=f.revision, error=f.last_error)

    watcher = asyncio.create_task(watch(env.reloadables, reloaded, refused)) if env.reloadables else None
    mdir = settings.metrics_dir
    flusher = asyncio.create_task(_flush_metrics(metrics, mdir, port)) if mdir else None
    anchor = asyncio.create_task(_anchor_audit(env))
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await serve(impl, settings.worker_host, port, credentials=_credentials(settings, metrics))
    finally:
        for task in (flusher, watcher, anchor, follower):
            if task is not None:
                task.cancel()
        if mdir is not None:
            metrics.write(mdir, f"worker-{port}")
        await impl.drain()
        _log_audit_head(env)
        await env.close()


async def _registry(
    settings: Settings, env: BuildEnv
) -> tuple[Callable[[], Registry], asyncio.Task[None] | None]:
    """The registry snapshot each request routes on, and the task that follows Consul (if it is the source)."""
    if settings.registry_source == "file":
        registry = Registry.load(settings.registry_file)
        return (lambda: registry), None

    def changed(src: ConsulRegistry) -> None:
        log().info("registry_loaded", source=src.source, revision=src.revision)
        _audit_config(env, "registry_loaded", source=src.source, revision=src.revision)

    def refused(src: ConsulRegistry) -> None:
        log().error(
            "registry_refused_keeping_last_good", source=src.source, kept=src.revision, error=src.last_error
        )
        _audit_config(env, "registry_refused", source=src.source, kept=src.revision, error=src.last_error)

    consul = Consul(settings.consul_url, settings.consul_token)
    source = ConsulRegistry(consul, settings.consul_key, settings.consul_stale_s, changed, refused)
    follower = asyncio.create_task(source.run())
    # Serve either way: until a document is read, every request is refused with 503.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(source.loaded.wait(), 10.0)
    if not source.loaded.is_set():
        log().error("registry_unavailable", source=source.source, error=source.last_error)
    return (lambda: source.current), follower


def _announce(chain: Chain) -> None:
    """Say which chain is in force; a chain without `principal` is allowed but never silent."""
    log().info("chain", filters=chain.names, policy=chain.revision)
    if "principal" not in chain.names:
        log().warning("chain_without_principal", filters=chain.names)


def _writer(env: BuildEnv) -> ChainWriter | None:
    """This process's audit chain, if its policy audits (a reload may add it later)."""
    writer: ChainWriter | None = env.engines.get(WRITER_ENGINE)
    return writer


def _audit_config(env: BuildEnv, kind: str, **fields: Any) -> None:
    """A configuration event in the audit chain (when the policy audits)."""
    writer = _writer(env)
    if writer is None:
        return
    try:
        writer.append({"v": 1, "kind": kind, "time": now(), **fields})
    except AuditError as exc:
        log().error("audit_write_failed", kind=kind, error=str(exc))


def _log_audit_head(env: BuildEnv) -> int:
    """Log the audit chain's head (an anchor outside the chain, so records cut off its end show
    against the log); returns the records written, -1 without an audit chain."""
    writer = _writer(env)
    if writer is None:
        return -1
    log().info("audit_head", path=str(writer.path), records=writer.seq, head=writer.head)
    return writer.seq


async def _anchor_audit(env: BuildEnv, every_s: float = 60.0) -> None:
    """Anchor the audit chain's head once a minute when it moved (a reload may add the chain)."""
    last = -1
    while True:
        await asyncio.sleep(every_s)
        writer = _writer(env)
        if writer is not None and writer.seq != last:
            last = _log_audit_head(env)


async def _flush_metrics(metrics: Metrics, directory: Path, port: int) -> None:
    """Write this worker's metric snapshot once a second (the admin endpoint sums them)."""
    while True:
        await asyncio.sleep(1.0)
        try:
            metrics.write(directory, f"worker-{port}")
        except OSError as exc:
            log().warning("metrics_write_failed", error_type=type(exc).__name__)


def main() -> None:
    """Entry point."""
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python -m gateway.worker PORT")
    try:
        uvloop.run(_main(int(sys.argv[1])))
    except ConfigError as exc:
        # Located problems, not a traceback: the operator fixes the file and restarts.
        sys.exit(f"ztgate worker: configuration has problems:\n{exc}")
    except AuditError as exc:
        sys.exit(f"ztgate worker: {exc}")


if __name__ == "__main__":
    main()
