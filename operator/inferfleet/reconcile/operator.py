"""Running the operator: kopf with the handlers of `inferfleet.reconcile.handlers`, alone or
only while this process leads (`reconcile.leadership`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

import kopf
from prometheus_client import start_http_server

from inferfleet.autoscale.controller import AutoscalerSettings
from inferfleet.autoscale.metrics import (
    KOPF_OBJECT_LOGGER,
    OperatorMetrics,
    ReconcileErrorCounter,
    registry_of,
)

# Importing the module registers its handlers with kopf.
from inferfleet.kube import Kube
from inferfleet.kube.lease import KubernetesLeaseStore
from inferfleet.reconcile import handlers  # noqa: F401
from inferfleet.reconcile.leadership import (
    LeaderElection,
    LeaderElector,
    election_loop_alive,
)
from inferfleet.render import InstallSettings

logger = logging.getLogger(__name__)
# What a leader that lost its lease exits with: not 0, so the kubelet restarts it as a follower.
EXIT_LEADERSHIP_LOST = 1


def run(
    namespaces: Sequence[str] = (),
    liveness_endpoint: str | None = None,
    install: InstallSettings | None = None,
    autoscaler: AutoscalerSettings | None = None,
    election: LeaderElection | None = None,
) -> None:
    """Block until SIGTERM/SIGINT. No namespaces: the whole cluster (needs the ClusterRole);
    some: only those (a namespaced Role in each suffices). `install`: the images and router
    discovery everything is rendered with; `autoscaler`: where the metrics are and how often
    each `policy: goodput` service ticks (handlers read both, and the namespaces, from kopf's
    memo). `election`:
    reconcile only while holding that Lease (a follower waits, answering its liveness probe);
    None: at once, alone."""
    kopf.configure(log_format=kopf.LogFormat.FULL)
    if election is None:
        _run_kopf(namespaces, liveness_endpoint, install, autoscaler)
        return
    store = KubernetesLeaseStore(
        Kube.from_environment().api_client, election.namespace, election.name, election.owner
    )
    elector = LeaderElector(store, election.identity, election.timing)
    stop = threading.Event()
    _stop_on_signals(stop)
    with _follower_health(liveness_endpoint, elector):
        logger.info(
            "leader election: %s is a candidate for Lease %s", elector.identity, store.where
        )
        acquired = elector.acquire(stop)
    if not acquired:
        logger.info("leader election: stopped while following")
        return
    renewal = elector.start_renewing(on_lost=_exit_lost)
    try:
        # SIGTERM between taking the lease and kopf's signal handlers: hand it straight back.
        if not stop.is_set():
            _run_kopf(namespaces, liveness_endpoint, install, autoscaler)
    finally:
        # kopf has stopped every handler: release, so a follower takes over at its next try
        # instead of after the lease runs out. Renewals stop first, lest one re-take it.
        renewal.stop()
        elector.release()


def _run_kopf(
    namespaces: Sequence[str],
    liveness_endpoint: str | None,
    install: InstallSettings | None,
    autoscaler: AutoscalerSettings | None,
) -> None:
    settings = kopf.OperatorSettings()
    # Named namespaces are served as named: no listing of every namespace, which a namespaced
    # install may not do (kopf would retry it, refused, for a minute before serving them).
    settings.scanning.disabled = bool(namespaces)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        settings=settings,
        standalone=True,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(
            install=install or InstallSettings(),
            autoscaler=autoscaler or AutoscalerSettings(),
            namespaces=tuple(namespaces),
        ),
    )


def _exit_lost(why: str) -> None:
    """A leader that cannot keep its lease stops acting at once, as controller-runtime does: no
    graceful shutdown (that could outlast the lease and overlap the next leader)."""
    logger.critical("leader election: leadership lost (%s); exiting", why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


def _stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop` until kopf installs its own handlers (if it runs)."""

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)


@contextmanager
def _follower_health(endpoint: str | None, elector: LeaderElector) -> Iterator[None]:
    """Answer the liveness probe at kopf's endpoint while following (kopf serves it only while
    it runs): 200 while the election loop keeps trying, 503 if it is stuck. Closed before kopf
    binds the same address."""
    if endpoint is None:
        yield
        return
    parts = urllib.parse.urlsplit(endpoint)
    path = parts.path or "/"

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if urllib.parse.urlsplit(self.path).path != path:
                self.send_error(404)
                return
            alive = election_loop_alive(elector.last_attempt_at, elector.now(), elector.timing)
            body = json.dumps(
                {"leading": elector.leading, "leader": elector.leader, "alive": alive}
            ).encode()
            self.send_response(200 if alive else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes every few seconds would drown the log.
            pass

    host = parts.hostname or "127.0.0.1"

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, parts.port or 80), Health)
    thread = threading.Thread(target=server.serve_forever, name="follower-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def serve_metrics(autoscaler: AutoscalerSettings, address: str, port: int) -> AutoscalerSettings:
    """Serve the operator's own metrics (`autoscale.metrics`) on `address:port` from a thread,
    and return `autoscaler` with its ticks recording into them; port 0: no metrics. A port
    that cannot be bound is logged, not fatal: reconciling matters more than being observed,
    and Prometheus shows the target down."""
    if port == 0:
        return autoscaler
    metrics = OperatorMetrics(expire_after_s=max(600.0, 10 * autoscaler.interval_s))
    try:
        start_http_server(port, address, registry_of(metrics))
    except OSError as error:
        logging.getLogger(__name__).error(
            "metrics not served: cannot listen on %s:%d (%s)", address, port, error
        )
        return autoscaler
    logging.getLogger(KOPF_OBJECT_LOGGER).addHandler(ReconcileErrorCounter(metrics))
    return dataclasses.replace(autoscaler, metrics=metrics)
