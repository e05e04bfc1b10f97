"""A real Prometheus server for the local fleet and the e2e tier, run as a supervised process
on loopback: Debian's `prometheus` package at a pinned version, fetched once by
tools/prometheus/fetch.sh (unpacked, not installed); or, where pods are found through the
API server, a build with Kubernetes service discovery (which Debian's lacks) from the pinned
Go module by tools/prometheus/build-kubernetes-sd.sh."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_api_client import PrometheusConnect

from inferfleet.devcluster import processes
from inferfleet.devcluster.processes import ProcessSpec
from inferfleet.devcluster.tools import TOOLS_DIR, ToolUnavailableError, cached_tool

BINARY_VARIABLE = "INFERFLEET_PROMETHEUS"
FETCH_SCRIPT = TOOLS_DIR / "prometheus" / "fetch.sh"
# Debian's package lacks Kubernetes service discovery: the local fleet's Prometheus is built
# from the published Go module with it.
KUBERNETES_SD_VARIABLE = "INFERFLEET_PROMETHEUS_KUBERNETES_SD"
KUBERNETES_SD_BUILD_SCRIPT = FETCH_SCRIPT.with_name("build-kubernetes-sd.sh")
_READY_TIMEOUT_S = 30.0


class PrometheusUnavailableError(ToolUnavailableError):
    pass


def ensure_prometheus(*, kubernetes_sd: bool = False) -> Path:
    """The Prometheus binary: $INFERFLEET_PROMETHEUS, or the fetch script's cache (fetching
    the Debian package on first use). With `kubernetes_sd`: $INFERFLEET_PROMETHEUS_KUBERNETES_SD,
    or the build script's cache (building it on first use, a few minutes)."""
    variable, script = (
        (KUBERNETES_SD_VARIABLE, KUBERNETES_SD_BUILD_SCRIPT)
        if kubernetes_sd
        else (BINARY_VARIABLE, FETCH_SCRIPT)
    )
    try:
        binary = cached_tool(variable, script)
    except ToolUnavailableError as error:
        raise PrometheusUnavailableError(f"no Prometheus: {error}") from None
    if not binary.is_file():
        raise PrometheusUnavailableError(f"{binary} is not a file")
    return binary


def static_job(
    name: str, targets: Sequence[str], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A scrape job over fixed `host:port` targets."""
    group: dict[str, Any] = {"targets": list(targets)}
    if labels:
        group["labels"] = dict(labels)
    return {"job_name": name, "static_configs": [group]}


def kubernetes_pods_job(
    name: str,
    *,
    api_server: str,
    ca_file: Path,
    token_file: Path,
    namespaces: Sequence[str] = (),
) -> dict[str, Any]:
    """A scrape job over the pods Kubernetes lists (`kubernetes_sd_configs`, role `pod`), as
    a cluster's Prometheus runs it: pods annotated `prometheus.io/scrape: "true"`, at their
    pod IP and `prometheus.io/port`, on `prometheus.io/path`; every pod label becomes a target
    label with `.`, `/` and `-` as `_` (`inferfleet.io/role` -> `inferfleet_io_role`), plus
    `namespace` and `pod`. The token (a ServiceAccount's, see `pod_discovery_rbac`) must let
    it list and watch pods; Prometheus reads its file at each request, so it may be renewed."""
    discovery: dict[str, Any] = {
        "role": "pod",
        "api_server": api_server,
        "tls_config": {"ca_file": str(ca_file)},
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
    }
    if namespaces:
        discovery["namespaces"] = {"names": list(namespaces)}
    meta = "__meta_kubernetes_pod"
    return {
        "job_name": name,
        "kubernetes_sd_configs": [discovery],
        "relabel_configs": [
            {
                "source_labels": [f"{meta}_annotation_prometheus_io_scrape"],
                "action": "keep",
                "regex": "true",
            },
            # Pods still pending or already finished have no process to scrape.
            {"source_labels": [f"{meta}_phase"], "action": "keep", "regex": "Running"},
            {
                "source_labels": [f"{meta}_annotation_prometheus_io_path"],
                "regex": "(.+)",
                "target_label": "__metrics_path__",
            },
            # One target per pod: the port comes from the annotation, not each container port.
            {
                "source_labels": [f"{meta}_ip", f"{meta}_annotation_prometheus_io_port"],
                "regex": "([^:]+);([0-9]+)",
                "replacement": "$1:$2",
                "target_label": "__address__",
            },
            {"action": "labelmap", "regex": f"{meta}_label_(.+)"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": [f"{meta}_name"], "target_label": "pod"},
        ],
    }


def pod_discovery_rbac(service_account: str, namespace: str) -> list[dict[str, Any]]:
    """A ServiceAccount for Prometheus that may read pods in every namespace and nothing
    else: what `kubernetes_pods_job` needs."""
    name = f"{namespace}-{service_account}-pod-discovery"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
    ]


def config_text(
    jobs: Sequence[Mapping[str, Any]], scrape_interval_s: float, rule_files: Sequence[Path] = ()
) -> str:
    interval = f"{int(scrape_interval_s * 1000)}ms"
    document: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [dict(job) for job in jobs],
    }
    if rule_files:
        document["rule_files"] = [str(path) for path in rule_files]
    return yaml.safe_dump(document, sort_keys=False)


@dataclass
class Prometheus:
    """A running Prometheus: its API at `url`, its files in `state_dir`."""

    pid: int
    port: int
    state_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        state_dir: Path,
        jobs: Sequence[Mapping[str, Any]],
        *,
        scrape_interval_s: float = 1.0,
        rule_files: Sequence[Path] = (),
        binary: Path | None = None,
        bound_to_parent: bool = True,
    ) -> Prometheus:
        """Start scraping `jobs` and evaluating `rule_files`; returns once the server says it
        is ready."""
        binary = binary or ensure_prometheus()
        state_dir.mkdir(parents=True, exist_ok=True)
        config = state_dir / "prometheus.yml"
        config.write_text(config_text(jobs, scrape_interval_s, rule_files))
        port = processes.free_port()
        spec = ProcessSpec(
            "prometheus",
            (
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={state_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",  # POST /-/reload after a config change
                "--storage.tsdb.retention.time=1d",
            ),
        )
        pid = processes.start(spec, state_dir, bound_to_parent=bound_to_parent)
        server = cls(pid, port, state_dir)
        if not processes.wait_until(server.ready, _READY_TIMEOUT_S):
            server.stop()
            raise PrometheusUnavailableError(
                "Prometheus did not become ready:\n" + processes.log_tail(state_dir, "prometheus")
            )
        return server

    def ready(self) -> bool:
        if not processes.alive(self.pid):
            raise PrometheusUnavailableError(
                "Prometheus exited:\n" + processes.log_tail(self.state_dir, "prometheus")
            )
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self) -> PrometheusConnect:
        return PrometheusConnect(url=self.url, disable_ssl=True)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        result: list[dict[str, Any]] = self.client().custom_query(query=promql)
        return result

    def scalar(self, promql: str) -> float | None:
        """The value of a query that returns one series; None when it returns none."""
        result = self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise ValueError(f"{promql} returned {len(result)} series, not one")
        return float(result[0]["value"][1])

    def stop(self) -> None:
        processes.stop([self.pid])
