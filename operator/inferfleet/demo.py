"""The live demo: a local fleet (dev cluster with the fleet agent, the operator and
Prometheus), an autoscaled example, a load replayed through a router pod (the built-in chat
load, or a production trace by path), and the fleet scaling as it happens, printed every few
seconds; then a summary and the teardown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from inferfleet.api.model_deployment import ModelDeploymentSpec
from inferfleet.bench import loadgen, traces
from inferfleet.bench.report import summarize
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, running
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import wait_until
from inferfleet.kube import Kube
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Slo

ROUTER_PORT = 8000
NAMESPACE = "demo"


@dataclass(frozen=True)
class DemoSettings:
    example: Path
    trace: Path | None
    """None: the built-in chat load (`traces.builtin_chat`)."""
    rate_multiplier: float = 1.0
    start_s: float = 0.0
    duration_s: float = 240.0
    pools: str = "L4-24GB=2"
    print_every_s: float = 5.0


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _healthy(ip: str) -> bool:
    try:
        return httpx.get(f"http://{ip}:{ROUTER_PORT}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _router_ip(kube: Kube, service: str) -> str | None:
    for pod in kube.list(
        "v1",
        "Pod",
        namespace=NAMESPACE,
        label_selector=f"inferfleet.io/inference-service={service}",
    ):
        ip = (pod.get("status") or {}).get("podIP")
        if ip and _healthy(ip):
            return str(ip)
    return None


def _replicas(kube: Kube, deployment: str) -> dict[str, int]:
    """Replicas ordered per role of the ModelDeployment."""
    return {
        (d.get("metadata") or {}).get("labels", {}).get("inferfleet.io/role", "?"): int(
            (d.get("spec") or {}).get("replicas") or 0
        )
        for d in kube.list(
            "apps/v1", "Deployment", namespace=NAMESPACE,
            label_selector=f"inferfleet.io/model-deployment={deployment}",
        )
    }  # fmt: skip


def _line(kube: Kube, service: str, replicas: dict[str, int], elapsed_s: float, sent: int) -> str:
    found = kube.get("inferfleet.io/v1alpha1", "InferenceService", service, NAMESPACE) or {}
    status = found.get("status") or {}
    observed = status.get("observed") or {}
    decision = status.get("lastDecision") or {}

    def shown(value: Any, unit: str = "") -> str:
        return "-" if value is None else f"{value}{unit}"

    return (
        f"{elapsed_s:5.0f}s  sent {sent:5d}  replicas {replicas}  "
        f"attainment {shown(observed.get('attainment'))}  "
        f"p95 TTFT {shown(observed.get('ttftP95Ms'), ' ms')}  "
        f"TPOT {shown(observed.get('tpotP95Ms'), ' ms')}  "
        f"last decision {shown(decision.get('reason'))}"
    )


@dataclass
class GpuTime:
    """GPUs the fleet ordered (replicas x tensor x pipeline, whether the engines are real or
    emulated), sampled as the demo prints: what the autoscaled fleet cost, against a static
    fleet held at the largest size it reached for the whole run."""

    gpus_per_replica: int
    gpu_seconds: float = 0.0
    peak_gpus: int = 0
    span_s: float = 0.0
    _last: tuple[float, int] | None = None

    def sample(self, elapsed_s: float, replicas: dict[str, int]) -> None:
        gpus = sum(replicas.values()) * self.gpus_per_replica
        if self._last is not None:
            since, held = self._last
            self.gpu_seconds += held * (elapsed_s - since)
            self.span_s = elapsed_s
        self.peak_gpus = max(self.peak_gpus, gpus)
        self._last = (elapsed_s, gpus)

    def to_text(self) -> str:
        static = self.peak_gpus * self.span_s
        if static <= 0:
            return "GPU-seconds: not sampled"
        return (
            f"GPU-seconds: {self.gpu_seconds:.0f} over {self.span_s:.0f} s (sampled every few "
            f"seconds); a static fleet at the peak of {self.peak_gpus} GPUs: {static:.0f} "
            f"({self.gpu_seconds / static:.2f}x)"
        )


def run_demo(settings: DemoSettings, state_dir: Path, echo: Callable[[str], None]) -> int:
    documents = _documents(settings.example)
    service = next(d for d in documents if d["kind"] == "InferenceService")
    deployment = next(d for d in documents if d["kind"] == "ModelDeployment")
    service_name = service["metadata"]["name"]
    deployment_name = deployment["metadata"]["name"]
    slo_spec = service["spec"]["slo"]
    slo = Slo(slo_spec.get("ttftP95Ms"), slo_spec.get("tpotP95Ms"), slo_spec["attainmentTarget"])
    requests = (
        traces.builtin_chat(settings.duration_s, rate_multiplier=settings.rate_multiplier)
        if settings.trace is None
        else traces.requests_from_trace(
            settings.trace,
            rate_multiplier=settings.rate_multiplier,
            start_s=settings.start_s,
            duration_s=settings.duration_s,
        )
    )
    echo(f"building or reusing the control plane; the fleet lives in {state_dir}")
    with running(
        state_dir, ensure_binaries(), NodePool.parse(settings.pools), with_fleet=True,
        autoscale_interval_s=5.0, metrics_window_s=30.0,
    ) as cluster:  # fmt: skip
        return _drive(
            cluster, settings, documents=documents, requests=requests, slo=slo, echo=echo,
            service=service_name, deployment=deployment_name,
        )  # fmt: skip


def _drive(
    cluster: DevCluster,
    settings: DemoSettings,
    *,
    documents: list[dict[str, Any]],
    requests: list[TraceRequest],
    slo: Slo,
    echo: Callable[[str], None],
    service: str,
    deployment: str,
) -> int:
    kube = Kube.from_kubeconfig(cluster.kubeconfig_path)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for document in documents:
        kube.apply({**document, "metadata": {**document["metadata"], "namespace": NAMESPACE}})
    echo(f"applied {settings.example} to namespace {NAMESPACE}; waiting for a router pod")
    found: list[str] = []

    def router_up() -> bool:
        ip = _router_ip(kube, service)
        if ip:
            found.append(ip)
        return ip is not None

    if not wait_until(router_up, 120, 1):
        echo("no router pod became healthy; see the logs in " + str(cluster.log_dir))
        return 1
    url = f"http://{found[-1]}:{ROUTER_PORT}"
    load = "the built-in chat load" if settings.trace is None else settings.trace.name
    echo(
        f"replaying {len(requests)} requests of {load} "
        f"(x{settings.rate_multiplier:g}) through the router at {url}"
    )
    outcome: dict[str, Any] = {}

    def replay() -> None:
        generator = loadgen.LoadGenerator(url, model=documents[0]["spec"]["model"]["name"])

        async def go() -> None:
            try:
                outcome["run"] = await generator.run(requests, drain_s=60.0)
            finally:
                await generator.aclose()

        asyncio.run(go())

    thread = threading.Thread(target=replay, daemon=True)
    started = time.monotonic()
    thread.start()
    model_deployment = next(d for d in documents if d["kind"] == "ModelDeployment")
    parallelism = ModelDeploymentSpec.model_validate(model_deployment["spec"]).parallelism
    gpu_time = GpuTime(parallelism.gpus_per_replica)
    while thread.is_alive():
        elapsed = time.monotonic() - started
        sent = sum(1 for r in requests if r.arrival_s <= elapsed)
        replicas = _replicas(kube, deployment)
        gpu_time.sample(elapsed, replicas)
        echo(_line(kube, service, replicas, elapsed, min(sent, len(requests))))
        thread.join(settings.print_every_s)
    gpu_time.sample(time.monotonic() - started, _replicas(kube, deployment))
    run = outcome.get("run")
    if run is None:
        echo("the replay failed")
        return 1
    report = summarize(run.results, slo=slo, duration_s=run.duration_s, client=run.client)
    echo(report.to_text())
    echo(gpu_time.to_text())
    events = kube.list("v1", "Event", namespace=NAMESPACE)
    decisions = [
        e for e in events
        if (e.get("involvedObject") or {}).get("kind") == "InferenceService"
    ]  # fmt: skip
    echo("the autoscaler's decisions (Events on the InferenceService):")
    for event in sorted(decisions, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime"))):
        echo(f"  {event.get('reason')}: {event.get('message')}")
    return 0
