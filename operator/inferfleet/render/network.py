"""NetworkPolicies (networking.k8s.io/v1), rendered when the install asks for them
(`NetworkIsolation`): engines answer only their own deployment's engines, the routers of the
InferenceServices that route to them and Prometheus; routers take users on their port and
Prometheus alone on the admin port.

NetworkPolicies add up: a pod selected by any policy takes only what one of them allows. So
each ModelDeployment selects its engine pods with a policy that lets its own engines and
Prometheus in (no router yet: engines nobody routes to take nobody's requests), and each
InferenceService adds one that lets its router in to the engines of the deployments it names.
The union is what the engines accept. Enforcement is the network plugin's (Calico, Cilium and
most managed clusters' plugins enforce; a cluster without one ignores the objects)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from inferfleet.engines import ENGINE_PORT
from inferfleet.render.common import (
    ENGINE_APP,
    LABEL_MODEL_DEPLOYMENT,
    LABEL_NAME,
    Owner,
    dns_label,
    label_value,
    object_meta,
)
from inferfleet.render.multinode import ENGINE_WORKER_APP
from inferfleet.router.config import ADMIN_PORT

NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label the API server sets on every namespace: its name."""


@dataclass(frozen=True)
class NetworkIsolation:
    """`prometheus_namespaces`: where the Prometheus that scrapes engines and routers runs (its
    pods may reach the engines' port, where they serve metrics, and the routers' admin port).
    Empty: nothing scrapes them past the policies."""

    prometheus_namespaces: tuple[str, ...] = ()

    def scrapers(self) -> list[dict[str, Any]]:
        """NetworkPolicy peers: every pod of the Prometheus namespaces."""
        if not self.prometheus_namespaces:
            return []
        names = sorted(self.prometheus_namespaces)
        selector = {"matchExpressions": [_in(NAMESPACE_NAME_LABEL, names)]}
        return [{"namespaceSelector": selector}]


def _in(key: str, values: Iterable[str]) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": sorted(set(values))}


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _policy(
    name: str, owner: Owner, labels: dict[str, str], pods: dict[str, Any], ingress: list[Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(name, owner, labels),
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _engines_of(deployments: Sequence[str]) -> dict[str, Any]:
    """The engine pods of `deployments`, by the labels every engine pod carries: the workers
    of multi-node groups too, which their leader's torch.distributed store and NCCL reach."""
    return {
        "matchExpressions": [
            _in(LABEL_NAME, (ENGINE_APP, ENGINE_WORKER_APP)),
            _in(LABEL_MODEL_DEPLOYMENT, map(label_value, deployments)),
        ],
    }


def engine_network_policy(
    owner: Owner, labels: dict[str, str], isolation: NetworkIsolation
) -> dict[str, Any]:
    """A ModelDeployment's engines: in from its own engines (the KV cache handed from prefill
    to decode, any port) and from Prometheus (the engine port, where metrics are)."""
    own = _engines_of([owner.name])
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": own}]}]
    scrapers = isolation.scrapers()
    if scrapers:
        ingress.append({"from": scrapers, "ports": _tcp(ENGINE_PORT)})
    return _policy(dns_label(f"{owner.name}-engines"), owner, labels, own, ingress)


def router_network_policies(
    owner: Owner,
    labels: dict[str, str],
    router_pods: dict[str, str],
    deployments: Sequence[str],
    *,
    router_port: int,
    isolation: NetworkIsolation,
) -> list[dict[str, Any]]:
    """An InferenceService's two: its router may call the engines of `deployments` (their
    engine port); its router pods take anyone on `router_port` (users, load balancers) and
    Prometheus alone on the admin port."""
    router = {"matchLabels": dict(sorted(router_pods.items()))}
    to_engines = _policy(
        dns_label(f"{owner.name}-router-to-engines"),
        owner,
        labels,
        _engines_of(deployments),
        [{"from": [{"podSelector": router}], "ports": _tcp(ENGINE_PORT)}],
    )
    ingress: list[dict[str, Any]] = [{"ports": _tcp(router_port)}]
    scrapers = isolation.scrapers()
    if scrapers:
        ingress.append({"from": scrapers, "ports": _tcp(ADMIN_PORT)})
    routers = _policy(dns_label(f"{owner.name}-router"), owner, labels, router, ingress)
    return [to_engines, routers]
