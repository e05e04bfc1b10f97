"""A replica larger than one node, as the multi-node tests build it."""

from __future__ import annotations

from typing import Any

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import (
    EngineName,
    ModelDeployment,
    ModelDeploymentSpec,
    Role,
)
from inferfleet.render import render_model_deployment

GPUS = GpuCatalog.builtin()


def llama_405b_bf16(engine: str = "vllm") -> ModelDeploymentSpec:
    """Tensor 8 on each of two H100 nodes. (The API serves it with vllm and tensorrt-llm only:
    another engine is set past validation, as an object stored before that rule would be.)"""
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.1-405b", "source": "hf://meta-llama/Llama-3.1-405B"},
            "engine": {"name": "vllm"},
            "gpu": {"type": "H100-80GB"},
            "parallelism": {"tensor": 8, "pipeline": 2},
            "replicas": 2,
        }
    )
    return spec.model_copy(
        update={"engine": spec.engine.model_copy(update={"name": EngineName(engine)})}
    )


def deployment(spec: ModelDeploymentSpec) -> ModelDeployment:
    """The ModelDeployment `llama-405b` of `spec` (not validated again: a test may set a field
    past validation)."""
    return ModelDeployment.model_construct(
        metadata={"name": "llama-405b", "namespace": "llm", "uid": "u"}, spec=spec
    )


def rendered(spec: ModelDeploymentSpec, replicas: int = 2) -> dict[str, Any]:
    """The LeaderWorkerSet of `deployment(spec)`, with `replicas` groups."""
    objects = render_model_deployment(deployment(spec), replicas={Role.AGGREGATED: replicas})
    (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    return lws
