"""The operator's RBAC: committed files equal regeneration, and the grants stay least-privilege.

Regenerate deploy/rbac/ after an intended change: INFERFLEET_UPDATE_GOLDEN=1 pytest
tests/unit/test_render_rbac.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.render.common import KIND_ORDER
from inferfleet.render.rbac import (
    CLUSTER_READER_NAME,
    DEFAULT_NAMESPACE,
    LEADER_ELECTION_NAME,
    OPERATOR_NAME,
    cluster_wide,
    rbac_files,
    single_namespace,
)
from tests.unit.golden import check_text, updating

RBAC_DIR = Path(__file__).resolve().parents[2] / "deploy" / "rbac"

Grants = dict[tuple[str, str], set[str]]


def grants(rules: list[dict[str, Any]]) -> Grants:
    """(api group, resource) -> verbs."""
    result: Grants = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                result.setdefault((group, resource), set()).update(rule["verbs"])
    return result


def kind(objects: list[dict[str, Any]], name: str, named: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == name and named in (None, o["metadata"]["name"])]
    return found


@pytest.mark.parametrize("name", sorted(rbac_files()))
def test_committed_rbac_is_up_to_date(name: str) -> None:
    check_text(RBAC_DIR / name, rbac_files()[name])


def test_no_stray_files_in_deploy_rbac() -> None:
    if updating():
        pytest.skip("regenerating")
    assert sorted(p.name for p in RBAC_DIR.glob("*.yaml")) == sorted(rbac_files())


def test_files_parse_as_the_objects() -> None:
    files = rbac_files()
    assert list(yaml.safe_load_all(files["cluster-wide.yaml"])) == cluster_wide()
    assert list(yaml.safe_load_all(files["single-namespace.yaml"])) == single_namespace()


WRITE = {"create", "delete", "get", "list", "patch", "watch"}
EXPECTED: Grants = {
    ("inferfleet.io", "inferenceservices"): {"get", "list", "patch", "watch"},
    ("inferfleet.io", "modeldeployments"): {"get", "list", "patch", "watch"},
    ("inferfleet.io", "inferenceservices/status"): {"get", "patch"},
    ("inferfleet.io", "modeldeployments/status"): {"get", "patch"},
    ("inferfleet.io", "modeldeployments/scale"): {"get"},
    ("apps", "deployments"): WRITE,
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): WRITE,
    ("", "services"): WRITE,
    ("", "configmaps"): WRITE,
    ("", "secrets"): {"create", "delete"},
    ("policy", "poddisruptionbudgets"): WRITE,
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("", "persistentvolumeclaims"): WRITE,
    ("batch", "jobs"): WRITE,
    ("", "resourcequotas"): {"get", "list", "watch"},
    ("", "serviceaccounts"): WRITE,
    ("rbac.authorization.k8s.io", "roles"): WRITE,
    ("rbac.authorization.k8s.io", "rolebindings"): WRITE,
    ("networking.k8s.io", "networkpolicies"): WRITE,
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
CLUSTER_ONLY: Grants = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("scheduling.k8s.io", "priorityclasses"): {"list"},
    ("", "namespaces"): {"list", "watch"},
}


def test_cluster_role_grants_exactly_what_the_operator_uses() -> None:
    role = kind(cluster_wide(), "ClusterRole")
    assert role["metadata"]["name"] == OPERATOR_NAME
    assert grants(role["rules"]) == EXPECTED | CLUSTER_ONLY


def test_single_namespace_install_keeps_namespaced_grants_in_a_role() -> None:
    objects = single_namespace("team-a")
    role = kind(objects, "Role", OPERATOR_NAME)
    assert role["metadata"]["namespace"] == "team-a"
    assert grants(role["rules"]) == EXPECTED
    cluster_role = kind(objects, "ClusterRole")
    assert cluster_role["metadata"]["name"] == CLUSTER_READER_NAME
    assert grants(cluster_role["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
        ("scheduling.k8s.io", "priorityclasses"): {"list"},
    }


def test_the_operator_writes_every_kind_it_renders() -> None:
    granted = grants(kind(cluster_wide(), "ClusterRole")["rules"])
    resources = {
        "ConfigMap": ("", "configmaps"),
        "Service": ("", "services"),
        "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
        "Deployment": ("apps", "deployments"),
        "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        "ServiceAccount": ("", "serviceaccounts"),
        "Role": ("rbac.authorization.k8s.io", "roles"),
        "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
        "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
        "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
        "Job": ("batch", "jobs"),
    }
    for rendered in KIND_ORDER:
        if rendered == "Secret":
            continue  # generated once, never applied again (below)
        assert {"create", "patch", "delete"} <= granted[resources[rendered]]


def test_nothing_beyond_least_privilege() -> None:
    granted = grants(kind(cluster_wide(), "ClusterRole")["rules"])
    assert all("*" not in verbs for verbs in granted.values())
    assert all("*" not in key for key in granted)
    # Secrets: created (a multi-node group's generated keys) and deleted once no longer
    # needed, never read, listed or changed.
    assert granted[("", "secrets")] == {"create", "delete"}
    # Pods: never created, replaced or deleted (their controllers do that); patched for a
    # deletion cost before a scale-in alone (`autoscale.scalein`).
    assert granted[("", "pods")] == {"get", "list", "watch", "patch"}
    # Leases only in the operator's own namespace (a Role there), never cluster-wide.
    assert ("coordination.k8s.io", "leases") not in granted
    # RBAC only for routers' Roles: no cluster roles, no bind or escalate (so the operator can
    # grant only what it holds itself).
    rbac = {resource for group, resource in granted if group == "rbac.authorization.k8s.io"}
    assert rbac == {"roles", "rolebindings"}
    assert all(
        not {"bind", "escalate"} & verbs
        for (group, _), verbs in granted.items()
        if group == "rbac.authorization.k8s.io"
    )
    # The spec of a user's resource is never written; patch serves kopf's annotations.
    assert "update" not in granted[("inferfleet.io", "modeldeployments")]


@pytest.mark.parametrize("objects", [cluster_wide(), single_namespace()])
def test_bindings_bind_the_operator_service_account(objects: list[dict[str, Any]]) -> None:
    account = kind(objects, "ServiceAccount")
    assert account["metadata"] == {
        "name": OPERATOR_NAME,
        "namespace": DEFAULT_NAMESPACE,
        "labels": {
            "app.kubernetes.io/name": OPERATOR_NAME,
            "app.kubernetes.io/part-of": "inferfleet",
        },
    }
    roles = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"].endswith("Role")}
    for binding in (o for o in objects if o["kind"].endswith("Binding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": DEFAULT_NAMESPACE}
        ]
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles


def test_headers_explain_every_rule() -> None:
    for name, text in rbac_files().items():
        header = [line for line in text.splitlines() if line.startswith("#   ")]
        objects = list(yaml.safe_load_all(text))
        rules = [r for o in objects if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]
        assert len(header) >= len(rules), name


@pytest.mark.parametrize(
    "objects",
    [cluster_wide("inferfleet-system"), single_namespace("inferfleet-system", watched="team-a")],
    ids=["cluster-wide", "single-namespace"],
)
def test_leader_election_reads_and_writes_leases_only_in_the_operators_namespace(
    objects: list[dict[str, Any]],
) -> None:
    role = kind(objects, "Role", LEADER_ELECTION_NAME)
    assert role["metadata"]["namespace"] == "inferfleet-system"
    # Read, create, renew by replace at a resourceVersion: no patch, list, watch or delete;
    # and read the operator's own Deployment, the Lease's owner.
    assert grants(role["rules"]) == {
        ("coordination.k8s.io", "leases"): {"create", "get", "update"},
        ("apps", "deployments"): {"get"},
    }
    binding = kind(objects, "RoleBinding", LEADER_ELECTION_NAME)
    assert binding["metadata"]["namespace"] == "inferfleet-system"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": LEADER_ELECTION_NAME,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": "inferfleet-system"}
    ]
    # Nothing else grants Leases.
    others = [o for o in objects if o["kind"].endswith("Role") and o is not role]
    assert all(("coordination.k8s.io", "leases") not in grants(o["rules"]) for o in others)
