"""What the operator's indices hold, per object: pure functions of the object as the API
server stores it, called by kopf's index handlers (`reconcile.handlers`), by the index of what
the operator created (`reconcile.children`) and by the controller where it must know what an
event or an apply changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferfleet.api.inference_service import KIND as INFERENCE_SERVICE
from inferfleet.api.model_deployment import KIND as MODEL_DEPLOYMENT
from inferfleet.api.model_deployment import Role
from inferfleet.kube import quantity
from inferfleet.reconcile.desired import APPLIED_HASH_ANNOTATION, Child, ObjectKey
from inferfleet.reconcile.fill import fill_state
from inferfleet.reconcile.status import RoleProgress
from inferfleet.render.common import LABEL_ROLE, WORKLOAD_KINDS


def _controlling_owner(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference of the ModelDeployment or InferenceService that made the object."""
    return next(
        (
            ref
            for ref in metadata.get("ownerReferences") or []
            if ref.get("controller") and ref.get("kind") in (MODEL_DEPLOYMENT, INFERENCE_SERVICE)
        ),
        None,
    )


def child_of(namespace: str, obj: Mapping[str, Any]) -> Child | None:
    """What the operator's index holds of an object it created (None: not one)."""
    metadata = obj.get("metadata") or {}
    owner = _controlling_owner(metadata)
    return None if owner is None else _child(obj, metadata, owner)


def _child(
    obj: Mapping[str, Any], metadata: Mapping[str, Any], owner: Mapping[str, Any]
) -> Child | None:
    if not obj.get("apiVersion") or not obj.get("kind"):
        return None
    key = ObjectKey(str(obj["apiVersion"]), str(obj["kind"]), str(metadata.get("name")))
    labels = metadata.get("labels") or {}
    role_label = labels.get(LABEL_ROLE)
    role = Role(str(role_label)) if role_label in Role._value2member_map_ else None
    workload = key.kind in WORKLOAD_KINDS
    replicas = (obj.get("spec") or {}).get("replicas") if workload else None
    of_deployment = owner.get("kind") == MODEL_DEPLOYMENT
    progress = RoleProgress.from_workload(obj) if workload else None
    return Child(
        key=key,
        owner_uid=str(owner.get("uid")),
        applied_hash=(metadata.get("annotations") or {}).get(APPLIED_HASH_ANNOTATION),
        replicas=replicas if isinstance(replicas, int) else None,
        role=role if of_deployment else None,
        progress=progress if of_deployment else None,
        serving=progress.available > 0 if progress is not None and not of_deployment else None,
        fill=fill_state(obj) if of_deployment else None,
    )


@dataclass(frozen=True)
class IndexedChild:
    """An object the operator created, as its index holds it: what its owner reads of it,
    which object its owner is, and its own identity."""

    child: Child
    owner: tuple[str, str]
    """The kind and name of the ModelDeployment or InferenceService that made it."""
    uid: str


def indexed_child(namespace: str, obj: Mapping[str, Any]) -> IndexedChild | None:
    metadata = obj.get("metadata") or {}
    owner = _controlling_owner(metadata)
    child = None if owner is None else _child(obj, metadata, owner)
    if child is None or owner is None:
        return None
    return IndexedChild(
        child, (str(owner.get("kind")), str(owner.get("name"))), str(metadata.get("uid", ""))
    )


GPU_QUOTA = "requests.nvidia.com/gpu"
"""The ResourceQuota resource that limits a namespace's GPUs (extended resources are quoted by
their requests only)."""


def gpu_quota_entry(namespace: str, quota: Mapping[str, Any]) -> dict[Any, Any]:
    """An index entry for a ResourceQuota on GPUs: the GPUs it leaves (hard - used, as the
    quota controller last counted them; the spec's hard limit before it has)."""
    status = quota.get("status") or {}
    hard = (status.get("hard") or (quota.get("spec") or {}).get("hard") or {}).get(GPU_QUOTA)
    if hard is None:
        return {}
    used = (status.get("used") or {}).get(GPU_QUOTA, "0")
    try:
        left = int(quantity(str(hard)) - quantity(str(used)))
    except ValueError:
        return {}
    return {("gpus", namespace): max(0, left)}
