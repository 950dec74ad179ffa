"""`python -m gateway.cluster_feed CDS_FILE`: keep Envoy's upstream clusters in step with Consul.

Runs beside Envoy when the registry source is Consul (`ztgate up` starts it before Envoy). It
follows the registry document and the passing instances of every service the registry names,
and on each change publishes the clusters to the CDS file Envoy watches (envoy_config). It also
writes `registry-status.json` beside it once a second, which the admin endpoint's readiness reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

import uvloop

from gateway import envoy_config
from gateway.consul import Consul, ConsulRegistry, EndpointFeed, Endpoints
from gateway.observability import log, setup_logging
from gateway.settings import Settings

STATUS_FILE = "registry-status.json"


def status_path(cds: Path) -> Path:
    """Where the feed says how the registry stands."""
    return cds.with_name(STATUS_FILE)


async def _main(cds: Path) -> None:
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    consul = Consul(settings.consul_url, settings.consul_token)
    feed: EndpointFeed | None = None

    def publish(snap: Endpoints) -> None:
        ups = snap.registry.spec.upstreams
        secrets = envoy_config.Secrets(cds.parent / envoy_config.SDS_DIR)
        clusters = envoy_config.upstream_clusters(
            settings, snap.registry, {n: list(snap.of(n)) for n in ups}, secrets
        )
        for problem in secrets.problems():
            # Envoy refuses such a secret and the upstream's connections fail (503, fail closed).
            log().error("upstream_tls_files_do_not_load", problem=str(problem))
        secrets.write()  # before the clusters that name them
        version = envoy_config.write_clusters(cds, clusters)
        counts = {n: len(snap.of(n)) for n in sorted(ups)}
        log().info("clusters_published", registry=snap.registry.revision, version=version, endpoints=counts)

    def report() -> None:
        """Say how the registry stands, for /readyz (every second, and at once on a change)."""
        doc = {
            "source": source.source,
            "revision": source.revision,
            "healthy": source.healthy,
            "error": source.last_error,
            "time": time.time(),
        }
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        tmp.replace(out)

    def changed(src: ConsulRegistry) -> None:
        log().info("registry_loaded", source=src.source, revision=src.revision)
        if feed is not None:
            feed.registry_changed()
        report()

    def refused(src: ConsulRegistry) -> None:
        log().error(
            "registry_refused_keeping_last_good", source=src.source, kept=src.revision, error=src.last_error
        )
        if src.loaded.is_set():
            report()

    out = status_path(cds)
    source = ConsulRegistry(consul, settings.consul_key, settings.consul_stale_s, changed, refused)
    feed = EndpointFeed(source, publish)
    follower = asyncio.create_task(source.run())
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: task.cancel() if task else None)
    try:
        # A bad start refuses to serve: with no valid document in Consul, Envoy is not started.
        try:
            await asyncio.wait_for(source.loaded.wait(), max(settings.consul_stale_s, 5.0))
        except TimeoutError:
            sys.exit(f"ztgate cluster feed: no valid registry in {source.source}: {source.last_error}")
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                report()
                await asyncio.sleep(1.0)
    finally:
        follower.cancel()
        feed.stop()
        await consul.close()


def read_status(cds: Path, max_age_s: float = 5.0) -> dict[str, object]:
    """The feed's latest status; `healthy` is false when it is missing or older than `max_age_s`."""
    try:
        doc: dict[str, object] = json.loads(status_path(cds).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"healthy": False, "error": "the cluster feed has not reported"}
    age = time.time() - float(str(doc.get("time", 0)))
    if age > max_age_s:
        doc["healthy"], doc["error"] = False, f"the cluster feed has not reported for {age:.0f} s"
    return doc


def main() -> None:
    """Entry point."""
    if len(sys.argv) != 2:
        sys.exit("usage: python -m gateway.cluster_feed CDS_FILE")
    with contextlib.suppress(asyncio.CancelledError):  # SIGTERM during start-up
        uvloop.run(_main(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
