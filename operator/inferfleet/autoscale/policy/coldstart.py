"""The cold start the policy plans with, measured per role.

`autoscaling.coldStartSeconds` is a guess written once; how long a replica really takes to
serve depends on where its weights come from, the model's size, the node it lands on and how
long it waits for GPUs, and differs between pools. The policy forecasts demand that far ahead,
so a short guess orders capacity late and a long one holds it early.

Measured: a scale-up ordered while the role served exactly the replicas it was asked for (none
starting, none draining) is timed from the tick that ordered it to the tick that first sees one
more replica serving, less half the time between that tick and the one before (the replica came
up somewhere between them). The loop sees a replica a tick and a scrape after it serves, so a
measurement is trusted to within `PolicySpec.cold_start_tolerance` of the configured value:
inside it, the configured value holds; beyond it, the slowest role's recent measurements
replace it (each role's newest `MEASURED_KEPT`, their maximum: the forecast has to cover the
slowest replica that may be ordered). A scale-up cancelled before it served measures nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.history import ColdStarts, PolicyHistory
from inferfleet.autoscale.policy.spec import PolicySpec
from inferfleet.autoscale.snapshot import MetricsSnapshot

MEASURED_KEPT = 5
"""Measurements kept per role: recent enough to follow a change (a weight cache filled), enough
that one fast start does not hide the slow ones."""


@dataclass(frozen=True)
class PlannedColdStart:
    seconds: float
    measured_role: Role | None = None
    """The role whose measurements replaced the configured value; None: the configured holds."""


def planned_cold_start(spec: PolicySpec, history: PolicyHistory) -> PlannedColdStart:
    """The cold start to forecast over: the configured one, unless the slowest role's recent
    measurements lie beyond it by more than the tolerance."""
    slowest: tuple[float, Role] | None = None
    for role, starts in sorted(history.cold_starts.items()):
        if starts.measured_s and (slowest is None or max(starts.measured_s) > slowest[0]):
            slowest = (max(starts.measured_s), role)
    if slowest is None:
        return PlannedColdStart(spec.cold_start_s)
    measured, role = slowest
    if abs(measured - spec.cold_start_s) <= spec.cold_start_tolerance * spec.cold_start_s:
        return PlannedColdStart(spec.cold_start_s)
    return PlannedColdStart(measured, role)


def track_cold_starts(
    history: PolicyHistory,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    replicas: Mapping[Role, int],
) -> dict[Role, ColdStarts]:
    """Per role, after this tick: a scale-up whose first new replica now serves measured, one
    ordered now (every replica serving) awaited, one cancelled forgotten."""
    now = snapshot.taken_at_s
    previous_tick = history.last_decision.at_s if history.last_decision is not None else None
    tracked = dict(history.cold_starts)
    for role, wanted in replicas.items():
        starts = tracked.get(role, ColdStarts())
        metrics = snapshot.roles.get(role)
        ready = metrics.ready_replicas if metrics is not None else 0
        ordered_at_s = starts.ordered_at_s
        if ordered_at_s is not None:
            # A replica lost meanwhile: the first new one serving brings the count back above
            # what is left.
            starts = replace(starts, ready_before=min(starts.ready_before, ready))
            if ready > starts.ready_before:
                since = now - ordered_at_s
                came_up_within = 0.0 if previous_tick is None else max(0.0, now - previous_tick)
                measured = max(0.0, since - came_up_within / 2)
                starts = ColdStarts(measured_s=(*starts.measured_s, measured)[-MEASURED_KEPT:])
            elif wanted <= starts.ready_before:
                starts = ColdStarts(measured_s=starts.measured_s)  # cancelled
        # Timed only when the role serves exactly what it is asked for: with replicas still
        # starting, or draining ones still counted, the next to serve says nothing of this one.
        if starts.ordered_at_s is None and wanted > current.get(role, 0) == ready:
            starts = replace(starts, ordered_at_s=now, ready_before=ready)
        tracked[role] = starts
    return tracked
