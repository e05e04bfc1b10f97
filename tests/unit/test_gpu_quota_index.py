"""What the operator reads of a namespace's ResourceQuota on GPUs and of its engines' pods:
the index entries, as the API server stores the objects."""

from __future__ import annotations

from typing import Any

import pytest

from inferfleet.api.model_deployment import ModelDeployment, Role
from inferfleet.autoscale.quota import GpuClaim, GpuQuota, Priorities
from inferfleet.reconcile.children import ChildrenIndex
from inferfleet.reconcile.entries import gpu_quota_entry, indexed_child
from inferfleet.reconcile.indices import Indices
from inferfleet.reconcile.quotas import QuotaBook


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
            "ownerReferences": [
                {"kind": "ModelDeployment", "name": "m", "uid": "u1", "controller": True}
            ],
        },
        "spec": {"replicas": 4},
        "status": {"replicas": 3, "readyReplicas": 2},
    }
    entries: dict[str, dict[Any, list[Any]]] = {"gpu_quotas": {}}
    for obj in (quota("16", "12"), quota("8", "7")):
        for key, value in gpu_quota_entry("team-a", obj).items():
            entries["gpu_quotas"].setdefault(key, []).append(value)
    children = ChildrenIndex()
    indexed = indexed_child("team-a", deployment)
    assert indexed is not None
    children.put("team-a", indexed)
    indices = Indices(entries, children)
    assert indices.gpu_quota_left("team-a") == 1
    assert indices.gpu_quota_left("team-b") is None
    assert indices.pods_created("team-a", "u1") == {Role.AGGREGATED: 3}


def _deployment(name: str, priority_class: str | None) -> ModelDeployment:
    spec: dict[str, Any] = {
        "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"name": "sim"},
        "gpu": {"type": "H100-80GB"},
        "replicas": 2,
    }
    if priority_class:
        spec["scheduling"] = {"priorityClassName": priority_class}
    return ModelDeployment.model_validate(
        {"metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}, "spec": spec}
    )


INTERVAL_S = 15.0


def _quota(
    book: QuotaBook, namespace: str, name: str, priority_class: str | None, *, left: int | None
) -> GpuQuota | None:
    return book.quota(
        namespace, name, {name: _deployment(name, priority_class)}, left=left,
        pods={name: {}}, now_s=NOW_S, interval_s=INTERVAL_S,
    )  # fmt: skip


NOW_S = 1000.0


def test_a_tick_sees_the_quota_less_what_live_claims_of_higher_priority_wait_for() -> None:
    book = QuotaBook(lambda: Priorities({"interactive": 100000, "batch": 1000}))
    waiting = GpuClaim("chat", 100000, True, held=1, wanted=4, at_s=NOW_S - INTERVAL_S)
    stale = GpuClaim("gone", 100000, True, held=0, wanted=8, at_s=NOW_S - 4 * INTERVAL_S)
    book.record("team-a", "chat", waiting)
    book.record("team-a", "gone", stale)
    quota = _quota(book, "team-a", "etl", "batch", left=4)
    assert quota is not None
    # Four GPUs are free and the interactive service waits for three: the batch one may add 1.
    assert (quota.left, quota.priority, quota.yields_to) == (1, 1000, (waiting,))
    # The interactive service itself may take all four; the claim three ticks old was dropped.
    chat = _quota(book, "team-a", "chat", "interactive", left=4)
    assert chat is not None
    assert (chat.left, chat.priority, chat.yields_to) == (4, 100000, ())
    # A namespace without a quota has none, and keeps no claims.
    book.record("team-b", "web", waiting)
    assert _quota(book, "team-b", "web", None, left=None) is None
    # ... so that once it has one, no claim from before holds GPUs back.
    later = _quota(book, "team-b", "web", None, left=8)
    assert later is not None
    assert later.yields_to == ()


def test_priority_classes_that_cannot_be_read_leave_every_service_at_priority_zero() -> None:
    """An install without the grant (manifests of an older version): the quota is served
    unordered, and nothing else stops."""

    def refusing() -> Priorities:
        raise PermissionError("priorityclasses is forbidden")

    quota = _quota(QuotaBook(refusing), "team-a", "etl", "batch", left=2)
    assert quota is not None
    assert (quota.left, quota.priority) == (2, 0)
