"""Least-privilege RBAC for the operator, rendered as YAML files for `deploy/rbac/`.

Two complete installs, each a ServiceAccount and its grants:
* `cluster-wide.yaml`: a ClusterRole and ClusterRoleBinding; the operator watches every
  namespace;
* `single-namespace.yaml`: a Role and RoleBinding in the watched namespace, plus a ClusterRole
  that only reads CustomResourceDefinitions (which are cluster-scoped).
Both add a Role and RoleBinding for leader election in the operator's own namespace: its Lease
lives there, and no other namespace's Leases are touched.

Every rule carries its reason, printed in the files' headers. Not granted, on purpose: the
spec of a user's resource is never written (only the status subresource, and `patch` to
remove the finalizer earlier versions set); no reading of Secrets (engines read the Hugging
Face token by reference, the kubelet resolves it; the SSH keys of a multi-node TensorRT-LLM
group are created once, with `create` alone, and never read back or updated); Leases only in
the operator's own namespace, without `patch`, `list` or `delete` (leader election reads,
creates and replaces its one Lease; kopf peering is off, `settings.peering.standalone`); RBAC
objects only to give each router a ServiceAccount that reads EndpointSlices, or pods and
Services with `--router-discovery pods` (which the operator must then read itself: RBAC lets
one grant only what one holds), and each weight cache's fill one that patches its progress
ConfigMap; no `update` but of the Lease (everything else is server-side
apply, which is `patch`; `create` is kept for clients that create first).

`rbac_files` is pure; a unit test compares the committed files with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from inferfleet.api.common import API_GROUP
from inferfleet.api.inference_service import PLURAL as INFERENCE_SERVICES
from inferfleet.api.model_deployment import PLURAL as MODEL_DEPLOYMENTS
from inferfleet.render.manifest_yaml import dump_manifests

OPERATOR_NAME: Final = "inferfleet-operator"
CLUSTER_READER_NAME: Final = "inferfleet-operator-cluster-reader"
LEADER_ELECTION_NAME: Final = "inferfleet-operator-leader-election"
DEFAULT_NAMESPACE: Final = "inferfleet-system"
LABELS: Final = {
    "app.kubernetes.io/name": OPERATOR_NAME,
    "app.kubernetes.io/part-of": "inferfleet",
}
_WRITE = ("create", "delete", "get", "list", "patch", "watch")


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": sorted(self.resources),
            "verbs": sorted(self.verbs),
        }

    def describe(self) -> str:
        groups = ",".join(g or "core" for g in self.api_groups)
        return f"{groups} {', '.join(sorted(self.resources))} [{' '.join(sorted(self.verbs))}]"


NAMESPACED_RULES: Final = (
    Rule(
        (API_GROUP,),
        (INFERENCE_SERVICES, MODEL_DEPLOYMENTS),
        ("get", "list", "patch", "watch"),
        "watch the resources; patch only to remove the finalizer earlier versions set",
    ),
    Rule(
        (API_GROUP,),
        (f"{INFERENCE_SERVICES}/status", f"{MODEL_DEPLOYMENTS}/status"),
        ("get", "patch"),
        "status is written through the status subresource, never the spec",
    ),
    Rule(
        (API_GROUP,),
        (f"{MODEL_DEPLOYMENTS}/scale",),
        ("get",),
        "read the replicas SREs set with kubectl scale",
    ),
    Rule(
        ("apps",),
        ("deployments",),
        _WRITE,
        "engine and router workloads: server-side apply, pruning roles that went away, "
        "readiness for status",
    ),
    Rule(
        ("leaderworkerset.x-k8s.io",),
        ("leaderworkersets",),
        _WRITE,
        "engine workloads whose replicas span several nodes (where LeaderWorkerSet is "
        "installed): server-side apply, pruning, readiness for status",
    ),
    Rule(
        ("",),
        ("configmaps", "services"),
        _WRITE,
        "engine config files and the Services of engines and routers; reading them is "
        "granted on to routers that find replicas by pod; a ConfigMap a ModelDeployment names "
        "in model.architectureFrom is read for the architecture it holds",
    ),
    Rule(
        ("policy",),
        ("poddisruptionbudgets",),
        _WRITE,
        "one disruption budget per engine pool and router",
    ),
    Rule(
        ("",),
        ("secrets",),
        ("create", "delete"),
        "the SSH keys of a multi-node TensorRT-LLM group (its leader's mpirun reaches the "
        "workers over SSH), generated once and never read back; the ModelDeployment owns them; "
        "deleted by name when a change of its spec no longer needs them",
    ),
    Rule(
        ("",),
        ("pods",),
        ("get", "list", "watch", "patch"),
        "engine pods the scheduler cannot place, reported in the ModelDeployment's "
        "conditions; reading them granted on to routers that find replicas by pod; before a "
        "scale-in, each engine pod's controller.kubernetes.io/pod-deletion-cost (the requests "
        "it holds), so that the ReplicaSet removes the least busy first",
    ),
    Rule(
        ("",),
        ("persistentvolumeclaims",),
        _WRITE,
        "a ModelDeployment's weight cache (model.cache): its volume, deleted with it or once "
        "a change of source, class or access mode renders another",
    ),
    Rule(
        ("batch",),
        ("jobs",),
        _WRITE,
        "the Job that fills a weight cache; its end (Complete, Failed) for status",
    ),
    Rule(
        ("",),
        ("resourcequotas",),
        ("get", "list", "watch"),
        "the GPUs a namespace's quota leaves: the autoscaler orders no more than that",
    ),
    Rule(
        ("",),
        ("serviceaccounts",),
        _WRITE,
        "each router's own identity, for finding its replicas; a weight cache's fill's, for "
        "pushing its progress",
    ),
    Rule(
        ("rbac.authorization.k8s.io",),
        ("rolebindings", "roles"),
        _WRITE,
        "each router's read access to the EndpointSlices (or pods and Services) of its "
        "namespace; a weight cache's fill's write access to its one progress ConfigMap",
    ),
    Rule(
        ("networking.k8s.io",),
        ("networkpolicies",),
        _WRITE,
        "with --network-policies, the NetworkPolicies that admit only routers to their engines",
    ),
    Rule(
        ("discovery.k8s.io",),
        ("endpointslices",),
        ("get", "list", "watch"),
        "held to be granted on to routers (RBAC forbids granting what one lacks)",
    ),
    Rule(("",), ("events",), ("create", "patch"), "decisions and errors as Events (core/v1)"),
    Rule(
        ("events.k8s.io",),
        ("events",),
        ("create", "patch"),
        "the same Events through events.k8s.io/v1",
    ),
)

CRD_RULE: Final = Rule(
    ("apiextensions.k8s.io",),
    ("customresourcedefinitions",),
    ("get", "list", "watch"),
    "kopf scans CustomResourceDefinitions to find the resources it serves",
)
PRIORITY_CLASS_RULE: Final = Rule(
    ("scheduling.k8s.io",),
    ("priorityclasses",),
    ("list",),
    "the priority of each service's engine pods, read once a minute where a namespace has a "
    "GPU quota: the quota's free GPUs go to the higher one first",
)
CLUSTER_READ_RULES: Final = (CRD_RULE, PRIORITY_CLASS_RULE)
"""What the operator reads cluster-wide whatever namespaces it watches."""
NAMESPACES_RULE: Final = Rule(
    ("",),
    ("namespaces",),
    ("list", "watch"),
    "cluster-wide mode: kopf follows namespaces as they come and go",
)

LEASE_RULE: Final = Rule(
    ("coordination.k8s.io",),
    ("leases",),
    ("create", "get", "update"),
    "leader election, in the operator's own namespace: read its Lease, create it, renew and "
    "release it by replace at the resourceVersion read",
)
LEASE_OWNER_RULE: Final = Rule(
    ("apps",),
    ("deployments",),
    ("get",),
    "leader election, in the operator's own namespace: its own Deployment, named as the "
    "Lease's owner so that removing the operator removes its Lease",
)
LEADER_ELECTION_RULES: Final = (LEASE_RULE, LEASE_OWNER_RULE)


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = dict(LABELS)
    return meta


def service_account(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(OPERATOR_NAME, namespace),
    }


def role(
    kind: str, name: str, rules: tuple[Rule, ...], namespace: str | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, namespace),
        "rules": [rule.to_wire() for rule in rules],
    }


def binding(
    kind: str, name: str, role_kind: str, account_namespace: str, namespace: str | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": account_namespace}
        ],
    }


def cluster_wide(namespace: str = DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
    """The operator watching every namespace; its ServiceAccount lives in `namespace`."""
    rules = (*NAMESPACED_RULES, *CLUSTER_READ_RULES, NAMESPACES_RULE)
    return [
        service_account(namespace),
        role("ClusterRole", OPERATOR_NAME, rules),
        binding("ClusterRoleBinding", OPERATOR_NAME, "ClusterRole", namespace),
        *leader_election(namespace),
    ]


def leader_election(namespace: str = DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
    """The Lease grant, in the operator's own namespace, whatever it watches."""
    return [
        role("Role", LEADER_ELECTION_NAME, LEADER_ELECTION_RULES, namespace),
        binding("RoleBinding", LEADER_ELECTION_NAME, "Role", namespace, namespace),
    ]


def single_namespace(
    namespace: str = DEFAULT_NAMESPACE, watched: str | None = None
) -> list[dict[str, Any]]:
    """The operator watching one namespace (`watched`, by default its own)."""
    watched = watched or namespace
    return [
        service_account(namespace),
        role("Role", OPERATOR_NAME, NAMESPACED_RULES, watched),
        binding("RoleBinding", OPERATOR_NAME, "Role", namespace, watched),
        role("ClusterRole", CLUSTER_READER_NAME, CLUSTER_READ_RULES),
        binding("ClusterRoleBinding", CLUSTER_READER_NAME, "ClusterRole", namespace),
        *leader_election(namespace),
    ]


def _header(purpose: str, rules: tuple[Rule, ...]) -> str:
    lines = [
        "# Generated from operator/inferfleet/render/rbac.py. Do not edit; regenerate with",
        "#   INFERFLEET_UPDATE_GOLDEN=1 pytest tests/unit/test_render_rbac.py",
        f"# {purpose}",
        "#",
        "# Why each rule:",
    ]
    lines += [f"#   {rule.describe()}: {rule.why}" for rule in rules]
    return "\n".join(lines) + "\n"


def _documents(objects: list[dict[str, Any]]) -> str:
    return dump_manifests(objects, explicit_start=True)


def rbac_files(namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """File name -> YAML text, what `deploy/rbac/` holds."""
    return {
        "cluster-wide.yaml": _header(
            f"The operator watching every namespace (ServiceAccount in {namespace}).",
            (*NAMESPACED_RULES, *CLUSTER_READ_RULES, NAMESPACES_RULE, *LEADER_ELECTION_RULES),
        )
        + _documents(cluster_wide(namespace)),
        "single-namespace.yaml": _header(
            f"The operator watching only {namespace}; the Role and RoleBinding go where it "
            "watches.",
            (*NAMESPACED_RULES, *CLUSTER_READ_RULES, *LEADER_ELECTION_RULES),
        )
        + _documents(single_namespace(namespace)),
    }
