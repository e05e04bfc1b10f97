"""Running the operator: kopf with the handlers of `inferfleet.reconcile.handlers`."""

from __future__ import annotations

from collections.abc import Sequence

import kopf

# Importing the module registers its handlers with kopf.
from inferfleet.reconcile import handlers  # noqa: F401


def run(namespaces: Sequence[str] = (), liveness_endpoint: str | None = None) -> None:
    """Block until SIGTERM/SIGINT. No namespaces: the whole cluster (needs the ClusterRole);
    some: only those (a namespaced Role in each suffices)."""
    kopf.configure(log_format=kopf.LogFormat.FULL)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=True,
        liveness_endpoint=liveness_endpoint,
    )
