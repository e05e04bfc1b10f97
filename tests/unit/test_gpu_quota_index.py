"""What the operator reads of a namespace's ResourceQuota on GPUs and of its engines' pods:
the index entries, as the API server stores the objects."""

from __future__ import annotations

from typing import Any

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.reconcile.controller import Indices, child_entries, gpu_quota_entry


def quota(hard: str | None, used: str | None = None, *, counted: bool = True) -> dict[str, Any]:
    spec = {"hard": {"pods": "100"} | ({"requests.nvidia.com/gpu": hard} if hard else {})}
    status = {"hard": spec["hard"], "used": {"requests.nvidia.com/gpu": used or "0"}}
    return {"kind": "ResourceQuota", "spec": spec} | ({"status": status} if counted else {})


@pytest.mark.parametrize(
    ("obj", "left"),
    [
        (quota("16", "12"), 4),
        (quota("4", "4"), 0),
        # Lowered below what pods already hold: nothing is left, not a negative count.
        (quota("2", "4"), 0),
        # Not yet counted by the quota controller: the hard limit.
        (quota("8", counted=False), 8),
        (quota("1k", "999"), 1),
    ],
)
def test_a_gpu_quota_leaves_hard_minus_used(obj: dict[str, Any], left: int) -> None:
    assert gpu_quota_entry("team-a", obj) == {("gpus", "team-a"): left}


def test_a_quota_without_gpus_or_with_a_bad_quantity_is_no_gpu_quota() -> None:
    assert gpu_quota_entry("team-a", quota(None)) == {}
    assert gpu_quota_entry("team-a", quota("lots")) == {}


def test_the_tightest_quota_of_a_namespace_and_the_pods_of_a_deployment() -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "llama-aggregated",
            "labels": {"inferfleet.io/role": "aggregated"},
            "ownerReferences": [{"kind": "ModelDeployment", "uid": "u1", "controller": True}],
        },
        "spec": {"replicas": 4},
        "status": {"replicas": 3, "readyReplicas": 2},
    }
    entries: dict[str, dict[Any, list[Any]]] = {"gpu_quotas": {}, "deployments": {}}
    for obj in (quota("16", "12"), quota("8", "7")):
        for key, value in gpu_quota_entry("team-a", obj).items():
            entries["gpu_quotas"].setdefault(key, []).append(value)
    for key, value in child_entries("team-a", deployment).items():
        entries["deployments"].setdefault(key, []).append(value)
    indices = Indices(entries)
    assert indices.gpu_quota_left("team-a") == 1
    assert indices.gpu_quota_left("team-b") is None
    assert indices.pods_created("team-a", "u1") == {Role.AGGREGATED: 3}
