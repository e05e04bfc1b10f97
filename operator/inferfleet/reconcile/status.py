"""Status of a ModelDeployment, computed from its plan and its workloads (pure).

Conditions follow Kubernetes conventions: one per type, `lastTransitionTime` moves only when the
status flips, `observedGeneration` says which spec they judge. `Ready` is the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.planning.capacity import CapacityPlan

GIB = 1024**3


@dataclass(frozen=True)
class RoleProgress:
    """What the Deployment of one role reports."""

    desired: int
    updated: int = 0
    ready: int = 0
    available: int = 0
    observed_current: bool = True
    """Whether the Deployment controller has seen the latest Deployment spec."""
    stalled: str | None = None
    """The Deployment controller's message when the rollout passed its progress deadline."""

    @classmethod
    def from_deployment(cls, deployment: Mapping[str, Any]) -> RoleProgress:
        spec, status = deployment.get("spec", {}), deployment.get("status") or {}
        generation = deployment.get("metadata", {}).get("generation", 0)
        stalled = next(
            (
                str(c.get("message", ""))
                for c in status.get("conditions") or []
                if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
            ),
            None,
        )
        return cls(
            stalled=stalled,
            desired=int(spec.get("replicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            available=int(status.get("availableReplicas", 0)),
            observed_current=status.get("observedGeneration", 0) >= generation,
        )

    @property
    def rolled_out(self) -> bool:
        return (
            self.observed_current
            and self.updated == self.desired
            and self.available == self.desired
            and self.ready == self.desired
        )


def condition(
    previous: Sequence[Mapping[str, Any]],
    type_: str,
    *,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    """A condition, keeping the previous transition time when the status did not flip."""
    value = "True" if status else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == value and before.get("lastTransitionTime")
        else now.isoformat().replace("+00:00", "Z")
    )
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }


def with_condition(
    conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """`conditions` with `new` in place of the one of its type, the others kept in order: the
    list is keyed by type, and each type has one writer, which must not drop the others'."""
    kept = [dict(c) for c in conditions if c.get("type") != new["type"]]
    index = next((i for i, c in enumerate(conditions) if c.get("type") == new["type"]), len(kept))
    return [*kept[:index], dict(new), *kept[index:]]


def plan_status(plan: CapacityPlan) -> dict[str, Any]:
    memory = plan.memory
    return {
        "fits": memory.fits,
        "gpusPerReplica": plan.config.gpus,
        "memoryPerGpu": {
            "totalGib": round(memory.total / GIB, 2),
            "usableGib": round(memory.usable / GIB, 2),
            "weightsGib": round(memory.weights / GIB, 2),
            "activationGib": round(memory.activations / GIB, 2),
            "runtimeGib": round(memory.runtime / GIB, 2),
            "kvCacheGib": round(memory.kv_cache / GIB, 2),
        },
        "kvCapacityTokens": memory.kv_capacity_tokens,
        "maxConcurrency": memory.max_concurrency(memory.context_limit),
        "predictedTtftMs": round(plan.idle_ttft_s * 1e3, 2) if memory.fits else None,
        "predictedTpotMs": round(plan.idle_tpot_s * 1e3, 3) if memory.fits else None,
        "message": memory.verdict(),
    }


def model_deployment_status(
    *,
    generation: int,
    plan: CapacityPlan,
    roles: Mapping[Role, RoleProgress],
    serving_role: Role,
    selector: str,
    previous: Mapping[str, Any],
    now: datetime,
    blocked: str | None = None,
    pinned: frozenset[Role] | set[Role] = frozenset(),
) -> dict[str, Any]:
    """The whole status. `blocked` explains why the spec was not applied (does not fit, or the
    engine cannot honour it); existing workloads are then left as they were."""
    conditions_before: Sequence[Mapping[str, Any]] = previous.get("conditions") or []
    fits = plan.memory.fits
    rolled_out = bool(roles) and all(progress.rolled_out for progress in roles.values())
    unready = {role: p for role, p in roles.items() if p.ready < p.desired}
    serving = roles.get(serving_role, RoleProgress(desired=0))

    def cond(type_: str, status: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(
            conditions_before,
            type_,
            status=status,
            reason=reason,
            message=message,
            generation=generation,
            now=now,
        )

    if blocked:
        ready = cond("Ready", False, "SpecNotApplied", blocked)
        progressing = cond("Progressing", False, "SpecNotApplied", blocked)
    elif rolled_out:
        ready = cond("Ready", True, "AllReplicasReady", _replicas_message(roles))
        progressing = cond("Progressing", False, "RolloutComplete", _replicas_message(roles))
    else:
        waiting = ", ".join(f"{r.value} {p.ready}/{p.desired} ready" for r, p in unready.items())
        ready = cond("Ready", False, "ReplicasNotReady", waiting or "rollout in progress")
        progressing = cond("Progressing", True, "RollingOut", waiting or "updating replicas")
    stalled = {role: p.stalled for role, p in roles.items() if p.stalled}
    degraded = cond(
        "Degraded",
        bool(stalled),
        "RolloutStalled" if stalled else "AsPlanned",
        "; ".join(f"{role.value}: {message}" for role, message in stalled.items()),
    )
    return {
        "observedGeneration": generation,
        "conditions": [
            ready,
            cond("Fits", fits, "Fits" if fits else "DoesNotFit", plan.memory.verdict()),
            progressing,
            degraded,
        ],
        "replicas": serving.desired,
        "readyReplicas": serving.ready,
        "selector": selector,
        "roles": [
            {"role": role.value, "desired": p.desired, "ready": p.ready, "pinned": role in pinned}
            for role, p in roles.items()
        ],
        "plan": plan_status(plan),
    }


def _replicas_message(roles: Mapping[Role, RoleProgress]) -> str:
    return ", ".join(f"{role.value} {p.ready}/{p.desired} ready" for role, p in roles.items())
