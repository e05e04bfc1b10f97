"""Pure helpers: nearest-rank percentiles, timestamps, and what Ready means for each kind."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100): a value that was measured, never interpolated."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: Sequence[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "p50": round(percentile(values, 50), 3),
        "p90": round(percentile(values, 90), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 timestamp (Kubernetes' `...Z`, with or without fractions) -> epoch seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def ready_condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The `Ready=True` condition of a ModelDeployment or InferenceService, if it has one."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return dict(condition)
    return None


def is_ready(obj: Mapping[str, Any]) -> bool:
    return ready_condition(obj) is not None


def rolled_out(deployment: Mapping[str, Any]) -> bool:
    """A Deployment whose controller has seen its current spec and whose every replica is
    updated, ready and available: what `kubectl rollout status` waits for, and what the
    operator waits for before it calls a ModelDeployment Ready."""
    status = deployment.get("status") or {}
    wanted = int((deployment.get("spec") or {}).get("replicas", 1))
    generation = int((deployment.get("metadata") or {}).get("generation", 0))
    return (
        int(status.get("observedGeneration", 0)) >= generation
        and int(status.get("replicas", 0)) == wanted
        and all(
            int(status.get(key, 0)) == wanted
            for key in ("updatedReplicas", "readyReplicas", "availableReplicas")
        )
    )
