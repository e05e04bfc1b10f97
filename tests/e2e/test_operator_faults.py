"""Faults and bad input at the operator, on a real control plane: pods the scheduler cannot
place, two services that want to autoscale one deployment, a name another resource holds, an
object the API server refuses, and the API server stopped mid-rollout."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

import pytest
import yaml
from kubernetes.utils import parse_quantity

from inferfleet.devcluster.cluster import DevCluster
from inferfleet.devcluster.processes import wait_until
from tests.e2e.conftest import Kubectl
from tests.e2e.test_operator import (
    EXAMPLES,
    Operator,
    _condition,
    _events,
    _md,
    _ready,
    _sim_deployment,
    operator,
)

__all__ = ["operator"]  # the module's own operator process, as test_operator starts it

# The Kubernetes client's parser, which has no annotations.
_parse_quantity = cast("Callable[[str], Decimal]", parse_quantity)


def _service(name: str, deployment: str, *, goodput: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "deployments": [{"name": deployment}],
        "slo": {"ttftP95Ms": 500, "tpotP95Ms": 50, "attainmentTarget": 0.99},
    }
    if goodput:
        spec["autoscaling"] = {"policy": "goodput", "aggregated": {"maxReplicas": 4}}
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def _apply(kubectl: Kubectl, namespace: str, *documents: dict[str, Any]) -> None:
    kubectl.run(
        "apply", "--server-side", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump_all(documents),
    )  # fmt: skip


def _quota(kubectl: Kubectl, namespace: str, name: str, hard: dict[str, str]) -> None:
    """A ResourceQuota of the namespace, enforced by the API server's quota admission."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": hard},
    }
    _apply(kubectl, namespace, quota)


def _get(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.json("get", kind, name, "-n", namespace)
    return found


def test_pods_the_scheduler_cannot_place_are_reported_with_its_reason(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    # vLLM engines ask for GPUs (the sim engine's pods do not): 20 of one GPU each on the
    # cluster's two 8-GPU H100 nodes leave four Pending.
    docs = yaml.safe_load_all((EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml").read_text())
    crowded = next(d for d in docs if d["kind"] == "ModelDeployment")
    crowded["metadata"]["name"] = "crowded"
    crowded["spec"]["replicas"] = 20
    _apply(kubectl, namespace, crowded)

    def degraded() -> dict[str, Any]:
        return _condition(_md(kubectl, namespace, "crowded"), "Degraded")

    assert wait_until(lambda: degraded().get("reason") == "Unschedulable", 60, 1), operator.tail()
    assert degraded()["status"] == "True"
    assert "Insufficient nvidia.com/gpu" in degraded()["message"], degraded()
    assert wait_until(lambda: '"Unschedulable"' in _events(kubectl, namespace), 15, 0.5)
    # What fits is scheduled: the deployment recovers and says so.
    kubectl.run(
        "patch", "mdep", "crowded", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"replicas": 1}}),
    )  # fmt: skip
    assert wait_until(lambda: degraded().get("status") == "False", 60, 1), degraded()
    assert wait_until(lambda: _ready(kubectl, namespace, "crowded"), 60, 1), operator.tail()


def test_a_namespace_at_its_gpu_quota_gets_a_condition_not_pending_pods(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _quota(kubectl, namespace, "gpus", {"requests.nvidia.com/gpu": "2"})
    docs = yaml.safe_load_all((EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml").read_text())
    greedy = next(d for d in docs if d["kind"] == "ModelDeployment")
    greedy["metadata"]["name"] = "greedy"
    greedy["spec"]["replicas"] = 3  # one GPU each
    _apply(kubectl, namespace, greedy)

    def degraded() -> dict[str, Any]:
        return _condition(_md(kubectl, namespace, "greedy"), "Degraded")

    assert wait_until(lambda: degraded().get("reason") == "QuotaExhausted", 60, 1), (
        degraded(),
        operator.tail(),
    )
    assert degraded()["status"] == "True"
    assert "exceeded quota: gpus" in degraded()["message"], degraded()
    assert wait_until(lambda: '"QuotaExhausted"' in _events(kubectl, namespace), 15, 0.5)
    # The quota admitted two pods and refused the third: none is left Pending for want of GPUs.
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", "inferfleet.io/model-deployment")
    assert len(pods["items"]) == 2, [p["metadata"]["name"] for p in pods["items"]]
    # The platform team raises the quota: the third pod is created and the condition clears.
    _quota(kubectl, namespace, "gpus", {"requests.nvidia.com/gpu": "3"})
    assert wait_until(lambda: degraded().get("status") == "False", 60, 1), degraded()
    assert wait_until(lambda: _ready(kubectl, namespace, "greedy"), 60, 1), operator.tail()


def test_one_of_two_autoscaling_services_owns_a_deployment_and_the_other_says_so(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, _sim_deployment("shared"), _service("first", "shared", goodput=True))

    def owner() -> str | None:
        record = _md(kubectl, namespace, "shared").get("status", {}).get("autoscaling") or {}
        return record.get("service")

    assert wait_until(lambda: owner() == "first", 60, 1), (
        _get(kubectl, namespace, "infsvc", "first").get("status"),
        operator.tail(),
    )
    _apply(kubectl, namespace, _service("second", "shared", goodput=True))

    def autoscaling(service: str) -> dict[str, Any]:
        return _condition(_get(kubectl, namespace, "infsvc", service), "Autoscaling")

    assert wait_until(
        lambda: autoscaling("second").get("reason") == "AutoscaledElsewhere", 30, 1
    ), operator.tail()
    assert "InferenceService first" in autoscaling("second")["message"]
    assert autoscaling("first")["status"] == "True"
    assert wait_until(lambda: '"AutoscaledElsewhere"' in _events(kubectl, namespace), 15, 0.5)
    # Both tick every 2 s: the workload is written by one decision only, not by turns.
    before = _get(kubectl, namespace, "deployment", "shared-aggregated")["metadata"]["generation"]
    time.sleep(10)
    after = _get(kubectl, namespace, "deployment", "shared-aggregated")["metadata"]["generation"]
    assert after == before
    assert owner() == "first"
    # The owner goes: the other claimant takes over.
    kubectl.run("delete", "infsvc", "first", "-n", namespace)
    assert wait_until(lambda: autoscaling("second").get("status") == "True", 30, 1), operator.tail()
    assert owner() == "second"


def test_a_name_another_resource_holds_is_refused_and_left_to_its_owner(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, _sim_deployment("llama"))
    assert wait_until(lambda: _ready(kubectl, namespace, "llama"), 60, 1), operator.tail()
    # The router's Service is named after the service: the engine Service's name.
    _apply(kubectl, namespace, _service("llama-aggregated", "llama", goodput=False))

    def ready() -> dict[str, Any]:
        return _condition(_get(kubectl, namespace, "infsvc", "llama-aggregated"), "Ready")

    assert wait_until(lambda: ready().get("reason") == "NameCollision", 30, 1), operator.tail()
    assert "Service/llama-aggregated" in ready()["message"]
    owners = _get(kubectl, namespace, "service", "llama-aggregated")["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [("ModelDeployment", "llama")]
    assert _ready(kubectl, namespace, "llama")
    assert wait_until(lambda: '"NameCollision"' in _events(kubectl, namespace), 15, 0.5)


@pytest.mark.timeout(200)
def test_an_object_inferfleet_did_not_create_is_never_taken_over(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    # A Service someone made by hand, under the name the engine Service would take.
    kubectl.run("create", "service", "clusterip", "llama-aggregated", "--tcp=80", "-n", namespace)
    before = _get(kubectl, namespace, "service", "llama-aggregated")
    _apply(kubectl, namespace, _sim_deployment("llama"))

    def ready() -> dict[str, Any]:
        return _condition(_get(kubectl, namespace, "mdep", "llama"), "Ready")

    assert wait_until(lambda: ready().get("reason") == "NameCollision", 30, 0.5), operator.tail()
    assert "inferfleet did not create" in ready()["message"], ready()
    assert '"NameCollision"' in _events(kubectl, namespace)
    after = _get(kubectl, namespace, "service", "llama-aggregated")
    assert "ownerReferences" not in after["metadata"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # No pod runs for a deployment that cannot be served (workloads are applied last).
    assert kubectl.json("get", "deployments", "-n", namespace)["items"] == []
    # Its owner removes it: the name is taken at the next look.
    kubectl.run("delete", "service", "llama-aggregated", "-n", namespace)
    assert wait_until(lambda: _ready(kubectl, namespace, "llama"), 120, 1), operator.tail()
    owners = _get(kubectl, namespace, "service", "llama-aggregated")["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [("ModelDeployment", "llama")]


@pytest.mark.timeout(200)
def test_an_apply_the_api_server_refuses_is_reported_and_tried_again(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    # A quota of no Deployments: the API server's quota admission refuses the engine's.
    _quota(kubectl, namespace, "no-deployments", {"count/deployments.apps": "0"})
    _apply(kubectl, namespace, _sim_deployment("llama"))

    def ready() -> dict[str, Any]:
        return _condition(_get(kubectl, namespace, "mdep", "llama"), "Ready")

    assert wait_until(lambda: ready().get("reason") == "ApplyRefused", 30, 0.5), operator.tail()
    message = ready()["message"]
    assert "the API server refused Deployment/llama-aggregated" in message, message
    assert "exceeded quota: no-deployments" in message, message
    assert wait_until(lambda: '"ApplyRefused"' in _events(kubectl, namespace), 15, 0.5)
    assert operator.process is not None
    assert operator.process.poll() is None, operator.tail()
    # The quota goes: the next try (within a minute) applies it.
    kubectl.run("delete", "resourcequota", "no-deployments", "-n", namespace)
    assert wait_until(lambda: _ready(kubectl, namespace, "llama"), 120, 1), operator.tail()


@pytest.mark.timeout(240)
def test_the_api_server_stopped_for_30_s_mid_rollout_converges_without_a_crash(
    operator: Operator, kubectl: Kubectl, cluster: DevCluster, namespace: str
) -> None:
    _apply(kubectl, namespace, _sim_deployment("steady"))
    assert wait_until(lambda: _ready(kubectl, namespace, "steady"), 60, 1), operator.tail()
    state = cluster.state()
    assert state is not None
    apiserver = state.pids["kube-apiserver"]
    kubectl.run(
        "patch", "mdep", "steady", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"replicas": 2}}),
    )  # fmt: skip
    os.kill(apiserver, signal.SIGSTOP)  # connections hang: watches and writes stall
    try:
        time.sleep(30)
    finally:
        os.kill(apiserver, signal.SIGCONT)
    assert operator.process is not None
    assert operator.process.poll() is None, operator.tail()

    # What the operator owns converges: the workload asks for two, and the status says so at
    # the current generation. (Not Ready: the node lifecycle controller marks the pods of
    # the nodes whose leases lapsed during the stop NotReady, and kwok's fake kubelet never
    # reports them ready again, as a real kubelet would.)
    def converged() -> bool:
        md = _md(kubectl, namespace, "steady")
        engine = _get(kubectl, namespace, "deployment", "steady-aggregated")
        roles = md.get("status", {}).get("roles") or [{}]
        return bool(
            engine["spec"]["replicas"] == 2
            and md["status"].get("observedGeneration") == md["metadata"]["generation"]
            and roles[0].get("desired") == 2
        )

    assert wait_until(converged, 90, 1), (_md(kubectl, namespace, "steady"), operator.tail())
    assert operator.process.poll() is None, "the operator kept running through it"


def test_scheduling_fields_reach_the_pods_and_a_missing_priority_class_is_reported(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    # Refused at `kubectl apply` by the CRD's rules, with their own message.
    bad = _sim_deployment("untolerated")
    bad["spec"]["scheduling"] = {"tolerations": [{"value": "inference"}]}
    refused = kubectl.run(
        "apply", "--server-side", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(bad), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "a toleration without a key must use operator Exists" in refused.stderr
    low = _sim_deployment("low-limit")
    low["spec"]["scheduling"] = {"resources": {"memory": "2Gi", "memoryLimit": "1Gi"}}
    refused = kubectl.run(
        "apply", "--server-side", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(low), check=False,
    )  # fmt: skip
    assert "memoryLimit must be at least memory" in refused.stderr, refused.stderr

    scheduled = _sim_deployment("scheduled")
    scheduled["spec"]["scheduling"] = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "nodeAffinity": {
            "preferred": [
                {"weight": 10, "matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]}
            ]
        },
        "tolerations": [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
        "priorityClassName": "inference-critical",
        "spreadAcross": "kubernetes.io/hostname",
        "resources": {"cpu": "500m", "memory": "512Mi"},
    }
    _apply(kubectl, namespace, scheduled)

    def degraded() -> dict[str, Any]:
        return _condition(_md(kubectl, namespace, "scheduled"), "Degraded")

    # The API server admits the pod template, then refuses its pods: the class does not exist.
    assert wait_until(lambda: degraded().get("reason") == "PodsRefused", 60, 1), (
        degraded(),
        operator.tail(),
    )
    assert "no PriorityClass with name inference-critical" in degraded()["message"], degraded()
    pod = _get(kubectl, namespace, "deployment", "scheduled-aggregated")["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["kubernetes.io/os"] == "linux"
    assert pod["priorityClassName"] == "inference-critical"
    assert {
        "key": "dedicated",
        "operator": "Equal",
        "value": "inference",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["containers"][0]["resources"]["requests"]["memory"] == "512Mi"
    limit = _parse_quantity(pod["containers"][0]["resources"]["limits"]["memory"])
    assert limit == 2 * _parse_quantity("512Mi")
    # The platform team creates the class: the pods are created, the condition clears.
    _apply(
        kubectl,
        namespace,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "inference-critical"},
            "value": 50000,
        },
    )
    try:
        assert wait_until(lambda: _ready(kubectl, namespace, "scheduled"), 90, 1), (
            degraded(),
            operator.tail(),
        )
        assert degraded().get("status") == "False", degraded()
        pods = kubectl.json("get", "pods", "-n", namespace, "-l", "inferfleet.io/model-deployment")
        assert {p["spec"].get("priority") for p in pods["items"]} == {50000}
    finally:
        kubectl.run("delete", "priorityclass", "inference-critical", check=False)
