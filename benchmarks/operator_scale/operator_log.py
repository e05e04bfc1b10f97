"""The operator's log: lines per level, tracebacks, kopf's handler runs per window, and the
distinct warnings and errors."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.operator_scale.audit import Phase

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
