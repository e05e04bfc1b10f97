"""The data plane end to end on loopback: a prefill and a decode emulated engine and a router,
each its own process, scraped by a real Prometheus; a production trace replayed open-loop
through the router. What the router counts, read back with PromQL, must agree with what the
clients measured."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.queries import role_queries, service_queries
from inferfleet.bench import loadgen, traces
from inferfleet.devcluster import processes
from inferfleet.devcluster.processes import ProcessSpec
from inferfleet.devcluster.prometheus import Prometheus, static_job
from inferfleet.slo import Slo

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MODEL = "llama-3.1-8b"
SERVICE = "chat"
# TPOT's target sits amid what this load gets, so that requests fall on both sides of it;
# TTFT's in its tail. A request's TPOT reads the same at the client and at the router; its
# TTFT is longer at the client by two loopback hops and two processes' scheduling (a few ms
# on a busy two-core machine), which would flip requests near a target set in the thick of
# the TTFT distribution.
SLO = Slo(ttft_p95_ms=250.0, tpot_p95_ms=8.0, attainment_target=0.9)
WINDOW_S = 60.0
RATE = 3.0
"""The first minute of azure2023_conv, replayed at twice its recorded rate (30 s)."""


@dataclass(frozen=True)
class DataPlane:
    router_url: str
    prometheus: Prometheus
    log_dir: Path


def _inferfleet() -> str:
    found = shutil.which("inferfleet", path=str(Path(sys.executable).parent))
    assert found, "the inferfleet command is installed beside the interpreter"
    return found


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def data_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlane]:
    logs = tmp_path_factory.mktemp("data-plane")
    ports = {name: processes.free_port() for name in ("prefill", "decode", "router")}
    # Prometheus reads the router's admin port, as it does in a cluster.
    router_admin = processes.free_port()
    command = _inferfleet()
    engine = (command, "sim-engine", "--model", MODEL, "--gpu", "H100-80GB", "--host", "127.0.0.1")
    specs = [
        ProcessSpec(role, (*engine, "--role", role, "--port", str(ports[role])))
        for role in ("prefill", "decode")
    ]
    backends = [
        f"deployment={SERVICE},role={role},engine=sim,model={MODEL},"
        f"urls=http://127.0.0.1:{ports[role]}"
        for role in ("prefill", "decode")
    ]
    specs.append(
        ProcessSpec(
            "router",
            (
                command,
                "router",
                "--service",
                SERVICE,
                "--host",
                "127.0.0.1",
                "--port",
                str(ports["router"]),
                "--admin-port",
                str(router_admin),
                "--backend",
                backends[0],
                "--backend",
                backends[1],
                "--slo-ttft-p95-ms",
                f"{SLO.ttft_p95_ms:g}",
                "--slo-tpot-p95-ms",
                f"{SLO.tpot_p95_ms:g}",
                "--slo-attainment-target",
                f"{SLO.attainment_target:g}",
                "--drain-delay",
                "0",
            ),
        )
    )
    pids = [processes.start(spec, logs, bound_to_parent=True) for spec in specs]
    prometheus: Prometheus | None = None
    try:
        for name, port in ports.items():
            if not processes.wait_until(lambda p=port: _healthy(f"http://127.0.0.1:{p}"), 30):  # type: ignore[misc]
                raise AssertionError(
                    f"{name} never became healthy:\n{processes.log_tail(logs, name)}"
                )
        scraped = ports | {"router": router_admin}
        jobs = [
            static_job(name, [f"127.0.0.1:{port}"], {"role": name})
            for name, port in scraped.items()
        ]
        prometheus = Prometheus.start(logs / "prometheus", jobs, scrape_interval_s=0.5)
        yield DataPlane(f"http://127.0.0.1:{ports['router']}", prometheus, logs)
    finally:
        if prometheus is not None:
            prometheus.stop()
        processes.stop(pids)


def test_prometheus_scrapes_the_router_and_both_engines(data_plane: DataPlane) -> None:
    prometheus = data_plane.prometheus
    assert processes.wait_until(lambda: prometheus.scalar("sum(up)") == 3, 15)
    for job in ("prefill", "decode"):
        kv = prometheus.scalar(f'max(vllm:kv_cache_usage_perc{{job="{job}"}})')
        assert kv is not None, f"{job} exposes vLLM's KV-cache gauge"
    healthy = prometheus.scalar(
        f'sum(inferfleet_router_replicas{{service="{SERVICE}",state="healthy"}})'
    )
    assert healthy == 2


def test_attainment_read_from_prometheus_matches_the_clients(data_plane: DataPlane) -> None:
    requests = traces.requests_from_trace(
        TRACES / "azure2023_conv.csv", rate_multiplier=RATE, duration_s=WINDOW_S
    )
    assert len(requests) > 100
    report = asyncio.run(
        loadgen.serve_benchmark(
            data_plane.router_url, requests, model=MODEL, slo=SLO, plots=False, drain_s=60.0
        )
    )
    assert report.completed == len(requests), report.errors
    assert report.attainment is not None
    prometheus = data_plane.prometheus
    total = f'sum(inferfleet_router_requests_total{{service="{SERVICE}"}})'
    # Until the last scrape after the run has the final counts.
    assert processes.wait_until(lambda: prometheus.scalar(total) == len(requests), 15), (
        prometheus.scalar(total),
        len(requests),
    )
    attainment = prometheus.scalar(
        f'sum(inferfleet_router_requests_total{{service="{SERVICE}",outcome="met"}}) / {total}'
    )
    assert attainment is not None
    router_ttft_s = prometheus.scalar(
        f'sum(inferfleet_router_ttft_seconds_sum{{service="{SERVICE}"}})'
        f' / sum(inferfleet_router_ttft_seconds_count{{service="{SERVICE}"}})'
    )
    print(
        f"\nattainment: clients {report.attainment:.4f}, router (PromQL) {attainment:.4f}; "
        f"mean TTFT: clients {report.ttft_ms.mean if report.ttft_ms else None:.1f} ms, "
        f"router {(router_ttft_s or 0) * 1000:.1f} ms"
    )
    # Both sides of the targets are exercised, so agreement says something.
    assert 0.05 < report.attainment < 0.95
    assert attainment == pytest.approx(report.attainment, abs=0.02)
    # The hand-off really went through both pools: each request prefilled once, decoded once.
    for job in ("prefill", "decode"):
        served = f'sum(vllm:request_success_total{{job="{job}"}})'

        def all_served(query: str = served) -> bool:
            return prometheus.scalar(query) == len(requests)

        # Each target is scraped on its own beat: the engines' last scrape may trail the router's.
        assert processes.wait_until(all_served, 15), (
            job,
            prometheus.scalar(served),
        )
    tokens = prometheus.scalar(f'sum(inferfleet_router_output_tokens_total{{service="{SERVICE}"}})')
    assert tokens == sum(request.output_tokens for request in requests)


def test_every_autoscaler_query_parses_in_prometheus(data_plane: DataPlane) -> None:
    """The controller's PromQL, filled in for names with dots and dashes, is valid PromQL."""
    queries = service_queries("chat-v1.2", "team-a", 30.0)
    for role in Role:
        queries |= {
            f"{role.value}:{name}": query
            for name, query in role_queries("team-a", "llama-3.1-8b", role, 30.0).items()
        }
    for name, query in queries.items():
        answer = httpx.get(
            f"{data_plane.prometheus.url}/api/v1/query", params={"query": query}, timeout=5.0
        )
        assert answer.status_code == 200, (name, query, answer.text)
