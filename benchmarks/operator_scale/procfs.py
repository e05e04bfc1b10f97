"""What the machine and its processes did: CPU seconds and peak RSS from /proc, a once-a-second
sampler of who was busy, the hardware, and which operator code ran."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import itertools
import os
import platform
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1
MACHINE = "machine (all processes)"


def die_with_parent() -> None:
    """In a child before exec: if the benchmark dies, the child gets SIGTERM."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


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


@dataclass
class CpuSnapshot:
    at: float
    processes: dict[str, float]
    system_busy: float
    benchmark: float
    benchmark_children: float


def snapshot(pids: Mapping[str, int]) -> CpuSnapshot:
    own, children = own_cpu_seconds()
    return CpuSnapshot(
        at=time.time(),
        processes={name: process_cpu_seconds(pid) or 0.0 for name, pid in pids.items()},
        system_busy=system_busy_seconds(),
        benchmark=own,
        benchmark_children=children,
    )


def cpu_between(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, Any]:
    """CPU seconds per process between two snapshots of the same processes, the benchmark's
    own, and the rest of the machine's busy time ("other processes": anything else running)."""
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
        cpu[MACHINE] = system_busy_seconds()
        self.samples.append((time.time(), cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def timeline(self, start: float, end: float, bucket_s: float = 10.0) -> dict[str, list[float]]:
        return timeline(self.samples, start, end, self.interval_s, bucket_s)


def timeline(
    samples: list[tuple[float, dict[str, float]]],
    start: float,
    end: float,
    interval_s: float = 1.0,
    bucket_s: float = 10.0,
) -> dict[str, list[float]]:
    """Cores used per process, averaged over consecutive `bucket_s` windows from `start`."""
    inside = [(t, cpu) for t, cpu in samples if start - interval_s <= t <= end]
    if len(inside) < 2:
        return {}
    edges = [inside[0]]
    for sample in inside[1:]:
        if sample[0] - edges[-1][0] >= bucket_s - interval_s / 2:
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
    ours = [values for name, values in line.items() if name not in ("from_s", MACHINE)]
    line["other processes"] = [
        round(max(0.0, total - sum(column)), 2)
        for total, *column in zip(line[MACHINE], *ours, strict=True)
    ]
    return line
