"""What a command of `inferfleet` imports, seen from a fresh interpreter: the module names and the
files of inferfleet's own. Shared by the import tests of the command line and the layout tests
of the operator path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Runs the command line as the `inferfleet` entry point does, then writes what it loaded.
_PROBE = """
import json, sys
out, argv = sys.argv[1], json.loads(sys.argv[2])
from inferfleet.cli import main
sys.argv = ["inferfleet", *argv]
try:
    main()
    code = 0
except SystemExit as exit:
    code = exit.code if isinstance(exit.code, int) else 1
files = {
    name: getattr(module, "__file__", None)
    for name, module in sys.modules.items()
    if name == "inferfleet" or name.startswith("inferfleet.")
}
with open(out, "w") as stream:
    json.dump({"code": code, "modules": sorted(sys.modules), "files": files}, stream)
"""

# `inferfleet run` where no cluster can be reached: it loads the operator, finds no
# configuration and exits 1 before it connects (no kubeconfig, not in a pod).
RUN_WITHOUT_A_CLUSTER = ("run", "--metrics-port", "0")
_CLUSTER_SETTINGS = {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}


@dataclass(frozen=True)
class Loaded:
    code: int
    stderr: str
    modules: frozenset[str]
    files: dict[str, str | None]
    """inferfleet's modules, each with its source file."""

    def under(self, package: str) -> list[str]:
        """The loaded modules that are `package` or inside it."""
        return sorted(m for m in self.modules if m == package or m.startswith(f"{package}."))


def modules_loaded_by(argv: tuple[str, ...], home: Path) -> Loaded:
    """Run `inferfleet *argv` in a fresh interpreter with `home` as its HOME and no cluster
    configuration in its environment."""
    environment = {k: v for k, v in os.environ.items() if k not in _CLUSTER_SETTINGS}
    out = home / "loaded.json"
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), json.dumps(list(argv))],
        capture_output=True, text=True, check=False, timeout=60,
        env={**environment, "HOME": str(home)},
    )  # fmt: skip
    assert out.is_file(), f"the probe wrote nothing: {result.stderr}"
    data = json.loads(out.read_text())
    return Loaded(data["code"], result.stderr, frozenset(data["modules"]), data["files"])
