"""The index of the engine pods the scheduler cannot place: per deployment, which pods and why;
what changes it reports, and what a new list drops."""

from __future__ import annotations

from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.reconcile.pods import Unschedulable, UnschedulablePods, unschedulable

WHY = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def pending_pod(
    name: str, *, why: str | None = WHY, deployment: str = "llama", role: str = "prefill"
) -> dict[str, Any]:
    conditions = (
        []
        if why is None
        else [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
        ]
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "labels": {"inferfleet.io/model-deployment": deployment, "inferfleet.io/role": role},
        },
        "status": {"phase": "Pending", "conditions": conditions},
    }


def test_an_engine_pod_is_unschedulable_only_when_the_scheduler_says_so() -> None:
    assert unschedulable(pending_pod("a")) == Unschedulable("llama", Role.PREFILL, WHY)
    assert unschedulable(pending_pod("a", why=None)) is None  # not yet tried
    assert unschedulable(pending_pod("a", role="sidecar")) is None
    no_message = pending_pod("a", why="")
    assert unschedulable(no_message) == Unschedulable(
        "llama", Role.PREFILL, "the scheduler gave no reason"
    )
    assert unschedulable({"metadata": None}) is None


def test_the_index_reports_each_change_of_a_deployments_unschedulable_pods_once() -> None:
    pods = UnschedulablePods()
    assert pods.update("llm", pending_pod("a", why=None), gone=False) == set()
    assert pods.update("llm", pending_pod("a"), gone=False) == {"llama"}
    assert pods.update("llm", pending_pod("a"), gone=False) == set()  # the same: no news
    assert pods.update("llm", pending_pod("b"), gone=False) == {"llama"}
    before = pods.of("llm", "llama")
    # The scheduler's reason changes: news, and a reader keeps what it was given.
    assert pods.update("llm", pending_pod("a", why="node(s) had taints"), gone=False) == {"llama"}
    assert before["a"].why == WHY
    assert pods.of("llm", "llama")["a"].why == "node(s) had taints"
    assert pods.of("other", "llama") == {}
    # Bound (it leaves the watch as a deletion): gone from the index.
    assert pods.update("llm", pending_pod("a"), gone=True) == {"llama"}
    assert set(pods.of("llm", "llama")) == {"b"}
    assert pods.update("llm", pending_pod("a"), gone=True) == set()
    # A new list that lacks b (bound while no watch ran) drops it, in its scope only.
    pods.update("llm", pending_pod("c", deployment="qwen"), gone=False)
    assert pods.unlisted("elsewhere", []) == set()
    assert pods.unlisted("llm", [("llm", "c")]) == {("llm", "llama")}
    assert pods.of("llm", "llama") == {}
    assert len(pods) == 1
