"""Running the operator: kopf with the handlers of `inferfleet.reconcile.handlers`."""

from __future__ import annotations

from collections.abc import Sequence

import kopf

from inferfleet.autoscale.controller import AutoscalerSettings

# Importing the module registers its handlers with kopf.
from inferfleet.reconcile import handlers  # noqa: F401
from inferfleet.router.config import DiscoveryMode


def run(
    namespaces: Sequence[str] = (),
    liveness_endpoint: str | None = None,
    router_discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES,
    autoscaler: AutoscalerSettings | None = None,
) -> None:
    """Block until SIGTERM/SIGINT. No namespaces: the whole cluster (needs the ClusterRole);
    some: only those (a namespaced Role in each suffices). `router_discovery`: how the
    routers it renders find their replicas; `autoscaler`: where the metrics are and how often
    each `policy: goodput` service ticks (handlers read both from kopf's memo)."""
    kopf.configure(log_format=kopf.LogFormat.FULL)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=True,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(
            router_discovery=router_discovery, autoscaler=autoscaler or AutoscalerSettings()
        ),
    )
