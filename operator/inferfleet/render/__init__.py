"""Spec -> Kubernetes objects: pure functions from typed API models to plain dicts in wire
form (camelCase), deterministic, for server-side apply and golden-file tests.

* `render_model_deployment`: per role a Deployment, a headless Service, a
  PodDisruptionBudget and, when the engine reads config files, a ConfigMap;
* `render_inference_service`: the router's Deployment, Service and PodDisruptionBudget;
* `InstallSettings`: what one install sets for all of them (images, router discovery, how
  GPU nodes are found);
* `rbac.rbac_files`: the operator's RBAC, as committed in `deploy/rbac/`.
"""

from inferfleet.engines import EngineOptions, UnsupportedSpecError
from inferfleet.render.common import SPEC_HASH_ANNOTATION, spec_hash
from inferfleet.render.inference_service import (
    DEFAULT_ROUTER_IMAGE,
    MissingReferenceError,
    render_inference_service,
    router_service_name,
)
from inferfleet.render.model_deployment import (
    GPU_PRODUCT_LABEL,
    Placement,
    engine_name,
    render_model_deployment,
    replicas_per_role,
    selector_labels,
    served_model_name,
)
from inferfleet.render.settings import InstallSettings

__all__ = [
    "DEFAULT_ROUTER_IMAGE",
    "GPU_PRODUCT_LABEL",
    "SPEC_HASH_ANNOTATION",
    "EngineOptions",
    "InstallSettings",
    "MissingReferenceError",
    "Placement",
    "UnsupportedSpecError",
    "engine_name",
    "render_inference_service",
    "render_model_deployment",
    "replicas_per_role",
    "router_service_name",
    "selector_labels",
    "served_model_name",
    "spec_hash",
]
