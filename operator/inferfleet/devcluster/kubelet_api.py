"""What the dev cluster's kubelets ask of the API server, and the operator never does:
registering nodes, watching them turn Ready, writing pod status, and minting pods' ServiceAccount
tokens. Through the client of `inferfleet.kube.Kube`; the Kubernetes client's own types are
needed here for the TokenRequest API and its errors, which `Kube`'s generic, dict-in dict-out
calls do not cover."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from inferfleet.kube import Kube

# The node lifecycle controller's taints of a node it does not yet (or no longer) trust.
_LIFECYCLE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def create_node(kube: Kube, node: dict[str, Any]) -> None:
    """Register a node as a kubelet does: the object, then its status (capacity)."""
    nodes = kube.resource("v1", "Node")
    try:
        nodes.create(body=node)
    except ApiException as error:
        if error.status != 409:
            raise
    nodes.status.patch(
        body={"status": node["status"]},
        name=node["metadata"]["name"],
        content_type="application/merge-patch+json",
    )


def ready_node_names(kube: Kube) -> set[str]:
    """Nodes that are Ready and no longer carry the lifecycle controller's not-ready or
    unreachable taints: the ones pods can be scheduled onto now."""
    ready = set()
    for node in kube.list("v1", "Node"):
        conditions = node.get("status", {}).get("conditions") or []
        taints = node.get("spec", {}).get("taints") or []
        lifecycle = any(t["key"] in _LIFECYCLE_TAINTS for t in taints)
        if not lifecycle and any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions
        ):
            ready.add(str(node["metadata"]["name"]))
    return ready


def patch_pod_status(kube: Kube, name: str, namespace: str, status: dict[str, Any]) -> None:
    """Strategic merge into a pod's status: conditions merge by type, as a kubelet writes
    them."""
    kube.resource("v1", "Pod").status.patch(
        body={"status": status},
        name=name,
        namespace=namespace,
        content_type="application/strategic-merge-patch+json",
    )


def request_token(
    kube: Kube,
    service_account: str,
    namespace: str,
    *,
    expiration_s: int,
    bound_pod: tuple[str, str] | None = None,
) -> str:
    """A token of a ServiceAccount from the TokenRequest API (`create` on
    `serviceaccounts/token`), bound to a pod (name, uid) when given: it stops working once
    that pod is gone, as the tokens kubelets mount do."""
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_s)
    if bound_pod is not None:
        spec.bound_object_ref = client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=bound_pod[0], uid=bound_pod[1]
        )
    answer = client.CoreV1Api(kube.api_client).create_namespaced_service_account_token(
        service_account, namespace, client.AuthenticationV1TokenRequest(spec=spec)
    )
    if answer.status is None or not answer.status.token:
        raise ApiException(reason=f"no token for {namespace}/{service_account}")
    return str(answer.status.token)
