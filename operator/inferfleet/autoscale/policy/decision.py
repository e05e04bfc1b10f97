"""One tick: `decide` (spec, metrics snapshot, current replicas, history) -> `Decision`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.constraints import constrain, stabilised
from inferfleet.autoscale.policy.demand import estimate_demand, role_metrics, trend_window_s
from inferfleet.autoscale.policy.explanation import (
    RoleEstimate,
    choose_reason,
    explain,
    role_estimate,
)
from inferfleet.autoscale.policy.history import (
    DemandSample,
    LastDecision,
    MissFloor,
    PolicyHistory,
    Recommendation,
)
from inferfleet.autoscale.policy.learning import (
    attainment_feedback,
    calibrate,
    planning_slo,
)
from inferfleet.autoscale.policy.sizing import Sizing, size_role
from inferfleet.autoscale.policy.spec import PolicySpec, Reason
from inferfleet.autoscale.snapshot import MetricsSnapshot


@dataclass(frozen=True)
class Decision:
    replicas: Mapping[Role, int]
    reason: Reason
    message: str
    """In words: the inputs and the predicted effect of each change."""
    history: PolicyHistory
    """What the caller stores and passes to the next tick."""
    estimates: Mapping[Role, RoleEstimate] = field(default_factory=dict)


def _hold(
    spec: PolicySpec,
    *,
    current: Mapping[Role, int],
    history: PolicyHistory,
    pins: Mapping[Role, int],
    reason: Reason,
    why: str,
) -> Decision:
    last = history.last_decision
    held = dict(last.replicas) if last is not None else dict(current)
    for role in spec.role_names:
        held[role] = max(1, held.get(role, current.get(role, 1)))
    constrained = constrain(spec, held, pins, frozenset())
    counts = ", ".join(f"{r.value} {constrained.replicas[r]}" for r in spec.role_names)
    source = "the last decision" if last is not None else "the current replicas"
    message = f"{why}: holding {source} ({counts})"
    if constrained.pinned:
        message += "; pinned: " + ", ".join(r.value for r in sorted(constrained.pinned))
    return Decision(constrained.replicas, reason, message, history)


def decide(
    spec: PolicySpec,
    snapshot: MetricsSnapshot | None,
    current: Mapping[Role, int],
    history: PolicyHistory,
    *,
    pins: Mapping[Role, int] | None = None,
    now_s: float | None = None,
) -> Decision:
    """Replicas per role for the next period, why, and the history to pass next time.

    `current` is the replicas each role is asked to run (ready or starting); `pins` the roles an
    SRE fixed (the pinned count wins over everything, budget included). `now_s`, on the
    snapshot's clock, adds the time since the snapshot was taken to its staleness."""
    pins = dict(pins or {})
    if not spec.enabled:
        replicas = {r: current.get(r, 1) for r in spec.role_names} | {
            r: n for r, n in pins.items() if r in spec.role_names
        }
        return Decision(
            replicas, Reason.DISABLED, "autoscaling policy is none: replicas as declared", history
        )
    if snapshot is None:
        return _hold(
            spec,
            current=current,
            history=history,
            pins=pins,
            reason=Reason.NO_METRICS,
            why="no metrics",
        )
    since_taken_s = 0.0 if now_s is None else max(0.0, now_s - snapshot.taken_at_s)
    age_s = snapshot.newest_sample_age_s + since_taken_s
    if age_s > spec.stale_after_s:
        return _hold(
            spec,
            current=current,
            history=history,
            pins=pins,
            reason=Reason.STALE_METRICS,
            why=f"newest metrics {age_s:.0f} s old (limit {spec.stale_after_s:.0f} s)",
        )
    return _decide_fresh(spec, snapshot, current, history, pins)


def _decide_fresh(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    history: PolicyHistory,
    pins: Mapping[Role, int],
) -> Decision:
    now = snapshot.taken_at_s
    roles = spec.role_names
    current_counts = {r: max(0, current.get(r, 0)) for r in roles}
    demand = estimate_demand(spec, snapshot, history)
    feedback = attainment_feedback(spec, snapshot, current_counts, history)
    calibration = calibrate(spec, snapshot, current_counts, history, demand)
    tightening = feedback.tightening

    def size(role: Role, extra_margin: float = 0.0, *, transient: bool = True) -> Sizing:
        return size_role(
            spec,
            spec.role(role),
            demand=demand,
            metrics=role_metrics(snapshot, role),
            slo=planning_slo(spec, calibration, tightening),
            margin=spec.load_margin + extra_margin,
            transient=transient,
        )

    sizings = {role: size(role) for role in roles}
    # A miss while the model asks for no more than is running is the model's error: learn it.
    # A miss while the model already asks for more is explained (the fleet is short, or new
    # replicas are starting): nothing to learn.
    learned: frozenset[Role] = frozenset()
    tightened_at, taught = history.tightened_at_s, history.attainment_when_tightened
    if feedback.lesson is not None and all(
        sizings[r].needed <= current_counts[r] for r in feedback.missed
    ):
        tightening, tightened_at, learned = feedback.lesson, now, feedback.missed
        taught = snapshot.service.attainment
        sizings = {role: size(role) for role in roles}
    elif not feedback.missed and snapshot.service.attainment is not None:
        # The target is met: the lessons so far worked, the next miss may teach again.
        taught = None

    def with_hysteresis(role: Role, sizing: Sizing, *, transient: bool) -> Sizing:
        """A pool shrinks only to a count that would hold a little more load than it is sized
        for, so a load at the edge between two counts does not flip between them."""
        if sizing.needed >= current_counts[role]:
            return sizing
        shrunk = size(role, spec.scale_down_margin, transient=transient)
        if shrunk.needed < current_counts[role]:
            return shrunk
        return Sizing(current_counts[role], shrunk.feasible, shrunk.why)

    sizings = {role: with_hysteresis(role, sizings[role], transient=True) for role in roles}
    # What a queue or a rising trend asks for is not remembered by stabilisation: once the
    # queue has drained and the rise has stopped, the fleet goes back to what arrivals need.
    steady = sizings
    if demand.drain_requests_per_s > 0 or demand.growth > 1:
        steady = {
            role: with_hysteresis(role, size(role, transient=False), transient=False)
            for role in roles
        }

    # A lesson adds replicas in proportion to the shortfall (the share of requests that would
    # have to meet the target and did not), at least one; the count that answered a miss holds
    # while the load that missed does.
    attainment = snapshot.service.attainment
    shortfall = 0.0 if attainment is None else max(0.0, spec.attainment_target - attainment)
    answer = {
        role: current_counts[role]
        + max(1, round(current_counts[role] * min(1.0, spec.lesson_gain * shortfall)))
        for role in learned
    }
    floors = {
        role: floor
        for role, floor in history.miss_floors.items()
        if floor.until_s > now and role in roles
    } | {
        role: MissFloor(answer[role], demand.requests_per_s, now + spec.miss_memory_s)
        for role in learned
    }
    holding = {
        role: floor.replicas
        for role, floor in floors.items()
        if demand.requests_per_s >= floor.requests_per_s * (1 - spec.scale_down_margin)
    }

    # The first tick seeds the window with the current replicas (as the HPA does), so a restart
    # with an empty history never scales down at once.
    window_start = now - spec.scale_down_stabilization_s
    seeded = history.recommendations or (Recommendation(now, dict(current_counts)),)
    past = [r for r in seeded if window_start < r.at_s <= now]

    raw: dict[Role, int] = {}
    remembered: dict[Role, int] = {}
    recommended: dict[Role, int] = {}
    for role in roles:
        floor = max(holding.get(role, 0), answer.get(role, 0))
        if role in feedback.missed:
            floor = max(floor, current_counts[role])
        raw[role] = max(sizings[role].needed, floor)
        remembered[role] = max(steady[role].needed, floor)
        recommended[role] = stabilised(spec, role, raw[role], current_counts[role], past)

    constrained = constrain(spec, recommended, pins, feedback.missed)
    replicas = constrained.replicas

    grew = {r for r in roles if replicas[r] > current_counts[r]}
    shrank = {r for r in roles if replicas[r] < current_counts[r]}
    held_down = {r for r in roles if raw[r] < current_counts[r] and r not in shrank}
    reason = choose_reason(
        feedback.reason,
        feedback.missed,
        constrained=constrained,
        grew=grew,
        shrank=shrank,
        held_down=held_down,
        learned=learned,
    )

    estimates = {
        role: role_estimate(
            spec,
            spec.role(role),
            demand=demand,
            sizing=sizings[role],
            recommended=recommended[role],
            count=replicas[role],
            calibration=calibration,
        )
        for role in roles
    }
    message = explain(
        spec,
        demand=demand,
        current=current_counts,
        replicas=replicas,
        sizings=sizings,
        estimates=estimates,
        note=feedback.note,
        constrained=constrained,
        pins=pins,
    )
    last_scale_up = dict(history.last_scale_up_s) | dict.fromkeys(grew, now)
    in_flight = snapshot.service.in_flight_requests * spec.traffic_share
    keep_after = now - max(spec.scale_down_stabilization_s, trend_window_s(spec, snapshot))
    new_history = PolicyHistory(
        recommendations=(
            *past,
            Recommendation(now, remembered),
        ),
        demand=(
            *(d for d in history.demand if keep_after <= d.at_s < now),
            DemandSample(now, demand.requests_per_s, in_flight),
        ),
        last_scale_up_s=last_scale_up,
        calibration=calibration,
        tightening=tightening,
        tightened_at_s=tightened_at,
        attainment_when_tightened=taught,
        miss_floors=floors,
        last_decision=LastDecision(now, dict(replicas), reason),
        mix=demand.mix,
    )
    return Decision(dict(replicas), reason, message, new_history, estimates)
