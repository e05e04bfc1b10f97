"""The operator on a real control plane, running as its least-privilege service account:
examples become Ready workloads on the right fake GPU nodes, a spec that cannot fit creates
nothing, changes roll out, deletion leaves nothing, restarts converge, idle costs no writes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.devcluster.cluster import DevCluster
from inferfleet.devcluster.processes import wait_until
from tests.e2e.conftest import Kubectl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RBAC = ROOT / "deploy" / "rbac"
OPERATOR_NAMESPACE = "inferfleet-system"
OPERATOR_ACCOUNT = "inferfleet-operator"


class Operator:
    """`inferfleet run` as a child process, with the service account's token."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                # Autoscaled services tick every 2 s against a Prometheus that is not there.
                [sys.executable, "-m", "inferfleet.cli", "run",
                 "--prometheus-url", "http://127.0.0.1:9", "--autoscale-interval", "2",
                 "--metrics-port", "0"],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=30)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def _service_account_kubeconfig(kubectl: Kubectl, cluster: DevCluster, path: Path) -> Path:
    token = kubectl.run(
        "create", "token", OPERATOR_ACCOUNT, "-n", OPERATOR_NAMESPACE, "--duration=2h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig_path.read_text())
    admin["users"] = [{"name": admin["users"][0]["name"], "user": {"token": token}}]
    path.write_text(yaml.safe_dump(admin))
    return path


@pytest.fixture(scope="module")
def operator(
    kubectl: Kubectl, cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    kubectl.run("create", "namespace", OPERATOR_NAMESPACE, check=False)
    for manifest in sorted(RBAC.glob("*.yaml")):
        kubectl.run("apply", "--server-side", "-f", str(manifest))
    directory = tmp_path_factory.mktemp("operator")
    running = Operator(
        _service_account_kubeconfig(kubectl, cluster, directory / "kubeconfig"),
        directory / "operator.log",
    )
    running.start()
    yield running
    running.stop()


def _apply(kubectl: Kubectl, namespace: str, path: Path) -> None:
    kubectl.run("apply", "--server-side", "-n", namespace, "-f", str(path))


def _md(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.json("get", "modeldeployment", name, "-n", namespace)
    return found


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for found in obj.get("status", {}).get("conditions", []):
        if found["type"] == type_:
            return dict(found)
    return {}


def _ready(kubectl: Kubectl, namespace: str, name: str) -> bool:
    md = _md(kubectl, namespace, name)
    return (
        _condition(md, "Ready").get("status") == "True"
        and md["status"].get("observedGeneration") == md["metadata"]["generation"]
    )


def _deployments(kubectl: Kubectl, namespace: str, md: str) -> dict[str, dict[str, Any]]:
    items = kubectl.json(
        "get", "deployments", "-n", namespace, "-l", f"inferfleet.io/model-deployment={md}"
    )["items"]
    return {d["metadata"]["labels"]["inferfleet.io/role"]: d for d in items}


def _pods(kubectl: Kubectl, namespace: str, md: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kubectl.json(
        "get", "pods", "-n", namespace, "-l", f"inferfleet.io/model-deployment={md}"
    )["items"]
    return pods


def test_aggregated_example_becomes_ready_on_h100_nodes(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    assert wait_until(lambda: _ready(kubectl, namespace, "llama-3-1-8b"), 90, 1), operator.tail()
    md = _md(kubectl, namespace, "llama-3-1-8b")
    assert md["status"]["plan"]["fits"] is True
    assert md["status"]["plan"]["kvCapacityTokens"] > 400_000
    assert md["status"]["readyReplicas"] == 2
    ((role, deployment),) = _deployments(kubectl, namespace, "llama-3-1-8b").items()
    assert role == "aggregated"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = " ".join(container.get("command", []) + container.get("args", []))
    assert "--max-model-len" in args
    assert "--gpu-memory-utilization" in args
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    pods = _pods(kubectl, namespace, "llama-3-1-8b")
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"].startswith("gpu-h100-80gb-")
    service = kubectl.json("get", "inferenceservice", "chat", "-n", namespace)
    assert wait_until(
        lambda: (
            _condition(kubectl.json("get", "infsvc", "chat", "-n", namespace), "Ready").get(
                "status"
            )
            == "True"
        ),
        60,
        1,
    ), operator.tail()
    assert service["metadata"]["name"] == "chat"
    routers = kubectl.json(
        "get", "pods", "-n", namespace, "-l", "inferfleet.io/inference-service=chat"
    )
    assert wait_until(
        lambda: all(
            p["status"].get("phase") == "Running"
            for p in kubectl.json(
                "get", "pods", "-n", namespace, "-l", "inferfleet.io/inference-service=chat"
            )["items"]
        ),
        60,
        1,
    )
    routers = kubectl.json(
        "get", "pods", "-n", namespace, "-l", "inferfleet.io/inference-service=chat"
    )
    assert len(routers["items"]) == 2
    assert all(p["spec"]["nodeName"] == "cpu-0" for p in routers["items"])
    # The routers' identity reads EndpointSlices of their namespace, and nothing else.
    identity = f"--as=system:serviceaccount:{namespace}:chat-router"
    for verb, resource, allowed in (
        ("watch", "endpointslices.discovery.k8s.io", "yes"),
        ("get", "secrets", "no"),
        ("list", "pods", "no"),
    ):
        answer = kubectl.run(
            "auth", "can-i", verb, resource, "-n", namespace, identity, check=False
        )
        assert answer.stdout.strip() == allowed, (verb, resource, answer.stdout, answer.stderr)
    answer = kubectl.run(
        "auth", "can-i", "watch", "endpointslices.discovery.k8s.io", "-n", "default", identity,
        check=False,
    )  # fmt: skip
    assert answer.stdout.strip() == "no"


def test_disaggregated_example_runs_both_pools(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.3-70b-fp8-disaggregated-trtllm.yaml")
    name = "llama-3-3-70b-fp8"
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()
    deployments = _deployments(kubectl, namespace, name)
    assert set(deployments) == {"prefill", "decode"}
    assert deployments["prefill"]["spec"]["replicas"] == 2
    assert deployments["decode"]["spec"]["replicas"] == 2
    for pod in _pods(kubectl, namespace, name):
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"].startswith("gpu-h100-80gb-")


def test_a_spec_that_cannot_fit_creates_nothing(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-405b-bf16-l40s-does-not-fit.yaml")
    name = "llama-3-1-405b-on-l40s"

    def judged() -> bool:
        return _condition(_md(kubectl, namespace, name), "Fits").get("status") == "False"

    assert wait_until(judged, 60, 1), operator.tail()
    fits = _condition(_md(kubectl, namespace, name), "Fits")
    assert fits["reason"] == "DoesNotFit"
    assert "weights 756.0 GiB" in fits["message"]
    assert _deployments(kubectl, namespace, name) == {}
    assert _pods(kubectl, namespace, name) == []
    events = kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout
    assert "SpecNotApplied" in events


def test_a_precision_change_rolls_out_and_deletion_leaves_nothing(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    name = "llama-3-1-8b"
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()
    before = _deployments(kubectl, namespace, name)["aggregated"]
    kubectl.run(
        "patch", "modeldeployment", name, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"precision": {"kvCache": "fp8"}}}),
    )  # fmt: skip
    strategy = before["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] in (0, "0", "0%")

    def rolled() -> bool:
        after = _deployments(kubectl, namespace, name)["aggregated"]
        args = " ".join(after["spec"]["template"]["spec"]["containers"][0].get("args", []))
        return "fp8" in args and _ready(kubectl, namespace, name)

    assert wait_until(rolled, 90, 1), operator.tail()
    after = _deployments(kubectl, namespace, name)["aggregated"]
    assert after["metadata"]["generation"] > before["metadata"]["generation"]

    kubectl.run("delete", "modeldeployment", name, "-n", namespace, "--wait=true")

    def gone() -> bool:
        left = kubectl.run(
            "get", "deployments,services,poddisruptionbudgets,configmaps,pods", "-n", namespace,
            "-l", f"inferfleet.io/model-deployment={name}", "-o", "name",
        ).stdout.strip()  # fmt: skip
        return left == ""

    assert wait_until(gone, 60, 1)


def test_a_killed_operator_converges_without_duplicates(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.3-70b-fp8-disaggregated-trtllm.yaml")
    time.sleep(0.5)  # mid-reconcile
    operator.stop(signal.SIGKILL)
    operator.start()
    name = "llama-3-3-70b-fp8"
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()
    deployments = kubectl.json("get", "deployments", "-n", namespace)["items"]
    assert sorted(d["metadata"]["name"] for d in deployments) == sorted(
        {d["metadata"]["name"] for d in deployments}
    )
    assert len(_deployments(kubectl, namespace, name)) == 2


def _sim_deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "qwen2.5-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct"},
            "engine": {"name": "sim"},
            "gpu": {"type": "L4-24GB"},
            "batching": {"maxModelLength": 8192},
            "replicas": 1,
        },
    }


def _operator_writes(audit_log: Path, since_line: int) -> list[str]:
    user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
    writes = []
    for line in audit_log.read_text().splitlines()[since_line:]:
        event = json.loads(line)
        if event.get("user", {}).get("username") == user and event["verb"] not in (
            "get", "list", "watch"
        ):  # fmt: skip
            writes.append(f"{event['verb']} {event.get('requestURI')}")
    return writes


IDLE_RESOURCES = 50
IDLE_SECONDS = 60


@pytest.mark.timeout(400)
def test_an_idle_fleet_costs_no_writes(
    operator: Operator, kubectl: Kubectl, cluster: DevCluster, namespace: str
) -> None:
    """Proven from the API server's audit log: the operator's account writes nothing while 50
    resources sit unchanged for a minute."""
    documents = [_sim_deployment(f"idle-{i}") for i in range(IDLE_RESOURCES)]
    kubectl.run(
        "apply", "--server-side", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump_all(documents),
    )  # fmt: skip

    def all_ready() -> bool:
        items = kubectl.json("get", "modeldeployments", "-n", namespace)["items"]
        return len(items) == IDLE_RESOURCES and all(
            _condition(md, "Ready").get("status") == "True" for md in items
        )

    assert wait_until(all_ready, 180, 2), operator.tail()

    def others_gone() -> bool:
        # Earlier tests' namespaces are deleted in the background: their teardown (deletion
        # handlers, Events) is not this idle fleet's.
        spaces = kubectl.json("get", "namespaces")["items"]
        return not any(n["status"].get("phase") == "Terminating" for n in spaces)

    assert wait_until(others_gone, 180, 2), operator.tail()
    time.sleep(5)  # let the last status writes of the rollout land
    audit_log = cluster.log_dir / "audit.log"
    # The log does attribute the operator's writes: the rollout just made plenty.
    assert len(_operator_writes(audit_log, 0)) >= IDLE_RESOURCES
    start = len(audit_log.read_text().splitlines())
    time.sleep(IDLE_SECONDS)
    assert _operator_writes(audit_log, start) == []


def _events(kubectl: Kubectl, namespace: str) -> str:
    return kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout


def test_a_pin_holds_replicas_until_it_expires(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    name = "llama-3-1-8b"
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()
    until = datetime.now(UTC) + timedelta(seconds=30)
    pin = {"replicas": {"aggregated": 3}, "reason": "load test", "until": until.isoformat()}
    kubectl.run("annotate", "mdep", name, "-n", namespace, f"inferfleet.io/pin={json.dumps(pin)}")

    def replicas() -> int:
        return int(_deployments(kubectl, namespace, name)["aggregated"]["spec"]["replicas"])

    def pinned() -> bool:
        roles = _md(kubectl, namespace, name)["status"].get("roles", [])
        return any(r["pinned"] for r in roles)

    assert wait_until(lambda: replicas() == 3 and pinned(), 30, 0.5), operator.tail()
    assert _md(kubectl, namespace, name)["spec"]["replicas"] == 2  # the spec stays Git's
    # Each Event is posted before the status that records its cause.
    assert '"Pinned"' in _events(kubectl, namespace)
    assert wait_until(lambda: replicas() == 2 and not pinned(), 90, 1), operator.tail()
    assert '"PinReleased"' in _events(kubectl, namespace)


def test_dropping_a_role_prunes_its_objects(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _apply(kubectl, namespace, EXAMPLES / "llama-3.3-70b-fp8-disaggregated-trtllm.yaml")
    name = "llama-3-3-70b-fp8"
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()
    kubectl.run(
        "patch", "mdep", name, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"topology": {"mode": "aggregated", "prefill": None}}}),
    )  # fmt: skip

    def aggregated_only() -> bool:
        left = kubectl.run(
            "get", "deployments,services,poddisruptionbudgets", "-n", namespace,
            "-l", f"inferfleet.io/model-deployment={name}", "-o", "name",
        ).stdout.split()  # fmt: skip
        return bool(left) and all("aggregated" in item for item in left)

    assert wait_until(aggregated_only, 60, 1), operator.tail()
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()


MULTI_NODE = "llama-3-1-405b"
"""The two-node example's ModelDeployment: Llama-3.1-405B in BF16, TP8 x PP2 on H100."""


def _leader_worker_sets(kubectl: Kubectl, namespace: str, md: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl.json(
        "get", "leaderworkersets", "-n", namespace, "-l", f"inferfleet.io/model-deployment={md}"
    )["items"]
    return found


def _report_groups_ready(kubectl: Kubectl, namespace: str, lws: dict[str, Any]) -> None:
    """What LWS's controller (v0.10.0) writes once every group is ready, written here in its
    place: its controller is not served to this machine."""
    name, groups = lws["metadata"]["name"], lws["spec"]["replicas"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "replicas": groups, "readyReplicas": groups, "updatedReplicas": groups,
        "observedGeneration": lws["metadata"]["generation"],
        "hpaPodSelector": f"leaderworkerset.sigs.k8s.io/name={name},"
        "leaderworkerset.sigs.k8s.io/worker-index=0",
        "conditions": [{
            "type": "Available", "status": "True", "reason": "AllGroupsReady",
            "message": "All replicas are ready", "lastTransitionTime": now,
        }],
    }  # fmt: skip
    kubectl.run(
        "patch", "leaderworkerset", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip


def test_a_replica_over_two_nodes_is_a_leader_worker_set_that_scales_and_prunes(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    """The 405B example as one LeaderWorkerSet (a group of two 8-GPU pods per replica) that
    the API server validates against LWS v0.10.0's CRD; Ready from the status LWS reports
    (written by the test in place of LWS's controller, which does not run here, so no pods
    follow); `kubectl scale` of the ModelDeployment scales the groups; a spec that fits one
    node again replaces the LeaderWorkerSet with a Deployment."""
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-405b-bf16-two-nodes-vllm.yaml")
    assert wait_until(lambda: bool(_leader_worker_sets(kubectl, namespace, MULTI_NODE)), 60, 1), (
        operator.tail()
    )
    (lws,) = _leader_worker_sets(kubectl, namespace, MULTI_NODE)
    group = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["spec"]["replicas"], group["size"]) == (1, 2)
    assert _deployments(kubectl, namespace, MULTI_NODE) == {}
    assert _condition(_md(kubectl, namespace, MULTI_NODE), "Ready").get("status") != "True"
    _report_groups_ready(kubectl, namespace, lws)
    assert wait_until(lambda: _ready(kubectl, namespace, MULTI_NODE), 60, 1), operator.tail()

    kubectl.run("scale", "modeldeployment", MULTI_NODE, "-n", namespace, "--replicas=2")

    def scaled() -> bool:
        (found,) = _leader_worker_sets(kubectl, namespace, MULTI_NODE)
        return bool(found["spec"]["replicas"] == 2)

    assert wait_until(scaled, 60, 1), operator.tail()
    assert wait_until(lambda: not _ready(kubectl, namespace, MULTI_NODE), 30, 1)
    (lws,) = _leader_worker_sets(kubectl, namespace, MULTI_NODE)
    _report_groups_ready(kubectl, namespace, lws)
    assert wait_until(lambda: _ready(kubectl, namespace, MULTI_NODE), 60, 1), operator.tail()
    assert _md(kubectl, namespace, MULTI_NODE)["status"]["readyReplicas"] == 2

    # FP8 weights fit one node: the groups give way to a Deployment.
    one_node = {"precision": {"weights": "fp8"}, "parallelism": {"pipeline": 1}}
    kubectl.run(
        "patch", "modeldeployment", MULTI_NODE, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": one_node}),
    )  # fmt: skip

    def on_one_node() -> bool:
        return not _leader_worker_sets(kubectl, namespace, MULTI_NODE) and bool(
            _deployments(kubectl, namespace, MULTI_NODE)
        )

    assert wait_until(on_one_node, 60, 1), operator.tail()


MULTI_NODE_TRTLLM = "llama-3-1-405b-trtllm"


def test_a_tensorrt_llm_replica_over_two_nodes_gets_its_group_keys_once(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    """The 405B example on TensorRT-LLM: a LeaderWorkerSet the API server admits, whose leader
    runs mpirun over SSH into its workers, and the Secret of the group's keys, generated by the
    operator when it creates it: a key pair in OpenSSH's format each for client and host, the
    same after the groups are scaled (reconciled again, never generated again), deleted when
    an engine change no longer needs them (new keys when one needs them again), and gone with
    the ModelDeployment (its owner)."""
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-405b-bf16-two-nodes-trtllm.yaml")
    assert wait_until(
        lambda: bool(_leader_worker_sets(kubectl, namespace, MULTI_NODE_TRTLLM)), 60, 1
    ), operator.tail()
    (lws,) = _leader_worker_sets(kubectl, namespace, MULTI_NODE_TRTLLM)
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert 'mpirun)" --allow-run-as-root' in leader["command"][2]
    uid = _md(kubectl, namespace, MULTI_NODE_TRTLLM)["metadata"]["uid"]
    secret_name = f"{MULTI_NODE_TRTLLM}-mpi-ssh-{uid[:8]}"

    def keys() -> dict[str, Any]:
        found: dict[str, Any] = kubectl.json("get", "secret", secret_name, "-n", namespace)
        return found

    secret = keys()
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert sorted(data) == ["client", "client.pub", "host", "host.pub"]
    assert data["client"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert data["host.pub"].startswith("ssh-ed25519 ")
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"

    kubectl.run("scale", "modeldeployment", MULTI_NODE_TRTLLM, "-n", namespace, "--replicas=2")

    def scaled() -> bool:
        (found,) = _leader_worker_sets(kubectl, namespace, MULTI_NODE_TRTLLM)
        return bool(found["spec"]["replicas"] == 2)

    assert wait_until(scaled, 60, 1), operator.tail()
    again = keys()
    assert again["data"] == secret["data"]
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    assert _md(kubectl, namespace, MULTI_NODE_TRTLLM)["status"]["generatedSecrets"] == [secret_name]

    def engine(name: str) -> None:
        patch = {"spec": {"engine": {"name": name, "image": None}}}
        kubectl.run("patch", "modeldeployment", MULTI_NODE_TRTLLM, "-n", namespace,
                    "--type=merge", "-p", json.dumps(patch))  # fmt: skip

    def secrets() -> list[Any]:
        found = kubectl.json("get", "secrets", "-n", namespace, "--field-selector",
                             f"metadata.name={secret_name}")  # fmt: skip
        items: list[Any] = found["items"]
        return items

    engine("vllm")  # vLLM's group runs over Ray: no keys

    def retired() -> bool:
        status = _md(kubectl, namespace, MULTI_NODE_TRTLLM).get("status", {})
        return not secrets() and "generatedSecrets" not in status

    assert wait_until(retired, 60, 1), operator.tail()
    assert _leader_worker_sets(kubectl, namespace, MULTI_NODE_TRTLLM)
    engine("tensorrt-llm")
    assert wait_until(lambda: bool(secrets()), 60, 1), operator.tail()
    assert keys()["data"] != secret["data"], "new keys"

    kubectl.run("delete", "modeldeployment", MULTI_NODE_TRTLLM, "-n", namespace)

    def collected() -> bool:
        found = kubectl.json("get", "secrets", "-n", namespace, "--field-selector",
                             f"metadata.name={secret_name}")  # fmt: skip
        return not found["items"]

    assert wait_until(collected, 90, 1), operator.tail()


CONFIGMAP_EXAMPLE = "qwen3-4b-architecture-from-configmap-vllm.yaml"
FROM_CONFIGMAP = "qwen3-4b"


@pytest.mark.timeout(200)
def test_an_architecture_read_from_a_configmap_is_planned_and_followed(
    operator: Operator, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """A model the catalog does not hold, its config.json in a labelled ConfigMap: until the
    ConfigMap exists, Ready=False ArchitectureUnavailable and nothing applied; once applied, the
    engine Deployment follows and the plan in status counts the parameters from it; a config
    the operator cannot read later says so and leaves the running Deployment alone."""
    docs = list(yaml.safe_load_all((EXAMPLES / CONFIGMAP_EXAMPLE).read_text()))
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    deployment_only = tmp_path / "deployment.yaml"
    deployment_only.write_text(
        yaml.safe_dump_all([d for d in docs if d["kind"] != "ConfigMap"], sort_keys=False)
    )
    _apply(kubectl, namespace, deployment_only)

    def reason() -> str:
        return str(_condition(_md(kubectl, namespace, FROM_CONFIGMAP), "Ready").get("reason"))

    assert wait_until(lambda: reason() == "ArchitectureUnavailable", 60, 1), operator.tail()
    message = _condition(_md(kubectl, namespace, FROM_CONFIGMAP), "Ready")["message"]
    assert "ConfigMap qwen3-4b-config not found" in message
    assert _deployments(kubectl, namespace, FROM_CONFIGMAP) == {}

    config_file = tmp_path / "config-map.yaml"
    config_file.write_text(yaml.safe_dump(config_map))
    _apply(kubectl, namespace, config_file)
    # Read again within MODEL_CONFIG_RECHECK_S, 30 s (the operator does not watch ConfigMaps).
    assert wait_until(lambda: bool(_deployments(kubectl, namespace, FROM_CONFIGMAP)), 60, 1), (
        operator.tail()
    )
    status = _md(kubectl, namespace, FROM_CONFIGMAP)["status"]
    assert status["plan"]["fits"] is True
    assert reason() != "ArchitectureUnavailable"

    config_map["data"]["config.json"] = json.dumps({"model_type": "bert"})
    config_file.write_text(yaml.safe_dump(config_map))
    _apply(kubectl, namespace, config_file)
    assert wait_until(lambda: reason() == "ArchitectureUnavailable", 60, 1), operator.tail()
    assert (
        "model_type 'bert'"
        in _condition(_md(kubectl, namespace, FROM_CONFIGMAP), "Ready")["message"]
    )
    assert _deployments(kubectl, namespace, FROM_CONFIGMAP)


AUTOSCALED = "llama-3-1-8b"
"""The ModelDeployment of the aggregated vLLM example, whose service `_autoscale` turns on."""


def _autoscale(kubectl: Kubectl, namespace: str) -> None:
    """The aggregated vLLM example (spec: 2 replicas), its service on `policy: goodput`."""
    _apply(kubectl, namespace, EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    autoscaling = {"policy": "goodput", "aggregated": {"minReplicas": 1, "maxReplicas": 4}}
    kubectl.run(
        "patch", "infsvc", "chat", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"autoscaling": autoscaling}}),
    )  # fmt: skip


def _autoscaled_replicas(kubectl: Kubectl, namespace: str) -> int:
    return int(_deployments(kubectl, namespace, AUTOSCALED)["aggregated"]["spec"]["replicas"])


def _held(kubectl: Kubectl, namespace: str) -> dict[str, Any] | None:
    """The autoscaler's decision in the ModelDeployment's status."""
    found: dict[str, Any] | None = (
        _md(kubectl, namespace, AUTOSCALED).get("status", {}).get("autoscaling")
    )
    return found


def _decide(kubectl: Kubectl, namespace: str, replicas: int) -> None:
    """Write a decision where the autoscaler writes its own: the service's status."""
    decision = [{"deployment": AUTOSCALED, "role": "aggregated", "replicas": replicas}]
    kubectl.run(
        "patch", "infsvc", "chat", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"replicas": decision}}),
    )  # fmt: skip


def test_an_autoscaled_service_without_metrics_holds_and_says_so(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _autoscale(kubectl, namespace)
    name = AUTOSCALED
    assert wait_until(lambda: _ready(kubectl, namespace, name), 90, 1), operator.tail()

    def service() -> dict[str, Any]:
        found: dict[str, Any] = kubectl.json("get", "infsvc", "chat", "-n", namespace)
        return found

    def replicas() -> int:
        return _autoscaled_replicas(kubectl, namespace)

    def conditions() -> dict[str, str]:
        return {c["type"]: c["status"] for c in service()["status"].get("conditions") or []}

    assert wait_until(
        lambda: _condition(service(), "MetricsAvailable").get("reason") == "PrometheusUnavailable",
        30,
        0.5,
    ), operator.tail()
    both = {"Ready": "True", "MetricsAvailable": "False", "Autoscaling": "True"}
    assert wait_until(lambda: conditions() == both, 30, 0.5), service()["status"]
    assert wait_until(lambda: '"PrometheusUnavailable"' in _events(kubectl, namespace), 15, 0.5)
    # Held at what runs: the spec's two, never zero.
    held = _held(kubectl, namespace)
    assert held is not None
    assert held["service"] == "chat"
    assert held["replicas"] == [{"role": "aggregated", "replicas": 2}]
    assert replicas() == 2

    # What the autoscaler chooses reaches the workload; the spec stays Git's.
    _decide(kubectl, namespace, 3)
    assert wait_until(lambda: replicas() == 3, 30, 0.5), operator.tail()
    assert _md(kubectl, namespace, name)["spec"]["replicas"] == 2
    # Ticks holding on stale metrics keep the last decision, not the spec. Meanwhile the
    # reconciler judges Ready anew as the third replica starts, and each writer keeps the
    # other's condition: both are there at every read.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert set(conditions()) == set(both), service()["status"]
        assert conditions()["MetricsAvailable"] == "False"
        time.sleep(0.25)
    assert replicas() == 3

    # Autoscaling off: the deployment follows its spec again.
    kubectl.run(
        "patch", "infsvc", "chat", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"autoscaling": {"policy": "none"}}}),
    )  # fmt: skip
    assert wait_until(lambda: replicas() == 2, 30, 0.5), operator.tail()
    assert "autoscaling" not in _md(kubectl, namespace, name)["status"]


def test_deleting_an_autoscaled_service_hands_the_replicas_back_to_the_spec(
    operator: Operator, kubectl: Kubectl, namespace: str
) -> None:
    _autoscale(kubectl, namespace)
    assert wait_until(lambda: _held(kubectl, namespace) is not None, 60, 0.5), operator.tail()
    held = _held(kubectl, namespace)
    assert held is not None
    _decide(kubectl, namespace, 3)
    assert wait_until(lambda: _autoscaled_replicas(kubectl, namespace) == 3, 30, 0.5)

    kubectl.run("delete", "infsvc", "chat", "-n", namespace)
    # Nothing autoscales the deployment any more: it runs what its spec says, and it stays.
    assert wait_until(lambda: _held(kubectl, namespace) is None, 30, 0.5), operator.tail()
    assert wait_until(lambda: _autoscaled_replicas(kubectl, namespace) == 2, 30, 0.5)
    assert _md(kubectl, namespace, AUTOSCALED)["spec"]["replicas"] == 2
