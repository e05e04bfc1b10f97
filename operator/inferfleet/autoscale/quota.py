"""A namespace's GPU quota shared between the services that autoscale in it.

The quota controller counts the GPUs a namespace's pods hold; what is left goes to whoever asks
first unless the autoscaler arbitrates. Each service's tick leaves a `GpuClaim` (what it holds,
what it would hold without the quota, its priority, whether its SLO is missed); the next tick
of another service sees the quota less what the claims ahead of it wait for (`quota_share`):

* a claim of a higher priority (the PriorityClass value of the engine pods, as the scheduler
  orders preemption) is served before this service grows, and this service gives back GPUs it
  holds, down to its minReplicas, while the higher one waits for them;
* a claim of the same priority whose SLO is missed, where this service's is not, is served
  from the GPUs no pod holds before this service grows; nothing is taken back within a
  priority, so two services of one tier never trade GPUs back and forth.

Pure: the controller keeps the claims (in memory, on the leader) and reads the quota and the
priorities from its indices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.spec import PolicySpec


@dataclass(frozen=True)
class GpuClaim:
    """What one service's last tick asked of its namespace's GPU quota."""

    service: str
    priority: int
    """The PriorityClass value of its engine pods (0 without one, as for pods)."""
    slo_missed: bool
    held: int
    """GPUs its replicas hold (pods that exist)."""
    wanted: int
    """GPUs its decision would hold with no quota (its own budget and bounds applied)."""
    at_s: float
    """When the claim was made (the controller's monotonic clock): claims expire."""

    @property
    def waiting(self) -> int:
        """GPUs it waits for beyond those it holds."""
        return max(0, self.wanted - self.held)

    def describe(self) -> str:
        missed = ", SLO missed" if self.slo_missed else ""
        return f"{self.service} (priority {self.priority}{missed}, waits for {self.waiting})"


@dataclass(frozen=True)
class QuotaShare:
    left: int
    """GPUs the service may add to those its pods hold; negative: GPUs it gives back."""
    yields_to: tuple[GpuClaim, ...] = ()
    """The claims served before it, highest priority first."""


def quota_share(
    service: str,
    priority: int,
    slo_missed: bool,
    left: int,
    claims: Iterable[GpuClaim],
) -> QuotaShare:
    """The share of the `left` GPUs no pod of the namespace holds that `service` may take,
    given the other services' `claims` (see the module's rules)."""
    higher = [c for c in claims if c.service != service and c.priority > priority and c.waiting]
    level = [
        c
        for c in claims
        if c.service != service
        and c.priority == priority
        and c.slo_missed
        and not slo_missed
        and c.waiting
    ]
    after_higher = left - sum(c.waiting for c in higher)
    if after_higher < 0:
        share = after_higher  # given back, down to its minReplicas (the policy's constraints)
    else:
        share = max(0, after_higher - sum(c.waiting for c in level))
    yields = tuple(sorted([*higher, *level], key=lambda c: (-c.priority, c.service)))
    return QuotaShare(share, yields if share < left else ())


@dataclass(frozen=True)
class GpuQuota:
    """What a namespace's ResourceQuota on GPUs leaves one service's tick."""

    left: int
    """GPUs no pod of the namespace holds yet, less those held for the claims ahead of this
    service (negative: GPUs it gives back)."""
    pods: Mapping[str, Mapping[Role, int]]
    """Per deployment and role, the pods that exist (their GPUs count against the quota)."""
    priority: int = 0
    """The service's priority (the PriorityClass value of its engine pods)."""
    yields_to: tuple[GpuClaim, ...] = field(default=())
    """The claims of other services served first (`quota_share`)."""

    def limit(self, deployment: str, spec: PolicySpec) -> PolicySpec:
        """`spec` with the GPUs `deployment` may hold: those its pods hold now and its share of
        those left."""
        held = self.held(deployment, spec)
        return replace(spec, gpu_quota=max(0, self.left + held), quota_yields_to=self.yielded())

    def held(self, deployment: str, spec: PolicySpec) -> int:
        pods = self.pods.get(deployment, {})
        return sum(pods.get(p.role, 0) * p.gpus_per_replica for p in spec.roles)

    def yielded(self) -> str:
        """In words, the claims served first ("" when none)."""
        return ", ".join(c.describe() for c in self.yields_to)
