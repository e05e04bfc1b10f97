"""The CRDs and the scheduling of GPU workloads on a real API server, scheduler and controllers."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.devcluster.cluster import DevCluster
from inferfleet.devcluster.components import POD_CIDR
from inferfleet.devcluster.processes import wait_until
from inferfleet.kube import Kube, StaleObjectError
from tests.e2e.conftest import POOLS, Kubectl
from tests.unit.multinode_fixtures import llama_405b_bf16
from tests.unit.multinode_fixtures import rendered as rendered_leader_worker_set
from tests.unit.validation_cases import ValidationCase, load_cases

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CASES = load_cases()
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_the_fake_gpu_nodes_are_ready(kubectl: Kubectl) -> None:
    nodes = kubectl.json("get", "nodes")["items"]
    gpu_nodes = [n for n in nodes if "nvidia.com/gpu" in n["status"]["allocatable"]]
    cpu_nodes = [n for n in nodes if n not in gpu_nodes]
    assert len(gpu_nodes) == sum(pool.count for pool in POOLS)
    assert len(cpu_nodes) == 1
    assert not cpu_nodes[0]["spec"].get("taints")
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True"
    for node in gpu_nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    table = kubectl.run("get", "nodes", "-L", "nvidia.com/gpu.product").stdout
    assert "NVIDIA-H100-80GB-HBM3" in table
    assert "NVIDIA-L4" in table


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_applies(kubectl: Kubectl, namespace: str, example: Path) -> None:
    kubectl.run("apply", "--server-side", "-n", namespace, "-f", str(example))
    for document in yaml.safe_load_all(example.read_text()):
        stored = kubectl.json(
            "get", document["kind"], document["metadata"]["name"], "-n", namespace
        )
        # Defaults from the CRD schema are filled in by the API server.
        if document["kind"] == "ModelDeployment":
            assert stored["spec"]["gpu"]["memoryUtilization"] == 0.9
            assert stored["spec"]["engine"]["name"] in ("vllm", "tensorrt-llm", "sim")


def _object(case: ValidationCase, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": case.kind,
        "metadata": {"name": f"case-{index}"},
        "spec": case.spec,
    }


def test_the_api_server_judges_every_case_as_the_models_do(
    kubectl: Kubectl, namespace: str
) -> None:
    """The same table the unit tier checks against pydantic and the emulation, replayed
    against the real API server (server-side dry run: nothing is stored)."""
    disagreements = []
    for index, case in enumerate(CASES):
        result = kubectl.run(
            "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
            check=False, stdin=yaml.safe_dump(_object(case, index)),
        )  # fmt: skip
        admitted = result.returncode == 0
        if admitted != case.valid:
            disagreements.append(f"{case.test_id}: admitted={admitted}: {result.stderr.strip()}")
        elif not case.valid and f"spec.{case.field}" not in result.stderr:
            disagreements.append(
                f"{case.test_id}: error names no spec.{case.field}: {result.stderr}"
            )
    assert not disagreements, "\n".join(disagreements)


def test_a_cel_rule_refuses_with_its_message(kubectl: Kubectl, namespace: str) -> None:
    spec = {
        "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"name": "vllm"},
        "gpu": {"type": "H100-80GB"},
        "precision": {"weights": "int4"},
    }
    document = {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "int4-without-method"},
        "spec": spec,
    }
    result = kubectl.run(
        "apply", "-n", namespace, "-f", "-", check=False, stdin=yaml.safe_dump(document)
    )
    assert result.returncode != 0
    assert "spec.precision.method" in result.stderr
    assert "int4 weights need method awq or gptq" in result.stderr


def test_printer_columns_show_what_an_sre_needs(kubectl: Kubectl, namespace: str) -> None:
    example = ROOT / "examples" / "llama-3.1-8b-aggregated-vllm.yaml"
    kubectl.run("apply", "--server-side", "-n", namespace, "-f", str(example))
    narrow = kubectl.run("get", "modeldeployments", "-n", namespace).stdout.splitlines()
    assert narrow[0].split() == ["NAME", "MODEL", "GPU", "REPLICAS", "READY", "STATUS", "AGE"]
    assert narrow[1].split()[:4] == ["llama-3-1-8b", "llama-3.1-8b", "H100-80GB", "2"]
    wide = kubectl.run("get", "mdep", "-n", namespace, "-o", "wide").stdout.splitlines()[0]
    for column in ("ENGINE", "TP", "MODE", "FITS"):
        assert column in wide.split()
    services = kubectl.run("get", "infsvc", "-n", namespace).stdout.splitlines()
    assert services[0].split() == ["NAME", "TTFT", "TPOT", "ATTAINMENT", "READY", "AGE"]
    listed = kubectl.run("get", "inferfleet", "-n", namespace).stdout
    assert "modeldeployment.inferfleet.io/llama-3-1-8b" in listed
    assert "inferenceservice.inferfleet.io/chat" in listed


@pytest.mark.parametrize(
    "example",
    ["llama-3.1-8b-aggregated-vllm.yaml", "llama-3.3-70b-fp8-disaggregated-trtllm.yaml"],
)
def test_kubectl_scale_sets_the_serving_pool(
    kubectl: Kubectl, namespace: str, example: str
) -> None:
    path = ROOT / "examples" / example
    kubectl.run("apply", "--server-side", "-n", namespace, "-f", str(path))
    name = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ModelDeployment")[
        "metadata"
    ]["name"]
    kubectl.run("scale", f"modeldeployment/{name}", "-n", namespace, "--replicas=5")
    assert kubectl.json("get", "mdep", name, "-n", namespace)["spec"]["replicas"] == 5
    scale = kubectl.json("get", "mdep", name, "-n", namespace, "--subresource=scale")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 5


def _gpu_deployment(name: str, product: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "engine:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def _pods(kubectl: Kubectl, namespace: str, app: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", namespace, "-l", f"app={app}")[
        "items"
    ]
    return pods


def test_a_gpu_deployment_runs_only_on_its_gpu_type(kubectl: Kubectl, namespace: str) -> None:
    kubectl.run(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(_gpu_deployment("l4", "NVIDIA-L4", 1)),
    )

    def running() -> bool:
        pods = _pods(kubectl, namespace, "l4")
        return bool(pods) and all(p["status"].get("phase") == "Running" for p in pods)

    assert wait_until(running, 60, 0.5), kubectl.run("describe", "pods", "-n", namespace).stdout
    (pod,) = _pods(kubectl, namespace, "l4")
    assert pod["spec"]["nodeName"] == "gpu-l4-24gb-0"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_CIDR)


def test_more_gpus_than_any_node_stays_pending_with_the_reason(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.run(
        "apply", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(_gpu_deployment("huge", "NVIDIA-H100-80GB-HBM3", 9)),
    )  # fmt: skip

    def unschedulable() -> str | None:
        for pod in _pods(kubectl, namespace, "huge"):
            for condition in pod["status"].get("conditions") or []:
                if (
                    condition["type"] == "PodScheduled"
                    and condition.get("reason") == "Unschedulable"
                ):
                    return str(condition.get("message"))
        return None

    assert wait_until(lambda: unschedulable() is not None, 60, 0.5)
    assert "Insufficient nvidia.com/gpu" in str(unschedulable())
    time.sleep(2)
    (pod,) = _pods(kubectl, namespace, "huge")
    assert pod["status"]["phase"] == "Pending"


def test_deleting_an_owner_collects_its_children(kubectl: Kubectl, namespace: str) -> None:
    example = ROOT / "examples" / "llama-3.1-8b-aggregated-vllm.yaml"
    kubectl.run("apply", "--server-side", "-n", namespace, "-f", str(example))
    owner = kubectl.json("get", "mdep", "llama-3-1-8b", "-n", namespace)
    child = _gpu_deployment("child", "NVIDIA-H100-80GB-HBM3", 1)
    child["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "inferfleet.io/v1alpha1",
            "kind": "ModelDeployment",
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    kubectl.run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(child))
    assert wait_until(lambda: len(_pods(kubectl, namespace, "child")) == 1, 60, 0.5)
    kubectl.run("delete", "mdep", "llama-3-1-8b", "-n", namespace, "--wait=true")

    def collected() -> bool:
        gone = kubectl.run("get", "deployment", "child", "-n", namespace, check=False)
        return gone.returncode != 0 and not _pods(kubectl, namespace, "child")

    assert wait_until(collected, 60, 0.5)


def test_status_reports_every_component_healthy(cluster: DevCluster) -> None:
    report = cluster.status()
    assert all(
        state.startswith("running") and "not healthy" not in state for state in report.values()
    ), report


def test_a_status_write_from_a_stale_read_is_refused(
    kubectl: Kubectl, kube: Kube, namespace: str
) -> None:
    """Two writers of one conditions list: the one that read before the other wrote must not
    drop the other's condition, so the API server refuses its write (optimistic concurrency)."""
    kubectl.run("apply", "--server-side", "-n", namespace, "-f", str(ROOT / "examples" /
        "llama-3.1-8b-aggregated-vllm.yaml"))  # fmt: skip
    api = "inferfleet.io/v1alpha1"
    read_by_first = kube.get(api, "InferenceService", "chat", namespace)
    read_by_second = kube.get(api, "InferenceService", "chat", namespace)
    assert read_by_first is not None
    assert read_by_second is not None
    metrics = {"type": "MetricsAvailable", "status": "False", "reason": "PrometheusUnavailable",
               "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    ready = {**metrics, "type": "Ready", "reason": "BackendsReady"}
    kube.patch_status(read_by_first, {"conditions": [metrics]}, if_unchanged=True)
    with pytest.raises(StaleObjectError):
        kube.patch_status(read_by_second, {"conditions": [ready]}, if_unchanged=True)
    stored = kube.get(api, "InferenceService", "chat", namespace)
    assert stored is not None
    assert [c["type"] for c in stored["status"]["conditions"]] == ["MetricsAvailable"]
    # From a fresh read the write goes through.
    kube.patch_status(stored, {"conditions": [metrics, ready]}, if_unchanged=True)
    stored = kube.get(api, "InferenceService", "chat", namespace)
    assert stored is not None
    assert {c["type"] for c in stored["status"]["conditions"]} == {"MetricsAvailable", "Ready"}


def test_the_api_server_takes_the_leader_worker_set_of_a_replica_over_two_nodes(
    kubectl: Kubectl, namespace: str
) -> None:
    """The LeaderWorkerSet the renderer makes for Llama-3.1-405B in BF16 on two H100 nodes, as
    the API server validates it against LWS v0.10.0's published CRD (installed by the dev
    cluster; LWS's controller does not run here, so no pods follow); `kubectl scale` scales
    its groups through the scale subresource."""
    lws = rendered_leader_worker_set(llama_405b_bf16())
    name = lws["metadata"]["name"]
    lws["metadata"]["namespace"] = namespace
    lws["metadata"].pop("ownerReferences", None)
    kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(lws))
    stored = kubectl.json("get", "leaderworkerset", name, "-n", namespace)
    assert stored["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert stored["spec"]["replicas"] == 2
    kubectl.run("scale", f"leaderworkerset/{name}", "-n", namespace, "--replicas=3")
    scale = kubectl.json("get", "leaderworkerset", name, "-n", namespace, "--subresource=scale")
    assert scale["spec"]["replicas"] == 3
    kubectl.run("delete", "leaderworkerset", name, "-n", namespace, "--wait=true")
