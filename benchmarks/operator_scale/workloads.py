"""What the benchmark applies: the services (a ModelDeployment and an InferenceService each),
and for the baselines the very objects the operator renders for them (the engine Deployments
alone, then everything), rendered by the package's own renderer with `inferfleet run`'s
defaults."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import ModelDeployment
from inferfleet.render.inference_service import render_inference_service
from inferfleet.render.manifest_yaml import dump_manifests
from inferfleet.render.model_deployment import render_model_deployment
from inferfleet.render.settings import InstallSettings

API = "inferfleet.io/v1alpha1"


def model_deployment(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "qwen2.5-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct"},
            "engine": {"name": "sim"},
            "gpu": {"type": "L4-24GB"},
            "batching": {"maxModelLength": 8192},
            "replicas": 1,
        },
    }


def inference_service(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "deployments": [{"name": name}],
            "slo": {"ttftP95Ms": 500, "tpotP95Ms": 50},
        },
    }


def manifests(names: Sequence[str], namespace: str) -> str:
    """Each service's ModelDeployment, then its InferenceService, as one YAML stream."""
    documents: list[dict[str, Any]] = []
    for name in names:
        documents += [model_deployment(name, namespace), inference_service(name, namespace)]
    return dump_manifests(documents)


def rendered(name: str, namespace: str) -> list[dict[str, Any]]:
    """The objects the operator applies for the service's ModelDeployment, rendered offline
    (no uid, so no owner reference: nothing for the garbage collector to act on)."""
    md = ModelDeployment.model_validate(model_deployment(name, namespace))
    return render_model_deployment(md, options=InstallSettings().engines)


def engine_deployments(names: Sequence[str], namespace: str) -> str:
    """The engine Deployments of those services' ModelDeployments, as one YAML stream."""
    documents = [
        obj
        for name in names
        for obj in rendered(name, namespace)
        if obj["apiVersion"] == "apps/v1" and obj["kind"] == "Deployment"
    ]
    return dump_manifests(documents)


def rendered_service(name: str, namespace: str) -> list[dict[str, Any]]:
    """Everything the operator applies for one service, rendered offline: its
    ModelDeployment's objects, then its InferenceService's (the router), with no owner."""
    md = ModelDeployment.model_validate(model_deployment(name, namespace))
    service = InferenceService.model_validate(inference_service(name, namespace))
    install = InstallSettings()
    router = render_inference_service(
        service,
        {name: md},
        router_image=install.router_image,
        router_discovery=install.router_discovery,
    )
    return [*render_model_deployment(md, options=install.engines), *router]


def all_rendered(names: Sequence[str], namespace: str) -> str:
    """Every object the operator renders for those services, as one YAML stream."""
    return dump_manifests([obj for name in names for obj in rendered_service(name, namespace)])


def audit_target(obj: dict[str, Any]) -> str:
    """`group/resource` as the audit log names an object's kind (`core` for the core group)."""
    group = str(obj["apiVersion"]).rpartition("/")[0] or "core"
    return f"{group}/{str(obj['kind']).lower()}s"


def children(name: str, namespace: str) -> frozenset[tuple[str, str]]:
    """(audit target, name) of every object the operator renders for a ModelDeployment."""
    return frozenset(
        (audit_target(obj), obj["metadata"]["name"]) for obj in rendered(name, namespace)
    )
