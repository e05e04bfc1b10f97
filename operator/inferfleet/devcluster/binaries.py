"""Where the control plane's binaries come from: built once from the pinned Go modules by
tools/devcluster/build.sh and cached outside the work tree by version."""

from __future__ import annotations

from pathlib import Path

from inferfleet.devcluster.tools import TOOLS_DIR, ToolUnavailableError, cached_tool

BIN_DIR_VARIABLE = "INFERFLEET_DEVCLUSTER_BIN"
BUILD_SCRIPT = TOOLS_DIR / "devcluster" / "build.sh"
BINARIES = ("kube", "kwok", "etcd")


class BinariesUnavailableError(ToolUnavailableError):
    pass


def ensure_binaries() -> Path:
    """The directory holding kube, kwok and etcd: $INFERFLEET_DEVCLUSTER_BIN, or the build
    script's cache (building on first use, which takes a while; progress goes to stderr)."""
    try:
        directory = cached_tool(BIN_DIR_VARIABLE, BUILD_SCRIPT)
    except ToolUnavailableError as error:
        raise BinariesUnavailableError(f"no control-plane binaries: {error}") from None
    missing = [name for name in BINARIES if not (directory / name).is_file()]
    if missing:
        raise BinariesUnavailableError(f"{directory} lacks {', '.join(missing)}")
    return directory
