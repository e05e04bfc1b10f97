"""Closing the loop on the local fleet: the load generator drives a service through a router
pod; Prometheus scrapes routers and engines through the API server; the operator's autoscaler
reads it and scales the ModelDeployment's pools; the fleet agent starts the new engines.

Each test reports what it measured (step to recovery, replicas over time) on stdout."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferfleet.autoscale.policy import Reason
from inferfleet.bench import loadgen, traces
from inferfleet.bench.report import RequestResult
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import (
    RECENT_METRICS_WINDOW_S,
    SCRAPE_INTERVAL_S,
    DevCluster,
    running,
)
from inferfleet.devcluster.hub import ModelHub, RunningHub
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import wait_until
from inferfleet.router.config import ADMIN_PORT
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Outcome, Slo
from tests.e2e.conftest import Kubectl

# A replay of a few minutes, in real time: longer than the suite's per-test limit.
pytestmark = pytest.mark.timeout(600)

MODEL = "llama-3.1-8b"
PORT = 8000
# Llama-3.1-8B on an L4: a 2000-token prompt prefills in about 0.45 s, so one replica holds
# about 1.3 requests/s of 2000/50 tokens within the SLO (`inferfleet plan`): small loads need
# several replicas, and the emulators' CPU stays low.
SLO = Slo(ttft_p95_ms=2000.0, tpot_p95_ms=150.0, attainment_target=0.9)
INPUT_TOKENS = 2000
OUTPUT_TOKENS = 50
WINDOW_S = 20.0
"""Requests are judged in windows of this many seconds of arrivals."""
COLD_START_S = 10
TICK_S = 5.0
METRICS_WINDOW_S = 30.0
"""The autoscaler reads rates over this many seconds."""
IDLE_S = 60
"""The shortest idle period the API allows before a service goes to zero."""
WAKE_TIMEOUT_S = 120
HUB_BYTES_PER_S = 1_000_000


def manifests(
    name: str, *, disaggregated: bool = False, to_zero: bool = False, prefix_caching: bool = True
) -> str:
    deployment: dict[str, Any] = {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL, "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"name": "sim"},
            "batching": {"maxModelLength": 8192},
            "gpu": {"type": "L4-24GB"},
            "prefixCaching": prefix_caching,
            "replicas": 1,
        },
    }
    bounds = {"minReplicas": 0 if to_zero else 1, "maxReplicas": 6}
    autoscaling: dict[str, Any] = {
        "policy": "goodput",
        "coldStartSeconds": COLD_START_S,
        "scaleDownStabilizationSeconds": 600,
    }
    if to_zero:
        autoscaling |= {
            "scaleToZeroIdleSeconds": IDLE_S,
            "wakeTimeoutSeconds": WAKE_TIMEOUT_S,
            "scaleDownStabilizationSeconds": 60,
        }
    if disaggregated:
        deployment["spec"]["topology"] = {"mode": "disaggregated", "prefill": {"replicas": 1}}
        autoscaling |= {"prefill": bounds, "decode": bounds}
    else:
        autoscaling["aggregated"] = bounds
    service = {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "deployments": [{"name": name}],
            "slo": {
                "ttftP95Ms": SLO.ttft_p95_ms,
                "tpotP95Ms": SLO.tpot_p95_ms,
                "attainmentTarget": SLO.attainment_target,
            },
            "expectedLoad": {
                "requestsPerSecond": 0.5,
                "inputTokens": INPUT_TOKENS,
                "outputTokens": OUTPUT_TOKENS,
            },
            "autoscaling": autoscaling,
        },
    }
    return yaml.safe_dump_all([deployment, service])


@dataclass
class Fleet:
    cluster: DevCluster
    kubectl: Kubectl
    hub: ModelHub | None = None
    """The model hub weight caches fill from, where the fleet serves one."""

    def apply(self, namespace: str, text: str) -> None:
        self.kubectl.run("create", "namespace", namespace, check=False)
        self.kubectl.run("apply", "--server-side", "-n", namespace, "-f", "-", stdin=text)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        found: dict[str, Any] = self.kubectl.json("get", kind, name, "-n", namespace)
        return found

    def replicas(self, namespace: str, deployment: str) -> dict[str, int]:
        items = self.kubectl.json(
            "get", "deployments", "-n", namespace,
            "-l", f"inferfleet.io/model-deployment={deployment}",
        )["items"]  # fmt: skip
        return {
            d["metadata"]["labels"]["inferfleet.io/role"]: int(d["spec"]["replicas"]) for d in items
        }

    def healthy_ips(self, namespace: str, selector: str) -> list[str]:
        """Pods Ready (their own process probed by the agent) that answer on their address.
        The address alone is not enough: the local fleet hands a deleted pod's address to
        the next pod at once, and the deleted pod's process may answer there while it drains."""
        pods = self.kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
        ips = []
        for pod in pods:
            ip = pod["status"].get("podIP")
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod["status"].get("conditions") or []
            )
            if pod["status"].get("phase") != "Running" or not ip or not ready:
                continue
            try:
                if httpx.get(f"http://{ip}:{PORT}/health", timeout=1.0).status_code == 200:
                    ips.append(ip)
            except httpx.HTTPError:
                continue
        return sorted(ips)

    def router(self, namespace: str, service: str) -> str:
        selector = f"inferfleet.io/inference-service={service}"
        assert wait_until(lambda: bool(self.healthy_ips(namespace, selector)), 90, 1), (
            self.diagnostics()
        )
        return self.healthy_ips(namespace, selector)[0]

    def diagnostics(self) -> str:
        logs = []
        for name in ("operator.log", "fleet-agent.log"):
            path = self.cluster.log_dir / name
            text = path.read_text(errors="replace") if path.exists() else ""
            logs.append(f"--- {name}\n" + "\n".join(text.splitlines()[-30:]))
        return "\n".join(logs)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    bin_dir = ensure_binaries()
    pools = NodePool.parse("L4-24GB=2")
    # The model hub weight caches fill from (the dev cluster has no network); slow enough
    # that a fill is seen under way.
    hub = ModelHub(tmp_path_factory.mktemp("hub"), bytes_per_s=HUB_BYTES_PER_S)
    serving = RunningHub(hub)
    try:
        with running(
            tmp_path_factory.mktemp("autoscaling"), bin_dir, pools, cpu_nodes=1,
            with_fleet=True, autoscale_interval_s=TICK_S, metrics_window_s=METRICS_WINDOW_S,
            hf_endpoint=serving.endpoint,
        ) as cluster:  # fmt: skip
            yield Fleet(cluster, Kubectl(bin_dir / "kube", cluster.kubeconfig_path), hub)
    finally:
        serving.close()


@dataclass
class Timeline:
    """Replicas per role over the run, sampled from the API server."""

    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def first(self, predicate: Any) -> float | None:
        return next((t for t, counts in self.samples if predicate(counts)), None)

    def describe(self) -> str:
        changes, last = [], None
        for moment, counts in self.samples:
            if counts != last:
                changes.append(f"{moment:.0f}s {counts}")
                last = counts
        return ", ".join(changes)


async def _run(url: str, requests: list[TraceRequest]) -> list[RequestResult]:
    generator = loadgen.LoadGenerator(url, model=MODEL)
    try:
        return (await generator.run(requests, drain_s=60.0)).results
    finally:
        await generator.aclose()


@dataclass
class Streams:
    """Streams through a router in the background: 2 req/s of 200/300 tokens for 60 s."""

    load: threading.Thread
    outcome: list[list[RequestResult]]

    @classmethod
    def start(cls, router: str, seed: int) -> Streams:
        requests = traces.poisson(2.0, 60.0, input_tokens=200, output_tokens=300, seed=seed)
        outcome: list[list[RequestResult]] = []
        load = threading.Thread(
            target=lambda: outcome.append(asyncio.run(_run(f"http://{router}:{PORT}", requests)))
        )
        load.start()
        return cls(load, outcome)

    def finish(self) -> tuple[list[RequestResult], list[RequestResult], list[RequestResult]]:
        """Every request, those that failed, and those answered with fewer tokens than asked."""
        self.load.join(180.0)
        [results] = self.outcome
        failed = [r for r in results if not r.ok]
        return results, failed, [r for r in results if r.ok and r.tokens < r.output_tokens]


def replay(
    fleet: Fleet, namespace: str, deployment: str, url: str, requests: list[TraceRequest]
) -> tuple[list[RequestResult], Timeline]:
    """Replay open-loop through a router while sampling the replicas every second."""
    timeline = Timeline()
    done = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        while not done.is_set():
            timeline.samples.append(
                (time.monotonic() - started, fleet.replicas(namespace, deployment))
            )
            done.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        results = asyncio.run(_run(url, requests))
    finally:
        done.set()
        sampler.join()
    return results, timeline


def met(result: RequestResult) -> bool:
    return SLO.outcome(ok=result.ok, ttft_s=result.ttft_s, tpot_s=result.tpot_s) is Outcome.MET


def windows(results: list[RequestResult], origin_s: float) -> list[tuple[float, float, int]]:
    """(window start, attainment, requests) per WINDOW_S of arrivals, on a grid with a boundary
    at `origin_s`, so that no window mixes the load before a change with the load after it."""
    by_window: dict[int, list[bool]] = {}
    for result in results:
        index = math.floor((result.scheduled_s - origin_s) / WINDOW_S)
        by_window.setdefault(index, []).append(met(result))
    return [
        (origin_s + index * WINDOW_S, sum(found) / len(found), len(found))
        for index, found in sorted(by_window.items())
    ]


def test_a_load_step_scales_the_pool_and_attainment_recovers(fleet: Fleet) -> None:
    namespace, name = "step", "chat"
    fleet.apply(namespace, manifests(name))
    router = fleet.router(namespace, name)
    step_at, duration = 30.0, 200.0
    requests = traces.step(
        0.5, 3.0, duration, switch_s=step_at,
        input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=7,
    )  # fmt: skip
    results, timeline = replay(fleet, namespace, name, f"http://{router}:{PORT}", requests)
    attainment = windows(results, origin_s=step_at)
    print(f"\nreplicas: {timeline.describe()}")
    decisions = _decisions(fleet, namespace, name)
    print("decisions:\n" + "\n".join(decisions))
    print(
        "attainment per window: " + ", ".join(f"{t:.0f}s {a:.2f} (n={n})" for t, a, n in attainment)
    )
    failed = [r.error for r in results if not r.ok]
    assert len(failed) <= 0.05 * len(requests), failed[:10]

    # Before the step one replica holds the SLO (judged over every arrival before it: a
    # window holds only a few at this rate, and one slow prompt is not a broken SLO); the step
    # needs three replicas or more, and the loop adds them.
    before = [r for r in results if r.scheduled_s < step_at]
    assert before, attainment
    assert sum(map(met, before)) >= SLO.attainment_target * len(before), attainment
    after = [(t, a) for t, a, _ in attainment if t >= step_at]
    scaled_at = timeline.first(lambda counts: counts.get("aggregated", 1) >= 2)
    assert scaled_at is not None, timeline.describe() + fleet.diagnostics()
    peak = max(counts.get("aggregated", 0) for _, counts in timeline.samples)
    assert peak >= 3, timeline.describe()
    # The loop orders the three replicas the step needs at once, at the first tick whose short
    # window holds enough of the step to tell it from noise: within that window, one scrape
    # and two ticks of it, where the rate window (METRICS_WINDOW_S) still reads mostly the
    # load before it.
    enough_at = timeline.first(lambda counts: counts.get("aggregated", 1) >= 3)
    assert enough_at is not None, timeline.describe()
    seen_within_s = RECENT_METRICS_WINDOW_S + SCRAPE_INTERVAL_S + 2 * TICK_S
    assert enough_at - step_at <= seen_within_s, timeline.describe()
    # It keeps up: every window that starts once those replicas have started (one cold start
    # later) meets the target. Windows before then queue behind too few replicas and may dip.
    settled = [(t, a) for t, a in after if t >= enough_at + COLD_START_S]
    assert settled, attainment
    assert all(a >= SLO.attainment_target for _, a in settled), attainment
    recovered = next(
        (t for t, _ in after if all(a >= SLO.attainment_target for u, a in after if u >= t)), None
    )
    assert recovered is not None, attainment
    print(
        f"step at {step_at:.0f}s; first scale-up {scaled_at - step_at:.0f}s after it, three "
        f"replicas {enough_at - step_at:.0f}s after it; "
        f"attainment back to target from the window starting {recovered - step_at:.0f}s after it "
        f"(windows of {WINDOW_S:.0f}s); peak {peak} replicas"
    )
    service = fleet.get("infsvc", name, namespace)
    # The step's scale-up is said with its reason. A later change may go either way: a replica
    # a lesson added on a miss is released once the load that missed is gone, and the windows
    # after it were judged above.
    assert any(line.split(" ", 1)[1].startswith("ScaleUp") for line in decisions), decisions
    assert service["status"]["lastDecision"]["reason"] in {reason.value for reason in Reason}
    assert service["status"]["observed"]["attainment"] is not None
    assert any(
        c["type"] == "MetricsAvailable" and c["status"] == "True"
        for c in service["status"]["conditions"]
    )
    # The loop timed its scale-ups, from the tick that ordered one to the tick that saw one
    # more replica serve, and says what it measured in status. Against what the API server
    # saw of the pods it added (created -> Ready, to the second): the order comes before the
    # pods are created (the operator applies it) and the loop sees a replica serve up to a
    # scrape and a tick after it does, less the half tick it takes off.
    [cold_starts] = service["status"]["coldStarts"]
    measured = cold_starts["measuredSeconds"]
    started = _added_pods_cold_starts(fleet, namespace, name)
    print(f"cold starts: {cold_starts} (configured {COLD_START_S} s); pods: {started}")
    assert (cold_starts["deployment"], cold_starts["role"]) == (name, "aggregated")
    assert measured, cold_starts
    assert started, fleet.diagnostics()
    low, high = min(started) - TICK_S - 1.0, max(started) + SCRAPE_INTERVAL_S + 2 * TICK_S + 1.0
    assert all(low <= m <= high for m in measured), (measured, started)
    assert cold_starts["plannedSeconds"] in (COLD_START_S, max(measured)), cold_starts


def _added_pods_cold_starts(fleet: Fleet, namespace: str, deployment: str) -> list[float]:
    """Seconds from creation to Ready of the deployment's engine pods, the first one left out
    (it served before the load), as the API server records them."""
    pods = fleet.kubectl.json(
        "get", "pods", "-n", namespace, "-l", f"inferfleet.io/model-deployment={deployment}"
    )["items"]  # fmt: skip
    pods.sort(key=lambda pod: pod["metadata"]["creationTimestamp"])
    seconds = []
    for pod in pods[1:]:
        ready = next((c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"), None)
        if ready is not None and ready["status"] == "True":
            created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
            seconds.append(
                (datetime.fromisoformat(ready["lastTransitionTime"]) - created).total_seconds()
            )
    return seconds


class Background:
    """A replay running in a thread while the test acts and watches."""

    def __init__(self, url: str, requests: list[TraceRequest]) -> None:
        self.results: list[RequestResult] = []
        self.thread = threading.Thread(target=self._run, args=(url, requests), daemon=True)
        self.thread.start()

    def _run(self, url: str, requests: list[TraceRequest]) -> None:
        self.results = asyncio.run(_run(url, requests))

    def join(self) -> list[RequestResult]:
        self.thread.join(timeout=600)
        return self.results


def _condition(fleet: Fleet, namespace: str, name: str, kind: str) -> dict[str, Any]:
    status = fleet.get("infsvc", name, namespace).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def _decisions(fleet: Fleet, namespace: str, name: str) -> list[str]:
    """The autoscaler's Events on a service, oldest first: what it read and why it acted."""
    events = json.loads(_events(fleet, namespace))["items"]
    return [
        f"{e.get('lastTimestamp') or e.get('eventTime')} {e['reason']}: {e['message']}"
        for e in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if e["involvedObject"].get("name") == name
        and e["involvedObject"]["kind"] == "InferenceService"
    ]


def _events(fleet: Fleet, namespace: str) -> str:
    return fleet.kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout


def test_prometheus_stopped_holds_replicas_until_it_returns(fleet: Fleet) -> None:
    namespace, name = "outage", "chat"
    fleet.apply(namespace, manifests(name))
    router = fleet.router(namespace, name)
    load = Background(
        f"http://{router}:{PORT}",
        traces.poisson(2.0, 120.0, input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=3),
    )
    assert wait_until(
        lambda: _condition(fleet, namespace, name, "MetricsAvailable").get("status") == "True",
        60,
        1,
    ), fleet.diagnostics()
    state = fleet.cluster.state()
    assert state is not None
    prometheus = state.pids["prometheus"]
    time.sleep(20)  # let the loop size the pool for this load first
    os.kill(prometheus, signal.SIGSTOP)  # no answers: connections hang, queries time out
    try:
        assert wait_until(
            lambda: (
                _condition(fleet, namespace, name, "MetricsAvailable").get("reason")
                == "PrometheusUnavailable"
            ),
            45,
            1,
        ), fleet.diagnostics()
        held = fleet.replicas(namespace, name)
        samples = []
        for _ in range(20):  # four ticks: nothing moves, nothing goes to zero
            samples.append(fleet.replicas(namespace, name))
            time.sleep(1)
        print(f"\nheld while Prometheus was stopped: {held}, then {samples[-1]}")
        assert all(sample == held for sample in samples), samples
        assert held["aggregated"] >= 1
        assert '"PrometheusUnavailable"' in _events(fleet, namespace)
    finally:
        os.kill(prometheus, signal.SIGCONT)
    assert wait_until(
        lambda: _condition(fleet, namespace, name, "MetricsAvailable").get("status") == "True",
        60,
        1,
    ), fleet.diagnostics()
    assert wait_until(lambda: '"MetricsAvailable"' in _events(fleet, namespace), 15, 1)
    load.join()


def test_a_pin_holds_until_it_expires_then_the_loop_resumes(fleet: Fleet) -> None:
    namespace, name = "pinned", "chat"
    fleet.apply(namespace, manifests(name))
    router = fleet.router(namespace, name)
    until = datetime.now(UTC) + timedelta(seconds=45)
    pin = {"replicas": {"aggregated": 1}, "reason": "INC-42 freeze", "until": until.isoformat()}
    fleet.kubectl.run(
        "annotate", "mdep", name, "-n", namespace, f"inferfleet.io/pin={json.dumps(pin)}"
    )
    requests = traces.poisson(
        3.0, 120.0, input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=5
    )
    results, timeline = replay(fleet, namespace, name, f"http://{router}:{PORT}", requests)
    print(f"\nreplicas: {timeline.describe()} (pin until {until:%H:%M:%S})")
    assert results
    expiry = 45.0 - 3.0  # the replay started a moment after the pin was set
    while_pinned = [counts for moment, counts in timeline.samples if moment < expiry]
    assert while_pinned
    assert all(counts.get("aggregated") == 1 for counts in while_pinned), timeline.describe()
    resumed = timeline.first(lambda counts: counts.get("aggregated", 1) >= 2)
    assert resumed is not None, timeline.describe() + fleet.diagnostics()
    assert resumed >= expiry
    print(f"the loop scaled up {resumed - 45.0:.0f}s after the pin expired")
    events = _events(fleet, namespace)
    assert '"Pinned"' in events
    assert '"PinReleased"' in events


def test_longer_prompts_at_the_same_rate_shift_the_prefill_decode_ratio(fleet: Fleet) -> None:
    namespace, name = "mix", "chat"
    fleet.apply(namespace, manifests(name, disaggregated=True))
    router = fleet.router(namespace, name)
    switch_at, duration = 50.0, 170.0
    requests = traces.mix_shift(
        1.0, duration, switch_s=switch_at,
        input_tokens=300, output_tokens=OUTPUT_TOKENS,
        input_tokens_after=4000, output_tokens_after=OUTPUT_TOKENS, seed=11,
    )  # fmt: skip
    results, timeline = replay(fleet, namespace, name, f"http://{router}:{PORT}", requests)
    print(f"\nreplicas: {timeline.describe()}")
    assert results
    before = [c for t, c in timeline.samples if t < switch_at]
    after = [c for t, c in timeline.samples if t > duration - 30]
    assert before
    assert after

    def ratio(counts: dict[str, int]) -> float:
        return counts.get("prefill", 1) / max(1, counts.get("decode", 1))

    assert max(ratio(c) for c in before) <= 1.0, timeline.describe()
    assert ratio(after[-1]) > max(ratio(c) for c in before), timeline.describe()
    assert after[-1]["prefill"] >= 2, timeline.describe()


def _first_token_s(url: str) -> tuple[int, float]:
    """A streamed request's status and the seconds to its first token (wall clock)."""
    started = time.monotonic()
    body = {"model": MODEL, "prompt": "wake up " * 50, "max_tokens": 8, "stream": True}
    with (
        httpx.Client(timeout=WAKE_TIMEOUT_S + 30) as client,
        client.stream("POST", f"{url}/v1/completions", json=body) as response,
    ):
        first = None
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if first is None and line.startswith("data: {"):
                first = time.monotonic() - started
        if response.status_code != 200:
            print(f"answered {response.status_code}: {' '.join(lines)[:500]}")
        return response.status_code, first if first is not None else math.inf


def test_an_idle_service_goes_to_zero_and_a_request_wakes_every_pool(fleet: Fleet) -> None:
    """Aggregated and disaggregated, side by side: no request for the idle period takes every
    pool to zero (the router stays); a request held at zero wakes them through the router's
    push, and is answered, its wait counted in its TTFT."""
    namespace = "idle"
    names = {"solo": False, "split": True}
    for name, disaggregated in names.items():
        fleet.apply(namespace, manifests(name, disaggregated=disaggregated, to_zero=True))
    routers = {name: fleet.router(namespace, name) for name in names}

    def at_zero() -> bool:
        return all(
            set(fleet.replicas(namespace, name).values()) == {0}
            and not fleet.kubectl.json(
                "get", "pods", "-n", namespace, "-l", f"inferfleet.io/model-deployment={name}"
            )["items"]
            for name in names
        )

    engine_ips = {
        ip
        for name in names
        for ip in fleet.healthy_ips(namespace, f"inferfleet.io/model-deployment={name}")
    }
    assert engine_ips, fleet.diagnostics()
    started = time.monotonic()
    assert wait_until(at_zero, IDLE_S + 120, 2), (
        {name: fleet.replicas(namespace, name) for name in names},
        fleet.diagnostics(),
    )
    print(f"\nat zero {time.monotonic() - started:.0f} s after the services were Ready")

    def answers(ip: str) -> bool:
        try:
            return httpx.get(f"http://{ip}:{PORT}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    # A deleted engine pod serves on through its preStop sleep. The local fleet hands a deleted
    # pod's IP to the next pod at once and marks it Ready: a wake within those seconds would
    # reach the old process there (a cluster gives a new pod an address of its own). At zero
    # means no engine process serves.
    assert wait_until(lambda: not any(answers(ip) for ip in engine_ips), 90, 1)
    for name in names:
        md = fleet.get("modeldeployment", name, namespace)
        ready = next(c for c in md["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero"), ready
        assert any("ScaleToZeroIdle" in line for line in _decisions(fleet, namespace, name))
        # The router stays, and says it is ready to hold requests.
        health = httpx.get(f"http://{routers[name]}:{PORT}/health", timeout=5.0)
        assert health.status_code == 200, health.text

    answered: dict[str, tuple[int, float]] = {}

    def ask(name: str) -> None:
        answered[name] = _first_token_s(f"http://{routers[name]}:{PORT}")

    callers = [threading.Thread(target=ask, args=(name,)) for name in names]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    print(f"first token after a wake from zero (s): {answered}")
    for name, (status, ttft_s) in answered.items():
        assert status == 200, (name, status, fleet.diagnostics())
        # Held for an engine to start (kwok pod, emulator process, readiness, discovery):
        # seconds here, the cold start on a cluster; within the router's wake timeout.
        assert 0.5 < ttft_s < WAKE_TIMEOUT_S, (name, ttft_s)
        assert all(n >= 1 for n in fleet.replicas(namespace, name).values())
        decisions = _decisions(fleet, namespace, name)
        assert any("WakeFromZero" in line for line in decisions), decisions
        # The router pushed what it held, and once it was answered, that none is left.
        wake = fleet.get("configmap", f"{name}-router-wake", namespace)
        assert wake["data"]["waitingForReplicas"] == "0", wake
        assert wake["data"]["router"].startswith(f"{name}-router-"), wake
    roles = fleet.replicas(namespace, "split")
    assert set(roles) == {"prefill", "decode"}, roles
    # The held requests are counted against the SLO as any request is, their wait included:
    # the p95 TTFT the loop reads back lies in the router's histogram bucket of that wait.

    def observed_ttft_ms(name: str) -> float:
        status = fleet.get("infsvc", name, namespace).get("status") or {}
        return float((status.get("observed") or {}).get("ttftP95Ms") or 0.0)

    assert wait_until(
        lambda: all(observed_ttft_ms(n) >= 500 * answered[n][1] for n in names), 60, 2
    ), {name: observed_ttft_ms(name) for name in names}


def steady_manifests(name: str, replicas: int) -> str:
    """A deployment whose replicas come from its spec (no autoscaling), behind a service."""
    deployment, service = yaml.safe_load_all(manifests(name))
    deployment["spec"]["replicas"] = replicas
    del service["spec"]["autoscaling"]
    return yaml.safe_dump_all([deployment, service])


def test_a_pool_scaled_in_under_load_finishes_every_stream(fleet: Fleet) -> None:
    """Streams in flight on the replicas a scale-in removes run to their end: the routers stop
    sending those replicas requests while their preStop sleep keeps them serving, and they
    drain after SIGTERM. Zero client errors, counted."""
    namespace, name = "scalein", "steady"
    fleet.apply(namespace, steady_manifests(name, 3))
    router = fleet.router(namespace, name)
    engines = f"inferfleet.io/model-deployment={name}"
    assert wait_until(lambda: len(fleet.healthy_ips(namespace, engines)) == 3, 90, 1), (
        fleet.diagnostics()
    )
    streams = Streams.start(router, seed=3)
    time.sleep(25.0)
    before = set(fleet.healthy_ips(namespace, engines))
    listed = httpx.get(f"http://{router}:{ADMIN_PORT}/debug/replicas", timeout=5.0).json()
    in_flight = {entry["url"].split("//")[1].split(":")[0]: entry["inFlight"] for entry in listed}
    fleet.kubectl.run("scale", "modeldeployment", name, "-n", namespace, "--replicas", "1")
    assert wait_until(lambda: len(fleet.healthy_ips(namespace, engines)) == 1, 60, 1)
    removed = before - set(fleet.healthy_ips(namespace, engines))
    results, failed, cut_short = streams.finish()
    print(
        f"\nscale-in 3 -> 1 under load: {len(results)} requests, {len(failed)} failed, "
        f"{len(cut_short)} short; in flight on the removed replicas when it was asked: "
        f"{sum(in_flight.get(ip, 0) for ip in removed)}"
    )
    assert len(removed) == 2, (before, removed)
    # The scale-in happened with streams running on the replicas it removed.
    assert sum(in_flight.get(ip, 0) for ip in removed) > 0, in_flight
    assert [r.error for r in failed] == []
    assert cut_short == []


def test_a_rollout_without_a_spare_gpu_under_load_finishes_every_stream(fleet: Fleet) -> None:
    """`spec.rollout: {maxSurge: 0, maxUnavailable: 1}`: a change to the engines replaces them
    one at a time in place, never more engine pods than replicas (no spare GPU), and the streams
    in flight on each replaced replica run to their end, as in a scale-in. Zero client errors,
    counted."""
    namespace, name = "rollout", "inplace"
    deployment, service = yaml.safe_load_all(steady_manifests(name, 2))
    deployment["spec"]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1}
    fleet.apply(namespace, yaml.safe_dump_all([deployment, service]))
    router = fleet.router(namespace, name)
    engines = f"inferfleet.io/model-deployment={name}"
    assert wait_until(lambda: len(fleet.healthy_ips(namespace, engines)) == 2, 90, 1), (
        fleet.diagnostics()
    )

    def pods() -> list[dict[str, Any]]:
        found = fleet.kubectl.json("get", "pods", "-n", namespace, "-l", engines)["items"]
        return [pod for pod in found if not pod["metadata"].get("deletionTimestamp")]

    def routers() -> set[str]:
        selector = f"inferfleet.io/inference-service={name}"
        found = fleet.kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
        return {pod["metadata"]["name"] for pod in found}

    before, routing = {pod["metadata"]["name"] for pod in pods()}, routers()
    streams = Streams.start(router, seed=5)
    time.sleep(15.0)
    listed = httpx.get(f"http://{router}:{ADMIN_PORT}/debug/replicas", timeout=5.0).json()
    in_flight = sum(entry["inFlight"] for entry in listed)
    # A new memory share changes the engines' pod template (a rollout) and nothing the router
    # is told: the router this test calls, by its pod's address, stays.
    fleet.kubectl.run(
        "patch", "modeldeployment", name, "-n", namespace, "--type", "merge",
        "-p", '{"spec": {"gpu": {"memoryUtilization": 0.85}}}',
    )  # fmt: skip
    most = 0

    def rolled_out() -> bool:
        nonlocal most
        current = pods()
        most = max(most, len(current))
        names = {pod["metadata"]["name"] for pod in current}
        return (
            len(names) == 2
            and not names & before
            and len(fleet.healthy_ips(namespace, engines)) == 2
        )

    assert wait_until(rolled_out, 150, 0.5), (pods(), fleet.diagnostics())
    results, failed, cut_short = streams.finish()
    print(
        f"\nrollout without surge under load: {len(results)} requests, {len(failed)} failed, "
        f"{len(cut_short)} short; {in_flight} in flight when it began; at most {most} engine "
        "pods not terminating"
    )
    assert in_flight > 0, listed
    assert routers() == routing
    assert most <= 2  # never a third replica, so never a spare GPU
    assert failed == [], ([(r.scheduled_s, r.error_detail) for r in failed], fleet.diagnostics())
    assert cut_short == []


def test_prompts_that_share_a_prefix_get_prefix_caching_advised(fleet: Fleet) -> None:
    """Prefix caching off, and every prompt opens with the same three blocks (a long system
    prompt): the routers count the repeats, the autoscaler advises turning caching on, in the
    service's status, the deployment's, and an Event; nothing is changed."""
    namespace, name = "advice", "shared"
    fleet.apply(namespace, manifests(name, prefix_caching=False))
    url = f"http://{fleet.router(namespace, name)}:{PORT}"
    # Four blocks of 512 tokens, three of them the same in every prompt: 1.5 requests/s.
    requests = [
        TraceRequest(i / 1.5, 2048, 20, prefix_hashes=(11, 12, 13, 1000 + i)) for i in range(150)
    ]
    loading = threading.Thread(target=lambda: asyncio.run(_run(url, requests)), daemon=True)
    loading.start()

    def status_at(kind: str, path: tuple[str, ...]) -> list[dict[str, Any]]:
        found: Any = fleet.get(kind, name, namespace).get("status") or {}
        for key in path:
            found = (found or {}).get(key)
        return list(found or [])

    def advised(kind: str, path: tuple[str, ...]) -> list[dict[str, Any]]:
        return [a for a in status_at(kind, path) if a.get("reason") == "EnablePrefixCaching"]

    started = time.monotonic()
    try:
        assert wait_until(lambda: bool(advised("infsvc", ("advice",))), 90, 2), (
            fleet.get("infsvc", name, namespace).get("status"),
            fleet.diagnostics(),
        )
        service_advice = advised("infsvc", ("advice",))
        advised_after_s = time.monotonic() - started
        assert wait_until(lambda: bool(advised("mdep", ("autoscaling", "advice"))), 30, 1), (
            fleet.get("mdep", name, namespace).get("status")
        )
        deployment_advice = advised("mdep", ("autoscaling", "advice"))
        # The same ticks diagnose the pool: what bounds it, and queueing against prefill.
        deployment_diagnosis = ("autoscaling", "diagnosis")
        assert wait_until(lambda: bool(status_at("mdep", deployment_diagnosis)), 30, 1), fleet.get(
            "mdep", name, namespace
        ).get("status")

        # The engines' histograms count a request once it finishes: the quantiles come with
        # the first requests done in the window.
        def queueing_read() -> bool:
            found = status_at("infsvc", ("diagnosis",))
            return bool(found) and all("queueP95Ms" in d["inputs"] for d in found)

        assert wait_until(queueing_read, 60, 2), status_at("infsvc", ("diagnosis",))
        service_diagnosis = status_at("infsvc", ("diagnosis",))
        # Read again, later in the load: the first reading's rates span its first seconds.
        later_advice = advised("infsvc", ("advice",)) or service_advice
    finally:
        loading.join(timeout=180)
    print(f"advised {advised_after_s:.0f} s after the load began: {service_advice}")
    print(f"later: {later_advice}")
    print(f"diagnosed: {service_diagnosis}")
    [diagnosis] = service_diagnosis
    assert (diagnosis["deployment"], diagnosis["role"]) == (name, "aggregated"), diagnosis
    assert diagnosis["bound"] in {"compute", "bandwidth", "light"}
    assert diagnosis["inputs"]["mfu"] > 0
    assert diagnosis["inputs"]["runningPerReplica"] > 0
    # The emulator exports vLLM's queue and prefill histograms: both quantiles are read.
    assert diagnosis["inputs"]["queueP95Ms"] >= 0
    assert diagnosis["inputs"]["prefillP95Ms"] > 0
    assert "prefilling: " in diagnosis["message"]
    [on_deployment] = status_at("mdep", deployment_diagnosis)
    assert on_deployment["role"] == "aggregated"
    [advice] = later_advice
    assert advice["deployment"] == name
    share = advice["inputs"]["repeatedPrefixShare"]
    # Three of four blocks (the first prompt saw none; Prometheus extrapolates rates).
    assert 0.6 <= share <= 0.8, advice
    assert advice["inputs"]["predictedIdleTtftCachedMs"] < advice["inputs"]["predictedIdleTtftMs"]
    assert deployment_advice[0]["reason"] == "EnablePrefixCaching"
    events = fleet.kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", "reason=EnablePrefixCaching"
    )["items"]
    assert [e["involvedObject"]["kind"] for e in events] == ["InferenceService"], events
    # Advice is never applied: the spec is as it was.
    assert fleet.get("mdep", name, namespace)["spec"]["prefixCaching"] is False


def test_a_weight_cache_is_filled_once_and_replicas_start_from_it(fleet: Fleet) -> None:
    """A deployment with `model.cache`: its volume is provisioned and bound, its Job fills it
    from the hub (progress in status), its replica waits for the fill, then starts with the
    weights on the volume and the plan's cold start from the cache. Deleted, it takes its
    volume with it."""
    namespace, name = "weight-cache", "cached"
    hub = fleet.hub
    assert hub is not None
    repo = hub.root / "acme" / "tiny-llama"
    (repo / "original").mkdir(parents=True)
    (repo / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for index, size in enumerate((3_000_000, 2_000_000), start=1):
        (repo / f"model-0000{index}-of-00002.safetensors").write_bytes(os.urandom(size))
    (repo / "original" / "consolidated.00.pth").write_bytes(os.urandom(1_000_000))
    served = {p.name for p in repo.iterdir() if p.is_file()}  # not original/
    total = sum((repo / n).stat().st_size for n in served)
    spec: dict[str, Any] = {
        "model": {"name": MODEL, "source": "hf://acme/tiny-llama", "cache": {"size": "1Gi"}},
        "engine": {"name": "sim"},
        "batching": {"maxModelLength": 8192},
        "gpu": {"type": "L4-24GB"},
        "replicas": 1,
    }
    fleet.apply(namespace, yaml.safe_dump(
        {"apiVersion": "inferfleet.io/v1alpha1", "kind": "ModelDeployment",
         "metadata": {"name": name}, "spec": spec}
    ))  # fmt: skip
    seen: list[tuple[str, str, int | None]] = []

    def status() -> dict[str, Any]:
        found: dict[str, Any] = fleet.get("mdep", name, namespace).get("status") or {}
        return found

    def filled_and_ready() -> bool:
        current = status()
        cache = current.get("weightCache") or {}
        ready: dict[str, Any] = next(
            (c for c in current.get("conditions", []) if c["type"] == "Ready"), {}
        )
        moment = (cache.get("phase", ""), ready.get("reason", ""), cache.get("bytesFilled"))
        if not seen or seen[-1] != moment:
            seen.append(moment)
        return bool(cache.get("phase") == "Filled" and ready.get("status") == "True")

    assert wait_until(filled_and_ready, 180, 0.5), (seen, fleet.diagnostics())
    print(f"phase, Ready's reason, bytes filled, as they changed: {seen}")
    final = status()
    cache = final["weightCache"]
    phases = [phase for phase, _, _ in seen]
    # Seen under way: pushed by the fill while the replica waited for it.
    assert "Filling" in phases, seen
    assert any(p == "Filling" and r == "WeightsNotCached" for p, r, _ in seen), seen
    assert phases.index("Filling") < phases.index("Filled")
    assert cache["bytesTotal"] == cache["bytesFilled"] == total
    assert cache["revision"] == hub.commit("acme/tiny-llama")
    conditions = {c["type"]: c for c in final["conditions"]}
    assert conditions["WeightsCached"]["status"] == "True", conditions
    assert final["plan"]["coldStart"]["weightSource"] == "cache"

    # The files are on the volume, as the hub has them; the other framework's copy is not.
    claim = fleet.get("pvc", cache["claim"], namespace)
    assert claim["status"]["phase"] == "Bound"
    volume = fleet.kubectl.json("get", "pv", claim["spec"]["volumeName"])
    directory = Path(volume["spec"]["hostPath"]["path"]) / "acme" / "tiny-llama"
    for file in served:
        assert (directory / file).read_bytes() == (repo / file).read_bytes(), file
    assert not (directory / "original" / "consolidated.00.pth").exists()
    assert hub.served.get("original/consolidated.00.pth", 0) == 0

    # The replica started once the fill ended: its pod turned Ready after the Job completed.
    [job] = fleet.kubectl.json("get", "jobs", "-n", namespace)["items"]
    completed = datetime.fromisoformat(job["status"]["completionTime"])
    [pod] = [
        p for p in fleet.kubectl.json(
            "get", "pods", "-n", namespace, "-l", f"inferfleet.io/model-deployment={name}"
        )["items"]
        if p["metadata"]["labels"].get("inferfleet.io/role") == "aggregated"
    ]  # fmt: skip
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert datetime.fromisoformat(ready["lastTransitionTime"]) >= completed, (ready, job)
    started = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    assert completed > started  # it waited: created before the fill ended
    print(f"fill: {total / 1e6:.1f} MB; replica created {started:%H:%M:%S}, fill done "
          f"{completed:%H:%M:%S}, Ready {ready['lastTransitionTime']}")  # fmt: skip

    # Another source: another volume and fill. The replica it replaces serves on from the
    # old volume meanwhile; the old Job goes with its pod, the old volume once no pod reads it.
    newer = hub.root / "acme" / "tiny-llama-2"
    newer.mkdir()
    for file in served:
        (newer / file).write_bytes((repo / file).read_bytes())
    spec["model"]["source"] = "hf://acme/tiny-llama-2"
    fleet.apply(namespace, yaml.safe_dump(
        {"apiVersion": "inferfleet.io/v1alpha1", "kind": "ModelDeployment",
         "metadata": {"name": name}, "spec": spec}
    ))  # fmt: skip

    def refilled() -> bool:
        current = status()
        cache = current.get("weightCache") or {}
        ready = {c["type"]: c["status"] for c in current.get("conditions", [])}.get("Ready")
        return bool(
            cache.get("claim") not in (None, claim["metadata"]["name"])
            and cache.get("phase") == "Filled"
            and ready == "True"
            and current.get("observedGeneration") == 2
        )

    assert wait_until(refilled, 180, 1), (status(), fleet.diagnostics())
    [newer_job] = fleet.kubectl.json("get", "jobs", "-n", namespace)["items"]
    assert newer_job["metadata"]["name"] != job["metadata"]["name"]
    old_pods = f"job-name={job['metadata']['name']}"

    def old_ones_gone() -> bool:
        pods = fleet.kubectl.json("get", "pods", "-n", namespace, "-l", old_pods)["items"]
        claims = fleet.kubectl.json("get", "pvc", "-n", namespace)["items"]
        names = {c["metadata"]["name"] for c in claims}
        return not pods and claim["metadata"]["name"] not in names and not directory.exists()

    assert wait_until(old_ones_gone, 120, 1), fleet.kubectl.run("get", "pods,pvc,pv", "-A").stdout

    fleet.kubectl.run("delete", "mdep", name, "-n", namespace, "--wait=false")
    volumes = directory.parent.parent.parent
    assert wait_until(lambda: not any(volumes.iterdir()), 120, 1), fleet.kubectl.run(
        "get", "pv,pvc", "-A"
    ).stdout
