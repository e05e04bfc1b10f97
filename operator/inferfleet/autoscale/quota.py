"""A namespace's GPU quota shared between the services that autoscale in it.

The quota controller counts the GPUs a namespace's pods hold; what is left goes to whoever asks
first unless the autoscaler arbitrates. Each service's tick leaves a `GpuClaim` (what its pods
hold, what it would hold without the quota, its priority, whether its SLO is missed); the next
tick of another service sees the GPUs no pod holds less those the claims ahead of it wait for
(`quota_share`):

* a claim of a higher priority (the PriorityClass value of the engine pods, the order in which
  the scheduler preempts) is served first;
* then, within a priority, a claim whose SLO is missed, where this service's is not.

A service never grows into GPUs a claim ahead of it waits for; what a service's pods hold is
never taken back (no preemption: a service gives GPUs back when its own load falls). A claim
is read as its service last made it, so for one tick after the service grew its claim still
waits for GPUs its new pods hold: the others wait a tick longer, and nothing is cut.

Pure: the controller keeps the claims (in memory, on the leader) and reads the quota and the
priorities."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from inferfleet.api.model_deployment import ModelDeployment, Role
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
    """When the claim was made (seconds since the epoch, the tick's clock): claims expire."""

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
    """GPUs the service may add to those its pods hold."""
    yields_to: tuple[GpuClaim, ...] = ()
    """The claims served before it, highest priority first (none when nothing is held
    back from it)."""


def quota_share(
    service: str,
    priority: int,
    slo_missed: bool,
    left: int,
    claims: Iterable[GpuClaim],
) -> QuotaShare:
    """The share of the `left` GPUs no pod of the namespace holds that `service` may take,
    given the other services' `claims` (see the module's rules)."""

    def ahead(claim: GpuClaim) -> bool:
        if claim.service == service or not claim.waiting:
            return False
        if claim.priority != priority:
            return claim.priority > priority
        return claim.slo_missed and not slo_missed

    first = sorted((c for c in claims if ahead(c)), key=lambda c: (-c.priority, c.service))
    share = max(0, left - sum(c.waiting for c in first))
    return QuotaShare(share, tuple(first) if share < left else ())


@dataclass(frozen=True)
class GpuQuota:
    """What a namespace's ResourceQuota on GPUs leaves one service's tick."""

    left: int
    """GPUs no pod of the namespace holds yet, less those held for the claims ahead of this
    service."""
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
        return replace(spec, gpu_quota=self.left + held, quota_yields_to=self.yielded())

    def after(self, deployment: str, spec: PolicySpec, replicas: Mapping[Role, int]) -> GpuQuota:
        """What is left for the next deployment of the same tick once `deployment` is decided
        to hold `replicas`: the GPUs it takes beyond those its pods hold are no longer free
        (those it gives back are, only once its pods are gone)."""
        taken = max(0, spec.gpus(replicas) - self.held(deployment, spec))
        return replace(self, left=max(0, self.left - taken))

    def held(self, deployment: str, spec: PolicySpec) -> int:
        return spec.gpus(self.pods.get(deployment, {}))

    def yielded(self) -> str:
        """In words, the claims served first ("" when none)."""
        return ", ".join(c.describe() for c in self.yields_to)


@dataclass(frozen=True)
class Priorities:
    """The PriorityClasses' values, as the API server gives them to pods."""

    values: Mapping[str, int] = field(default_factory=dict)
    default: int = 0
    """The global default's value: a pod that names no class gets it (0 without one)."""

    @classmethod
    def of(cls, classes: Iterable[Mapping[str, Any]]) -> Priorities:
        values: dict[str, int] = {}
        default = 0
        for obj in classes:
            value = obj.get("value")
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            values[str((obj.get("metadata") or {}).get("name"))] = value
            if obj.get("globalDefault") is True:
                default = value
        return cls(values, default)

    def of_deployment(self, md: ModelDeployment) -> int:
        """The priority of a ModelDeployment's engine pods."""
        scheduling = md.spec.scheduling
        return self.priority(scheduling.priority_class_name if scheduling else None)

    def priority(self, class_name: str | None) -> int:
        """The priority of pods of PriorityClass `class_name` (None: the default); 0 for a
        class not read (the API server would not admit such pods)."""
        return self.values.get(class_name, 0) if class_name else self.default


PRIORITIES_TTL_S: Final = 60.0
"""How long the PriorityClasses read are used before they are read again (they change when a
platform team installs a tier, rarely)."""
