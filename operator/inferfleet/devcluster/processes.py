"""Supervision of the control plane's processes: start in their own process groups, log to
files, stop cleanly (SIGTERM, then SIGKILL), and never leave one behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

_PR_SET_PDEATHSIG = 1
_STOP_GRACE_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    (port,) = free_ports(1, host)
    return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nothing listens on right now: each socket is held bound until
    all are picked, so the kernel cannot hand one port out twice."""
    with contextlib.ExitStack() as held:
        probes = [
            held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for probe in probes:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def _die_with_parent() -> None:
    # Runs in the child before exec: if the test process dies, so does the component.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the launcher's environment."""


def start(spec: ProcessSpec, log_dir: Path, *, bound_to_parent: bool) -> int:
    """Start a component in a new session; returns its pid (also its process group)."""
    return popen(spec, log_dir, bound_to_parent=bound_to_parent).pid


def popen(
    spec: ProcessSpec, log_dir: Path, *, bound_to_parent: bool, inherit_env: bool = True
) -> subprocess.Popen[bytes]:
    """Start a component in a new session, appending to `<log_dir>/<name>.log`. Bound to its
    parent, it gets SIGTERM when the thread that started it ends. Without `inherit_env` it
    sees only `spec.env`."""
    log = (log_dir / f"{spec.name}.log").open("ab")
    try:
        return subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env} if inherit_env else dict(spec.env),
            start_new_session=True,
            preexec_fn=_die_with_parent if bound_to_parent else None,  # noqa: PLW1509
        )
    finally:
        log.close()


def alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        # Not our child (a cluster started by another command): ask the kernel.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _state(pid) not in ("Z", "X")
    return finished == 0


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat.rsplit(")", 1)[1].split()[0]


def stop(pids: Sequence[int], grace_s: float = _STOP_GRACE_S) -> list[int]:
    """Stop process groups in the order given; returns the pids that had to be killed."""
    killed = []
    for pid in pids:
        if not alive(pid):
            continue
        _signal_group(pid, signal.SIGTERM)
        if not wait_until(lambda p=pid: not alive(p), grace_s):  # type: ignore[misc]
            _signal_group(pid, signal.SIGKILL)
            wait_until(lambda p=pid: not alive(p), grace_s)  # type: ignore[misc]
            killed.append(pid)
    return killed


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes; whether it held."""
    polling = Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
        retry=retry_if_result(lambda held: not held),
        retry_error_callback=lambda _: False,
    )
    return bool(polling(condition))


def log_tail(log_dir: Path, name: str, lines: int = 20) -> str:
    path = log_dir / f"{name}.log"
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
