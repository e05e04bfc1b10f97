"""The `inferfleet` command's entry point.

In a container the command runs as PID 1, and the kernel drops a signal sent to PID 1 whose
disposition is the default. A SIGTERM that comes while the command is still importing (a pod
deleted as it starts, a rollout superseded at once) would be lost, and the pod would hold its
node's resources and its IP for its whole termination grace period until SIGKILL. So a
handler that ends the process is installed before anything else is imported; the servers
replace it with their graceful drain once they listen."""

from __future__ import annotations

import signal
from types import FrameType


def _exit_now(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """End the process on SIGTERM, as it would end were it not PID 1."""
    signal.signal(signal.SIGTERM, _exit_now)


def main() -> None:
    exit_on_sigterm()
    from inferfleet.cli import main as cli_main  # noqa: PLC0415 (after the handler, on purpose)

    cli_main()
