"""Running the operator: kopf with the handlers of `inferfleet.reconcile.handlers`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

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
from inferfleet.reconcile import handlers  # noqa: F401
from inferfleet.render import InstallSettings


def run(
    namespaces: Sequence[str] = (),
    liveness_endpoint: str | None = None,
    install: InstallSettings | None = None,
    autoscaler: AutoscalerSettings | None = None,
) -> None:
    """Block until SIGTERM/SIGINT. No namespaces: the whole cluster (needs the ClusterRole);
    some: only those (a namespaced Role in each suffices). `install`: the images and router
    discovery everything is rendered with; `autoscaler`: where the metrics are and how often
    each `policy: goodput` service ticks (handlers read both from kopf's memo)."""
    kopf.configure(log_format=kopf.LogFormat.FULL)
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
            install=install or InstallSettings(), autoscaler=autoscaler or AutoscalerSettings()
        ),
    )


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
