"""The fill of a ModelDeployment's weight cache (`render.weight_cache`), read from what the
cluster holds: its Job's status, its volume's phase and what the fill pushed. Pure: the
children index carries each part (`Child.fill`), and the status is built from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inferfleet.api.conditions import condition
from inferfleet.api.weight_cache import FillPhase, WeightCacheStatus
from inferfleet.render.weight_cache import FillReport, pushed_progress


@dataclass(frozen=True)
class JobState:
    """A fill Job's end, if it ended: Complete, or Failed with the Job controller's reason."""

    complete: bool = False
    completion_time: str | None = None
    failure: str | None = None


@dataclass(frozen=True)
class ClaimState:
    phase: str
    """Pending, Bound or Lost."""


FillState = JobState | ClaimState | FillReport


def fill_state(obj: Mapping[str, Any]) -> FillState | None:
    """What a deployment's status reads of one of its objects (None: nothing)."""
    kind, status = obj.get("kind"), obj.get("status") or {}
    if kind == "Job":
        conditions = {
            str(c.get("type")): c
            for c in status.get("conditions") or []
            if c.get("status") == "True"
        }
        failed = conditions.get("Failed")
        return JobState(
            complete="Complete" in conditions or int(status.get("succeeded") or 0) > 0,
            completion_time=status.get("completionTime"),
            failure=None
            if failed is None
            else f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": "),
        )
    if kind == "PersistentVolumeClaim":
        return ClaimState(str(status.get("phase") or "Pending"))
    if kind == "ConfigMap":
        return pushed_progress(obj)
    return None


def weight_cache_status(
    objects: Sequence[Mapping[str, Any]], held: Mapping[str, FillState], source: str
) -> WeightCacheStatus | None:
    """The cache's state, where the rendered `objects` hold one (None: the spec asks for
    none), from what the children index holds by name (`held`). Its Job's end wins; else what
    this Job's fill last pushed; else it is pending."""
    job = _named(objects, "Job")
    claim = _named(objects, "PersistentVolumeClaim")
    if job is None or claim is None:
        return None
    ended = held.get(job["metadata"]["name"])
    report = next(
        (
            f
            for f in held.values()
            if isinstance(f, FillReport) and f.job == job["metadata"]["name"]
        ),
        None,
    )
    volume = held.get(claim["metadata"]["name"])
    fields: dict[str, Any] = {
        "claim": claim["metadata"]["name"],
        "source": source,
        "size": claim["spec"]["resources"]["requests"]["storage"],
    }
    if report is not None:
        fields |= {
            "bytesTotal": report.bytes_total,
            "bytesFilled": report.bytes_filled,
            "revision": report.revision or None,
        }
    if isinstance(ended, JobState) and ended.complete:
        done = report.describe() if report else "every file is on the volume"
        fields |= {"phase": FillPhase.FILLED, "message": f"filled: {done}"}
        if ended.completion_time:
            fields["completionTime"] = ended.completion_time
    elif isinstance(ended, JobState) and ended.failure:
        last = f" (last pushed: {report.describe()})" if report else ""
        fields |= {"phase": FillPhase.FAILED, "message": f"the fill failed: {ended.failure}{last}"}
    elif report is not None:
        fields |= {"phase": FillPhase.FILLING, "message": f"filling: {report.describe()}"}
    else:
        phase = volume.phase if isinstance(volume, ClaimState) else "not created yet"
        message = (
            f"the fill has not started: its volume is {phase}, its pod waits for a node, its "
            "image or the volume"
        )
        fields |= {"phase": FillPhase.PENDING, "message": message}
    return WeightCacheStatus.model_validate({k: v for k, v in fields.items() if v is not None})


def _named(objects: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((o for o in objects if o.get("kind") == kind), None)


_REASONS = {
    FillPhase.FILLED: "Filled",
    FillPhase.FILLING: "Filling",
    FillPhase.PENDING: "FillPending",
    FillPhase.FAILED: "FillFailed",
}


def weights_cached_condition(
    before: Sequence[Mapping[str, Any]],
    cache: WeightCacheStatus,
    *,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    """`WeightsCached`: True once the volume holds every file of the source."""
    return condition(
        before, "WeightsCached", status=cache.phase == FillPhase.FILLED,
        reason=_REASONS[cache.phase], message=cache.message, generation=generation, now=now,
    )  # fmt: skip
