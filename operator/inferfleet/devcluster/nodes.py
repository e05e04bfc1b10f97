"""Fake GPU nodes for kwok: shaped, labelled and tainted as real GPU nodes are."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from inferfleet.api.catalog import GpuCatalog, GpuType

GPU_RESOURCE = "nvidia.com/gpu"
# The label NVIDIA's GPU feature discovery sets; workloads select their GPU type by it.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_TYPE_LABEL = "inferfleet.io/gpu-type"
# kwok manages the nodes that carry this annotation, and only those.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# GPU node pools taint their nodes so that only pods that ask for GPUs land there.
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

# A typical 8-GPU server's host resources.
_HOST_CPU = "192"
_HOST_MEMORY = "2Ti"
_PODS = "110"


@dataclass(frozen=True)
class NodePool:
    gpu_type: GpuType
    count: int

    @classmethod
    def parse(cls, text: str) -> tuple[NodePool, ...]:
        """`H100-80GB=2,L4-24GB=1` -> pools; errors name the bad part."""
        pools = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, count = part.partition("=")
            try:
                gpu_type = GpuType(name)
            except ValueError:
                known = ", ".join(t.value for t in GpuType)
                raise ValueError(
                    f"unknown GPU type {name!r} in {part!r} (known: {known})"
                ) from None
            if not re.fullmatch(r"[0-9]+", count or "1") or int(count or "1") < 1:
                raise ValueError(f"node count in {part!r} must be a positive integer")
            pools.append(cls(gpu_type, int(count or "1")))
        if not pools:
            raise ValueError("at least one node pool is needed, e.g. H100-80GB=2")
        return tuple(pools)


def node_name(gpu_type: GpuType, index: int) -> str:
    return f"gpu-{gpu_type.value.lower()}-{index}"


def _kwok_node(
    name: str,
    labels: dict[str, str],
    resources: dict[str, str],
    taints: list[dict[str, str]],
) -> dict[str, Any]:
    """A Node as a kubelet registers it, marked for kwok to play that kubelet."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def gpu_node(gpu_type: GpuType, index: int, gpus: GpuCatalog) -> dict[str, Any]:
    """A GPU server with the NVIDIA device plugin and GPU feature discovery."""
    spec = gpus[gpu_type]
    labels = {
        GPU_PRODUCT_LABEL: spec.node_product_label,
        GPU_COUNT_LABEL: str(spec.gpus_per_node),
        GPU_MEMORY_LABEL: str(spec.memory_bytes // 2**20),
        GPU_TYPE_LABEL: gpu_type.value,
    }
    resources = {
        "cpu": _HOST_CPU,
        "memory": _HOST_MEMORY,
        "pods": _PODS,
        "ephemeral-storage": "3Ti",
        GPU_RESOURCE: str(spec.gpus_per_node),
    }
    return _kwok_node(node_name(gpu_type, index), labels, resources, [dict(GPU_TAINT)])


def cpu_node(index: int) -> dict[str, Any]:
    """A node without GPUs or taints, where routers and other CPU work land."""
    resources = {"cpu": "64", "memory": "256Gi", "pods": _PODS, "ephemeral-storage": "1Ti"}
    return _kwok_node(f"cpu-{index}", {}, resources, [])


def fleet_nodes(
    pools: tuple[NodePool, ...], cpu_nodes: int, gpus: GpuCatalog
) -> list[dict[str, Any]]:
    """GPU nodes per pool, then the CPU nodes."""
    gpu = [gpu_node(pool.gpu_type, i, gpus) for pool in pools for i in range(pool.count)]
    return gpu + [cpu_node(i) for i in range(cpu_nodes)]
