"""Building blocks of every rendered object: names, labels, owner references, security
contexts and the spec hash. Pure and deterministic."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MANAGED_BY: Final = "inferfleet"
ENGINE_APP: Final = "inferfleet-engine"
ROUTER_APP: Final = "inferfleet-router"

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_MODEL_DEPLOYMENT: Final = "inferfleet.io/model-deployment"
LABEL_ROLE: Final = "inferfleet.io/role"
LABEL_INFERENCE_SERVICE: Final = "inferfleet.io/inference-service"

SPEC_HASH_ANNOTATION: Final = "inferfleet.io/spec-hash"
PROMETHEUS_SCRAPE: Final = "prometheus.io/scrape"
PROMETHEUS_PORT: Final = "prometheus.io/port"
PROMETHEUS_PATH: Final = "prometheus.io/path"

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_MAX_LABEL = 63
_HASH_CHARS = 8


def spec_hash(obj: Any) -> str:
    """A short, stable digest of a JSON-able object (keys sorted, so dict order is irrelevant).
    Put on a pod template, it makes any change of what the pods run roll them out."""
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def dns_label(name: str) -> str:
    """`name` as an RFC 1035 label (Service names): itself when valid, else a cleaned,
    truncated form with a digest of the original, so distinct names stay distinct."""
    if _DNS_LABEL.match(name) and len(name) <= _MAX_LABEL:
        return name
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not cleaned[:1].isalpha():
        cleaned = f"x-{cleaned}"
    keep = _MAX_LABEL - _HASH_CHARS - 1
    return f"{cleaned[:keep].rstrip('-')}-{_digest(name)}"


def label_value(value: str) -> str:
    """`value` as a label value (63 characters at most), truncated with a digest if longer."""
    if _LABEL_VALUE.match(value) and len(value) <= _MAX_LABEL:
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")
    keep = _MAX_LABEL - _HASH_CHARS - 1
    return f"{cleaned[:keep].rstrip('-_.')}-{_digest(value)}"


@dataclass(frozen=True)
class Owner:
    """The custom resource the rendered objects belong to."""

    api_version: str
    kind: str
    name: str
    namespace: str | None
    uid: str | None

    @classmethod
    def of(cls, api_version: str, kind: str, metadata: Mapping[str, object]) -> Owner:
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{kind} metadata.name is required to render its objects")
        namespace = metadata.get("namespace")
        uid = metadata.get("uid")
        return cls(
            api_version,
            kind,
            name,
            namespace if isinstance(namespace, str) and namespace else None,
            uid if isinstance(uid, str) and uid else None,
        )

    def references(self) -> list[dict[str, Any]]:
        """The controller owner reference: deleting the resource deletes its objects, and
        foreground deletion waits for them. None without a uid (rendering offline)."""
        if self.uid is None:
            return []
        return [
            {
                "apiVersion": self.api_version,
                "kind": self.kind,
                "name": self.name,
                "uid": self.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def object_meta(
    name: str,
    owner: Owner,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner.namespace is not None:
        meta["namespace"] = owner.namespace
    meta["labels"] = dict(sorted(labels.items()))
    if annotations:
        meta["annotations"] = dict(sorted(annotations.items()))
    references = owner.references()
    if references:
        meta["ownerReferences"] = references
    return meta


def pod_security_context(run_as_user: int | None) -> dict[str, Any]:
    """Non-root where the image allows it (fsGroup makes the volumes writable for that user);
    the runtime's default seccomp profile either way."""
    context: dict[str, Any] = {}
    if run_as_user is not None:
        context.update(
            runAsNonRoot=True,
            runAsUser=run_as_user,
            runAsGroup=run_as_user,
            fsGroup=run_as_user,
        )
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


def container_security_context(added: Sequence[str] = ()) -> dict[str, Any]:
    """No capabilities and no privilege escalation: serving needs neither (GPUs come through
    the device plugin, not through privileges). `added`: the few a container's process needs
    back (an SSH daemon's privilege separation)."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if added:
        capabilities["add"] = sorted(added)
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def rolling_update(max_surge: int = 1, max_unavailable: int = 0) -> dict[str, Any]:
    """By default, surge one new replica before an old one goes: capacity never drops during a
    rollout (an engine's cold start takes minutes, and a GPU replica is a large share of
    capacity)."""
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
    }


def pod_disruption_budget(
    name: str, owner: Owner, labels: Mapping[str, str], selector: Mapping[str, str]
) -> dict[str, Any]:
    """At most one pod of the pool voluntarily down at a time. `maxUnavailable: 1` rather than
    a computed `minAvailable`: it follows every scaling decision without being re-rendered,
    and a pool of one replica can still be drained (minAvailable 1 would block node drains
    forever). Unhealthy pods may always be evicted, so a crash-looping engine never blocks a
    drain."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(name, owner, labels),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": dict(sorted(selector.items()))},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def account_role_binding(name: str, owner: Owner, labels: Mapping[str, str]) -> dict[str, Any]:
    """The RoleBinding that grants the ServiceAccount `name` the Role `name`, both the owner's,
    in its namespace."""
    # A ServiceAccount subject must name its namespace; with none given, kubectl's default.
    namespace = owner.namespace or "default"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta(name, owner, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


KIND_ORDER: Final = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "ConfigMap",
    "Secret",
    "PersistentVolumeClaim",
    "Service",
    "PodDisruptionBudget",
    "Job",
    "Deployment",
    "LeaderWorkerSet",
)
WORKLOAD_KINDS: Final = ("Deployment", "LeaderWorkerSet")
"""The kinds that run pods: their replicas are the scale, their status the rollout."""


def apply_order(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Configuration before the workloads that read it; by name within a kind."""
    return sorted(objects, key=lambda o: (KIND_ORDER.index(o["kind"]), str(o["metadata"]["name"])))
