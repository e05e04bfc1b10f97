"""The tools the local cluster runs, each built or fetched once by a script of the checkout's
`tools/` and cached outside the work tree by version (the script's last line of output is
where); or, where a variable names one, that one instead."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parents[3] / "tools"


class ToolUnavailableError(RuntimeError):
    """A tool that is neither configured nor buildable here; the message says how to get it."""


def cached_tool(variable: str, script: Path) -> Path:
    """$`variable`, or what `script` prints last: it builds or fetches on first use, which can
    take minutes (its progress goes to stderr), and answers at once from its cache after."""
    configured = os.environ.get(variable)
    if configured:
        return Path(configured)
    if not script.exists():
        where = script.relative_to(TOOLS_DIR.parent)
        raise ToolUnavailableError(f"set {variable}, or run from a checkout that has {where}")
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ToolUnavailableError(f"{script} failed with exit status {result.returncode}")
    return Path(lines[-1])
