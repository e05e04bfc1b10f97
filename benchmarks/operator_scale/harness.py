"""The cluster harness: a fresh dev cluster, kubectl, the operator as its service account, watches
that see things turn ready, and the run itself (`measure`), phase by phase:

1. bare Deployments (before the operator starts): the engine Deployments the operator would
   render for the N services, applied directly, timed to all rolled out; then deleted, and
   the run waits until they are gone;
2. warm-up: the operator starts; one service, so its start-up is not charged to what follows;
3. single services: one service applied alone, a few times in a row;
4. rollout: N services in one `kubectl apply --server-side`, each timed to its
   InferenceService's Ready=True;
5. steady: a settling pause, then a minute in which nothing changes.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from unittest import mock

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.operator_scale.audit import (
    OPERATOR_ACCOUNT,
    OPERATOR_NAMESPACE,
    OPERATOR_USER,
    FleetObjects,
    Phase,
    audit_policy,
)
from benchmarks.operator_scale.procfs import (
    ROOT,
    CpuSampler,
    CpuSnapshot,
    alive,
    die_with_parent,
    hardware,
    process_cpu_seconds,
    process_status_kib,
    processes_mentioning,
    snapshot,
    source_state,
)
from benchmarks.operator_scale.stats import is_ready, parse_time, ready_condition, rolled_out
from benchmarks.operator_scale.workloads import all_rendered, engine_deployments, manifests
from inferfleet.devcluster import cluster as cluster_module
from inferfleet.devcluster.cluster import DevCluster, running
from inferfleet.devcluster.components import ClientRateLimit
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import free_port

RBAC = ROOT / "deploy" / "rbac" / "cluster-wide.yaml"
BARE_NAMESPACE = "bench-bare"
BARE_RENDERED_NAMESPACE = "bench-bare-rendered"
BARE_DEPLOYMENTS = "bare Deployments"
BARE_RENDERED = "bare rendered objects"
WARMUP_NAMESPACE = "bench-warmup"
BASELINE_NAMESPACE = "bench-baseline"
FLEET_NAMESPACE = "bench-fleet"
NAMESPACES = (
    BARE_NAMESPACE,
    BARE_RENDERED_NAMESPACE,
    WARMUP_NAMESPACE,
    BASELINE_NAMESPACE,
    FLEET_NAMESPACE,
)
WATCH = "benchmark: kubectl watch"
QUIET_CORES = 0.02
"""An operator under 2 % of a core has no queued work (idle, it uses well under 1 %)."""

Key = tuple[str, str]


def service_names(services: int) -> list[str]:
    return [f"svc-{i:03d}" for i in range(services)]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Kubectl:
    """`kube kubectl` (the multi-call binary) against one kubeconfig."""

    binary: Path
    kubeconfig: Path

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), "kubectl", f"--kubeconfig={self.kubeconfig}", *args]

    def run(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        result = subprocess.run(
            self.argv(*args), input=stdin, capture_output=True, text=True, check=False,
            timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def items(self, *args: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.run("get", *args, "-o", "json"))["items"]
        return found


class Operator:
    """`python -m inferfleet.cli run` as a child in its own session, as the service account,
    its own metrics served on a loopback port."""

    def __init__(self, kubeconfig: Path, log_path: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log = log_path
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.last_cpu_s = 0.0
        self.last_peak_rss_kib = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "inferfleet.cli", "run",
                    "--metrics-port", str(self.metrics_port),
                ],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent,  # noqa: PLW1509
            )  # fmt: skip

    def sample(self) -> float:
        """CPU seconds so far; also remembers them and the peak RSS for after it exits."""
        cpu = process_cpu_seconds(self.pid)
        peak = process_status_kib(self.pid, "VmHWM")
        if cpu is not None:
            self.last_cpu_s = cpu
        if peak is not None:
            self.last_peak_rss_kib = peak
        return self.last_cpu_s

    def reconciles(self) -> int | None:
        """Reconciles of ModelDeployments and InferenceServices it has finished so far, from
        its own metrics (None where they cannot be read)."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return None
        return round(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "inferfleet_operator_reconcile_duration_seconds_count"
                and sample.labels.get("queue") == "reconcile"
            )
        )

    def check(self) -> None:
        """Raises if the operator exited: nothing it should do will happen."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"the operator exited with status {self.process.returncode}; see {self.log}"
            )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.sample()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def service_account_kubeconfig(kubectl: Kubectl, cluster: DevCluster, path: Path) -> Path:
    token = kubectl.run(
        "create", "token", OPERATOR_ACCOUNT, "-n", OPERATOR_NAMESPACE, "--duration=2h"
    ).strip()
    config = yaml.safe_load(cluster.kubeconfig_path.read_text())
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class ReadyWatch:
    """One `kubectl get <resource> --watch -o json` stream; records when each object is first
    seen ready by `ready` (benchmark clock), and the lastTransitionTime of its Ready condition
    where it has one (the operator's clock). Falls back to a 0.5 s poll if the stream ends."""

    def __init__(
        self,
        kubectl: Kubectl,
        resource: str,
        ready: Callable[[Mapping[str, Any]], bool],
        namespace: str | None = None,
    ) -> None:
        self.kubectl = kubectl
        self.scope = ("-n", namespace) if namespace else ("--all-namespaces",)
        self.resource = resource
        self.ready = ready
        self.seen_ready: dict[Key, float] = {}
        self.transition: dict[Key, float] = {}
        self.events = 0
        self.polls = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.cpu_s = 0.0
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.kubectl.argv(
                "get", self.resource, *self.scope, "--watch", "--output-watch-events", "-o", "json"
            ),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509
        )  # fmt: skip
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self._reader.daemon = True
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        decoder = json.JSONDecoder()
        text = codecs.getincrementaldecoder("utf-8")()
        buffer = ""
        while chunk := os.read(stream.fileno(), 1 << 16):
            now = time.time()
            buffer += text.decode(chunk)
            while buffer := buffer.lstrip():
                try:
                    event, end = decoder.raw_decode(buffer)
                except json.JSONDecodeError:
                    break  # the rest of the object has not arrived yet
                buffer = buffer[end:]
                self.events += 1
                self._observe(event.get("object", event), now)
        with self._changed:
            self._changed.notify_all()

    def _observe(self, obj: Mapping[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if key in self.seen_ready or not self.ready(obj):
            return
        with self._changed:
            self.seen_ready[key] = now
            transition = parse_time((ready_condition(obj) or {}).get("lastTransitionTime"))
            if transition is not None:
                self.transition[key] = transition
            self._changed.notify_all()

    @property
    def streaming(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _poll(self) -> None:
        self.polls += 1
        now = time.time()
        for obj in self.kubectl.items(self.resource, *self.scope):
            self._observe(obj, now)

    def wait(
        self, keys: Iterable[Key], timeout_s: float, check: Callable[[], None] | None = None
    ) -> bool:
        """Until every key has been seen ready, or `timeout_s` passed; whether all were.
        `check` runs twice a second and may raise (the process that should act is gone)."""
        wanted = set(keys)
        deadline = time.time() + timeout_s
        while True:
            if check is not None:
                check()
            with self._changed:
                if wanted <= self.seen_ready.keys():
                    return True
                remaining = deadline - time.time()
                if remaining <= 0:
                    return False
                if self.streaming:
                    self._changed.wait(min(remaining, 0.5))
                    continue
            self._poll()
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is None:
            return
        cpu = process_cpu_seconds(self.process.pid)
        if cpu is not None:
            self.cpu_s = cpu
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)

    def stats(self) -> dict[str, Any]:
        return {"events": self.events, "polls": self.polls, "streaming_to_the_end": self.streaming}


def fleet_objects(kubectl: Kubectl, namespace: str) -> FleetObjects:
    ready = {}
    for md in kubectl.items("modeldeployments", "-n", namespace):
        at = parse_time((ready_condition(md) or {}).get("lastTransitionTime"))
        if at is not None:
            ready[md["metadata"]["name"]] = at
    pods = kubectl.items("pods", "-n", namespace)
    unscheduled = [
        str(c.get("message", ""))
        for p in pods
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "False"
    ]
    return FleetObjects(
        model_deployment_ready=ready,
        pods_by_phase=dict(Counter(str((p.get("status") or {}).get("phase")) for p in pods)),
        unscheduled_pods=len(unscheduled),
        unscheduled_example=unscheduled[0] if unscheduled else None,
    )


@dataclass
class Config:
    services: int
    baseline_samples: int
    settle_s: float
    quiet_timeout_s: float
    steady_s: float
    timeout_s: float
    nodes: str
    cpu_nodes: int
    keep_state: bool
    client_rate: ClientRateLimit


@dataclass
class BareRun:
    """A baseline with no operator: objects the operator renders, applied directly."""

    deployments: int = 0
    objects: int = 0
    apply_start: float = 0.0
    apply_end: float = 0.0
    rolled_out: dict[str, float] = field(default_factory=dict)
    """Deployment name -> when the watch first saw it rolled out."""
    complete: bool = False
    deleted_s: float = 0.0
    """Delete of their namespace -> it is gone (every pod with it)."""
    watch: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """Everything measured, before it is summarised."""

    config: Config
    bin_dir: Path
    state_dir: Path
    hardware: dict[str, Any]
    cluster_up_s: float = 0.0
    bare: BareRun = field(default_factory=BareRun)
    """The engine Deployments alone."""
    bare_rendered: BareRun = field(default_factory=BareRun)
    """Everything the operator renders for the services (engine and router objects)."""
    operator_start: float = 0.0
    warmup_ready_s: float = 0.0
    baseline: list[tuple[float, float, float | None]] = field(default_factory=list)
    """(apply start, seen Ready, Ready's lastTransitionTime) per single service."""
    apply_start: float = 0.0
    apply_end: float = 0.0
    rollout_ready: dict[str, float] = field(default_factory=dict)
    rollout_transition: dict[str, float] = field(default_factory=dict)
    complete: bool = False
    quiet_after_s: float | None = None
    """All Ready -> the operator's CPU stayed under QUIET_CORES for a settle window (None:
    not within the quiet timeout); the rollout window ends there."""
    phases: list[Phase] = field(default_factory=list)
    cpu: dict[str, CpuSnapshot] = field(default_factory=dict)
    reconciles: dict[str, int | None] = field(default_factory=dict)
    """The operator's reconciles so far, at the same moments as `cpu`'s snapshots."""
    timeline: dict[str, list[float]] = field(default_factory=dict)
    """Cores used per process in 10 s windows from the apply to the steady minute."""
    fleet: FleetObjects | None = None
    source: dict[str, Any] = field(default_factory=dict)
    watch: dict[str, Any] = field(default_factory=dict)
    operator_cpu_s: float = 0.0
    operator_peak_rss_kib: int = 0
    loadavg_before: str = ""
    loadavg_after: str = ""
    audit_policy_counts_reads: bool = False
    leftovers: list[str] = field(default_factory=list)
    busy_before: list[str] = field(default_factory=list)
    """Other control planes or test runs already on the machine when the run began."""


def wait_quiet(operator: Operator, window_s: float, timeout_s: float) -> bool:
    """Until the operator used under QUIET_CORES of a core over a whole `window_s` (the work a
    rollout queued is done: what follows is idle), or `timeout_s` passed; whether it was."""
    deadline = time.time() + timeout_s
    while True:
        before = operator.sample()
        time.sleep(window_s)
        operator.check()
        if operator.sample() - before < QUIET_CORES * window_s:
            return True
        if time.time() >= deadline:
            return False


def _apply(kubectl: Kubectl, stream: str, timeout_s: float) -> None:
    kubectl.run("apply", "--server-side", "-f", "-", stdin=stream, timeout=timeout_s)


def bare_apply(
    run: Run,
    kubectl: Kubectl,
    component_pids: Mapping[str, int],
    *,
    phase: str,
    namespace: str,
    stream: str,
) -> BareRun:
    """A baseline with no operator: `stream` applied in one `kubectl apply` to `namespace`,
    timed until every Deployment in it is rolled out, then deleted (the namespace, waited for
    until gone). Its CPU is measured over `component_pids` and the watch; the phase is named
    `phase`."""
    config = run.config
    bare = BareRun()
    documents = list(yaml.safe_load_all(stream))
    names = [doc["metadata"]["name"] for doc in documents if doc["kind"] == "Deployment"]
    bare.deployments, bare.objects = len(names), len(documents)
    watch = ReadyWatch(kubectl, "deployments", rolled_out, namespace=namespace)
    watch.start()
    assert watch.process is not None
    pids = {**component_pids, WATCH: watch.process.pid}
    try:
        log(f"{phase}: applying {len(documents)} objects, no operator running")
        run.cpu[f"{phase} start"] = snapshot(pids)
        bare.apply_start = time.time()
        _apply(kubectl, stream, config.timeout_s)
        bare.apply_end = time.time()
        bare.complete = watch.wait([(namespace, n) for n in names], config.timeout_s)
        run.cpu[f"{phase} rolled out"] = snapshot(pids)
        bare.rolled_out = {name: at for (_, name), at in watch.seen_ready.items()}
        log(
            f"{phase}: {len(bare.rolled_out)}/{len(names)} Deployments rolled out after "
            f"{time.time() - bare.apply_start:.1f} s; deleting them"
        )
        run.phases.append(Phase(phase, bare.apply_start, time.time(), 0))
    finally:
        watch.stop()
        bare.watch = {**watch.stats(), "kubectl_cpu_s": round(watch.cpu_s, 2)}
    deleting = time.time()
    timeout = f"--timeout={config.timeout_s:.0f}s"
    kubectl.run("delete", "namespace", namespace, "--wait=true", timeout,
                timeout=config.timeout_s + 30)  # fmt: skip
    bare.deleted_s = time.time() - deleting
    time.sleep(config.settle_s)
    return bare


def baselines(run: Run, kubectl: Kubectl, component_pids: Mapping[str, int]) -> None:
    """Phase 1: the engine Deployments alone; then everything the operator renders for the
    services (engine and router objects), each applied bare."""
    names = service_names(run.config.services)
    run.bare = bare_apply(
        run, kubectl, component_pids, phase=BARE_DEPLOYMENTS, namespace=BARE_NAMESPACE,
        stream=engine_deployments(names, BARE_NAMESPACE),
    )  # fmt: skip
    run.bare_rendered = bare_apply(
        run, kubectl, component_pids, phase=BARE_RENDERED, namespace=BARE_RENDERED_NAMESPACE,
        stream=all_rendered(names, BARE_RENDERED_NAMESPACE),
    )  # fmt: skip


def warm_up_and_single_services(
    run: Run, kubectl: Kubectl, watch: ReadyWatch, operator: Operator, pids: Mapping[str, int]
) -> None:
    """Phases 2 and 3: the operator's start-up paid by one service, then one at a time."""
    config = run.config
    log("operator started; warm-up service")
    _apply(kubectl, manifests(["warmup"], WARMUP_NAMESPACE), config.timeout_s)
    if not watch.wait([(WARMUP_NAMESPACE, "warmup")], config.timeout_s, operator.check):
        raise RuntimeError("the warm-up service never turned Ready; see operator.log")
    run.warmup_ready_s = watch.seen_ready[(WARMUP_NAMESPACE, "warmup")] - run.operator_start
    time.sleep(config.settle_s)
    run.cpu["baseline start"] = snapshot(pids)
    for i in range(config.baseline_samples):
        name = f"single-{i}"
        started = time.time()
        _apply(kubectl, manifests([name], BASELINE_NAMESPACE), config.timeout_s)
        key = (BASELINE_NAMESPACE, name)
        if not watch.wait([key], config.timeout_s, operator.check):
            raise RuntimeError(f"single service {name} never turned Ready")
        run.baseline.append((started, watch.seen_ready[key], watch.transition.get(key)))
        log(f"single service {name}: Ready after {watch.seen_ready[key] - started:.2f} s")
        time.sleep(config.settle_s)
        run.phases.append(Phase(f"baseline {name}", started, time.time(), 2))


def rollout_and_steady(
    run: Run,
    kubectl: Kubectl,
    watch: ReadyWatch,
    operator: Operator,
    pids: Mapping[str, int],
) -> None:
    """Phases 4 and 5: N services in one apply, each timed to Ready; then the idle minute
    (CPU sampled once a second throughout, for the cores-used time line)."""
    log(f"applying {run.config.services} services")
    sampler = CpuSampler({**pids, "benchmark (Python)": os.getpid()})
    sampler.start()
    try:
        _rollout(run, kubectl, watch, operator, pids)
    finally:
        sampler.stop()
    steady = next(phase for phase in run.phases if phase.name == "steady")
    run.timeline = sampler.timeline(run.apply_start, steady.start)


def _rollout(
    run: Run, kubectl: Kubectl, watch: ReadyWatch, operator: Operator, pids: Mapping[str, int]
) -> None:
    config = run.config
    names = service_names(config.services)
    run.cpu["rollout start"] = snapshot(pids)
    run.reconciles["rollout start"] = operator.reconciles()
    run.apply_start = time.time()
    _apply(kubectl, manifests(names, FLEET_NAMESPACE), config.timeout_s)
    run.apply_end = time.time()
    log(f"apply took {run.apply_end - run.apply_start:.1f} s; waiting for Ready")
    keys = [(FLEET_NAMESPACE, n) for n in names]
    run.complete = watch.wait(keys, config.timeout_s, operator.check)
    all_ready = time.time()
    run.cpu["all ready"] = snapshot(pids)
    for key in keys:
        if key in watch.seen_ready:
            run.rollout_ready[key[1]] = watch.seen_ready[key]
        if key in watch.transition:
            run.rollout_transition[key[1]] = watch.transition[key]
    took = all_ready - run.apply_start
    log(f"{len(run.rollout_ready)}/{config.services} Ready after {took:.1f} s")
    if wait_quiet(operator, config.settle_s, config.quiet_timeout_s):
        run.quiet_after_s = time.time() - all_ready
    log(f"operator quiet: {run.quiet_after_s is not None}, {time.time() - all_ready:.1f} s on")
    run.phases.append(Phase("rollout", run.apply_start, time.time(), 2 * config.services))
    run.cpu["steady start"] = snapshot(pids)
    run.reconciles["steady start"] = operator.reconciles()
    steady_start = time.time()
    log(f"steady window: {config.steady_s:.0f} s")
    time.sleep(config.steady_s)
    run.phases.append(Phase("steady", steady_start, time.time(), 0))
    run.cpu["steady end"] = snapshot(pids)


def measure(config: Config, bin_dir: Path, state_dir: Path) -> Run:
    run = Run(config=config, bin_dir=bin_dir, state_dir=state_dir, hardware=hardware())
    run.source["at_start"] = source_state()
    run.busy_before = processes_mentioning("kube-apiserver") + processes_mentioning("pytest")
    run.loadavg_before = Path("/proc/loadavg").read_text().strip()
    pools = NodePool.parse(config.nodes)
    with contextlib.ExitStack() as stack:
        log(f"starting the dev cluster ({config.nodes}, {config.cpu_nodes} CPU) in {state_dir}")
        started = time.time()
        with mock.patch.object(cluster_module, "AUDIT_POLICY", audit_policy()):
            cluster = stack.enter_context(
                running(
                    state_dir / "cluster", bin_dir, pools, cpu_nodes=config.cpu_nodes,
                    client_rate=config.client_rate,
                )
            )  # fmt: skip
        run.cluster_up_s = time.time() - started
        written = yaml.safe_load((cluster.state_dir / "audit-policy.yaml").read_text())
        run.audit_policy_counts_reads = any(
            rule.get("users") == [OPERATOR_USER] for rule in written["rules"]
        )
        cluster.install_crds()
        kubectl = Kubectl(bin_dir / "kube", cluster.kubeconfig_path)
        kubectl.run("create", "namespace", OPERATOR_NAMESPACE)
        kubectl.run("apply", "--server-side", "-f", str(RBAC))
        for namespace in NAMESPACES:
            kubectl.run("create", "namespace", namespace)
        state = cluster.state()
        assert state is not None
        component_pids = dict(state.pids)

        baselines(run, kubectl, component_pids)

        operator = Operator(
            service_account_kubeconfig(kubectl, cluster, state_dir / "operator.kubeconfig"),
            state_dir / "operator.log",
        )
        stack.callback(operator.stop)
        watch = ReadyWatch(kubectl, "inferenceservices", is_ready)
        stack.callback(watch.stop)
        watch.start()
        operator.start()
        run.operator_start = time.time()
        assert watch.process is not None
        pids = {**component_pids, "operator": operator.pid, WATCH: watch.process.pid}
        run.cpu["operator start"] = snapshot(pids)
        warm_up_and_single_services(run, kubectl, watch, operator, pids)
        rollout_and_steady(run, kubectl, watch, operator, pids)
        first_single = next(p for p in run.phases if p.name.startswith("baseline"))
        run.phases.append(
            Phase("operator start-up and warm-up", run.operator_start, first_single.start, 2)
        )
        log("collecting object timestamps")
        run.fleet = fleet_objects(kubectl, FLEET_NAMESPACE)
        operator.sample()
        run.watch = watch.stats()
        log("stopping the operator and the cluster")
    # Out of the stack: watch, operator and cluster are stopped (in that order).
    run.operator_cpu_s = operator.last_cpu_s
    run.operator_peak_rss_kib = operator.last_peak_rss_kib
    run.watch["kubectl_cpu_s"] = round(watch.cpu_s, 2)
    run.loadavg_after = Path("/proc/loadavg").read_text().strip()
    run.source["at_end"] = source_state()
    stopped = [*component_pids.values(), operator.pid, watch.process.pid]
    run.leftovers = [f"{pid} still alive" for pid in stopped if alive(pid)]
    run.leftovers += processes_mentioning(str(state_dir))
    return run
