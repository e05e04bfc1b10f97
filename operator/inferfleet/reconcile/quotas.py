"""The leader's book of the services' claims on each namespace's GPU quota (`autoscale.quota`):
each service's last claim, and the PriorityClasses that order them. Held in memory on the
leader only; one round of ticks rebuilds it after a hand-over."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from inferfleet.api.model_deployment import ModelDeployment, Role
from inferfleet.autoscale.quota import PRIORITIES_TTL_S, GpuClaim, GpuQuota, Priorities, quota_share

logger = logging.getLogger(__name__)

CLAIM_LIFE_TICKS = 3
"""A claim lives this many ticks: a service deleted or no longer autoscaled stops holding."""


class QuotaBook:
    """`list_priorities`: the cluster's PriorityClasses (raises where they cannot be read)."""

    def __init__(self, list_priorities: Callable[[], Priorities]) -> None:
        self._list_priorities = list_priorities
        self._claims: dict[str, dict[str, GpuClaim]] = {}
        self._lock = threading.Lock()
        # The PriorityClasses as last read, and when (monotonic): read only where a namespace
        # has a GPU quota, so an install without the grant works but for the arbitration.
        self._priorities: tuple[float, Priorities] | None = None

    def quota(
        self,
        namespace: str,
        name: str,
        deployments: Mapping[str, ModelDeployment],
        *,
        left: int | None,
        pods: Mapping[str, Mapping[Role, int]],
        now_s: float,
        interval_s: float,
    ) -> GpuQuota | None:
        """What the namespace's GPU quota (`left`: the GPUs no pod holds; None: no quota on
        GPUs) leaves service `name` this tick, less what the other services' live claims ahead
        of it wait for; `pods`: per deployment, the replicas that exist per role."""
        expired = now_s - CLAIM_LIFE_TICKS * interval_s
        with self._lock:
            live = {
                service: claim
                for service, claim in self._claims.pop(namespace, {}).items()
                if claim.at_s >= expired
            }
            if left is not None:
                self._claims[namespace] = live
            claims = list(live.values())
        if left is None:
            return None
        own = live.get(name)
        priorities = self._read_priorities()
        priority = max(
            (priorities.of_deployment(md) for md in deployments.values()),
            default=priorities.default,
        )
        share = quota_share(name, priority, own is not None and own.slo_missed, left, claims)
        return GpuQuota(share.left, pods, priority, share.yields_to)

    def record(self, namespace: str, name: str, claim: GpuClaim) -> None:
        with self._lock:
            self._claims.setdefault(namespace, {})[name] = claim

    def _read_priorities(self) -> Priorities:
        """The PriorityClasses, read again when `PRIORITIES_TTL_S` old; what was read before
        (none at first: every service of priority 0) when they cannot be read (logged)."""
        now = time.monotonic()
        cached = self._priorities
        if cached is not None and now - cached[0] < PRIORITIES_TTL_S:
            return cached[1]
        try:
            read = self._list_priorities()
        except Exception as error:  # not granted, or the API server away: tried again later
            logger.warning("cannot read PriorityClasses (%s): GPU quota served unordered", error)
            read = cached[1] if cached is not None else Priorities()
        self._priorities = (now, read)
        return read
