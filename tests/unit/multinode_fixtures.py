"""A replica larger than one node, as the multi-node tests build it."""

from __future__ import annotations

from typing import Any

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.engines import build_engine_container
from inferfleet.engines.multinode import group_members
from inferfleet.render.common import Owner
from inferfleet.render.model_deployment import Placement, served_model_name
from inferfleet.render.multinode import engine_leader_worker_set

GPUS = GpuCatalog.builtin()


def llama_405b_bf16(engine: str = "vllm") -> ModelDeploymentSpec:
    """Tensor 8 on each of two H100 nodes. (The API still refuses a replica over one node, so
    the second stage is set past validation.)"""
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.1-405b", "source": "hf://meta-llama/Llama-3.1-405B"},
            "engine": {"name": engine},
            "gpu": {"type": "H100-80GB"},
            "parallelism": {"tensor": 8},
            "replicas": 2,
        }
    )
    return spec.model_copy(
        update={"parallelism": spec.parallelism.model_copy(update={"pipeline": 2})}
    )


def rendered(spec: ModelDeploymentSpec, replicas: int = 2) -> dict[str, Any]:
    metadata = {"name": "llama-405b", "namespace": "llm", "uid": "u"}
    owner = Owner.of("inferfleet.io/v1alpha1", "ModelDeployment", metadata)
    engine = build_engine_container(spec, Role.AGGREGATED, model_name=served_model_name(spec))
    members = group_members(spec, engine, 2)
    return engine_leader_worker_set(
        owner, spec, Role.AGGREGATED, members, replicas,
        nodes=2, placement=Placement(), gpus=GPUS,
    )  # fmt: skip
