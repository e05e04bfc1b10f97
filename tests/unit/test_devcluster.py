"""The dev cluster's pure parts (node shapes, command lines) and its process supervision."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from inferfleet.api.catalog import GpuCatalog, GpuType
from inferfleet.devcluster import pki, processes
from inferfleet.devcluster.cluster import State, operator_deployment
from inferfleet.devcluster.components import POD_CIDR, ClientRateLimit, Ports, component_specs
from inferfleet.devcluster.nodes import GPU_RESOURCE, NodePool, gpu_node
from inferfleet.devcluster.oci import ImageConfig, container_launch


def test_node_pools_parse_and_refuse_by_part() -> None:
    assert NodePool.parse("H100-80GB=2, L4-24GB") == (
        NodePool(GpuType.H100_80GB, 2),
        NodePool(GpuType.L4_24GB, 1),
    )
    with pytest.raises(ValueError, match="unknown GPU type 'H100' in 'H100=2'"):
        NodePool.parse("H100=2")
    with pytest.raises(ValueError, match="positive integer"):
        NodePool.parse("H100-80GB=0")
    with pytest.raises(ValueError, match="at least one node pool"):
        NodePool.parse(" , ")


def test_a_fake_gpu_node_looks_like_a_real_one() -> None:
    node = gpu_node(GpuType.H200_141GB, 3, GpuCatalog.builtin())
    assert node["metadata"]["name"] == "gpu-h200-141gb-3"
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["inferfleet.io/gpu-type"] == "H200-141GB"
    assert node["status"]["capacity"][GPU_RESOURCE] == "8"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert node["spec"]["taints"] == [
        {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_components_bind_loopback_and_admit_quota_and_policies(tmp_path: Path) -> None:
    certs = pki.generate(tmp_path / "pki")
    ports = Ports(2379, 2380, 6443, 10257, 10259, 10247)
    specs = {s.name: s.argv for s in component_specs(Path("/bin"), tmp_path, ports, certs)}
    assert list(specs) == [
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"
    ]  # fmt: skip
    apiserver = " ".join(specs["kube-apiserver"])
    assert "--bind-address=127.0.0.1" in apiserver
    assert "ResourceQuota" in apiserver
    assert "ValidatingAdmissionPolicy" in apiserver
    assert "--authorization-mode=Node,RBAC" in apiserver
    controllers = next(a for a in specs["kube-controller-manager"] if a.startswith("--controllers"))
    for needed in ("garbage-collector", "deployment", "replicaset", "endpointslice"):
        assert f"{needed}-controller" in controllers
    assert f"--cidr={POD_CIDR}" in specs["kwok"]


def test_a_client_rate_limit_raises_the_controller_manager_and_scheduler_only(
    tmp_path: Path,
) -> None:
    certs = pki.generate(tmp_path / "pki")
    ports = Ports(2379, 2380, 6443, 10257, 10259, 10247)
    by_default = {s.name: s.argv for s in component_specs(Path("/bin"), tmp_path, ports, certs)}
    raised = {
        s.name: s.argv
        for s in component_specs(
            Path("/bin"), tmp_path, ports, certs, ClientRateLimit(qps=100, burst=200)
        )
    }
    for argv in by_default.values():
        assert not any(a.startswith("--kube-api-") for a in argv)
    for name in ("kube-controller-manager", "kube-scheduler"):
        assert raised[name] == (*by_default[name], "--kube-api-qps=100", "--kube-api-burst=200")
    for name in ("etcd", "kube-apiserver", "kwok"):
        assert raised[name] == by_default[name]


def test_pki_files_are_private(tmp_path: Path) -> None:
    certs = pki.generate(tmp_path / "pki")
    assert (tmp_path / "pki").stat().st_mode & 0o777 == 0o700
    assert certs.admin.key.stat().st_mode & 0o777 == 0o600
    assert certs.service_account_key.stat().st_mode & 0o777 == 0o600


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    # A parent that ignores nothing and a grandchild: both must go.
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    spec = processes.ProcessSpec("sleeper", (sys.executable, "-c", script))
    pid = processes.start(spec, tmp_path, bound_to_parent=True)
    assert processes.wait_until(lambda: _group_size(pid) == 2, 10)
    assert processes.alive(pid)
    assert processes.stop([pid], grace_s=5) == []
    assert not processes.alive(pid)
    # The grandchild got the same SIGTERM; on a busy machine it may take a moment to exit.
    assert processes.wait_until(lambda: _group_size(pid) == 0, 5)


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ignoring"
    script = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(300)"
    )
    spec = processes.ProcessSpec("stubborn", (sys.executable, "-c", script, str(ready)))
    pid = processes.start(spec, tmp_path, bound_to_parent=True)
    assert processes.wait_until(ready.exists, 10)
    assert processes.stop([pid], grace_s=0.5) == [pid]
    assert not processes.alive(pid)


def _group_size(pgid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            count += 1
    return count


def test_free_port_is_free() -> None:
    port = processes.free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))


def test_the_operator_pod_runs_its_image_locked_down_on_its_pod_ip() -> None:
    deployment = operator_deployment(
        "inferfleet/operator:0.1.0", "inferfleet-system", ("--prometheus-url", "http://p:9090")
    )
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "inferfleet-operator"
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["image"] == "inferfleet/operator:0.1.0"
    assert container["command"] == ["inferfleet", "run"]
    assert container["args"][:2] == ["--prometheus-url", "http://p:9090"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Pods share the host's network on fake nodes: its ports listen on the pod's IP only.
    launch = container_launch(
        {"metadata": {"name": "op", "namespace": "inferfleet-system"},
         "status": {"podIP": "127.1.0.4"}, "spec": spec},
        container,
        ImageConfig(user="65532:65532"),
        ("127.0.0.1", 6443),
    )  # fmt: skip
    assert launch.argv[-2:] == ("--liveness", "http://127.1.0.4:8081/healthz")
    assert dict(launch.env)["INFERFLEET_METRICS_ADDRESS"] == "127.1.0.4"
    assert launch.read_only_root
    assert [m.path for m in launch.mounts] == ["/tmp"]
    assert launch.identity.uid == 65532


def test_a_state_file_records_how_the_fleet_runs(tmp_path: Path) -> None:
    state = State("/bin", Ports(1, 2, 3, 4, 5, 6), fleet=True, runtime="oci", images="/i")
    state.operator = "pod"
    state.save(tmp_path / "state.json")
    loaded = State.load(tmp_path / "state.json")
    assert (loaded.runtime, loaded.images, loaded.operator) == ("oci", "/i", "pod")
