"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and kwok playing the kubelets of fake GPU nodes.

`DevCluster` is what `inferfleet dev-cluster up|down|status|kubeconfig` and the e2e fixture
both use; its components' command lines are `devcluster.components`. With the fleet (`up
--with-fleet`, `running(..., with_fleet=True)`), it also runs what makes pods real: the fleet
agent (`devcluster.fleet`: a process per engine and router pod, on the pod's IP), the operator
as its least-privilege ServiceAccount with routers that find replicas by pod (`inferfleet run
--router-discovery pods`), and a Prometheus that discovers and scrapes the pods through the API
server.

The fleet runs pods one of two ways (`Runtime`): the venv's `inferfleet` as host processes
(the default, quick to start), or each pod's container from its image through crun (`oci`:
the images tools/images/build.sh builds). In the OCI mode the operator runs as a pod too: a
Deployment of its image with its ServiceAccount, as a chart installs it; or not at all
(`operator=False`), for whoever installs it themselves.

Everything lives in one state directory: certificates, kubeconfigs, etcd's data, logs and
`state.json` (ports and pids), so `down` and `status` work from another process.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
import yaml

from inferfleet import __version__
from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.crd import custom_resource_definitions
from inferfleet.devcluster import kubelet_api, pki, processes
from inferfleet.devcluster.components import (
    ClientRateLimit,
    Ports,
    component_specs,
    fleet_pod_stages,
    kubeconfig,
)
from inferfleet.devcluster.images import ensure_images
from inferfleet.devcluster.nodes import NodePool, fleet_nodes
from inferfleet.devcluster.processes import ProcessSpec
from inferfleet.devcluster.prometheus import (
    Prometheus,
    ensure_prometheus,
    kubernetes_pods_job,
    pod_discovery_rbac,
    static_job,
)
from inferfleet.devcluster.thirdparty import PUBLISHED_CRDS, published_crd
from inferfleet.kube import Kube
from inferfleet.render.rbac import DEFAULT_NAMESPACE as OPERATOR_NAMESPACE
from inferfleet.render.rbac import OPERATOR_NAME, cluster_wide

STATE_FILE = "state.json"
# Components start in this order and stop in the reverse one.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# With the fleet, these start after the control plane, in this order, and stop before it.
FLEET_COMPONENTS = ("fleet-agent", "prometheus", "operator")
# ServiceAccount tokens of the operator and Prometheus: a dev cluster rarely lives longer.
TOKEN_LIFETIME_S = 7 * 24 * 3600
# Prometheus' identity: a ServiceAccount that reads pods, nothing else.
MONITORING_NAMESPACE = "monitoring"
PROMETHEUS_ACCOUNT = "prometheus"
SCRAPE_INTERVAL_S = 1.0
# The autoscaler's recent arrival rate, over five of those scrapes.
RECENT_METRICS_WINDOW_S = 5 * SCRAPE_INTERVAL_S
OPERATOR_IMAGE = f"inferfleet/operator:{__version__}"
# The alerting and recording rules the chart ships, evaluated by the fleet's Prometheus too
# (in a checkout; an installed package has no chart beside it).
RULES_FILE = (
    Path(__file__).resolve().parents[3]
    / "charts"
    / "inferfleet"
    / "rules"
    / "inferfleet.rules.yaml"
)
# The operator pod's liveness and metrics ports, on its pod IP (pods share the host's network).
OPERATOR_HEALTH_PORT = 8081
OPERATOR_METRICS_PORT = 8080
# Write requests, with who made them: what the e2e tier counts to prove an idle operator idles.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "Metadata"},
    ],
}


class Runtime(StrEnum):
    """How the fleet agent runs pods: host processes of the venv, or containers of images."""

    VENV = "venv"
    OCI = "oci"


class DevClusterError(RuntimeError):
    """The cluster could not be brought up or reached; the message says which component."""


@dataclass
class State:
    bin_dir: str
    ports: Ports
    pids: dict[str, int] = field(default_factory=dict)
    node_pools: list[str] = field(default_factory=list)
    started_at: float = 0.0
    fleet: bool = False
    prometheus_port: int | None = None
    operator_health_port: int | None = None
    operator_metrics_port: int | None = None
    runtime: str = Runtime.VENV.value
    images: str | None = None
    operator: str = "process"
    """How the operator runs: "process" (a host process), "pod", or "none"."""

    @classmethod
    def load(cls, path: Path) -> State:
        data = json.loads(path.read_text())
        return cls(
            bin_dir=data["bin_dir"],
            ports=Ports(**data["ports"]),
            pids=data["pids"],
            node_pools=data["node_pools"],
            started_at=data["started_at"],
            fleet=data.get("fleet", False),
            prometheus_port=data.get("prometheus_port"),
            operator_health_port=data.get("operator_health_port"),
            operator_metrics_port=data.get("operator_metrics_port"),
            runtime=data.get("runtime", Runtime.VENV.value),
            images=data.get("images"),
            operator=data.get("operator", "process"),
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))


def operator_metrics_job(port: int) -> dict[str, Any]:
    """The host operator's own metrics. Its series carry the namespaces of the resources they
    describe: kept as they are (`honor_labels`), as a cluster's Prometheus scrapes them."""
    return {**static_job("inferfleet-operator", [f"127.0.0.1:{port}"]), "honor_labels": True}


def operator_deployment(image: str, namespace: str, args: tuple[str, ...]) -> dict[str, Any]:
    """The operator as a pod of its image, as an install would run it: its ServiceAccount,
    non-root, read-only root, no capabilities. Its liveness and metrics ports listen on the
    pod's IP (on the dev cluster's fake nodes pods share the host's network, where a wildcard
    address would collide with the next pod's)."""
    labels = {"app.kubernetes.io/name": OPERATOR_NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR_NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": OPERATOR_NAME,
                    "securityContext": {"runAsNonRoot": True},
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    "containers": [
                        {
                            "name": "operator",
                            "image": image,
                            "command": ["inferfleet", "run"],
                            "args": [
                                *args,
                                "--liveness",
                                f"http://$(POD_IP):{OPERATOR_HEALTH_PORT}/healthz",
                            ],
                            "env": [
                                {
                                    "name": "POD_IP",
                                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                },
                                {"name": "INFERFLEET_METRICS_ADDRESS", "value": "$(POD_IP)"},
                                {
                                    "name": "INFERFLEET_METRICS_PORT",
                                    "value": str(OPERATOR_METRICS_PORT),
                                },
                            ],
                            "ports": [
                                {"name": "health", "containerPort": OPERATOR_HEALTH_PORT},
                                {"name": "metrics", "containerPort": OPERATOR_METRICS_PORT},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/healthz", "port": "health"},
                            },
                            # The root is read-only; HOME and scratch space are /tmp.
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                            "securityContext": {
                                "readOnlyRootFilesystem": True,
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


class DevCluster:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.resolve()

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfigs" / "admin.yaml"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def _state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    def state(self) -> State | None:
        return State.load(self._state_path) if self._state_path.exists() else None

    def up(
        self,
        bin_dir: Path,
        pools: tuple[NodePool, ...],
        *,
        cpu_nodes: int = 1,
        bound_to_parent: bool = False,
        timeout_s: float = 120.0,
        client_rate: ClientRateLimit | None = None,
        readiness_by_fleet: bool = False,
    ) -> State:
        """Start every component, wait until each is healthy and every node Ready;
        `client_rate` raises the controller manager's and the scheduler's request limits;
        `readiness_by_fleet`: pods with a readiness probe turn Running unready, for the fleet
        agent to make ready (`components.fleet_pod_stages`)."""
        existing = self.state()
        if existing and any(processes.alive(pid) for pid in existing.pids.values()):
            raise DevClusterError(
                f"a dev cluster already runs from {self.state_dir}; `inferfleet dev-cluster down`"
            )
        for sub in ("kubeconfigs", "logs", "etcd"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        certs = pki.generate(self.state_dir / "pki")
        ports = Ports.pick()
        server = f"https://127.0.0.1:{ports.apiserver}"
        identities = {
            "admin": certs.admin,
            "controller-manager": certs.controller_manager,
            "scheduler": certs.scheduler,
            "kwok": certs.kwok,
        }
        for name, pair in identities.items():
            path = self.state_dir / "kubeconfigs" / f"{name}.yaml"
            path.write_text(yaml.safe_dump(kubeconfig(server, certs.ca.cert, pair)))
            path.chmod(0o600)
        (self.state_dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

        state = State(
            bin_dir=str(bin_dir),
            ports=ports,
            node_pools=[f"{p.gpu_type.value}={p.count}" for p in pools],
            started_at=time.time(),
        )
        try:
            stages = None
            if readiness_by_fleet:
                stages = self.state_dir / "kwok-stages.yaml"
                built = (bin_dir / "kwok-stages.yaml").read_text()
                stages.write_text(fleet_pod_stages(built))
            specs = component_specs(
                bin_dir, self.state_dir, ports, certs, client_rate, stages=stages
            )
            for spec in specs:
                state.pids[spec.name] = processes.start(
                    spec, self.log_dir, bound_to_parent=bound_to_parent
                )
                state.save(self._state_path)
                self._wait_healthy(spec.name, state, certs, timeout_s)
            self._register_nodes(pools, cpu_nodes, timeout_s)
        except BaseException:
            self.down()
            raise
        return state

    def start_fleet(
        self,
        *,
        bound_to_parent: bool = False,
        timeout_s: float = 60.0,
        autoscale_interval_s: float = 15.0,
        metrics_window_s: float = 60.0,
        runtime: Runtime = Runtime.VENV,
        images: Path | None = None,
        operator: bool = True,
        hf_endpoint: str | None = None,
    ) -> State:
        """On a running cluster: the CRDs, the operator's RBAC (deploy/rbac/cluster-wide.yaml),
        then the fleet agent, Prometheus, and the operator as its ServiceAccount (routers that
        find replicas by pod, autoscaling from that Prometheus).

        `runtime=Runtime.OCI`: the agent runs pods from the images in `images` (default: built
        by tools/images/build.sh) through crun, and the operator is a pod of its image.
        `operator=False`: no operator at all, nor its CRDs (whoever installs the operator, a
        chart, brings them); the published CRDs of the projects it renders for are installed.
        `hf_endpoint`: the model hub the operator's weight caches fill from (`inferfleet
        run --hf-endpoint`; the dev cluster has no network: `devcluster.hub` serves one)."""
        state = self.state()
        if state is None or not processes.alive(state.pids.get("kube-apiserver", 0)):
            raise DevClusterError(f"no dev cluster runs from {self.state_dir}")
        if runtime == Runtime.OCI and images is None:
            images = ensure_images()
        self.install_crds(ours=operator)
        kube = Kube.from_kubeconfig(self.kubeconfig_path)
        for namespace in (OPERATOR_NAMESPACE, MONITORING_NAMESPACE):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for obj in cluster_wide(OPERATOR_NAMESPACE):
            kube.apply(obj)
        for obj in pod_discovery_rbac(PROMETHEUS_ACCOUNT, MONITORING_NAMESPACE):
            kube.apply(obj)
        prometheus_token = self._token_file(
            kube, PROMETHEUS_ACCOUNT, MONITORING_NAMESPACE, "prometheus.token"
        )
        state.fleet = True
        state.runtime = runtime.value
        state.images = str(images.resolve()) if runtime == Runtime.OCI and images else None
        state.operator = "none" if not operator else "pod" if runtime == Runtime.OCI else "process"
        python = sys.executable
        certs = self._pki_paths()
        agent: tuple[str, ...] = (python, "-m", "inferfleet.devcluster.fleet", str(self.state_dir))
        if state.images:
            agent += ("--images", state.images)
        try:
            self._start(ProcessSpec("fleet-agent", agent), state, bound_to_parent=bound_to_parent)
            job = kubernetes_pods_job(
                "kubernetes-pods",
                api_server=f"https://127.0.0.1:{state.ports.apiserver}",
                ca_file=certs.ca.cert,
                token_file=prometheus_token,
            )
            jobs = [job]
            if state.operator == "process":
                # Known before Prometheus starts, so that it scrapes the operator from the first.
                state.operator_metrics_port = processes.free_port()
                jobs.append(operator_metrics_job(state.operator_metrics_port))
            prometheus = Prometheus.start(
                self.state_dir / "prometheus",
                jobs,
                scrape_interval_s=SCRAPE_INTERVAL_S,
                rule_files=[RULES_FILE] if RULES_FILE.is_file() else [],
                binary=ensure_prometheus(kubernetes_sd=True),
                bound_to_parent=bound_to_parent,
            )
            state.pids["prometheus"] = prometheus.pid
            state.prometheus_port = prometheus.port
            state.save(self._state_path)
            operator_args = (
                "--router-discovery", "pods",
                "--prometheus-url", prometheus.url,
                "--autoscale-interval", f"{autoscale_interval_s:g}",
                "--metrics-window", f"{metrics_window_s:g}",
                "--recent-metrics-window", f"{RECENT_METRICS_WINDOW_S:g}",
                *(("--hf-endpoint", hf_endpoint) if hf_endpoint else ()),
            )  # fmt: skip
            self._wait_healthy("fleet-agent", state, certs, timeout_s)
            # Last: it reads the metrics of the services it autoscales from that Prometheus.
            if state.operator == "process":
                state.operator_health_port = processes.free_port()
                self._start(
                    ProcessSpec(
                        "operator",
                        (
                            python, "-m", "inferfleet.cli", "run", *operator_args,
                            "--liveness",
                            f"http://127.0.0.1:{state.operator_health_port}/healthz",
                            "--metrics-address", "127.0.0.1",
                            "--metrics-port", str(state.operator_metrics_port),
                        ),
                        env={"KUBECONFIG": str(self._operator_kubeconfig(kube))},
                    ),
                    state,
                    bound_to_parent=bound_to_parent,
                )  # fmt: skip
                self._wait_healthy("operator", state, certs, timeout_s)
            elif state.operator == "pod":
                kube.apply(operator_deployment(OPERATOR_IMAGE, OPERATOR_NAMESPACE, operator_args))
                self.wait_deployment_ready(OPERATOR_NAME, OPERATOR_NAMESPACE, timeout_s)
        except BaseException:
            self.down()
            raise
        return state

    def wait_deployment_ready(self, name: str, namespace: str, timeout_s: float) -> None:
        """Until a Deployment's replicas are all Ready (the fleet agent's probes say so)."""
        kube = Kube.from_kubeconfig(self.kubeconfig_path)

        def ready() -> bool:
            found = kube.get("apps/v1", "Deployment", name, namespace) or {}
            wanted = (found.get("spec") or {}).get("replicas", 1)
            return bool((found.get("status") or {}).get("readyReplicas", 0) >= wanted)

        if not processes.wait_until(ready, timeout_s, 0.5):
            raise DevClusterError(
                f"Deployment {namespace}/{name} not Ready after {timeout_s:.0f} s; the fleet "
                "agent's log ends:\n" + processes.log_tail(self.log_dir, "fleet-agent")
            )

    def _start(self, spec: ProcessSpec, state: State, *, bound_to_parent: bool) -> None:
        state.pids[spec.name] = processes.start(spec, self.log_dir, bound_to_parent=bound_to_parent)
        state.save(self._state_path)

    def _token_file(self, kube: Kube, account: str, namespace: str, file_name: str) -> Path:
        """A token of a ServiceAccount (TokenRequest API) in a private file."""
        token = kubelet_api.request_token(kube, account, namespace, expiration_s=TOKEN_LIFETIME_S)
        path = self.state_dir / "kubeconfigs" / file_name
        path.touch(mode=0o600)
        path.write_text(token)
        return path

    def _operator_kubeconfig(self, kube: Kube) -> Path:
        """A kubeconfig with a token of the operator's ServiceAccount, as its pod would get."""
        token_file = self._token_file(kube, OPERATOR_NAME, OPERATOR_NAMESPACE, "operator.token")
        admin = yaml.safe_load(self.kubeconfig_path.read_text())
        admin["users"] = [
            {"name": admin["users"][0]["name"], "user": {"tokenFile": str(token_file)}}
        ]
        path = self.state_dir / "kubeconfigs" / "operator.yaml"
        path.write_text(yaml.safe_dump(admin))
        path.chmod(0o600)
        return path

    @property
    def prometheus_url(self) -> str | None:
        """Where the fleet's Prometheus answers, while it runs."""
        state = self.state()
        if state is None or state.prometheus_port is None or "prometheus" not in state.pids:
            return None
        return f"http://127.0.0.1:{state.prometheus_port}"

    def down(self) -> list[str]:
        """Stop every component (the fleet first, then kwok, etcd last); returns those that
        needed SIGKILL."""
        state = self.state()
        if state is None:
            return []
        order = [c for c in (*reversed(FLEET_COMPONENTS), *reversed(COMPONENTS)) if c in state.pids]
        killed = processes.stop([state.pids[c] for c in order])
        state.pids = {}
        state.save(self._state_path)
        return [c for c in order if state.pids.get(c) in killed]

    def status(self) -> dict[str, str]:
        """Each component: running (with pid) or stopped, and whether it answers health checks."""
        state = self.state()
        if state is None:
            return dict.fromkeys(COMPONENTS, "never started")
        report = {}
        fleet = [c for c in FLEET_COMPONENTS if c != "operator" or state.operator == "process"]
        for component in (*COMPONENTS, *(fleet if state.fleet else ())):
            pid = state.pids.get(component)
            if pid is None or not processes.alive(pid):
                report[component] = "stopped"
                continue
            healthy = self._healthy(component, state, self._pki_paths())
            report[component] = f"running (pid {pid}){'' if healthy else ', not healthy'}"
        return report

    def _pki_paths(self) -> pki.ClusterPki:
        directory = self.state_dir / "pki"

        def pair(name: str) -> pki.Pair:
            return pki.Pair(directory / f"{name}.crt", directory / f"{name}.key")

        return pki.ClusterPki(
            ca=pair("ca"),
            apiserver=pair("apiserver"),
            admin=pair("admin"),
            controller_manager=pair("controller-manager"),
            scheduler=pair("scheduler"),
            kwok=pair("kwok"),
            service_account_key=directory / "service-account.key",
            service_account_public=directory / "service-account.pub",
        )

    def _health_url(self, component: str, state: State) -> str | None:
        """Where a component answers health checks; None where being alive is all it shows."""
        ports = state.ports
        return {
            "etcd": f"http://127.0.0.1:{ports.etcd_client}/health",
            "kube-apiserver": f"https://127.0.0.1:{ports.apiserver}/readyz",
            "kube-controller-manager": f"https://127.0.0.1:{ports.controller_manager}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{ports.scheduler}/healthz",
            "kwok": f"http://127.0.0.1:{ports.kwok}/healthz",
            "operator": f"http://127.0.0.1:{state.operator_health_port}/healthz",
            "prometheus": f"http://127.0.0.1:{state.prometheus_port}/-/ready",
        }.get(component)

    def _healthy(self, component: str, state: State, certs: pki.ClusterPki) -> bool:
        url = self._health_url(component, state)
        if url is None:
            return True
        tls = ssl.create_default_context(cafile=str(certs.ca.cert))
        tls.load_cert_chain(str(certs.admin.cert), str(certs.admin.key))
        try:
            with httpx.Client(verify=tls, timeout=2.0) as client:
                return client.get(url).status_code == httpx.codes.OK
        except httpx.HTTPError:
            return False

    def _wait_healthy(
        self, component: str, state: State, certs: pki.ClusterPki, timeout_s: float
    ) -> None:
        pid = state.pids[component]

        def ready() -> bool:
            if not processes.alive(pid):
                raise DevClusterError(
                    f"{component} exited during start-up; its log ends:\n"
                    + processes.log_tail(self.log_dir, component)
                )
            return self._healthy(component, state, certs)

        if not processes.wait_until(ready, timeout_s, interval_s=0.2):
            raise DevClusterError(
                f"{component} not healthy after {timeout_s:.0f} s; its log ends:\n"
                + processes.log_tail(self.log_dir, component)
            )

    def install_crds(self, timeout_s: float = 60.0, *, ours: bool = True) -> list[str]:
        """Apply the generated CRDs (unless `ours=False`) and the published ones of the
        projects the operator renders for (`thirdparty`), and wait until the API server serves
        them."""
        kube = Kube.from_kubeconfig(self.kubeconfig_path)
        names = []
        published = [published_crd(crd) for crd in PUBLISHED_CRDS]
        generated = custom_resource_definitions() if ours else []
        for crd in [*generated, *published]:
            kube.apply(crd)
            names.append(crd["metadata"]["name"])

        def established() -> bool:
            for name in names:
                crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
                conditions = (crd or {}).get("status", {}).get("conditions") or []
                if not any(
                    c["type"] == "Established" and c["status"] == "True" for c in conditions
                ):
                    return False
            return True

        if not processes.wait_until(established, timeout_s, 0.2):
            raise DevClusterError(f"CRDs {names} not established after {timeout_s:.0f} s")
        return names

    def _register_nodes(
        self, pools: tuple[NodePool, ...], cpu_nodes: int, timeout_s: float
    ) -> None:
        kube = Kube.from_kubeconfig(self.kubeconfig_path)
        nodes = fleet_nodes(pools, cpu_nodes, GpuCatalog.builtin())
        for node in nodes:
            kubelet_api.create_node(kube, node)
        names = {n["metadata"]["name"] for n in nodes}
        if not processes.wait_until(
            lambda: names <= kubelet_api.ready_node_names(kube), timeout_s, 0.5
        ):
            raise DevClusterError(
                f"fake nodes not Ready after {timeout_s:.0f} s (missing: "
                f"{sorted(names - kubelet_api.ready_node_names(kube))}); kwok's log ends:\n"
                + processes.log_tail(self.log_dir, "kwok")
            )


@contextmanager
def running(
    state_dir: Path,
    bin_dir: Path,
    pools: tuple[NodePool, ...],
    cpu_nodes: int = 1,
    timeout_s: float = 120.0,
    *,
    with_fleet: bool = False,
    autoscale_interval_s: float = 15.0,
    metrics_window_s: float = 60.0,
    runtime: Runtime = Runtime.VENV,
    images: Path | None = None,
    operator: bool = True,
    client_rate: ClientRateLimit | None = None,
    hf_endpoint: str | None = None,
) -> Iterator[DevCluster]:
    """A cluster for the duration of a block, stopped however the block ends; with the
    fleet (agent, operator, Prometheus) when asked: see `DevCluster.start_fleet` for
    `runtime`, `images` and `operator`, and `DevCluster.up` for `client_rate`."""
    cluster = DevCluster(state_dir)
    cluster.up(
        bin_dir,
        pools,
        cpu_nodes=cpu_nodes,
        bound_to_parent=True,
        timeout_s=timeout_s,
        client_rate=client_rate,
        readiness_by_fleet=with_fleet,
    )
    try:
        if with_fleet:
            cluster.start_fleet(
                bound_to_parent=True,
                timeout_s=timeout_s,
                autoscale_interval_s=autoscale_interval_s,
                metrics_window_s=metrics_window_s,
                runtime=runtime,
                images=images,
                operator=operator,
                hf_endpoint=hf_endpoint,
            )
        yield cluster
    finally:
        cluster.down()
