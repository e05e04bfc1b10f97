"""What reconciles read of the cluster: kopf's indices of the operator's resources and quotas,
the index of what the operator created (`reconcile.children`) and that of the engine pods the
scheduler cannot place (`reconcile.pods`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.ownership import Claim
from inferfleet.reconcile.children import ChildrenIndex
from inferfleet.reconcile.desired import Child, Namespace, ObjectKey
from inferfleet.reconcile.pods import UnschedulablePods
from inferfleet.render.common import label_value


class Indices:
    """Reads of kopf's indices (each key maps to the values of the objects that gave it) and of
    the operator's own (what it created, the engine pods it explains)."""

    def __init__(
        self,
        indices: Mapping[str, Any],
        children: ChildrenIndex | None = None,
        pods: UnschedulablePods | None = None,
    ) -> None:
        self._indices = indices
        self._children = children if children is not None else ChildrenIndex()
        self._pods = pods if pods is not None else UnschedulablePods()

    def _values(self, index: str, key: Any) -> list[Any]:
        found = self._indices.get(index)
        return list(found.get(key, ())) if found is not None else []

    def model_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(iter(self._values("model_deployments", (namespace, name))), None)

    def model_deployment_named(self, namespace: str, label: str) -> str | None:
        return next(iter(self._values("model_deployments", ("label", namespace, label))), None)

    def inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(iter(self._values("inference_services", (namespace, name))), None)

    def inference_services(self) -> Iterable[tuple[str, str]]:
        found = self._indices.get("inference_services") or {}
        return [key for key in list(found) if len(key) == 2]

    def claims(self, namespace: str, deployment: str) -> list[Claim]:
        return self._values("inference_services", ("backend", namespace, deployment))

    def children(self, namespace: str, uid: str) -> list[Child]:
        return self._children.children(namespace, uid)

    def holder(self, namespace: str, key: ObjectKey) -> str | None:
        """The uid of the resource whose child holds the name."""
        return self._children.holder(namespace, key)

    def namespace(self, namespace: str, uid: str) -> Namespace:
        return Namespace(
            children=self.children(namespace, uid),
            holder=functools.partial(self.holder, namespace),
        )

    def gpu_quota_left(self, namespace: str) -> int | None:
        """The GPUs the namespace's quotas leave (the tightest); None: no quota on GPUs."""
        return min(self._values("gpu_quotas", ("gpus", namespace)), default=None)

    def pods_created(self, namespace: str, uid: str) -> dict[Role, int]:
        """Per role, the replicas of a ModelDeployment that exist (pods, or groups of pods over
        several nodes; both, while a role changes kind, as both hold GPUs)."""
        created: dict[Role, int] = {}
        for child in self.children(namespace, uid):
            if child.role is not None and child.progress is not None:
                created[child.role] = created.get(child.role, 0) + child.progress.created
        return created

    def unschedulable(self, namespace: str, deployment: str) -> dict[Role, str]:
        pods: dict[Role, list[tuple[str, str]]] = {}
        for pod, held in self._pods.of(namespace, label_value(deployment)).items():
            pods.setdefault(held.role, []).append((pod, held.why))
        return {
            role: f"{len(found)} pod(s) unschedulable ({min(found)[0]}): {min(found)[1]}"
            for role, found in pods.items()
        }
