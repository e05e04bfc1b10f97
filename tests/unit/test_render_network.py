"""The NetworkPolicies rendered with `--network-policies`, judged by what they let through.

The dev cluster runs no network plugin, so nothing there enforces a NetworkPolicy (its API
server stores and validates them, which tests/e2e/test_helm_install.py checks). Here a small
evaluator of the policies' semantics (networking.k8s.io/v1: a pod selected by no policy takes
everything; one selected by some takes what any of them allows) stands in for the plugin,
and asks who can reach an engine and a router, on which port."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from inferfleet.api.inference_service import InferenceService
from inferfleet.render import render_inference_service, render_model_deployment
from inferfleet.render.network import NetworkIsolation
from tests.unit.golden.specs import aggregated_spec, disaggregated_spec, model_deployment

ISOLATION = NetworkIsolation(prometheus_namespaces=("monitoring",))
ENGINE_PORT, ROUTER_PORT, ADMIN_PORT = 8000, 8000, 8001


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _peer_admits(peer: Mapping[str, Any], source: Pod, namespace: str) -> bool:
    namespace_labels = {"kubernetes.io/metadata.name": source.namespace}
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], namespace_labels):
            return False
    elif source.namespace != namespace:  # a podSelector alone is the policy's namespace
        return False
    return "podSelector" not in peer or _matches(peer["podSelector"], source.labels)


def admitted(policies: Sequence[Mapping[str, Any]], source: Pod, target: Pod, port: int) -> bool:
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and _matches(p["spec"]["podSelector"], target.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports is not None and port not in {p["port"] for p in ports}:
                continue
            peers = rule.get("from")
            if peers is None or any(_peer_admits(p, source, target.namespace) for p in peers):
                return True
    return False


def _service(name: str, deployments: list[str]) -> InferenceService:
    return InferenceService.model_validate(
        {
            "metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}"},
            "spec": {"deployments": [{"name": d} for d in deployments], "slo": {"ttftP95Ms": 800}},
        }
    )


def _pods(objects: Sequence[Mapping[str, Any]], component: str) -> Pod:
    (deployment,) = [
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(component)
    ]
    return Pod("serving", deployment["spec"]["template"]["metadata"]["labels"])


@pytest.fixture
def fleet() -> dict[str, Any]:
    """Two deployments; `chat` routes to the disaggregated one, `batch` to the other."""
    pd = model_deployment(disaggregated_spec(), name="llama-pd")
    llama = model_deployment(aggregated_spec(), name="llama")
    chat = render_inference_service(
        _service("chat", ["llama-pd"]), {"llama-pd": pd}, isolation=ISOLATION
    )
    batch = render_inference_service(
        _service("batch", ["llama"]), {"llama": llama}, isolation=ISOLATION
    )
    engines_pd = render_model_deployment(pd, isolation=ISOLATION)
    engines = render_model_deployment(llama, isolation=ISOLATION)
    policies = [o for o in [*chat, *batch, *engines_pd, *engines] if o["kind"] == "NetworkPolicy"]
    return {
        "policies": policies,
        "prefill": _pods(engines_pd, "prefill"),
        "decode": _pods(engines_pd, "decode"),
        "llama": _pods(engines, "aggregated"),
        "chat-router": _pods(chat, "router"),
        "batch-router": _pods(batch, "router"),
    }


def test_only_the_routers_that_route_to_a_deployment_reach_its_engines(
    fleet: dict[str, Any],
) -> None:
    policies = fleet["policies"]
    chat, batch = fleet["chat-router"], fleet["batch-router"]
    for engine in (fleet["prefill"], fleet["decode"]):
        assert admitted(policies, chat, engine, ENGINE_PORT)
        assert not admitted(policies, batch, engine, ENGINE_PORT)
        assert not admitted(policies, chat, engine, 22)
    assert admitted(policies, batch, fleet["llama"], ENGINE_PORT)
    assert not admitted(policies, chat, fleet["llama"], ENGINE_PORT)


def test_no_pod_of_the_namespace_or_another_calls_an_engine_past_the_router(
    fleet: dict[str, Any],
) -> None:
    policies = fleet["policies"]
    for stranger in (
        Pod("serving", {"app": "notebook"}),
        Pod("team-b", {}),
        Pod("kube-system", {}),
    ):
        for engine in ("prefill", "decode", "llama"):
            assert not admitted(policies, stranger, fleet[engine], ENGINE_PORT), (stranger, engine)
    # Nor another deployment's engines.
    assert not admitted(policies, fleet["llama"], fleet["decode"], ENGINE_PORT)


def test_a_deployment_s_engines_reach_each_other_for_the_kv_cache(fleet: dict[str, Any]) -> None:
    # Prefill hands its KV cache to decode over the engines' own transfer ports.
    assert admitted(fleet["policies"], fleet["prefill"], fleet["decode"], 14579)
    assert admitted(fleet["policies"], fleet["decode"], fleet["prefill"], ENGINE_PORT)


def test_users_reach_the_router_and_prometheus_alone_its_admin_port(fleet: dict[str, Any]) -> None:
    policies, router = fleet["policies"], fleet["chat-router"]
    user = Pod("apps", {})
    prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
    assert admitted(policies, user, router, ROUTER_PORT)
    assert not admitted(policies, user, router, ADMIN_PORT)
    assert admitted(policies, prometheus, router, ADMIN_PORT)
    # Prometheus scrapes the engines on their port (where vLLM serves /metrics).
    assert admitted(policies, prometheus, fleet["decode"], ENGINE_PORT)


def test_without_a_prometheus_namespace_nothing_scrapes_past_the_policies() -> None:
    llama = model_deployment(aggregated_spec(), name="llama")
    policies = [
        o
        for o in render_model_deployment(llama, isolation=NetworkIsolation())
        if o["kind"] == "NetworkPolicy"
    ]
    engine = Pod(
        "serving",
        {"app.kubernetes.io/name": "inferfleet-engine", "inferfleet.io/model-deployment": "llama"},
    )
    assert not admitted(policies, Pod("monitoring", {}), engine, ENGINE_PORT)


def test_policies_are_rendered_only_when_asked_and_owned_by_their_resource() -> None:
    llama = model_deployment(aggregated_spec(), name="llama")
    assert "NetworkPolicy" not in {o["kind"] for o in render_model_deployment(llama)}
    (policy,) = [
        o
        for o in render_model_deployment(llama, isolation=ISOLATION)
        if o["kind"] == "NetworkPolicy"
    ]
    assert policy["metadata"]["name"] == "llama-engines"
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"
    assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "inferfleet"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
