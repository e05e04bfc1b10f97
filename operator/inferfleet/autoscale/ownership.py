"""Which InferenceService autoscales a ModelDeployment (pure).

Several services may route to one ModelDeployment (weighted variants, a canary, a second
endpoint); at most one of them may choose its replicas, or their decisions overwrite each other
tick after tick. Every service that routes to a deployment with weight > 0 and `policy: goodput`
is a *claimant*; the *owner* is the claimant the deployment already records as its autoscaler
(`status.autoscaling.service`) while it still claims, else the oldest claimant (creation time,
then name). The rule is a function of what the cluster holds, so the operator, a restarted
operator and every tick agree on it without a lock.

A claim also carries the claimant's latest decision for the deployment (its `status.replicas`):
the ModelDeployment's reconcile reads the owner's decision as data and applies it, and no other
writer touches the workloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferfleet.api.inference_service import ReplicaBounds
from inferfleet.api.model_deployment import Bound, Role
from inferfleet.api.pins import PinLimits
from inferfleet.autoscale.advice import Advice
from inferfleet.autoscale.diagnosis import RoleDiagnosis

DEFAULT_MAX_REPLICAS = ReplicaBounds.model_fields["max_replicas"].default


@dataclass(frozen=True)
class Claim:
    """An InferenceService that routes to a ModelDeployment, as its object says."""

    service: str
    created: str
    """metadata.creationTimestamp (RFC 3339, so it sorts as text)."""
    autoscales: bool
    """Whether it routes with weight > 0 under `policy: goodput`."""
    replicas: Mapping[Role, int] = field(default_factory=dict)
    """Its latest decision for the deployment; empty before its first tick."""
    reason: str | None = None
    """Why it last changed the replicas (its `status.lastDecision`), if it has."""
    time: str | None = None
    max_replicas: Mapping[Role, int] = field(default_factory=dict)
    """Its autoscaling bounds per role (a pin may not exceed them)."""
    zero_roles: frozenset[Role] = frozenset()
    """Roles its bounds let go to zero replicas (minReplicas 0): a decision of zero for them
    is applied, any other is taken for a reading of an older status and ignored."""
    gpu_budget: int | None = None
    advice: tuple[Advice, ...] = ()
    """What its autoscaler advises changing in the deployment (its `status.advice`)."""
    diagnosis: tuple[RoleDiagnosis, ...] = ()
    """What its autoscaler finds limits each pool of the deployment (its `status.diagnosis`)."""

    def decided(self, roles: Iterable[Role]) -> dict[Role, int]:
        """Its decision for `roles`: zero only where its bounds allow it."""
        return {
            role: n
            for role, n in self.replicas.items()
            if role in roles and (n > 0 or role in self.zero_roles)
        }

    def pin_limits(self, gpus_per_replica: int) -> PinLimits:
        return PinLimits(self.service, self.max_replicas, gpus_per_replica, self.gpu_budget)


def claims_of(service: Mapping[str, Any]) -> dict[str, Claim]:
    """The claim an InferenceService object makes on each ModelDeployment it references, read
    from the object as stored. Tolerant by design: it indexes what the API server holds, which
    a newer or older schema may have written; what cannot be read claims nothing."""
    metadata, spec = _mapping(service.get("metadata")), _mapping(service.get("spec"))
    status = _mapping(service.get("status"))
    autoscaling = _mapping(spec.get("autoscaling"))
    goodput = autoscaling.get("policy") == "goodput"
    budget = autoscaling.get("gpuBudget")
    decided: dict[str, dict[Role, int]] = {}
    for entry in _list(status.get("replicas")):
        try:
            role, count = Role(entry["role"]), entry["replicas"]
            deployment = str(entry["deployment"])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            decided.setdefault(deployment, {})[role] = count
    last = _mapping(status.get("lastDecision"))
    advised = _advice(status.get("advice"))
    diagnosed = _diagnosis(status.get("diagnosis"))
    claims: dict[str, Claim] = {}
    for ref in _list(spec.get("deployments")):
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
            continue
        weight = ref.get("weight", 100)
        claims[ref["name"]] = Claim(
            service=str(metadata.get("name", "")),
            created=str(metadata.get("creationTimestamp") or ""),
            autoscales=goodput and isinstance(weight, int) and weight > 0,
            replicas=decided.get(ref["name"], {}),
            reason=str(last["reason"]) if last.get("reason") else None,
            time=str(last["time"]) if last.get("time") else None,
            max_replicas=_max_replicas(autoscaling),
            zero_roles=_zero_roles(autoscaling),
            gpu_budget=budget if isinstance(budget, int) and not isinstance(budget, bool) else None,
            advice=advised.get(ref["name"], ()),
            diagnosis=diagnosed.get(ref["name"], ()),
        )
    return claims


def _advice(entries: Any) -> dict[str, tuple[Advice, ...]]:
    """Per deployment, the advice a service's status holds; entries that do not read as
    advice are skipped."""
    advised: dict[str, tuple[Advice, ...]] = {}
    for raw in _list(entries):
        entry = _mapping(raw)
        deployment, reason = entry.get("deployment"), entry.get("reason")
        if not isinstance(deployment, str) or not isinstance(reason, str):
            continue
        advice = Advice(reason, str(entry.get("message", "")), _numbers(entry.get("inputs")))
        advised[deployment] = (*advised.get(deployment, ()), advice)
    return advised


def _diagnosis(entries: Any) -> dict[str, tuple[RoleDiagnosis, ...]]:
    """Per deployment, the diagnosis a service's status holds; entries that do not read as one
    (an unknown role or bound) are skipped."""
    diagnosed: dict[str, tuple[RoleDiagnosis, ...]] = {}
    for raw in _list(entries):
        entry = _mapping(raw)
        deployment = entry.get("deployment")
        try:
            role, bound = Role(str(entry.get("role"))), Bound(str(entry.get("bound")))
        except ValueError:
            continue
        if not isinstance(deployment, str):
            continue
        found = RoleDiagnosis(
            role, bound, str(entry.get("message", "")), _numbers(entry.get("inputs"))
        )
        diagnosed[deployment] = (*diagnosed.get(deployment, ()), found)
    return diagnosed


def _numbers(inputs: Any) -> dict[str, float]:
    return {
        str(k): float(v)
        for k, v in _mapping(inputs).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _max_replicas(autoscaling: Mapping[str, Any]) -> dict[Role, int]:
    """The most replicas per role, as the API defaults them when a role's bounds are absent."""
    most: dict[Role, int] = {}
    for role in Role:
        found = _mapping(autoscaling.get(role.value)).get("maxReplicas", DEFAULT_MAX_REPLICAS)
        if isinstance(found, int) and not isinstance(found, bool):
            most[role] = found
    return most


def _zero_roles(autoscaling: Mapping[str, Any]) -> frozenset[Role]:
    return frozenset(
        role for role in Role if _mapping(autoscaling.get(role.value)).get("minReplicas") == 0
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def autoscaling_owner(recorded: str | None, claims: Iterable[Claim]) -> Claim | None:
    """The claimant that autoscales the deployment: the one it records while that one still
    claims (ownership does not move while its holder wants it), else the oldest claimant."""
    claimants = [claim for claim in claims if claim.autoscales]
    for claim in claimants:
        if claim.service == recorded:
            return claim
    return min(claimants, key=lambda claim: (claim.created, claim.service), default=None)


def recorded_autoscaler(deployment: Mapping[str, Any]) -> str | None:
    """The service a ModelDeployment object records as its autoscaler, if any."""
    record = _mapping(_mapping(deployment.get("status")).get("autoscaling"))
    service = record.get("service")
    return service if isinstance(service, str) else None
