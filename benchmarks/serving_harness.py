"""What the serving benchmarks share: engine and router processes, CPU accounting from /proc,
the machine's description, Prometheus scrapes and Markdown tables.

Every engine and router runs as its own `inferfleet` process (`sim-engine`, `router`) on
127.0.0.1, so each has its own interpreter and event loop and its CPU time can be read from
/proc apart from the load generator's, which runs in the benchmark process.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import ModelDeploymentSpec
from inferfleet.planning.replica import ReplicaConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------------------ engines


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The emulated replica, as the `sim-engine` flags give it."""

    model: str = "llama-3.1-8b"
    gpu: str = "H100-80GB"
    max_sequences: int = 256
    max_batched_tokens: int = 8192
    tensor: int = 1
    weights: str = "bf16"

    def flags(self) -> list[str]:
        return [
            f"--model={self.model}",
            f"--gpu={self.gpu}",
            f"--tensor={self.tensor}",
            f"--weights={self.weights}",
            f"--max-sequences={self.max_sequences}",
            f"--max-batched-tokens={self.max_batched_tokens}",
        ]

    def replica_config(self) -> ReplicaConfig:
        """The planner's view of the same replica, built as `inferfleet sim-engine` builds it."""
        settings: dict[str, Any] = {
            "model": {"name": self.model, "source": f"hf://{self.model}"},
            "engine": {"name": "sim"},
            "gpu": {"type": self.gpu, "memoryUtilization": 0.9},
            "parallelism": {"tensor": self.tensor, "pipeline": 1},
            "precision": {"weights": self.weights, "kvCache": "auto"},
            "batching": {
                "maxSequences": self.max_sequences,
                "maxBatchedTokens": self.max_batched_tokens,
                "chunkedPrefill": True,
            },
        }
        spec = ModelDeploymentSpec.model_validate(settings)
        return ReplicaConfig.from_spec(spec, GpuCatalog.builtin())

    def describe(self) -> str:
        gpus = f"{self.tensor}x {self.gpu} (tensor parallel)" if self.tensor > 1 else self.gpu
        return (
            f"{self.model} ({self.weights}) on an emulated {gpus}, max {self.max_sequences} "
            f"sequences, {self.max_batched_tokens}-token step budget"
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    # A benchmark killed mid-run must not leave engines behind.
    with contextlib.suppress(Exception):
        import ctypes  # noqa: PLC0415

        ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Service:
    """One `inferfleet` server process."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_url: str
    """Where its /metrics is: its own URL, or a router's admin port."""

    @property
    def pid(self) -> int:
        return self.process.pid


def start_process(
    name: str,
    arguments: Sequence[str],
    port: int,
    log_dir: Path,
    cpus: set[int] | None = None,
    *,
    metrics_port: int | None = None,
) -> Service:
    """Start `inferfleet <arguments>` listening on `port` (and its /metrics on `metrics_port`,
    default the same); its output goes to a log file."""
    log_path = log_dir / f"{name}.log"
    command = [sys.executable, "-m", "inferfleet.cli", *arguments]
    if cpus is not None:
        command = ["taskset", "-c", ",".join(str(cpu) for cpu in sorted(cpus)), *command]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (the benchmark starts no threads before)
            cwd=ROOT,
        )
    metrics_url = f"http://127.0.0.1:{metrics_port or port}"
    return Service(name, f"http://127.0.0.1:{port}", process, log_path, metrics_url)


def start_engine(
    name: str, shape: EngineShape, log_dir: Path, cpus: set[int] | None = None
) -> Service:
    port = free_port()
    arguments = ["sim-engine", *shape.flags(), "--host=127.0.0.1", f"--port={port}"]
    return start_process(name, arguments, port, log_dir, cpus)


def start_router(
    name: str,
    engines: Sequence[Service],
    model: str,
    log_dir: Path,
    cpus: set[int] | None = None,
    *,
    sequences: int | None = None,
    extra: Sequence[str] = (),
) -> Service:
    """A router in front of `engines`; `sequences` per engine bounds what it sends at once
    (its fair-share gate), `extra` are more of its flags (tenants)."""
    port, admin_port = free_port(), free_port()
    urls = ";".join(engine.url for engine in engines)
    seqs = "" if sequences is None else f",seqs={sequences}"
    arguments = [
        "router",
        "--service=bench",
        f"--backend=deployment=bench,role=aggregated,engine=sim,model={model}{seqs},urls={urls}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--admin-port={admin_port}",
        "--drain-delay=0",
        "--drain-timeout=2",
        *extra,
    ]
    return start_process(name, arguments, port, log_dir, cpus, metrics_port=admin_port)


def wait_healthy(services: Sequence[Service], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        for service in services:
            while True:
                if service.process.poll() is not None:
                    raise RuntimeError(
                        f"{service.name} exited with {service.process.returncode}: "
                        + service.log_path.read_text(errors="replace")[-2000:]
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(service.url + "/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{service.name} not healthy after {timeout_s:g} s")
                time.sleep(0.1)


def stop_all(services: Sequence[Service]) -> list[str]:
    """SIGTERM each, then SIGKILL what is left; the names of those that needed a kill."""
    for service in services:
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
    killed: list[str] = []
    for service in services:
        try:
            service.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait()
            killed.append(service.name)
    return killed


@contextlib.contextmanager
def running(services: Sequence[Service]) -> Iterator[Sequence[Service]]:
    try:
        wait_healthy(services)
        yield services
    finally:
        stop_all(services)


# ------------------------------------------------------------------------------ /proc


def process_cpu_s(pid: int) -> float:
    """utime + stime of one process (its threads included), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def all_process_cpu_s() -> dict[int, tuple[str, float]]:
    """Every process's command name and CPU seconds (utime + stime)."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        found[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return found


@dataclass
class CpuMeter:
    """CPU seconds per named process, and the machine's, between `start` and `stop`."""

    pids: Mapping[str, int]
    own: bool = True
    """Count the benchmark process itself as `load generator`."""
    started: dict[str, float] = field(default_factory=dict)
    wall_start: float = 0.0
    used: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    others_start: dict[int, tuple[str, float]] = field(default_factory=dict)
    others: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the busiest processes that are not ours, by command name."""

    def _sample(self) -> dict[str, float]:
        sample = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        if self.own:
            sample["load generator"] = time.process_time()
        sample["machine"] = machine_busy_s()
        return sample

    def start(self) -> None:
        self.others_start = all_process_cpu_s()
        self.started = self._sample()
        self.wall_start = time.monotonic()

    def stop(self) -> None:
        end = self._sample()
        self.wall_s = time.monotonic() - self.wall_start
        ours = {*self.pids.values(), os.getpid()}
        spent: dict[str, float] = {}
        for pid, (name, cpu) in all_process_cpu_s().items():
            if pid in ours:
                continue
            before = self.others_start.get(pid, (name, 0.0))[1]
            spent[name] = spent.get(name, 0.0) + cpu - before
        busiest = sorted(spent.items(), key=lambda item: -item[1])[:3]
        self.others = {name: round(cpu, 2) for name, cpu in busiest if cpu >= 0.05}
        self.used = {name: end[name] - self.started[name] for name in end}
        listed = sum(value for name, value in self.used.items() if name != "machine")
        self.used["other processes"] = max(self.used["machine"] - listed, 0.0)

    def cores(self) -> dict[str, float]:
        """Mean cores used per process over the interval."""
        if self.wall_s <= 0:
            return {}
        return {name: value / self.wall_s for name, value in self.used.items()}


# ------------------------------------------------------------------------------ metrics


def scrape(url: str) -> dict[str, float]:
    """`/metrics` of a server as {sample name with labels: value}."""
    text = httpx.get(url + "/metrics", timeout=10.0).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(
                f"{key}={value}"
                for key, value in sorted(sample.labels.items())
                if key not in ("model_name", "engine")
            )
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return values


def delta(after: Mapping[str, float], before: Mapping[str, float], name: str) -> float:
    """How much a sample grew; a name without labels sums the series of every label set."""

    def total(values: Mapping[str, float]) -> float:
        if name in values:
            return values[name]
        return sum(value for key, value in values.items() if key.startswith(name + "{"))

    return total(after) - total(before)


def mean_ms(after: Mapping[str, float], before: Mapping[str, float], histogram: str) -> float:
    """A histogram's mean over an interval, ms."""
    count = delta(after, before, histogram + "_count")
    return 1e3 * delta(after, before, histogram + "_sum") / count if count else math.nan


# ------------------------------------------------------------------------------ reporting


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return math.nan


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def other_busy_cores(seconds: float = 2.0) -> float:
    """Cores the machine was busy over a short quiet sample before the run: other work."""
    before = machine_busy_s()
    time.sleep(seconds)
    return (machine_busy_s() - before) / seconds


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(memory_gib(), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": Path("/proc/loadavg").read_text().strip(),
        "commit": git_commit(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def machine_line(info: Mapping[str, Any]) -> str:
    return (
        f"Run {info['started']} on {info['cpu']}, {info['cores']} cores, "
        f"{info['memory_gib']} GiB (kernel {info['kernel']}, Python {info['python']}), "
        f"inferfleet at {info['commit']}."
    )


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            if math.isnan(value):
                return "-"
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else math.nan
