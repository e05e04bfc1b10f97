"""The local fleet: a dev cluster with the fleet agent, the operator and Prometheus. Pods of
the `sim` example become real processes on their pod IPs; a request through a router pod
streams tokens; scaling adds an engine the routers find; deleting a pod ends its process, and
one that dies is restarted; Prometheus, discovering pods through the API server, scrapes
engines and routers with the labels the autoscaling controller's PromQL selects by; and LoRA
adapters added to the deployment are served by name through the routers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferfleet.autoscale.snapshot import ROLE_QUERIES, SERVICE_QUERIES
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, running
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import alive, wait_until
from inferfleet.devcluster.prometheus import Prometheus
from inferfleet.router.config import ADMIN_PORT
from tests.e2e.conftest import Kubectl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-8b-aggregated-sim.yaml"
NAMESPACE = "fleet"
DEPLOYMENT = "llama-3-1-8b"
SERVICE = "chat"
MODEL = "llama-3.1-8b"
ENGINES = f"inferfleet.io/model-deployment={DEPLOYMENT}"
ROUTERS = f"inferfleet.io/inference-service={SERVICE}"
PORT = 8000


@dataclass(frozen=True)
class Fleet:
    cluster: DevCluster
    kubectl: Kubectl
    prometheus: Prometheus

    def pods(self, selector: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.kubectl.json(
            "get", "pods", "-n", NAMESPACE, "-l", selector
        )["items"]
        return found

    def running_ips(self, selector: str) -> list[str]:
        return sorted(
            p["status"]["podIP"]
            for p in self.pods(selector)
            if p["status"].get("phase") == "Running"
            and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        )

    def log(self, name: str) -> str:
        path = self.cluster.log_dir / name
        return path.read_text(errors="replace")[-4000:] if path.exists() else f"(no {path})"

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {name}\n{self.log(name)}" for name in ("fleet-agent.log", "operator.log")
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    bin_dir = ensure_binaries()
    pools = NodePool.parse("H100-80GB=2")
    with running(tmp_path_factory.mktemp("fleet"), bin_dir, pools, with_fleet=True) as cluster:
        state = cluster.state()
        assert state is not None
        assert state.prometheus_port is not None
        prometheus = Prometheus(
            state.pids["prometheus"], state.prometheus_port, cluster.state_dir / "prometheus"
        )
        kubectl = Kubectl(bin_dir / "kube", cluster.kubeconfig_path)
        kubectl.run("create", "namespace", NAMESPACE)
        kubectl.run("apply", "--server-side", "-n", NAMESPACE, "-f", str(EXAMPLE))
        yield Fleet(cluster, kubectl, prometheus)


def _healthy(ip: str) -> bool:
    try:
        return httpx.get(f"http://{ip}:{PORT}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _pids_listening_on(ip: str) -> set[int]:
    """This machine's processes started with `--host <ip>` (what the agent runs per pod)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--host" in argv and ip.encode() in argv:
            found.add(int(cmdline.parent.name))
    return found


def _replicas(router_ip: str) -> list[str]:
    listed = httpx.get(f"http://{router_ip}:{ADMIN_PORT}/debug/replicas", timeout=2.0).json()
    return sorted(r["url"] for r in listed if r.get("healthy", True))


def _ready_condition(pod: dict[str, Any]) -> str | None:
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "Ready":
            return str(condition["status"])
    return None


def stream_completion(router_ip: str) -> list[str]:
    """The text pieces of a streamed completion through a router."""
    pieces = []
    body = {"model": MODEL, "prompt": "hello " * 50, "max_tokens": 16, "stream": True}
    with httpx.stream(
        "POST", f"http://{router_ip}:{PORT}/v1/completions", json=body, timeout=30.0
    ) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[len("data: ") :])["choices"][0]["text"])
    return pieces


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferfleet.cli", "dev-cluster", *args],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_dev_cluster_up_with_fleet_status_and_down(tmp_path: Path) -> None:
    directory = str(tmp_path / "dev-cluster")
    try:
        up = _cli("up", "--with-fleet", "--dir", directory, "--nodes", "H100-80GB=1")
        assert up.returncode == 0, up.stderr
        status = _cli("status", "--dir", directory)
        assert status.returncode == 0, status.stdout
        # `status` prints a 24-character name column, then the state.
        lines = {line[:24].strip(): line[24:].strip() for line in status.stdout.splitlines()}
        for component in ("fleet-agent", "operator", "prometheus"):
            assert lines[component].startswith("running"), status.stdout
        url = lines["prometheus url"]
        assert httpx.get(f"{url}/-/ready", timeout=5.0).status_code == 200
        state = json.loads((tmp_path / "dev-cluster" / "state.json").read_text())
        pids = list(state["pids"].values())
    finally:
        down = _cli("down", "--dir", directory)
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if alive(pid)]


def test_pods_run_as_processes_and_the_routers_follow_scaling(fleet: Fleet) -> None:
    # The engine pod: a process bound to its IP, answering, and Ready as the agent saw it.
    assert wait_until(lambda: len(fleet.running_ips(ENGINES)) == 1, 60, 0.5), fleet.diagnostics()
    (engine_ip,) = fleet.running_ips(ENGINES)
    assert engine_ip.startswith("127.1.")
    assert wait_until(lambda: _healthy(engine_ip), 30, 0.5), fleet.diagnostics()
    assert _pids_listening_on(engine_ip)
    (engine_pod,) = fleet.pods(ENGINES)
    assert wait_until(lambda: _ready_condition(fleet.pods(ENGINES)[0]) == "True", 15, 0.5)

    # Two router pods, each its own process, each finding the engine by pod.
    assert wait_until(lambda: len(fleet.running_ips(ROUTERS)) == 2, 60, 0.5), fleet.diagnostics()
    router_ips = fleet.running_ips(ROUTERS)
    for ip in router_ips:
        assert wait_until(lambda ip=ip: _healthy(ip), 30, 0.5), fleet.diagnostics()  # type: ignore[misc]
        assert _replicas(ip) == [f"http://{engine_ip}:{PORT}"]
    router = fleet.pods(ROUTERS)[0]
    assert "--discovery" in router["spec"]["containers"][0]["args"]

    pieces = stream_completion(router_ips[0])
    assert len(pieces) >= 8, pieces

    # kubectl scale: a second engine pod, a second process, both routers route to both.
    fleet.kubectl.run("scale", "mdep", DEPLOYMENT, "-n", NAMESPACE, "--replicas", "2")
    assert wait_until(lambda: len(fleet.running_ips(ENGINES)) == 2, 60, 0.5), fleet.diagnostics()
    engine_ips = fleet.running_ips(ENGINES)
    for ip in engine_ips:
        assert wait_until(lambda ip=ip: _healthy(ip), 30, 0.5), fleet.diagnostics()  # type: ignore[misc]
    wanted = [f"http://{ip}:{PORT}" for ip in engine_ips]
    for ip in router_ips:
        assert wait_until(lambda ip=ip: _replicas(ip) == wanted, 30, 0.5), (  # type: ignore[misc]
            _replicas(ip),
            wanted,
        )

    # Deleting the first engine pod ends its process (the Deployment replaces the pod).
    pids = _pids_listening_on(engine_ip)
    assert pids
    fleet.kubectl.run(
        "delete", "pod", engine_pod["metadata"]["name"], "-n", NAMESPACE, "--wait=false"
    )
    assert wait_until(lambda: not (pids & _pids_listening_on(engine_ip)), 30, 0.5), (
        fleet.diagnostics()
    )
    assert wait_until(
        lambda: (
            all(f"http://{engine_ip}:{PORT}" not in _replicas(ip) for ip in router_ips)
            or engine_ip in fleet.running_ips(ENGINES)
        ),
        30,
        0.5,
    )


def test_prometheus_scrapes_engines_and_routers_with_their_pod_labels(fleet: Fleet) -> None:
    prometheus = fleet.prometheus
    assert wait_until(lambda: len(fleet.running_ips(ROUTERS)) == 2, 60, 0.5)
    # A request, so that the router's per-outcome counters exist.
    ip = fleet.running_ips(ROUTERS)[0]
    assert wait_until(lambda: _healthy(ip), 30, 0.5), fleet.diagnostics()
    stream_completion(ip)

    def engine_series() -> list[dict[str, Any]]:
        return prometheus.query(f'vllm:num_requests_running{{namespace="{NAMESPACE}"}}')

    assert wait_until(lambda: len(engine_series()) >= 1, 30, 0.5), prometheus.query("up")
    for series in engine_series():
        labels = series["metric"]
        assert labels["inferfleet_io_role"] == "aggregated"
        assert labels["inferfleet_io_model_deployment"] == DEPLOYMENT
        assert labels["pod"].startswith(f"{DEPLOYMENT}-aggregated-")
        assert labels["instance"].startswith("127.1.")

    def router_series() -> list[dict[str, Any]]:
        return prometheus.query(
            f'inferfleet_router_requests_total{{namespace="{NAMESPACE}",service="{SERVICE}"}}'
        )

    assert wait_until(lambda: len(router_series()) >= 1, 30, 0.5), prometheus.query("up")
    for series in router_series():
        assert series["metric"]["inferfleet_io_inference_service"] == SERVICE

    # The controller's own queries select these series.
    substitutions = {
        "$NS": NAMESPACE,
        "$MD": DEPLOYMENT,
        "$R": "aggregated",
        "$S": SERVICE,
        "$w": "1m",
    }

    def promql(template: str) -> str:
        for name, value in substitutions.items():
            template = template.replace(name, value)
        return template

    ready = prometheus.scalar(promql(ROLE_QUERIES["ready_replicas"]))
    assert ready is not None
    assert ready >= 1
    assert wait_until(
        lambda: prometheus.scalar(promql(SERVICE_QUERIES["requests_per_s"])) is not None, 30, 0.5
    )


def test_a_process_that_dies_is_restarted_and_counted(fleet: Fleet) -> None:
    assert wait_until(lambda: len(fleet.running_ips(ENGINES)) >= 1, 60, 0.5)
    ip = fleet.running_ips(ENGINES)[0]
    assert wait_until(lambda: _healthy(ip), 30, 0.5), fleet.diagnostics()
    (pid,) = _pids_listening_on(ip)
    os.kill(pid, signal.SIGKILL)

    def pod() -> dict[str, Any]:
        (found,) = [p for p in fleet.pods(ENGINES) if p["status"].get("podIP") == ip]
        return found

    def restarted() -> bool:
        statuses = pod()["status"].get("containerStatuses") or [{}]
        return bool(statuses[0].get("restartCount", 0) >= 1 and _ready_condition(pod()) == "True")

    assert wait_until(restarted, 30, 0.5), (pod()["status"], fleet.diagnostics())
    assert _healthy(ip)
    new = _pids_listening_on(ip)
    assert new
    assert pid not in new


def _completion(router_ip: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "hello " * 20, "max_tokens": 4}
    return httpx.post(f"http://{router_ip}:{PORT}/v1/completions", json=body, timeout=30.0)


def test_lora_adapters_are_served_by_name_through_the_router(fleet: Fleet) -> None:
    """Adapters added to the deployment: the engines roll to serve them, the routers roll to
    route their names, and a request naming an adapter is answered under that name."""
    assert wait_until(lambda: len(fleet.running_ips(ENGINES)) >= 1, 60, 0.5), fleet.diagnostics()
    assert wait_until(lambda: len(fleet.running_ips(ROUTERS)) >= 1, 60, 0.5), fleet.diagnostics()
    adapters = [{"name": "sql-assistant", "source": "hf://example/sql-lora", "rank": 16}]
    fleet.kubectl.run(
        "patch", "mdep", DEPLOYMENT, "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"adapters": adapters}}),
    )  # fmt: skip

    for deployment in (f"{DEPLOYMENT}-aggregated", f"{SERVICE}-router"):
        fleet.kubectl.run(
            "rollout", "status", f"deployment/{deployment}", "-n", NAMESPACE, "--timeout=120s"
        )
    rolled: list[str] = []  # a router pod that routes the adapter's name

    def serving_the_adapter() -> bool:
        rolled[:] = [
            ip
            for ip in fleet.running_ips(ROUTERS)
            if _healthy(ip) and _completion(ip, "sql-assistant").status_code == 200
        ]
        return bool(rolled)

    assert wait_until(serving_the_adapter, 120, 1), fleet.diagnostics()
    engine = fleet.pods(ENGINES)[0]["spec"]["containers"][0]["args"]
    assert engine[engine.index("--adapter") + 1] == "sql-assistant=16"
    router_ip = rolled[0]
    answer = _completion(router_ip, "sql-assistant")
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "sql-assistant"
    assert _completion(router_ip, MODEL).json()["model"] == MODEL
    unknown = _completion(router_ip, "nope")
    assert unknown.status_code == 404
    assert "sql-assistant" in unknown.text
