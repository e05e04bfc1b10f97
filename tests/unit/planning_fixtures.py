"""Replica configurations shared by the planning tests."""

from __future__ import annotations

from dataclasses import replace

from inferfleet.api.catalog import GpuCatalog, GpuType, catalog_models
from inferfleet.api.model_deployment import KvCacheDtype, QuantizationMethod, WeightPrecision
from inferfleet.planning.replica import ReplicaConfig

GPUS = GpuCatalog.builtin()


def replica(
    model: str = "llama-3.1-8b",
    gpu: GpuType = GpuType.H100_80GB,
    **settings: object,
) -> ReplicaConfig:
    base = ReplicaConfig(model=catalog_models()[model], gpu_type=gpu, gpu=GPUS[gpu])
    return replace(base, **settings)  # type: ignore[arg-type]


def fp8(config: ReplicaConfig) -> ReplicaConfig:
    return replace(
        config,
        weights=WeightPrecision.FP8,
        method=QuantizationMethod.FP8,
        kv_cache=KvCacheDtype.FP8,
    )
