"""Conditions as Kubernetes conventions have them (pure): one per type, `lastTransitionTime`
moves only when the status flips, `observedGeneration` says which spec they judge, and each
type has one writer, which must not drop the others' entries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any


def transition_time(now: datetime) -> str:
    """`now` as metav1.Time writes it: RFC 3339 in UTC, whole seconds."""
    return now.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def condition(
    previous: Sequence[Mapping[str, Any]],
    type_: str,
    *,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    """A condition, keeping the previous transition time when the status did not flip."""
    value = "True" if status else "False"
    before = find(previous, type_)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == value and before.get("lastTransitionTime")
        else transition_time(now)
    )
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }


def find(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def with_condition(
    conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """`conditions` with `new` in place of the one of its type, the others kept in order."""
    kept = [dict(c) for c in conditions if c.get("type") != new["type"]]
    index = next((i for i, c in enumerate(conditions) if c.get("type") == new["type"]), len(kept))
    return [*kept[:index], dict(new), *kept[index:]]


def without_conditions(
    conditions: Sequence[Mapping[str, Any]], types: Sequence[str]
) -> list[dict[str, Any]]:
    return [dict(c) for c in conditions if c.get("type") not in types]
