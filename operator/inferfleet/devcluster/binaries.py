"""Where the control plane's binaries come from: built once from the pinned Go modules by
tools/devcluster/build.sh and cached outside the work tree by version."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BIN_DIR_VARIABLE = "INFERFLEET_DEVCLUSTER_BIN"
BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "devcluster" / "build.sh"
BINARIES = ("kube", "kwok", "etcd")


class BinariesUnavailableError(RuntimeError):
    pass


def ensure_binaries() -> Path:
    """The directory holding kube, kwok and etcd: $INFERFLEET_DEVCLUSTER_BIN, or the build
    script's cache (building on first use, which takes a while; progress goes to stderr)."""
    configured = os.environ.get(BIN_DIR_VARIABLE)
    if configured:
        directory = Path(configured)
    elif BUILD_SCRIPT.exists():
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
        )
        if result.returncode != 0:
            raise BinariesUnavailableError(
                f"{BUILD_SCRIPT} failed with exit status {result.returncode}"
            )
        directory = Path(result.stdout.strip().splitlines()[-1])
    else:
        raise BinariesUnavailableError(
            f"no control-plane binaries: set {BIN_DIR_VARIABLE}, or run from a checkout that "
            "has tools/devcluster/build.sh"
        )
    missing = [name for name in BINARIES if not (directory / name).is_file()]
    if missing:
        raise BinariesUnavailableError(f"{directory} lacks {', '.join(missing)}")
    return directory
