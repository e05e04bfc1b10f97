"""Status of a ModelDeployment, computed from its plan and its workloads (pure), and built as
the typed status model, so that what is written is what the CRD's schema says.

Conditions follow Kubernetes conventions (`api.conditions`). `Ready` is the summary; `Fits`
is the planner's verdict; `Progressing` and `Degraded` follow the rollout (a stalled rollout,
pods the scheduler cannot place and pods the API server refuses, by quota or policy, degrade
it); `Pinned` says whether an SRE pin is in force, or why one is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inferfleet.api.conditions import condition
from inferfleet.api.model_deployment import (
    AutoscalingStatus,
    ModelDeploymentStatus,
    Role,
    RoleStatus,
)
from inferfleet.api.plan_status import CapacityPlanStatus, ColdStartEstimateStatus, MemoryBreakdown
from inferfleet.api.weight_cache import FillPhase, WeightCacheStatus
from inferfleet.planning.capacity import CapacityPlan
from inferfleet.reconcile.fill import weights_cached_condition

GIB = 1024**3


@dataclass(frozen=True)
class RoleProgress:
    """What the workload of one role reports: its Deployment, or its LeaderWorkerSet."""

    desired: int
    updated: int = 0
    ready: int = 0
    available: int = 0
    created: int = 0
    """Its pods that exist, ready or not (what a namespace's quota counts)."""
    observed_current: bool = True
    """Whether the Deployment controller has seen the latest Deployment spec."""
    stalled: str | None = None
    """The Deployment controller's message when the rollout passed its progress deadline."""
    refused: str | None = None
    """Its message when the API server refused to create pods (a namespace's ResourceQuota,
    a LimitRange, an admission policy)."""

    @classmethod
    def from_deployment(cls, deployment: Mapping[str, Any]) -> RoleProgress:
        spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
        generation = (deployment.get("metadata") or {}).get("generation", 0)
        conditions = status.get("conditions") or []
        stalled = next(
            (
                str(c.get("message", ""))
                for c in conditions
                if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
            ),
            None,
        )
        # The Deployment controller copies its ReplicaSet's failure to create pods here.
        refused = next(
            (
                str(c.get("message") or "the API server refused the pods")
                for c in conditions
                if c.get("type") == "ReplicaFailure" and c.get("status") == "True"
            ),
            None,
        )
        return cls(
            stalled=stalled,
            refused=refused,
            desired=int(spec.get("replicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            available=int(status.get("availableReplicas", 0)),
            created=int(status.get("replicas", 0)),
            observed_current=status.get("observedGeneration", 0) >= generation,
        )

    @classmethod
    def from_leader_worker_set(cls, lws: Mapping[str, Any]) -> RoleProgress:
        """A LeaderWorkerSet's groups, each a replica: created, updated, ready. LWS has no
        progress deadline, and a group is available when it is ready."""
        spec, status = lws.get("spec") or {}, lws.get("status") or {}
        generation = (lws.get("metadata") or {}).get("generation", 0)
        # Reported since LWS v0.9.0; with an earlier release the counts are taken as current.
        observed = status.get("observedGeneration")
        ready = int(status.get("readyReplicas", 0))
        return cls(
            desired=int(spec.get("replicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            ready=ready,
            available=ready,
            created=int(status.get("replicas", 0)),
            observed_current=observed is None or int(observed) >= generation,
        )

    @classmethod
    def from_workload(cls, workload: Mapping[str, Any]) -> RoleProgress:
        """What a role's Deployment or LeaderWorkerSet reports."""
        if workload.get("kind") == "LeaderWorkerSet":
            return cls.from_leader_worker_set(workload)
        return cls.from_deployment(workload)

    @property
    def rolled_out(self) -> bool:
        return (
            self.observed_current
            and self.updated == self.desired
            and self.available == self.desired
            and self.ready == self.desired
        )


@dataclass(frozen=True)
class Blocked:
    """Why the spec was not applied (existing workloads are then left as they were)."""

    reason: str
    """InvalidSpec, SpecNotApplied, NameCollision or ApplyRefused."""
    message: str
    recheck_after_s: float | None = None
    """When what blocks it may have changed without an event that says so (a CRD installed)."""


@dataclass(frozen=True)
class PinState:
    """The Pinned condition's inputs: the pin in force (described), or why one is ignored."""

    in_force: str | None = None
    ignored: str | None = None


def plan_status(plan: CapacityPlan) -> CapacityPlanStatus:
    memory = plan.memory
    predicted = (
        {
            "predicted_ttft_ms": round(plan.idle_ttft_s * 1e3, 2),
            "predicted_tpot_ms": round(plan.idle_tpot_s * 1e3, 3),
        }
        if memory.fits
        else {}
    )
    return CapacityPlanStatus(
        fits=memory.fits,
        gpus_per_replica=plan.config.gpus,
        memory_per_gpu=MemoryBreakdown(
            total_gib=round(memory.total / GIB, 2),
            usable_gib=round(memory.usable / GIB, 2),
            weights_gib=round(memory.weights / GIB, 2),
            activation_gib=round(memory.activations / GIB, 2),
            runtime_gib=round(memory.runtime / GIB, 2),
            kv_cache_gib=round(memory.kv_cache / GIB, 2),
        ),
        kv_capacity_tokens=memory.kv_capacity_tokens,
        max_concurrency=memory.max_concurrency(memory.context_limit),
        message=memory.verdict(),
        cold_start=None
        if plan.cold_start is None
        else ColdStartEstimateStatus(
            weight_source=plan.cold_start.source,
            estimated_seconds=round(plan.cold_start.seconds, 1),
            message=plan.cold_start.describe(),
        ),
        **predicted,
    )


def model_deployment_status(
    *,
    generation: int,
    plan: CapacityPlan,
    roles: Mapping[Role, RoleProgress],
    serving_role: Role,
    selector: str,
    previous: Mapping[str, Any],
    now: datetime,
    blocked: Blocked | None = None,
    pinned: frozenset[Role] | set[Role] = frozenset(),
    pin: PinState | None = None,
    unschedulable: Mapping[Role, str] | None = None,
    autoscaling: AutoscalingStatus | None = None,
    generated_secrets: Sequence[str] = (),
    weight_cache: WeightCacheStatus | None = None,
) -> ModelDeploymentStatus:
    """The whole status. `unschedulable`: per role, the scheduler's reason for pods it cannot
    place; `autoscaling`: the record of the InferenceService whose decision is applied;
    `generated_secrets`: the names of the Secrets with generated data it has."""
    conditions_before: Sequence[Mapping[str, Any]] = previous.get("conditions") or []
    fits = plan.memory.fits
    serving = roles.get(serving_role, RoleProgress(desired=0))

    def cond(type_: str, status: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(
            conditions_before, type_, status=status, reason=reason, message=message,
            generation=generation, now=now,
        )  # fmt: skip

    ready, progressing = _rollout(cond, roles, blocked, weight_cache)
    conditions = [
        ready,
        cond("Fits", fits, "Fits" if fits else "DoesNotFit", plan.memory.verdict()),
        progressing,
        _degraded(cond, roles, unschedulable or {}),
        _pinned(cond, pin or PinState()),
    ]
    if weight_cache is not None:
        conditions.append(
            weights_cached_condition(
                conditions_before, weight_cache, generation=generation, now=now
            )
        )
    fields = {
        "observedGeneration": generation,
        "conditions": conditions,
        "replicas": serving.desired,
        "readyReplicas": serving.ready,
        "selector": selector,
        "roles": [
            RoleStatus(role=role, desired=p.desired, ready=p.ready, pinned=role in pinned)
            for role, p in roles.items()
        ],
        "plan": plan_status(plan),
        "autoscaling": autoscaling,
        "generatedSecrets": sorted(generated_secrets) or None,
        "weightCache": weight_cache,
    }
    # An absent field, not a null: the status model refuses nulls as the API server does.
    return ModelDeploymentStatus.model_validate(
        {key: value for key, value in fields.items() if value is not None}
    )


def _rollout(
    cond: Any,
    roles: Mapping[Role, RoleProgress],
    blocked: Blocked | None,
    weight_cache: WeightCacheStatus | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`Ready` and `Progressing`."""
    rolled_out = bool(roles) and all(progress.rolled_out for progress in roles.values())
    unready = {role: p for role, p in roles.items() if p.ready < p.desired}
    if blocked:
        ready = cond("Ready", False, blocked.reason, blocked.message)
        progressing = cond("Progressing", False, blocked.reason, blocked.message)
    elif rolled_out and all(p.desired == 0 for p in roles.values()):
        idle = "no replica runs; the service's router holds requests while the pools wake"
        ready = cond("Ready", True, "ScaledToZero", idle)
        progressing = cond("Progressing", False, "RolloutComplete", _replicas_message(roles))
    elif rolled_out:
        ready = cond("Ready", True, "AllReplicasReady", _replicas_message(roles))
        progressing = cond("Progressing", False, "RolloutComplete", _replicas_message(roles))
    elif weight_cache is not None and weight_cache.phase != FillPhase.FILLED:
        # The replicas wait for the fill (`render.weight_cache`): said, rather than unready.
        ready = cond("Ready", False, "WeightsNotCached", weight_cache.message)
        progressing = cond("Progressing", True, "FillingWeightCache", weight_cache.message)
    else:
        waiting = ", ".join(f"{r.value} {p.ready}/{p.desired} ready" for r, p in unready.items())
        ready = cond("Ready", False, "ReplicasNotReady", waiting or "rollout in progress")
        progressing = cond("Progressing", True, "RollingOut", waiting or "updating replicas")
    return ready, progressing


QUOTA_REFUSAL = "exceeded quota"
"""What the API server's ResourceQuota admission says when a pod would pass a quota."""


def _degraded(
    cond: Any, roles: Mapping[Role, RoleProgress], unschedulable: Mapping[Role, str]
) -> dict[str, Any]:
    stalled = {role: p.stalled for role, p in roles.items() if p.stalled}
    refused = {role: p.refused for role, p in roles.items() if p.refused}
    if refused:
        message = "; ".join(f"{role.value}: {why}" for role, why in sorted(refused.items()))
        # A quota is the platform's limit, not a fault of the spec: said apart so that an SRE
        # asks for quota rather than debugging the pods.
        reason = "QuotaExhausted" if QUOTA_REFUSAL in message else "PodsRefused"
        return dict(cond("Degraded", True, reason, message))
    if unschedulable:
        message = "; ".join(f"{role.value}: {why}" for role, why in sorted(unschedulable.items()))
        return dict(cond("Degraded", True, "Unschedulable", message))
    if stalled:
        message = "; ".join(f"{role.value}: {why}" for role, why in stalled.items())
        return dict(cond("Degraded", True, "RolloutStalled", message))
    return dict(cond("Degraded", False, "AsPlanned", ""))


def _pinned(cond: Any, pin: PinState) -> dict[str, Any]:
    if pin.in_force is not None:
        return dict(cond("Pinned", True, "PinInForce", pin.in_force))
    if pin.ignored is not None:
        return dict(cond("Pinned", False, "PinIgnored", pin.ignored))
    return dict(cond("Pinned", False, "NotPinned", "replicas follow the spec or the autoscaler"))


def _replicas_message(roles: Mapping[Role, RoleProgress]) -> str:
    return ", ".join(f"{role.value} {p.ready}/{p.desired} ready" for role, p in roles.items())
