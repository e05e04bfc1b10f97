"""The Helm chart installed into the dev cluster, as a user installs it: a real helm (built by
tools/helm/build.sh) against the real API server, the fleet agent running every pod from the
images tools/images/build.sh builds (the OCI runtime mode, through crun), no operator but the
chart's.

In order, on one cluster: every object the chart renders passes the API server's server-side
dry-run (the monitoring ones against the Prometheus Operator's own CRDs); `helm install --wait`
creates the CRDs and runs the operator from its image; the sim example becomes Ready with the
router and engine images the values name and serves a request; `helm test` fails against a
dead endpoint and passes against the operator's; `helm uninstall` leaves nothing of the operator
behind, and the CRDs stay."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml

from inferfleet import __version__
from inferfleet.api.crd import crd_files
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, Runtime, running
from inferfleet.devcluster.images import ensure_images
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import wait_until
from tests.e2e.conftest import Kubectl
from tests.unit.test_chart import CHART, helm_binary

# The first test brings the cluster up (and the images, if not cached); installs wait minutes.
pytestmark = pytest.mark.timeout(600)

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
EXAMPLE: Final = REPO_ROOT / "examples" / "llama-3.1-8b-aggregated-sim.yaml"
PROMETHEUS_OPERATOR_CRDS: Final = REPO_ROOT / "tools" / "helm" / "prometheus-operator-crds.sh"

# Not `inferfleet` in inferfleet-system: the dev cluster's fleet applies deploy/rbac/ there.
RELEASE: Final = "fleet"
NAMESPACE: Final = "ml-serving"
OPERATOR: Final = "fleet-inferfleet-operator"
# The local image store finds an image by its repository's last component, so a registry in
# the values still runs the images built here; the references prove where they came from.
REGISTRY: Final = "registry.example.com/ml"
ROUTER_IMAGE: Final = f"{REGISTRY}/inferfleet/router:{__version__}"
SIM_ENGINE_IMAGE: Final = f"{REGISTRY}/inferfleet/sim-engine:{__version__}"
OPERATOR_IMAGE: Final = f"{REGISTRY}/inferfleet/operator:{__version__}"
MODEL: Final = "llama-3.1-8b"
ROUTERS: Final = "inferfleet.io/inference-service=chat"
ENGINES: Final = "inferfleet.io/model-deployment=llama-3-1-8b"
OPERATOR_PODS: Final = (
    f"app.kubernetes.io/name=inferfleet-operator,app.kubernetes.io/instance={RELEASE}"
)
MONITORING_CRDS: Final = ("servicemonitors", "podmonitors", "prometheusrules")
CRD_NAMES: Final = tuple(yaml.safe_load(text)["metadata"]["name"] for text in crd_files().values())


@dataclass(frozen=True)
class Install:
    cluster: DevCluster
    kubectl: Kubectl
    helm_home: Path

    def helm(
        self, *args: str, check: bool = True, timeout_s: float = 360
    ) -> subprocess.CompletedProcess[str]:
        home = str(self.helm_home)
        result = subprocess.run(
            [str(helm_binary()), *args, "--kubeconfig", str(self.cluster.kubeconfig_path)],
            capture_output=True, text=True, check=False, timeout=timeout_s,
            env={"PATH": os.environ.get("PATH", ""), "HOME": home,
                 "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
                 "HELM_DATA_HOME": f"{home}/data"},
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n"
                f"{result.stderr}\n{self.diagnostics()}"
            )
        return result

    def values(self) -> list[str]:
        """The install's values: the images from a registry, the dev cluster's Prometheus,
        routers that find replicas by pod (Services are not routed here), one namespace's RBAC,
        NetworkPolicies, and every monitoring object."""
        settings = {
            "image.registry": REGISTRY,
            "rbac.scope": "namespace",
            "operator.routerDiscovery": "pods",
            "operator.prometheusUrl": self.cluster.prometheus_url or "",
            "monitoring.serviceMonitor.enabled": "true",
            "monitoring.podMonitor.enabled": "true",
            "monitoring.prometheusRule.enabled": "true",
            "monitoring.dashboards.enabled": "true",
            "operator.networkPolicies.enabled": "true",
            "operator.networkPolicies.prometheusNamespaces": "{monitoring}",
        }
        return [flag for key, value in settings.items() for flag in ("--set", f"{key}={value}")]

    def pods(self, selector: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.kubectl.json(
            "get", "pods", "-n", NAMESPACE, "-l", selector
        )["items"]
        return found

    def diagnostics(self) -> str:
        logs = self.cluster.log_dir
        paths = [logs / "fleet-agent.log", *sorted((logs / "pods").glob(f"{NAMESPACE}_*.log"))]
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in paths if p.exists()
        )


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    bin_dir = ensure_binaries()
    ensure_images()
    pools = NodePool.parse("H100-80GB=2")
    with running(
        tmp_path_factory.mktemp("helm-cluster"), bin_dir, pools,
        with_fleet=True, runtime=Runtime.OCI, operator=False,
    ) as cluster:  # fmt: skip
        kubectl = Kubectl(bin_dir / "kube", cluster.kubeconfig_path)
        # A fleet without an operator leaves its CRDs to the installer: here, the chart.
        listed = kubectl.run("get", "customresourcedefinition", "-o", "name").stdout
        assert not any(name in listed for name in CRD_NAMES), listed
        crds = (
            subprocess.run(
                ["bash", str(PROMETHEUS_OPERATOR_CRDS)], capture_output=True, text=True, check=True
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        for plural in MONITORING_CRDS:
            kubectl.run(
                "apply", "--server-side", "-f", f"{crds}/monitoring.coreos.com_{plural}.yaml"
            )
        kubectl.run("create", "namespace", NAMESPACE)
        yield Install(cluster, kubectl, tmp_path_factory.mktemp("helm-home"))


def _ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _owned_by_release(install: Install) -> list[str]:
    """Every object of the kinds the chart creates that carries the release's label."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    namespaced = "deployments,replicasets,pods,services,serviceaccounts,configmaps,roles," + (
        "rolebindings,servicemonitors,podmonitors,prometheusrules"
    )
    found = install.kubectl.json("get", namespaced, "-n", NAMESPACE, "-l", selector)["items"]
    found += install.kubectl.json("get", "clusterroles,clusterrolebindings", "-l", selector)[
        "items"
    ]
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in found)


@pytest.mark.parametrize(
    "settings",
    [
        ["rbac.scope=namespace"],
        ["rbac.scope=cluster"],
        # Tenant namespaces, with the admission policies and the tenant's quota and limits.
        [
            "rbac.scope=namespaces", f"rbac.namespaces={{{NAMESPACE}}}", "policies.enabled=true",
            "policies.allowedImageRegistries={registry.example.com/ml}",
            f"policies.tenants[0].namespace={NAMESPACE}", "policies.tenants[0].gpus=8",
            "policies.tenants[0].gpuTypes={H100-80GB,L4-24GB}",
            "policies.tenants[0].maxGpusPerReplica=4",
        ],
    ],
    ids=["namespace", "cluster", "tenant-namespaces-with-policies"],
)  # fmt: skip
def test_every_rendered_object_passes_server_side_dry_run(
    install: Install, settings: list[str]
) -> None:
    rendered = install.helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *install.values(),
        *(flag for setting in settings for flag in ("--set", setting)),
    ).stdout  # fmt: skip
    # CRDs aside (templates only): the API server validates each against its schema.
    result = install.kubectl.run(
        "apply", "--server-side", "--dry-run=server", "-f", "-",
        stdin=rendered, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    kinds = {line.split("/", 1)[0] for line in result.stdout.splitlines()}
    for kind in (
        "deployment.apps",
        "clusterrole.rbac.authorization.k8s.io",
        "servicemonitor.monitoring.coreos.com",
        "podmonitor.monitoring.coreos.com",
        "prometheusrule.monitoring.coreos.com",
        "configmap",
        "pod",
    ):
        assert kind in kinds, result.stdout


def test_install_runs_the_operator_from_its_image(install: Install) -> None:
    install.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, *install.values(),
        "--wait", "--timeout", "5m",
    )  # fmt: skip
    for name in CRD_NAMES:
        install.kubectl.run("get", "customresourcedefinition", name)
    deployment = install.kubectl.json("get", "deployment", OPERATOR, "-n", NAMESPACE)
    assert deployment["status"].get("readyReplicas") == 2
    pods = install.pods(OPERATOR_PODS)
    assert len(pods) == 2
    for url in [f"http://{p['status']['podIP']}:8081/healthz" for p in pods]:
        assert wait_until(functools.partial(_answers, url), 60, 0.5), install.diagnostics()

    def holder() -> str:
        r = install.kubectl.run(
            "get", "lease", OPERATOR, "-n", NAMESPACE, "-o", "json", check=False
        )
        return json.loads(r.stdout)["spec"].get("holderIdentity", "") if r.returncode == 0 else ""

    assert wait_until(lambda: holder() != "", 60, 0.5), install.diagnostics()
    # One leads (its name starts the Lease's holder identity); the other waits, alive.
    (pod,) = [p for p in pods if holder().startswith(p["metadata"]["name"] + "_")]
    assert pod["spec"]["containers"][0]["image"] == OPERATOR_IMAGE
    ip = pod["status"]["podIP"]
    # The operator answers on its pod's IP: kopf's health endpoint and its own metrics. (kwok
    # reports a pod Ready the moment it runs, before the fleet agent has started its container
    # and probed it: `--wait` here is weaker than on a cluster with kubelets.)
    assert wait_until(lambda: _answers(f"http://{ip}:8081/healthz"), 60, 0.5), install.diagnostics()
    metrics = httpx.get(f"http://{ip}:8080/metrics", timeout=5.0)
    assert metrics.status_code == 200
    assert "inferfleet_operator_reconcile_errors" in metrics.text
    # Run from the image: the interpreter is the image's, which this machine does not have.
    assert not Path("/opt/inferfleet").exists()
    assert _operator_argv(ip), "no process of the image's inferfleet listens on the pod's IP"


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _operator_argv(ip: str) -> list[str]:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = [a.decode() for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if "/opt/inferfleet/bin/inferfleet" in argv and f"--metrics-address={ip}" in argv:
            return argv
    return []


def test_the_example_becomes_ready_with_the_images_of_the_values(install: Install) -> None:
    install.kubectl.run("apply", "--server-side", "-n", NAMESPACE, "-f", str(EXAMPLE))

    def service_ready() -> bool:
        service = install.kubectl.json("get", "inferenceservice", "chat", "-n", NAMESPACE)
        return _ready(service)

    assert wait_until(service_ready, 180, 1.0), install.diagnostics()
    routers = install.pods(ROUTERS)
    engines = install.pods(ENGINES)
    assert routers
    assert engines
    assert {p["spec"]["containers"][0]["image"] for p in routers} == {ROUTER_IMAGE}
    assert {p["spec"]["containers"][0]["image"] for p in engines} == {SIM_ENGINE_IMAGE}
    # The NetworkPolicies the values ask for, stored by the API server (which validates them;
    # the dev cluster has no network plugin to enforce them: tests/unit/test_render_network.py
    # judges what they let through).
    policies = install.kubectl.json("get", "networkpolicies", "-n", NAMESPACE)["items"]
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "chat-router", "chat-router-to-engines", "llama-3-1-8b-engines",
    ]  # fmt: skip
    # A request through a router pod reaches the engine and comes back (once the fleet agent
    # has started the router's container: kwok's Ready comes first).
    router_ip = routers[0]["status"]["podIP"]
    body = {"model": MODEL, "prompt": "hello " * 20, "max_tokens": 8}
    texts: list[str] = []

    def completed() -> bool:
        try:
            answer = httpx.post(f"http://{router_ip}:8000/v1/completions", json=body, timeout=30)
        except httpx.HTTPError:
            return False
        if answer.status_code == 200:
            texts.append(answer.json()["choices"][0]["text"])
        return answer.status_code == 200

    assert wait_until(completed, 90, 1.0), install.diagnostics()
    assert texts[-1]


def test_helm_test_checks_the_operators_health_endpoint(install: Install) -> None:
    pod = install.pods(OPERATOR_PODS)[0]
    ip = pod["status"]["podIP"]
    # Services are not routed in the dev cluster: the test pod is pointed at the pod's IP.
    # First at a port nothing listens on, where it must fail...
    install.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *install.values(),
        "--set", f"tests.healthUrl=http://{ip}:9/healthz", "--wait",
    )  # fmt: skip
    failed = install.helm(
        "test", RELEASE, "--namespace", NAMESPACE, "--timeout", "90s", check=False
    )
    assert failed.returncode != 0, failed.stdout
    # Failed because its container could not connect and exited non-zero, not by a timeout
    # (its log is the fleet agent's file: no kubelet serves pod logs here); and the pod is
    # gone, as after every run.
    assert "deadline exceeded" not in failed.stderr, failed.stderr
    log = install.cluster.log_dir / "pods" / f"{NAMESPACE}_{OPERATOR}-test-health.log"
    assert "Connection refused" in log.read_text(errors="replace"), install.diagnostics()
    assert not _test_pods(install)
    # ...then at the operator's health endpoint, where it passes.
    install.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *install.values(),
        "--set", f"tests.healthUrl=http://{ip}:8081/healthz", "--wait",
    )  # fmt: skip
    passed = install.helm("test", RELEASE, "--namespace", NAMESPACE, "--timeout", "90s")
    assert "Succeeded" in passed.stdout, passed.stdout
    assert not _test_pods(install)
    # The upgrades changed no pod: the operator was not restarted by them.
    assert pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in install.pods(OPERATOR_PODS)}


def _test_pods(install: Install) -> list[str]:
    found = install.kubectl.run(
        "get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=test", "-o", "name"
    ).stdout
    return found.split()


def test_uninstall_leaves_nothing_of_the_operator_and_keeps_the_crds(install: Install) -> None:
    assert _owned_by_release(install)
    # Users' resources first, while the operator still runs.
    install.kubectl.run("delete", "-n", NAMESPACE, "-f", str(EXAMPLE), "--wait=true")
    pod = install.pods(OPERATOR_PODS)[0]
    ip = pod["status"]["podIP"]
    install.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")

    assert wait_until(lambda: not _owned_by_release(install), 60, 1.0), _owned_by_release(install)
    # By name too, whatever their labels.
    left = install.kubectl.run(
        "get", "deployment,serviceaccount,service,role,rolebinding", OPERATOR, "-n", NAMESPACE,
        "--ignore-not-found", "-o", "name",
    ).stdout + install.kubectl.run(
        "get", "clusterrole,clusterrolebinding", f"{OPERATOR}-cluster-reader-{NAMESPACE}",
        "--ignore-not-found", "-o", "name",
    ).stdout  # fmt: skip
    assert not left.strip(), left
    assert wait_until(lambda: not _operator_argv(ip), 60, 1.0), "the operator still runs"
    # The Lease the operator created goes with its Deployment, its owner.
    assert wait_until(
        lambda: (
            not install.kubectl.run(
                "get", "lease", OPERATOR, "-n", NAMESPACE, "--ignore-not-found", "-o", "name"
            ).stdout.strip()
        ),
        60,
        1.0,
    ), "the operator's Lease is still there"
    listed = install.helm("list", "--namespace", NAMESPACE, "-o", "json").stdout
    assert json.loads(listed) == []
    assert "not found" in install.helm("status", RELEASE, "-n", NAMESPACE, check=False).stderr
    # Helm never deletes CRDs: the users' definitions (and any resources elsewhere) stay.
    for name in CRD_NAMES:
        install.kubectl.run("get", "customresourcedefinition", name)
