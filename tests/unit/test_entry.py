"""The command as PID 1 of a container (a PID namespace of its own, as crun and every
container runtime give it): a SIGTERM that comes before a server installs its drain ends it,
where the kernel would drop it for a PID 1 with the default disposition."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

STILL_STARTING = "import time; time.sleep(60)"  # stands for the imports of a slow start


def _pid1(code: str) -> subprocess.Popen[bytes]:
    """`code` in a fresh interpreter that is PID 1 of a new PID namespace."""
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _its_pid1(namespace_owner: subprocess.Popen[bytes]) -> int:
    """The interpreter, unshare's child (what a runtime signals)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        children = subprocess.run(
            ["pgrep", "-P", str(namespace_owner.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        if children:
            time.sleep(0.5)  # past its own start
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("no PID 1 started")


@pytest.mark.parametrize(("early_exit", "ends"), [(True, True), (False, False)])
def test_a_sigterm_during_start_ends_pid_1_only_with_the_early_handler(
    early_exit: bool, ends: bool
) -> None:
    prelude = "from inferfleet.entry import exit_on_sigterm; exit_on_sigterm(); "
    owner = _pid1((prelude if early_exit else "") + STILL_STARTING)
    try:
        pid1 = _its_pid1(owner)
        os.kill(pid1, signal.SIGTERM)
        try:
            owner.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            assert not ends, "PID 1 ignored the SIGTERM"
        else:
            assert ends, "PID 1 without a handler ended on SIGTERM: the kernel rule changed"
            assert owner.returncode == 128 + signal.SIGTERM
    finally:
        owner.kill()
        owner.wait()
