"""How the operator copes with many services at once, on the local dev cluster.

    .venv/bin/python -m benchmarks.operator_scale [--services 200] [--out benchmarks/results]

Starts a fresh dev cluster (audit log extended to the operator's reads), installs the CRDs and
the cluster-wide RBAC, runs `inferfleet run` as its service account, then:

1. warm-up: one service, so the operator's start-up is not charged to what follows;
2. baseline: one service applied alone, a few times in a row: the per-service latency floor;
3. rollout: N services (a ModelDeployment on the `sim` engine and an InferenceService each)
   in one `kubectl apply --server-side`, timing each service from the apply to its
   InferenceService's `Ready=True`, seen through one `kubectl get --watch` stream;
4. steady: a settling pause, then a minute in which nothing changes.

Then it reads the API server's audit log (requests per user, verb and resource), the
objects' timestamps (where the time went), the operator's log (warnings and errors) and
/proc (CPU seconds and peak RSS per process), stops everything, checks that no process is
left, and writes `operator_scale.json` and `operator_scale.md` to `--out`.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import copy
import ctypes
import hashlib
import itertools
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any
from unittest import mock
from urllib.parse import urlsplit

import yaml

from inferfleet import __version__
from inferfleet.devcluster import cluster as cluster_module
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, running
from inferfleet.devcluster.nodes import NodePool
from inferfleet.render.inference_service import ROUTER_REPLICAS

ROOT = Path(__file__).resolve().parents[1]
RBAC = ROOT / "deploy" / "rbac" / "cluster-wide.yaml"
OPERATOR_NAMESPACE = "inferfleet-system"
OPERATOR_ACCOUNT = "inferfleet-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
READ_VERBS = ("get", "list", "watch")
API = "inferfleet.io/v1alpha1"

WARMUP_NAMESPACE = "bench-warmup"
BASELINE_NAMESPACE = "bench-baseline"
FLEET_NAMESPACE = "bench-fleet"

PODS_PER_NODE = 110  # inferfleet.devcluster.nodes gives every fake node 110 pods
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------------------- small helpers


def _die_with_parent() -> None:
    """In a child before exec: if the benchmark dies, the child gets SIGTERM."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100): a value that was measured, never interpolated."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: Sequence[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "p50": round(percentile(values, 50), 3),
        "p90": round(percentile(values, 90), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 timestamp (Kubernetes' `...Z`, with or without fractions) -> epoch seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def ready_condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return dict(condition)
    return None


# ------------------------------------------------------------------------- processes, /proc


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process (all its threads), from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_status_kib(pid: int, key: str) -> int | None:
    """A `kB` line of /proc/<pid>/status, e.g. VmHWM (peak RSS) or VmRSS."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return None


def system_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (every process, not only ours)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / CLOCK_TICKS


def own_cpu_seconds() -> tuple[float, float]:
    """(this process, its reaped children): the benchmark's own work and its short kubectl runs."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def processes_mentioning(text: str) -> list[str]:
    """`pid command` of every live process whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv and alive(int(entry.name)):
            found.append(f"{entry.name} {argv.strip()[:200]}")
    return found


def source_state() -> dict[str, Any]:
    """Which operator code ran: the commit, files changed since, and a digest of the sources
    (taken at the start and the end, so a change during the run shows)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "operator").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    state: dict[str, Any] = {"operator_sources_sha256": digest.hexdigest()[:16]}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(ROOT)]
        state["commit"] = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--", "operator"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        state["operator_files_changed_since_commit"] = [
            line[3:] for line in changed.splitlines() if line.strip()
        ]
    return state


def hardware() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10)
        for line in lscpu.stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


# -------------------------------------------------------------------------------- kubectl


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


# ------------------------------------------------------------------------------- operator


class Operator:
    """`python -m inferfleet.cli run` as a child in its own session, as the service account."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.last_cpu_s = 0.0
        self.last_peak_rss_kib = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "inferfleet.cli", "run", "--metrics-port", "0"],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
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


# ------------------------------------------------------------------------- Ready watching


class CpuSampler:
    """Once a second, the CPU seconds of each process and of the whole machine: a time line of
    who was busy (one /proc read per process per second: negligible overhead)."""

    def __init__(self, pids: Mapping[str, int], interval_s: float = 1.0) -> None:
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        cpu = {name: process_cpu_seconds(pid) or 0.0 for name, pid in self.pids.items()}
        cpu["machine (all processes)"] = system_busy_seconds()
        self.samples.append((time.time(), cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def timeline(self, start: float, end: float, bucket_s: float = 10.0) -> dict[str, list[float]]:
        """Cores used per process, averaged over consecutive `bucket_s` windows from `start`."""
        inside = [(t, cpu) for t, cpu in self.samples if start - self.interval_s <= t <= end]
        if len(inside) < 2:
            return {}
        edges = [inside[0]]
        for sample in inside[1:]:
            if sample[0] - edges[-1][0] >= bucket_s - self.interval_s / 2:
                edges.append(sample)
        if edges[-1] is not inside[-1]:
            edges.append(inside[-1])
        # `+ 0.0` turns -0.0 (a first sample a hair before `start`) into 0.0.
        line: dict[str, list[float]] = {
            "from_s": [max(0.0, round(t - start, 1)) + 0.0 for t, _ in edges[:-1]]
        }
        for name in inside[0][1]:
            line[name] = [
                round((b[name] - a[name]) / (tb - ta), 2)
                for (ta, a), (tb, b) in itertools.pairwise(edges)
            ]
        machine = line["machine (all processes)"]
        ours = [
            values
            for name, values in line.items()
            if name not in ("from_s", "machine (all processes)")
        ]
        line["other processes"] = [
            round(max(0.0, total - sum(column)), 2)
            for total, *column in zip(machine, *ours, strict=True)
        ]
        return line


class ReadyWatch:
    """One `kubectl get inferenceservices -A --watch -o json` stream; records when each
    service is first seen Ready=True (benchmark clock) and the condition's own
    lastTransitionTime (the operator's clock). Falls back to a 0.5 s poll if the stream ends."""

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl
        self.seen_ready: dict[tuple[str, str], float] = {}
        self.transition: dict[tuple[str, str], float] = {}
        self.events = 0
        self.polls = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.cpu_s = 0.0
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.kubectl.argv(
                "get", "inferenceservices", "--all-namespaces", "--watch",
                "--output-watch-events", "-o", "json",
            ),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
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
        condition = ready_condition(obj)
        if condition is None or key in self.seen_ready:
            return
        with self._changed:
            self.seen_ready[key] = now
            transition = parse_time(condition.get("lastTransitionTime"))
            if transition is not None:
                self.transition[key] = transition
            self._changed.notify_all()

    @property
    def streaming(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _poll(self) -> None:
        self.polls += 1
        now = time.time()
        for obj in self.kubectl.items("inferenceservices", "--all-namespaces"):
            self._observe(obj, now)

    def wait(self, keys: Iterable[tuple[str, str]], timeout_s: float) -> bool:
        """Until every key has been seen Ready, or `timeout_s` passed; whether all were."""
        wanted = set(keys)
        deadline = time.time() + timeout_s
        while True:
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


# ------------------------------------------------------------------------------ workloads


def model_deployment(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "qwen2.5-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct"},
            "engine": {"name": "sim"},
            "gpu": {"type": "L4-24GB"},
            "batching": {"maxModelLength": 8192},
            "replicas": 1,
        },
    }


def inference_service(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "deployments": [{"name": name}],
            "slo": {"ttftP95Ms": 500, "tpotP95Ms": 50},
        },
    }


def manifests(names: Sequence[str], namespace: str) -> str:
    """Each service's ModelDeployment, then its InferenceService, as one YAML stream."""
    documents: list[dict[str, Any]] = []
    for name in names:
        documents += [model_deployment(name, namespace), inference_service(name, namespace)]
    return yaml.safe_dump_all(documents)


# ------------------------------------------------------------------------- measurements


@dataclass
class CpuSnapshot:
    at: float
    processes: dict[str, float]
    system_busy: float
    benchmark: float
    benchmark_children: float


@dataclass
class Phase:
    """A window of wall-clock time whose API requests and CPU are reported together."""

    name: str
    start: float
    end: float
    resources: int
    """ModelDeployments plus InferenceServices created in the window (0: none)."""


@dataclass(frozen=True)
class ApiRequest:
    at: float
    user: str
    verb: str
    target: str
    namespace: str
    name: str
    code: int
    message: str


def read_audit(log_dir: Path) -> tuple[list[ApiRequest], int]:
    """Every request in the audit log(s), once each (a watch logs two stages); and how many
    files there were (more than one means the log rotated: still all read)."""
    requests: dict[str, ApiRequest] = {}
    files = sorted(log_dir.glob("audit*.log"))
    for path in files:
        with path.open() as lines:
            for line in lines:
                event = json.loads(line)
                audit_id = event.get("auditID", "")
                if audit_id in requests and event.get("stage") != "ResponseComplete":
                    continue
                ref = event.get("objectRef")
                if ref and ref.get("resource"):
                    target = f"{ref.get('apiGroup') or 'core'}/{ref['resource']}"
                    if ref.get("subresource"):
                        target += f"/{ref['subresource']}"
                else:
                    target = urlsplit(event.get("requestURI", "")).path
                status = event.get("responseStatus") or {}
                at = parse_time(event.get("requestReceivedTimestamp")) or 0.0
                requests[audit_id] = ApiRequest(
                    at=at,
                    user=str((event.get("user") or {}).get("username", "")),
                    verb=str(event.get("verb", "")),
                    target=target,
                    namespace=str((ref or {}).get("namespace", "")),
                    name=str((ref or {}).get("name", "")),
                    code=int(status.get("code", 0) or 0),
                    message=str(status.get("message", ""))[:300],
                )
    return sorted(requests.values(), key=lambda r: r.at), len(files)


def api_summary(requests: Sequence[ApiRequest], phase: Phase) -> dict[str, Any]:
    """The operator's requests in a phase: writes and reads, per verb and resource, failures."""
    mine = [r for r in requests if r.user == OPERATOR_USER and phase.start <= r.at < phase.end]
    writes = [r for r in mine if r.verb not in READ_VERBS]
    reads = [r for r in mine if r.verb in READ_VERBS]
    failed = Counter(f"{r.code} {r.verb} {r.target}" for r in mine if r.code >= 300)
    failure_messages = {}
    for r in mine:
        key = f"{r.code} {r.verb} {r.target}"
        if r.code >= 300 and key not in failure_messages:
            failure_messages[key] = r.message
    summary: dict[str, Any] = {
        "window_s": round(phase.end - phase.start, 2),
        "writes": len(writes),
        "reads": len(reads),
        "writes_by_request": dict(Counter(f"{r.verb} {r.target}" for r in writes).most_common()),
        "reads_by_request": dict(Counter(f"{r.verb} {r.target}" for r in reads).most_common()),
        "failed": dict(failed.most_common()),
        "failure_examples": failure_messages,
    }
    if phase.resources:
        summary["resources_reconciled"] = phase.resources
        summary["writes_per_resource"] = round(len(writes) / phase.resources, 2)
        summary["reads_per_resource"] = round(len(reads) / phase.resources, 2)
        summary["requests_per_resource"] = round(len(mine) / phase.resources, 2)
    return summary


def writers(requests: Sequence[ApiRequest], phase: Phase) -> dict[str, dict[str, float | int]]:
    """Writes per user in a phase (who keeps the API server busy), with their mean rate and
    their busiest 10 s: a client held at a steady ceiling (20/s is kube-controller-manager's
    default --kube-api-qps) is rate-limited on its own side."""
    buckets: dict[str, Counter[int]] = {}
    for r in requests:
        if phase.start <= r.at < phase.end and r.verb not in READ_VERBS:
            buckets.setdefault(r.user, Counter())[int((r.at - phase.start) // 10)] += 1
    seconds = max(phase.end - phase.start, 1e-9)
    summary = {
        user: {
            "writes": sum(counted.values()),
            "mean_per_s": round(sum(counted.values()) / seconds, 1),
            "busiest_10s_per_s": round(max(counted.values()) / min(10.0, seconds), 1),
        }
        for user, counted in buckets.items()
    }
    ranked = sorted(summary.items(), key=lambda kv: -kv[1]["writes"])
    return dict(ranked[:12])


_LOG_LEVEL = re.compile(r"\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\]")
_HANDLER = re.compile(r"Handler '([^']+)' (succeeded|failed|is retried)")
_VARYING = re.compile(r"\d+(\.\d+)?|svc-\d+|[0-9a-f]{8,}")


_LOGGED_AT = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def scan_operator_log(path: Path, phases: Sequence[Phase]) -> dict[str, Any]:
    """Lines per level, tracebacks, handler runs per phase (kopf logs one line per run), and
    the distinct warnings and errors (numbers and names folded so that one problem repeated
    200 times reads as one line with a count)."""
    levels: Counter[str] = Counter()
    problems: Counter[str] = Counter()
    examples: dict[str, str] = {}
    handlers: dict[str, Counter[str]] = {phase.name: Counter() for phase in phases}
    tracebacks = 0
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        if line.startswith("Traceback"):
            tracebacks += 1
        match = _LOG_LEVEL.search(line)
        level = match.group(1) if match else "other"
        levels[level] += 1
        handled = _HANDLER.search(line)
        logged = _LOGGED_AT.match(line)
        if handled and logged:
            # kopf logs local time, to the millisecond.
            at = datetime.strptime(logged.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for phase in phases:
                if phase.start <= at < phase.end:
                    handlers[phase.name][f"{handled.group(1)} {handled.group(2)}"] += 1
        if level in ("WARNING", "ERROR", "CRITICAL"):
            folded = _VARYING.sub("N", line[match.end() if match else 0 :]).strip()[:200]
            problems[f"{level} {folded}"] += 1
            examples.setdefault(f"{level} {folded}", line[:400])
    return {
        "lines": len(lines),
        "bytes": path.stat().st_size if path.exists() else 0,
        "by_level": dict(levels.most_common()),
        "tracebacks": tracebacks,
        "handler_runs_by_phase": {
            name: dict(counted.most_common()) for name, counted in handlers.items()
        },
        "problems": [
            {"count": count, "example": examples[key]} for key, count in problems.most_common(12)
        ],
    }


@dataclass(frozen=True)
class FleetObjects:
    """What the fleet namespace holds once everything is Ready."""

    model_deployment_ready: dict[str, float]
    """ModelDeployment name -> its Ready condition's lastTransitionTime (operator's clock)."""
    pods_by_phase: dict[str, int]
    unscheduled_pods: int
    unscheduled_example: str | None


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


_SERVICE = re.compile(r"^(svc-\d+)([-.]|$)")


STEPS = (
    "apply creates the ModelDeployment",
    "operator: first request for it",
    "operator applies the engine Deployment",
    "controller manager creates the ReplicaSet",
    "scheduler binds the engine pod",
    "kwok marks the pod Running",
    "controller manager reports the Deployment rolled out",
    "operator: ModelDeployment Ready",
    "operator: InferenceService Ready",
    "watch sees the InferenceService Ready",
)


def stages(
    requests: Sequence[ApiRequest],
    *,
    namespace: str,
    objects: FleetObjects,
    isvc_ready: Mapping[str, float],
    isvc_seen: Mapping[str, float],
    start: float,
) -> dict[str, dict[str, dict[str, float | int] | None]]:
    """Where each service's time went. `offsets`: per step, its time after the start of the
    apply; `gaps`: per step, its time after the step before, for the same service; both as
    distributions over the services. Steps are requests in the audit log (to the microsecond),
    found by the object names the operator derives from the service's (`svc-N-aggregated-...`),
    and the operator's Ready conditions (their lastTransitionTime)."""
    per_service: dict[str, list[ApiRequest]] = {}
    for r in requests:
        match = _SERVICE.match(r.name) if r.namespace == namespace else None
        if match:
            per_service.setdefault(match.group(1), []).append(r)

    def first(found: Iterable[ApiRequest], after: float = 0.0) -> float | None:
        return next((r.at for r in found if r.at >= after), None)

    def last(found: Iterable[ApiRequest], before: float) -> float | None:
        return max((r.at for r in found if r.at <= before), default=None)

    offsets: dict[str, list[float]] = {step: [] for step in STEPS}
    gaps: dict[str, list[float]] = {step: [] for step in STEPS[1:]}
    for service in sorted(set(per_service) | set(isvc_seen)):
        found = per_service.get(service, [])
        engine = f"{service}-aggregated"
        bound = first(
            r for r in found if r.target == "core/pods/binding" and r.name.startswith(f"{engine}-")
        )
        running = first(
            (r for r in found if r.target == "core/pods/status" and r.verb == "patch"
             and r.name.startswith(f"{engine}-") and r.user.startswith("kwok")),
            after=bound or 0.0,
        )  # fmt: skip
        times = [
            first(r for r in found if r.name == service and r.target.endswith("/modeldeployments")
                  and r.verb == "patch" and r.user != OPERATOR_USER),
            first(r for r in found if r.user == OPERATOR_USER),
            first(r for r in found if r.user == OPERATOR_USER and r.name == engine
                  and r.target == "apps/deployments" and r.verb == "patch"),
            first(r for r in found if r.target == "apps/replicasets" and r.verb == "create"
                  and r.name.startswith(f"{engine}-")),
            bound,
            running,
            # The last one before the operator saw the rollout complete: the one that said so.
            last(
                (r for r in found if r.target == "apps/deployments/status" and r.name == engine
                 and r.code < 300),
                before=objects.model_deployment_ready.get(service, math.inf),
            ),
            objects.model_deployment_ready.get(service),
            isvc_ready.get(service),
            isvc_seen.get(service),
        ]  # fmt: skip
        for i, (step, at) in enumerate(zip(STEPS, times, strict=True)):
            if at is None:
                continue
            offsets[step].append(at - start)
            before = times[i - 1] if i else None
            if before is not None:
                gaps[step].append(at - before)
    return {
        "offsets": {step: distribution(values) for step, values in offsets.items()},
        "gaps": {step: distribution(values) for step, values in gaps.items()},
    }


def writes_per_service(
    requests: Sequence[ApiRequest], namespace: str, window: Phase
) -> dict[str, dict[str, float | int] | None]:
    """How many times the operator wrote each kind of thing per service in a window, as a
    distribution over the services (names derived from `svc-N`, as in `stages`)."""
    counts: dict[str, Counter[str]] = {}
    for r in requests:
        match = _SERVICE.match(r.name) if r.namespace == namespace else None
        if not match or r.user != OPERATOR_USER or r.verb in READ_VERBS:
            continue
        if not window.start <= r.at < window.end:
            continue
        service = match.group(1)
        counted = counts.setdefault(service, Counter())
        counted["all operator writes"] += 1
        # `svc-N-aggregated` -> `-aggregated`; the service's own name and its Events -> nothing.
        suffix = r.name[len(service) :]
        counted[
            f"{r.verb} {r.target} {suffix}".strip() if suffix[:1] == "-" else f"{r.verb} {r.target}"
        ] += 1
    kinds = sorted({kind for counted in counts.values() for kind in counted})
    return {
        kind: distribution([float(counted[kind]) for counted in counts.values()]) for kind in kinds
    }


# ------------------------------------------------------------------------------ the run


@dataclass
class Config:
    services: int
    baseline_samples: int
    settle_s: float
    steady_s: float
    timeout_s: float
    nodes: str
    cpu_nodes: int
    keep_state: bool


@dataclass
class Run:
    """Everything measured, before it is summarised."""

    config: Config
    bin_dir: Path
    state_dir: Path
    hardware: dict[str, Any]
    cluster_up_s: float = 0.0
    operator_start: float = 0.0
    warmup_ready_s: float = 0.0
    baseline: list[tuple[float, float, float | None]] = field(default_factory=list)
    """(apply start, seen Ready, Ready's lastTransitionTime) per sample."""
    apply_start: float = 0.0
    apply_end: float = 0.0
    rollout_ready: dict[str, float] = field(default_factory=dict)
    rollout_transition: dict[str, float] = field(default_factory=dict)
    complete: bool = False
    phases: list[Phase] = field(default_factory=list)
    cpu: dict[str, CpuSnapshot] = field(default_factory=dict)
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


def _audit_policy() -> dict[str, Any]:
    """The dev cluster's policy (writes only, at Metadata level), plus the operator's own
    reads: other components' reads stay unlogged, so the API server's extra work is small."""
    policy: dict[str, Any] = copy.deepcopy(cluster_module.AUDIT_POLICY)
    operator_reads = {"level": "Metadata", "users": [OPERATOR_USER], "verbs": list(READ_VERBS)}
    return {**policy, "rules": [operator_reads, *policy["rules"]]}


def _snapshot(pids: Mapping[str, int]) -> CpuSnapshot:
    own, children = own_cpu_seconds()
    return CpuSnapshot(
        at=time.time(),
        processes={name: process_cpu_seconds(pid) or 0.0 for name, pid in pids.items()},
        system_busy=system_busy_seconds(),
        benchmark=own,
        benchmark_children=children,
    )


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(config: Config, bin_dir: Path, state_dir: Path) -> Run:
    run = Run(config=config, bin_dir=bin_dir, state_dir=state_dir, hardware=hardware())
    run.source["at_start"] = source_state()
    run.busy_before = processes_mentioning("kube-apiserver") + processes_mentioning("pytest")
    run.loadavg_before = Path("/proc/loadavg").read_text().strip()
    pools = NodePool.parse(config.nodes)
    with contextlib.ExitStack() as stack:
        _log(f"starting the dev cluster ({config.nodes}, {config.cpu_nodes} CPU) in {state_dir}")
        started = time.time()
        with mock.patch.object(cluster_module, "AUDIT_POLICY", _audit_policy()):
            cluster = stack.enter_context(
                running(state_dir / "cluster", bin_dir, pools, cpu_nodes=config.cpu_nodes)
            )
        run.cluster_up_s = time.time() - started
        written = yaml.safe_load((cluster.state_dir / "audit-policy.yaml").read_text())
        run.audit_policy_counts_reads = written["rules"][0].get("users") == [OPERATOR_USER]
        cluster.install_crds()
        kubectl = Kubectl(bin_dir / "kube", cluster.kubeconfig_path)
        kubectl.run("create", "namespace", OPERATOR_NAMESPACE)
        kubectl.run("apply", "--server-side", "-f", str(RBAC))
        for namespace in (WARMUP_NAMESPACE, BASELINE_NAMESPACE, FLEET_NAMESPACE):
            kubectl.run("create", "namespace", namespace)

        operator = Operator(
            service_account_kubeconfig(kubectl, cluster, state_dir / "operator.kubeconfig"),
            state_dir / "operator.log",
        )
        stack.callback(operator.stop)
        watch = ReadyWatch(kubectl)
        stack.callback(watch.stop)
        watch.start()
        operator.start()
        run.operator_start = time.time()
        state = cluster.state()
        assert state is not None
        component_pids = dict(state.pids)
        pids = {**component_pids, "operator": operator.pid}
        assert watch.process is not None
        pids["benchmark: kubectl watch"] = watch.process.pid
        run.cpu["operator start"] = _snapshot(pids)

        # 1. Warm-up: the operator's start-up (discovery, first watches) is paid here.
        _log("operator started; warm-up service")
        kubectl.run(
            "apply", "--server-side", "-f", "-", stdin=manifests(["warmup"], WARMUP_NAMESPACE)
        )
        if not watch.wait([(WARMUP_NAMESPACE, "warmup")], config.timeout_s):
            raise RuntimeError("the warm-up service never turned Ready; see operator.log")
        run.warmup_ready_s = watch.seen_ready[(WARMUP_NAMESPACE, "warmup")] - run.operator_start
        time.sleep(config.settle_s)

        # 2. Baseline: one service alone, several times: the per-service latency floor.
        run.cpu["baseline start"] = _snapshot(pids)
        for i in range(config.baseline_samples):
            name = f"single-{i}"
            started = time.time()
            kubectl.run(
                "apply", "--server-side", "-f", "-", stdin=manifests([name], BASELINE_NAMESPACE)
            )
            if not watch.wait([(BASELINE_NAMESPACE, name)], config.timeout_s):
                raise RuntimeError(f"baseline service {name} never turned Ready")
            key = (BASELINE_NAMESPACE, name)
            run.baseline.append((started, watch.seen_ready[key], watch.transition.get(key)))
            _log(f"baseline {name}: Ready after {watch.seen_ready[key] - started:.2f} s")
            time.sleep(config.settle_s)
            run.phases.append(Phase(f"baseline {name}", started, time.time(), 2))

        # 3. Rollout: N services in one apply.
        names = [f"svc-{i:03d}" for i in range(config.services)]
        stream = manifests(names, FLEET_NAMESPACE)
        _log(f"applying {config.services} services")
        sampler = CpuSampler({**pids, "benchmark (Python)": os.getpid()})
        stack.callback(sampler.stop)
        sampler.start()
        run.cpu["rollout start"] = _snapshot(pids)
        run.apply_start = time.time()
        kubectl.run("apply", "--server-side", "-f", "-", stdin=stream, timeout=config.timeout_s)
        run.apply_end = time.time()
        _log(f"apply took {run.apply_end - run.apply_start:.1f} s; waiting for Ready")
        keys = [(FLEET_NAMESPACE, n) for n in names]
        run.complete = watch.wait(keys, config.timeout_s)
        all_ready = time.time()
        run.cpu["all ready"] = _snapshot(pids)
        for key in keys:
            if key in watch.seen_ready:
                run.rollout_ready[key[1]] = watch.seen_ready[key]
            if key in watch.transition:
                run.rollout_transition[key[1]] = watch.transition[key]
        _log(
            f"{len(run.rollout_ready)}/{config.services} Ready "
            f"after {all_ready - run.apply_start:.1f} s"
        )

        # 4. Steady: settle, then a minute with nothing to do.
        time.sleep(config.settle_s)
        run.phases.append(Phase("rollout", run.apply_start, time.time(), 2 * config.services))
        run.cpu["steady start"] = _snapshot(pids)
        steady_start = time.time()
        _log(f"steady window: {config.steady_s:.0f} s")
        time.sleep(config.steady_s)
        run.phases.append(Phase("steady", steady_start, time.time(), 0))
        run.cpu["steady end"] = _snapshot(pids)
        sampler.stop()
        run.timeline = sampler.timeline(run.apply_start, steady_start)
        run.phases.insert(
            0, Phase("operator start-up and warm-up", run.operator_start, run.phases[0].start, 2)
        )

        _log("collecting object timestamps")
        run.fleet = fleet_objects(kubectl, FLEET_NAMESPACE)
        operator.sample()
        run.watch = {
            "events": watch.events,
            "polls": watch.polls,
            "streaming_to_the_end": watch.streaming,
        }
        _log("stopping the operator and the cluster")
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


# ------------------------------------------------------------------------------ reporting


def _cpu_between(run: Run, first: str, last: str) -> dict[str, Any]:
    a, b = run.cpu[first], run.cpu[last]
    per_process = {name: round(b.processes[name] - a.processes[name], 2) for name in a.processes}
    benchmark = round(b.benchmark - a.benchmark, 2)
    kubectl_runs = round(b.benchmark_children - a.benchmark_children, 2)
    busy = b.system_busy - a.system_busy
    tracked = sum(per_process.values()) + benchmark + kubectl_runs
    return {
        "wall_s": round(b.at - a.at, 2),
        "cpu_s_by_process": dict(sorted(per_process.items(), key=lambda kv: -kv[1])),
        "benchmark_python_cpu_s": benchmark,
        "benchmark_kubectl_runs_cpu_s": kubectl_runs,
        "machine_busy_cpu_s": round(busy, 2),
        "machine_capacity_cpu_s": round((b.at - a.at) * (os.cpu_count() or 1), 2),
        "other_processes_cpu_s": round(max(0.0, busy - tracked), 2),
    }


def summarise(run: Run) -> dict[str, Any]:
    requests, audit_files = read_audit(run.state_dir / "cluster" / "logs")
    phases = {phase.name: phase for phase in run.phases}
    singles = [ready - start for start, ready, _ in run.baseline]
    single = percentile(singles, 50)
    per_service = [ready - run.apply_start for ready in run.rollout_ready.values()]
    per_service_operator_clock = [t - run.apply_start for t in run.rollout_transition.values()]
    all_ready = max(per_service) if per_service else None
    rollout = distribution(per_service) or {}

    def ratio(value: float | None) -> float | None:
        return round(value / single, 1) if value is not None and single > 0 else None

    baseline_api = [api_summary(requests, p) for p in run.phases if p.name.startswith("baseline")]
    rollout_api = api_summary(requests, phases["rollout"])
    steady_api = api_summary(requests, phases["steady"])
    return {
        "benchmark": "operator_scale",
        "run_at": iso(run.operator_start),
        "hardware": run.hardware,
        "software": {
            "inferfleet": __version__,
            "control_plane": run.bin_dir.parent.name,
            "operator_source": run.source["at_start"],
            "operator_sources_sha256_at_end": run.source["at_end"]["operator_sources_sha256"],
            # The operator imports its code at start: a change after that did not run.
            "operator_sources_changed_during_run": run.source["at_start"]["operator_sources_sha256"]
            != run.source["at_end"]["operator_sources_sha256"],
            "engine": "sim (no GPU requested; pods placed on kwok fake L4-24GB nodes)",
        },
        "config": {
            "services": run.config.services,
            "objects_applied": 2 * run.config.services,
            "node_pools": run.config.nodes,
            "cpu_nodes": run.config.cpu_nodes,
            "pods_per_node": PODS_PER_NODE,
            "model_deployment": model_deployment("<name>", FLEET_NAMESPACE)["spec"],
            "inference_service": inference_service("<name>", FLEET_NAMESPACE)["spec"],
            "baseline_samples": run.config.baseline_samples,
            "settle_s": run.config.settle_s,
            "steady_s": run.config.steady_s,
        },
        "headline": {
            "complete": run.complete,
            "services_ready": len(run.rollout_ready),
            "single_service_ready_s": round(single, 3),
            "apply_s": round(run.apply_end - run.apply_start, 3),
            "all_ready_s": round(all_ready, 3) if all_ready is not None else None,
            "p50_ready_s": rollout.get("p50"),
            "p99_ready_s": rollout.get("p99"),
            "all_ready_x_single": ratio(all_ready),
            "p50_x_single": ratio(float(rollout["p50"])) if rollout else None,
            "p99_x_single": ratio(float(rollout["p99"])) if rollout else None,
            "operator_peak_rss_mib": round(run.operator_peak_rss_kib / 1024, 1),
            "operator_cpu_s_total": round(run.operator_cpu_s, 2),
            "operator_cpu_s_rollout": round(
                run.cpu["all ready"].processes["operator"]
                - run.cpu["rollout start"].processes["operator"],
                2,
            ),
            "operator_cpu_s_per_service_single": round(
                (
                    run.cpu["rollout start"].processes["operator"]
                    - run.cpu["baseline start"].processes["operator"]
                )
                / max(1, len(run.baseline)),
                3,
            ),
            "operator_cpu_s_per_service_rollout": round(
                (
                    run.cpu["all ready"].processes["operator"]
                    - run.cpu["rollout start"].processes["operator"]
                )
                / run.config.services,
                3,
            ),
            "operator_writes_per_resource_rollout": rollout_api.get("writes_per_resource"),
            "operator_reads_per_resource_rollout": rollout_api.get("reads_per_resource"),
            "operator_writes_per_resource_single": baseline_api[0].get("writes_per_resource")
            if baseline_api
            else None,
            "operator_reads_per_resource_single": baseline_api[0].get("reads_per_resource")
            if baseline_api
            else None,
            "operator_writes_steady_minute": steady_api["writes"],
            "operator_reads_steady_minute": steady_api["reads"],
        },
        "startup": {
            "cluster_up_s": round(run.cluster_up_s, 2),
            "operator_start_to_first_service_ready_s": round(run.warmup_ready_s, 2),
        },
        "baseline": {
            "ready_s": [round(s, 3) for s in singles],
            "ready_s_operator_clock": [
                round(t - start, 3) for start, _, t in run.baseline if t is not None
            ],
            "api": baseline_api,
        },
        "rollout": {
            "ready_s": rollout,
            "ready_s_operator_clock": distribution(per_service_operator_clock),
            "stages_s": stages(
                requests,
                namespace=FLEET_NAMESPACE,
                objects=run.fleet,
                isvc_ready=run.rollout_transition,
                isvc_seen=run.rollout_ready,
                start=run.apply_start,
            )
            if run.fleet
            else None,
            "operator_writes_per_service": writes_per_service(
                requests, FLEET_NAMESPACE, phases["rollout"]
            ),
            "pods_at_the_end": {
                "by_phase": run.fleet.pods_by_phase,
                "unschedulable": run.fleet.unscheduled_pods,
                "unschedulable_example": run.fleet.unscheduled_example,
            }
            if run.fleet
            else None,
            "api": rollout_api,
            "writes_by_user": writers(requests, phases["rollout"]),
            "cpu": _cpu_between(run, "rollout start", "all ready"),
            "cores_used_per_10s": run.timeline,
        },
        "steady": {
            "api": steady_api,
            "writes_by_user": writers(requests, phases["steady"]),
            "cpu": _cpu_between(run, "steady start", "steady end"),
        },
        "operator_start_up_and_warm_up": {
            "api": api_summary(requests, phases["operator start-up and warm-up"]),
        },
        "operator_log": scan_operator_log(run.state_dir / "operator.log", run.phases),
        "measurement": {
            "ready_seen_by": "one `kubectl get inferenceservices -A --watch -o json` stream "
            f"({run.watch.get('events')} events, {run.watch.get('polls')} fallback polls)",
            "watch": run.watch,
            "percentiles": f"nearest rank over the services (p99 of {run.config.services} = "
            f"the {math.ceil(0.99 * run.config.services)}th fastest)",
            "audit_log_files": audit_files,
            "reads_counted": run.audit_policy_counts_reads,
            "reads_note": "the dev cluster's audit policy logs writes only; this run adds one rule "
            "that logs the operator's own get/list/watch (other components' reads stay unlogged)"
            if run.audit_policy_counts_reads
            else "reads are NOT counted: the audit policy logs writes only",
            "other_work_at_start": run.busy_before,
            "loadavg_before": run.loadavg_before,
            "loadavg_after": run.loadavg_after,
            "leftover_processes": run.leftovers,
        },
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def markdown(result: Mapping[str, Any]) -> str:
    head, hw = result["headline"], result["hardware"]
    services = result["config"]["services"]
    single = head["single_service_ready_s"]
    lines = [
        f"# Operator scale: {services} services in one apply",
        "",
        f"Run {result['run_at']} on {hw['cpu_model']}, {hw['cores']} cores, "
        f"{hw['memory_gib']} GiB (kernel {hw['kernel']}, Python {hw['python']}); control "
        f"plane {result['software']['control_plane']}; nodes {result['config']['node_pools']} "
        f"and {result['config']['cpu_nodes']} CPU nodes; operator at "
        f"{result['software']['operator_source'].get('commit', '?')}"
        + (
            " with uncommitted changes"
            if result["software"]["operator_source"].get("operator_files_changed_since_commit")
            else ""
        )
        + ".",
        "Everything (etcd, API server, controller manager, scheduler, kwok, the operator and "
        "the benchmark) shares those cores.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| services Ready | {head['services_ready']}/{services} |",
        f"| single service alone, time to Ready (median of "
        f"{len(result['baseline']['ready_s'])}) | {single:.2f} s |",
        f"| `kubectl apply` of {2 * services} objects | {head['apply_s']:.1f} s |",
        f"| time to all Ready | {_fmt(head['all_ready_s'])} s "
        f"(= {_fmt(head['all_ready_x_single'])} x single) |",
        f"| per-service time to Ready, p50 | {_fmt(head['p50_ready_s'])} s "
        f"(= {_fmt(head['p50_x_single'])} x single) |",
        f"| per-service time to Ready, p99 | {_fmt(head['p99_ready_s'])} s "
        f"(= {_fmt(head['p99_x_single'])} x single) |",
        f"| operator peak RSS (VmHWM) | {head['operator_peak_rss_mib']} MiB |",
        f"| operator CPU, whole run / rollout | {head['operator_cpu_s_total']} s / "
        f"{head['operator_cpu_s_rollout']} s |",
        f"| operator CPU per service, rollout / single | "
        f"{head['operator_cpu_s_per_service_rollout']} s / "
        f"{head['operator_cpu_s_per_service_single']} s |",
        f"| operator writes per reconciled resource, rollout / single | "
        f"{_fmt(head['operator_writes_per_resource_rollout'])} / "
        f"{_fmt(head['operator_writes_per_resource_single'])} |",
        f"| operator reads per reconciled resource, rollout / single | "
        f"{_fmt(head['operator_reads_per_resource_rollout'])} / "
        f"{_fmt(head['operator_reads_per_resource_single'])} |",
        f"| operator writes / reads in the steady minute | "
        f"{head['operator_writes_steady_minute']} / {head['operator_reads_steady_minute']} |",
        "",
        "A reconciled resource is one ModelDeployment or one InferenceService "
        f"({2 * services} in the rollout, 2 per single service).",
        "",
        "## Where the rollout's time went",
        "",
        "Per step, over the services: its time after the start of the apply, and after the "
        "step before it for the same service (the gap: who kept it waiting). Steps are "
        "requests in the audit log (microsecond timestamps) and the operator's own Ready "
        "conditions.",
        "",
        "| step | after apply p50 s | p99 s | max s | gap p50 s | gap p99 s | gap max s |",
        "|---|---|---|---|---|---|---|",
    ]
    stage_times = result["rollout"]["stages_s"] or {"offsets": {}, "gaps": {}}
    for step, dist in stage_times["offsets"].items():
        gap = stage_times["gaps"].get(step)
        if dist:
            gap_cells = f"{gap['p50']} | {gap['p99']} | {gap['max']}" if gap else "- | - | -"
            lines.append(
                f"| {step} | {dist['p50']} | {dist['p99']} | {dist['max']} | {gap_cells} |"
            )
    pods = result["rollout"]["pods_at_the_end"] or {}
    lines += [
        "",
        f"Pods at the end: {pods.get('by_phase')}; unschedulable: {pods.get('unschedulable')}"
        + (f" ({pods['unschedulable_example']})" if pods.get("unschedulable_example") else "")
        + ".",
        "",
        "## CPU seconds during the rollout (apply to all Ready)",
        "",
    ]
    lines += _cpu_table(result["rollout"]["cpu"])
    timeline = result["rollout"]["cores_used_per_10s"]
    if timeline:
        lines += [
            "",
            "Cores used, 10 s windows from the apply (2 = the whole machine):",
            "",
            "| from s | " + " | ".join(f"{t:g}" for t in timeline["from_s"]) + " |",
            "|---|" + "---|" * len(timeline["from_s"]),
        ]
        for name, values in timeline.items():
            if name != "from_s":
                lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    lines += ["", "Writes by client during the rollout:", ""]
    lines += _writers_table(result["rollout"]["writes_by_user"])
    lines += ["", "## CPU seconds during the steady minute", ""]
    lines += _cpu_table(result["steady"]["cpu"])
    lines += ["", "Writes by client during the steady minute:", ""]
    lines += _writers_table(result["steady"]["writes_by_user"])
    lines += ["", "## The operator's API requests", ""]
    lines += _api_table(
        {
            "single service": result["baseline"]["api"][0] if result["baseline"]["api"] else {},
            "rollout": result["rollout"]["api"],
            "steady minute": result["steady"]["api"],
        }
    )
    per_service = result["rollout"]["operator_writes_per_service"] or {}
    if per_service:
        lines += [
            "",
            "The operator's writes per service during the rollout (over the services; "
            "`-aggregated` is the engine's object, `-router` the router's):",
            "",
            "| write | min | p50 | max |",
            "|---|---|---|---|",
        ]
        for kind, dist in per_service.items():
            if dist:
                lines.append(f"| {kind} | {dist['min']:g} | {dist['p50']:g} | {dist['max']:g} |")
    log = result["operator_log"]
    lines += [
        "",
        "## Operator log",
        "",
        f"{log['lines']} lines ({log['bytes'] // 1024} KiB), by level {log['by_level']}, "
        f"{log['tracebacks']} tracebacks.",
    ]
    handler_runs = log["handler_runs_by_phase"]
    shown = [name for name in handler_runs if name == "rollout" or name.endswith("single-0")]
    if shown:
        lines += ["", "Handler runs (one kopf log line each):", ""]
        lines += ["| handler | " + " | ".join(shown) + " |", "|---|" + "---|" * len(shown)]
        handler_names = sorted({h for name in shown for h in handler_runs[name]})
        for handler in handler_names:
            counts = " | ".join(str(handler_runs[name].get(handler, 0)) for name in shown)
            lines.append(f"| {handler} | {counts} |")
        lines.append("")
    for problem in log["problems"]:
        lines.append(f"- {problem['count']} x `{problem['example'][:300]}`")
    measurement = result["measurement"]
    lines += [
        "",
        "## How it was measured",
        "",
        f"- Ready seen by {measurement['ready_seen_by']}; percentiles: "
        f"{measurement['percentiles']}.",
        f"- API requests from the API server's audit log; {measurement['reads_note']}.",
        "- CPU seconds: utime + stime from /proc/<pid>/stat; peak RSS: VmHWM from "
        "/proc/<pid>/status.",
        f"- Benchmark overhead during the rollout: "
        f"{result['rollout']['cpu']['benchmark_python_cpu_s']} s of its own Python, "
        f"{result['rollout']['cpu']['benchmark_kubectl_runs_cpu_s']} s in short kubectl runs "
        "(the apply itself), and the watch's kubectl in the table above.",
        f"- Load average before / after: {measurement['loadavg_before']} / "
        f"{measurement['loadavg_after']}; other control planes or test runs at the start: "
        f"{len(measurement['other_work_at_start']) or 'none'}.",
        f"- Processes left after the run: {measurement['leftover_processes'] or 'none'}.",
        "",
    ]
    return "\n".join(lines)


def _cpu_table(cpu: Mapping[str, Any]) -> list[str]:
    lines = [
        f"{cpu['wall_s']} s of wall time = {cpu['machine_capacity_cpu_s']} CPU s of capacity; "
        f"{cpu['machine_busy_cpu_s']} CPU s busy.",
        "",
        "| process | CPU s |",
        "|---|---|",
    ]
    for name, seconds in cpu["cpu_s_by_process"].items():
        lines.append(f"| {name} | {seconds} |")
    lines += [
        f"| benchmark (Python) | {cpu['benchmark_python_cpu_s']} |",
        f"| benchmark (short kubectl runs) | {cpu['benchmark_kubectl_runs_cpu_s']} |",
        f"| other processes on the machine | {cpu['other_processes_cpu_s']} |",
    ]
    return lines


def _writers_table(writes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not writes:
        return ["(none)"]
    lines = ["| client | writes | mean /s | busiest 10 s, /s |", "|---|---|---|---|"]
    for user, figures in writes.items():
        lines.append(
            f"| {user} | {figures['writes']} | {figures['mean_per_s']} | "
            f"{figures['busiest_10s_per_s']} |"
        )
    return lines


def _api_table(windows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    keys: list[str] = []
    for api in windows.values():
        for key in [*api.get("writes_by_request", {}), *api.get("reads_by_request", {})]:
            if key not in keys:
                keys.append(key)
    lines = [
        "| request | " + " | ".join(windows) + " |",
        "|---|" + "---|" * len(windows),
    ]
    for key in keys:
        counts = [
            str(
                api.get("writes_by_request", {}).get(key)
                or api.get("reads_by_request", {}).get(key)
                or 0
            )
            for api in windows.values()
        ]
        lines.append(f"| {key} | " + " | ".join(counts) + " |")
    lines.append(
        "| **writes** | " + " | ".join(str(a.get("writes", 0)) for a in windows.values()) + " |"
    )
    lines.append(
        "| **reads** | " + " | ".join(str(a.get("reads", 0)) for a in windows.values()) + " |"
    )
    failed = {name: api.get("failed") for name, api in windows.items() if api.get("failed")}
    if failed:
        lines += ["", f"Failed requests (HTTP status >= 300): {failed}."]
    return lines


# ------------------------------------------------------------------------------ main


def nodes_for(pods: int) -> int:
    """Nodes that hold `pods` at 80 % of a node's pod limit, plus a spare."""
    return math.ceil(pods / (PODS_PER_NODE * 0.8)) + 1


def default_nodes(services: int, baseline_samples: int) -> str:
    """L4 nodes for one engine pod per service (warm-up and baseline included)."""
    return f"L4-24GB={nodes_for(services + baseline_samples + 1)}"


def default_cpu_nodes(services: int, baseline_samples: int) -> int:
    """Untainted CPU nodes for every router pod (ROUTER_REPLICAS per service)."""
    return nodes_for(ROUTER_REPLICAS * (services + baseline_samples + 1))


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Path]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.operator_scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--services", type=int, default=200, help="services applied at once")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--baseline-samples", type=int, default=3)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--timeout-seconds", type=float, default=600.0)
    parser.add_argument("--nodes", help="GPU node pools, e.g. L4-24GB=4 (default: sized to fit)")
    parser.add_argument(
        "--cpu-nodes", type=int, help="untainted CPU nodes for the routers (default: sized to fit)"
    )
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the cluster's state directory (logs)"
    )
    args = parser.parse_args(argv)
    if args.services < 1 or args.baseline_samples < 1:
        parser.error("--services and --baseline-samples must be at least 1")
    config = Config(
        services=args.services,
        baseline_samples=args.baseline_samples,
        settle_s=args.settle_seconds,
        steady_s=args.steady_seconds,
        timeout_s=args.timeout_seconds,
        nodes=args.nodes or default_nodes(args.services, args.baseline_samples),
        cpu_nodes=args.cpu_nodes
        if args.cpu_nodes is not None
        else default_cpu_nodes(args.services, args.baseline_samples),
        keep_state=args.keep_state,
    )
    return config, args.out


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the stacks: operator and cluster get stopped


def main(argv: Sequence[str] | None = None) -> int:
    config, out = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    bin_dir = ensure_binaries()
    state_dir = Path(tempfile.mkdtemp(prefix="inferfleet-operator-scale-"))
    try:
        run = measure(config, bin_dir, state_dir)
        result = summarise(run)
    finally:
        if config.keep_state:
            _log(f"state kept in {state_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "operator_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "operator_scale.md").write_text(markdown(result))
    print(markdown(result))
    leftovers = result["measurement"]["leftover_processes"]
    if leftovers:
        _log(f"processes left behind: {leftovers}")
    return 0 if result["headline"]["complete"] and not leftovers else 1


if __name__ == "__main__":
    sys.exit(main())
