"""The engine pods the scheduler cannot place, as the operator's watch of them last showed them
(`reconcile.watches`): per ModelDeployment (by the value of its pods' label), which pods, of
which role, and the scheduler's reason, for the Degraded condition its status reports.

Only pending engine pods bound to no node are streamed (`ENGINE_PODS`): a pod the scheduler
binds leaves the stream, as a deletion, and the index with it; its start and its status from
then on are never sent, however many pods the cluster runs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.reconcile.children import MANAGED
from inferfleet.reconcile.watches import Watched
from inferfleet.render.common import LABEL_MODEL_DEPLOYMENT, LABEL_ROLE

ENGINE_PODS = Watched(
    "v1",
    "Pod",
    f"{MANAGED},{LABEL_MODEL_DEPLOYMENT}",
    field_selector="status.phase=Pending,spec.nodeName=",
)
"""Engine pods (their ModelDeployment explains them; a router's pods have no such label) that
no node is theirs yet."""


@dataclass(frozen=True)
class Unschedulable:
    """An engine pod the scheduler cannot place."""

    deployment: str
    """The value of its `inferfleet.io/model-deployment` label."""
    role: Role
    why: str


def unschedulable(pod: Mapping[str, Any]) -> Unschedulable | None:
    """The pod, where it is an engine pod whose PodScheduled condition says Unschedulable."""
    metadata = pod.get("metadata")
    status = pod.get("status")
    if not isinstance(metadata, Mapping) or not isinstance(status, Mapping):
        return None
    labels = metadata.get("labels") or {}
    deployment, role = labels.get(LABEL_MODEL_DEPLOYMENT), labels.get(LABEL_ROLE)
    if not deployment or role not in Role._value2member_map_:
        return None
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            why = str(cond.get("message") or "the scheduler gave no reason")
            return Unschedulable(str(deployment), Role(str(role)), why)
    return None


class UnschedulablePods:
    """Written on the event loop only; read by reconciles on worker threads, which each get a
    mapping no write changes after it is published."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], Unschedulable] = {}
        self._by_deployment: dict[tuple[str, str], Mapping[str, Unschedulable]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def update(self, namespace: str, pod: Mapping[str, Any], *, gone: bool) -> set[str]:
        """The pod as its watch shows it now (`gone`: deleted or bound); the deployments (by
        label value) whose unschedulable pods or reasons changed."""
        metadata = pod.get("metadata")
        name = str(metadata.get("name")) if isinstance(metadata, Mapping) else ""
        now = None if gone else unschedulable(pod)
        before = self._held.get((namespace, name))
        if now == before:
            return set()
        if before is not None:
            self._drop(namespace, name, before)
        if now is not None:
            self._held[(namespace, name)] = now
            key = (namespace, now.deployment)
            self._by_deployment[key] = {**self._by_deployment.get(key, {}), name: now}
        return {held.deployment for held in (before, now) if held is not None}

    def _drop(self, namespace: str, name: str, held: Unschedulable) -> None:
        del self._held[(namespace, name)]
        key = (namespace, held.deployment)
        left = {pod: each for pod, each in self._by_deployment.get(key, {}).items() if pod != name}
        if left:
            self._by_deployment[key] = left
        else:
            self._by_deployment.pop(key, None)

    def unlisted(
        self, namespace: str | None, listed: Iterable[tuple[str, str]]
    ) -> set[tuple[str, str]]:
        """Those (in `namespace`, or in all where None) that a new list lacks: bound or deleted
        while no watch ran. Dropped; returns the (namespace, deployment label) of each."""
        kept = set(listed)
        stale = [
            (ns, name, held)
            for (ns, name), held in list(self._held.items())
            if (namespace is None or ns == namespace) and (ns, name) not in kept
        ]
        for ns, name, held in stale:
            self._drop(ns, name, held)
        return {(ns, held.deployment) for ns, _, held in stale}

    def of(self, namespace: str, deployment: str) -> Mapping[str, Unschedulable]:
        """The unschedulable pods (by name) of the deployment whose label value is given."""
        return self._by_deployment.get((namespace, deployment), {})
