"""One tick: `decide` (spec, metrics snapshot, current replicas, history) -> `Decision`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.coldstart import planned_cold_start, track_cold_starts
from inferfleet.autoscale.policy.constraints import (
    Constrained,
    constrain,
    forecasts_held,
    stabilised,
)
from inferfleet.autoscale.policy.demand import (
    Demand,
    estimate_demand,
    role_metrics,
    trend_window_s,
)
from inferfleet.autoscale.policy.explanation import (
    RoleEstimate,
    choose_reason,
    explain,
    role_estimate,
)
from inferfleet.autoscale.policy.history import (
    Calibration,
    DemandSample,
    LastDecision,
    LatencyFactors,
    MissFloor,
    OutcomeTally,
    PolicyHistory,
    Recommendation,
)
from inferfleet.autoscale.policy.idle import (
    idle_state,
    wake_progress,
    waking,
    woken,
    zero_decision,
)
from inferfleet.autoscale.policy.learning import (
    Feedback,
    attainment_feedback,
    calibrate,
    load_factor,
    planning_slo,
    tally_outcomes,
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
    cold_start_s: float | None = None
    """The cold start the policy plans with from now on, this tick's measurement included
    (`coldstart`); None: autoscaling disabled."""
    unquoted: Mapping[Role, int] | None = None
    """The replicas it would choose were there no namespace quota (None: `replicas`): what
    it claims of the quota (`autoscale.quota`)."""
    slo_missed: bool = False
    """Whether the attainment target was missed (a role is short)."""


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
        held[role] = max(0 if spec.scales_to_zero else 1, held.get(role, current.get(role, 1)))
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
    planned = planned_cold_start(spec, history)
    if snapshot is None:
        held = _hold(
            spec,
            current=current,
            history=history,
            pins=pins,
            reason=Reason.NO_METRICS,
            why="no metrics",
        )
        return replace(held, cold_start_s=planned.seconds)
    since_taken_s = 0.0 if now_s is None else max(0.0, now_s - snapshot.taken_at_s)
    age_s = snapshot.newest_sample_age_s + since_taken_s
    if age_s > spec.stale_after_s:
        held = _hold(
            spec,
            current=current,
            history=history,
            pins=pins,
            reason=Reason.STALE_METRICS,
            why=f"newest metrics {age_s:.0f} s old (limit {spec.stale_after_s:.0f} s)",
        )
        return replace(held, cold_start_s=planned.seconds)
    counts = {r: max(0, current.get(r, 0)) for r in spec.role_names}
    idle = idle_state(snapshot, counts, history)
    zero = zero_decision(spec, snapshot, idle, history, pins)
    if zero is not None:
        decision = Decision(*zero)
    else:
        awake = replace(spec.awake(), cold_start_s=planned.seconds)
        decision = _decide_fresh(awake, snapshot, current, history, pins)
        wake = woken(spec, idle, decision.replicas)
        if wake is not None:
            decision = replace(
                decision, reason=Reason.WAKE_FROM_ZERO, message=f"{wake}; {decision.message}"
            )
        seen = replace(decision.history, requests_seen_at_s=idle.idle_since_s)
        decision = replace(decision, history=seen)
    woke, served = wake_progress(spec, snapshot, history, decision.reason)
    decision = replace(
        decision, history=replace(decision.history, woke_at_s=woke, wake_caught_up_at_s=served)
    )
    message = decision.message
    if planned.measured_role is not None:
        message += (
            f"; a cold start of {planned.seconds:.0f} s planned for, as measured "
            f"({planned.measured_role.value}), not the {spec.cold_start_s:.0f} s "
            + ("estimated" if spec.cold_start_estimated else "configured")
        )
    cold_starts = track_cold_starts(history, snapshot, counts, decision.replicas)
    new_history = replace(decision.history, cold_starts=cold_starts)
    return replace(
        decision,
        message=message,
        history=new_history,
        cold_start_s=planned_cold_start(spec, new_history).seconds,
    )


@dataclass(frozen=True)
class _Sizer:
    """Sizes the roles for this tick's demand, against the SLO as calibrated and tightened."""

    spec: PolicySpec
    snapshot: MetricsSnapshot
    demand: Demand
    calibration: Calibration
    tightening: LatencyFactors
    current: Mapping[Role, int]

    def size(self, role: Role, extra_margin: float = 0.0, *, transient: bool = True) -> Sizing:
        return size_role(
            self.spec,
            self.spec.role(role),
            demand=self.demand,
            metrics=role_metrics(self.snapshot, role),
            slo=planning_slo(self.spec, self.calibration),
            margin=self.spec.load_margin + extra_margin,
            load_factor=load_factor(self.tightening, role),
            transient=transient,
            steps_too_slow=self.steps_too_slow,
        )

    @property
    def steps_too_slow(self) -> bool:
        """The router's p95 TPOT misses the target: engines run batches larger than the
        target allows, and their sequences last longer than the load needs at target speed."""
        measured, target = self.snapshot.service.tpot_p95_s, self.spec.slo.tpot_p95_s
        return measured is not None and target is not None and measured > target

    def with_hysteresis(self, role: Role, sizing: Sizing, *, transient: bool) -> Sizing:
        """A pool shrinks only to a count that would hold a little more load than it is sized
        for, so a load at the edge between two counts does not flip between them."""
        if sizing.needed >= self.current[role]:
            return sizing
        shrunk = self.size(role, self.spec.scale_down_margin, transient=transient)
        if shrunk.needed < self.current[role]:
            return shrunk
        return Sizing(self.current[role], shrunk.feasible, shrunk.why)

    def shrinking_slowly(
        self, sizings: Mapping[Role, Sizing]
    ) -> tuple[dict[Role, Sizing], dict[Role, Sizing]]:
        """The sizings with hysteresis on the way down; and the same without what a queue or a
        rising trend asks for, which stabilisation does not remember: once the queue has
        drained and the rise has stopped, the fleet goes back to what arrivals need."""
        roles = self.spec.role_names
        shrunk = {role: self.with_hysteresis(role, sizings[role], transient=True) for role in roles}
        if not (self.demand.drain_requests_per_s > 0 or self.demand.growth > 1):
            return shrunk, shrunk
        steady = {
            role: self.with_hysteresis(role, self.size(role, transient=False), transient=False)
            for role in roles
        }
        return shrunk, steady


def _stabilisation_window(
    history: PolicyHistory, now: float, current: Mapping[Role, int], span_s: float
) -> list[Recommendation]:
    """The recommendations of the last `span_s` that scale-down stabilisation reads. The first
    tick seeds the window with the current replicas (as the HPA does), so a restart with an
    empty history never scales down at once."""
    window_start = now - span_s
    seeded = history.recommendations or (Recommendation(now, dict(current)),)
    return [r for r in seeded if window_start < r.at_s <= now]


@dataclass(frozen=True)
class _Lesson:
    """What this tick learned from attainment, and the sizer that plans with it."""

    sizer: _Sizer
    learned: frozenset[Role]
    """Roles whose miss the model did not explain: they get more replicas than they run."""
    tightened_at_s: float | None
    attainment_when_tightened: float | None


def _learn(
    sizer: _Sizer, feedback: Feedback, history: PolicyHistory
) -> tuple[_Lesson, dict[Role, Sizing]]:
    """The lesson of a miss, and each role's sizing with it.

    A miss while the model asks for no more than is running is the model's error: learn it. A
    miss while the model already asks for more is explained (the fleet is short, or new
    replicas are starting): nothing to learn."""
    roles, snapshot = sizer.spec.role_names, sizer.snapshot
    sizings = {role: sizer.size(role) for role in roles}
    lesson = _Lesson(sizer, frozenset(), history.tightened_at_s, history.attainment_when_tightened)
    if feedback.lesson is not None and all(
        sizings[r].needed <= sizer.current[r] for r in feedback.missed
    ):
        taught = replace(sizer, tightening=feedback.lesson)
        lesson = _Lesson(taught, feedback.missed, snapshot.taken_at_s, snapshot.service.attainment)
        sizings = {role: taught.size(role) for role in roles}
    elif not feedback.missed and snapshot.service.attainment is not None:
        # The target is met: the lessons so far worked, the next miss may teach again.
        lesson = replace(lesson, attainment_when_tightened=None)
    return lesson, sizings


def _miss_floors(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    *,
    history: PolicyHistory,
    demand: Demand,
    current: Mapping[Role, int],
    learned: frozenset[Role],
    missed: frozenset[Role],
    tally: OutcomeTally,
) -> tuple[dict[Role, int], dict[Role, MissFloor]]:
    """The fewest replicas each role may have now, and the floors remembered from misses.

    A role whose target is missed does not shrink below the replicas that served the miss
    (those still starting were asked for to answer it, and the sizing says whether they are
    still needed). A lesson adds replicas in proportion to the shortfall of the decayed tally
    of all requests (what the target is judged on; a burst that one window missed entirely is
    not a fleet short by half), at least one; the count that answered a miss holds while the
    load that missed does."""
    now, roles = snapshot.taken_at_s, spec.role_names
    serving = {
        role: min(current[role], role_metrics(snapshot, role).ready_replicas) for role in roles
    }
    attainment = tally.attainment
    if attainment is None:
        attainment = snapshot.service.attainment
    shortfall = 0.0 if attainment is None else max(0.0, spec.attainment_target - attainment)
    answer = {
        role: current[role] + max(1, round(current[role] * min(1.0, spec.lesson_gain * shortfall)))
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
    now_floors = {
        role: max(
            holding.get(role, 0),
            answer.get(role, 0),
            serving[role] if role in missed else 0,
        )
        for role in roles
    }
    return now_floors, floors


def _next_history(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    demand: Demand,
    *,
    past: Sequence[Recommendation],
    remembered: Mapping[Role, int],
) -> PolicyHistory:
    """The windows the next tick reads: the recommendations stabilisation remembers and the
    demand samples its trend and mix read, this tick's added (the rest is the caller's)."""
    now = snapshot.taken_at_s
    keep_after = now - max(
        spec.scale_down_stabilization_s, trend_window_s(spec, snapshot), spec.growth_memory_s
    )
    return PolicyHistory(
        recommendations=(*past, Recommendation(now, remembered)),
        demand=(
            *(d for d in history.demand if keep_after <= d.at_s < now),
            _demand_sample(spec, snapshot, demand),
        ),
        mix=demand.mix,
    )


def _demand_sample(spec: PolicySpec, snapshot: MetricsSnapshot, demand: Demand) -> DemandSample:
    """This tick's demand as the history keeps it."""
    return DemandSample(
        snapshot.taken_at_s,
        demand.requests_per_s,
        snapshot.service.in_flight_requests * spec.traffic_share,
        demand.recent_requests_per_s,
        demand.reactive_forecast_requests_per_s,
        demand.backlog_requests,
    )


def _recommended(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    *,
    raw: Mapping[Role, int],
    current: Mapping[Role, int],
    past: Sequence[Recommendation],
) -> dict[Role, int]:
    """Each role's sizing after scale-down stabilisation; and no role shrinks before what it
    last grew by has been seen serving: replicas ordered serve after a cold start and are
    measured a rate window later (cancelling them sooner turns every forecast that did not
    come true into two direction changes)."""
    since_growth = spec.cold_start_s + snapshot.window_s
    recommended = {}
    for role in spec.role_names:
        count = stabilised(spec, role, raw[role], current[role], past)
        grew_at = history.last_scale_up_s.get(role, -math.inf)
        if snapshot.taken_at_s - grew_at < since_growth:
            count = max(count, current[role])
        recommended[role] = count
    return recommended


def _after_stabilisation(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    tally: OutcomeTally,
    *,
    demand: Demand,
    raw: Mapping[Role, int],
    current: Mapping[Role, int],
    past: Sequence[Recommendation],
    note: str,
) -> tuple[dict[Role, int], str, bool]:
    """The recommendation after scale-down stabilisation, the decision's note, and whether the
    window was shortened to reach it: to one rate window where the forecasts have held for the
    whole stabilisation window (`forecasts_held`) and the spec allows it; the note then says
    why."""
    recommended = _recommended(spec, snapshot, history, raw=raw, current=current, past=past)
    now = snapshot.taken_at_s
    samples = (*history.demand, _demand_sample(spec, snapshot, demand))
    if not spec.shorten_stabilization or not forecasts_held(spec, samples, now, tally.attainment):
        return recommended, note, False
    span_s = min(spec.scale_down_stabilization_s, snapshot.window_s)
    recent = _stabilisation_window(history, now, current, span_s)
    shortened = _recommended(spec, snapshot, history, raw=raw, current=current, past=recent)
    if shortened == recommended:
        return recommended, note, False
    return shortened, "; ".join(filter(None, [note, _shortened_note(spec, snapshot, tally)])), True


def _shortened_note(spec: PolicySpec, snapshot: MetricsSnapshot, tally: OutcomeTally) -> str:
    attainment = tally.attainment or 0.0
    window_s = min(spec.scale_down_stabilization_s, snapshot.window_s)
    stabilisation_s = spec.scale_down_stabilization_s
    return (
        f"scale-down after {window_s:.0f} s of lower demand, not {stabilisation_s:.0f} s: over "
        f"the last {stabilisation_s:.0f} s every forecast covered the load that came and "
        f"attainment ({attainment:.1%}) met its target"
    )


def _observe(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    history: PolicyHistory,
    demand: Demand,
) -> tuple[OutcomeTally, Feedback, Calibration]:
    """What the window's outcomes say: the decayed tally, the attainment's feedback and the
    latency calibration; unchanged while requests held through a wake may fill them."""
    if waking(snapshot, history):
        tally = history.outcomes or OutcomeTally(snapshot.taken_at_s, 0.0, 0.0)
        return tally, Feedback(frozenset(), history.tightening, None, None, ""), history.calibration
    tally = tally_outcomes(spec, snapshot, history)
    feedback = attainment_feedback(spec, snapshot, current, history, tally)
    return tally, feedback, calibrate(spec, snapshot, current, history, demand)


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
    tally, feedback, calibration = _observe(spec, snapshot, current_counts, history, demand)
    untaught = _Sizer(spec, snapshot, demand, calibration, feedback.tightening, current_counts)
    lesson, sizings = _learn(untaught, feedback, history)
    sizer, learned = lesson.sizer, lesson.learned
    sizings, steady = sizer.shrinking_slowly(sizings)
    floors_now, floors = _miss_floors(
        spec,
        snapshot,
        history=history,
        demand=demand,
        current=current_counts,
        learned=learned,
        missed=feedback.missed,
        tally=tally,
    )
    past = _stabilisation_window(history, now, current_counts, spec.scale_down_stabilization_s)
    raw = {role: max(sizings[role].needed, floors_now[role]) for role in roles}
    # What stabilisation remembers: the sizing without what a queue or a trend adds.
    remembered = {role: max(steady[role].needed, floors_now[role]) for role in roles}
    recommended, note, shortening = _after_stabilisation(
        spec, snapshot, history, tally, demand=demand, raw=raw, current=current_counts,
        past=past, note=feedback.note,
    )  # fmt: skip

    constrained = constrain(spec, recommended, pins, feedback.missed)
    replicas = constrained.replicas

    grew = {r for r in roles if replicas[r] > current_counts[r]}
    shrank = {r for r in roles if replicas[r] < current_counts[r]}
    held_down = {r for r in roles if raw[r] < current_counts[r] and r not in shrank}
    reason = choose_reason(
        feedback.reason, feedback.missed, constrained=constrained,
        grew=grew, shrank=shrank, held_down=held_down, learned=learned, shortened=shortening,
    )  # fmt: skip
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
        spec, demand=demand, current=current_counts, replicas=replicas, sizings=sizings,
        estimates=estimates, note=note, constrained=constrained, pins=pins,
    )  # fmt: skip
    new_history = replace(
        _next_history(spec, snapshot, history, demand, past=past, remembered=remembered),
        last_scale_up_s=dict(history.last_scale_up_s) | dict.fromkeys(grew, now),
        calibration=calibration,
        tightening=sizer.tightening,
        tightened_at_s=lesson.tightened_at_s,
        attainment_when_tightened=lesson.attainment_when_tightened,
        miss_floors=floors,
        last_decision=LastDecision(now, dict(replicas), reason),
        outcomes=tally,
    )
    return Decision(
        dict(replicas), reason, message, new_history, estimates,
        unquoted=_unquoted(spec, constrained, recommended, pins, feedback.missed),
        slo_missed=bool(feedback.missed),
    )  # fmt: skip


def _unquoted(
    spec: PolicySpec,
    constrained: Constrained,
    recommended: Mapping[Role, int],
    pins: Mapping[Role, int],
    missed: frozenset[Role],
) -> dict[Role, int] | None:
    """The replicas a decision cut to the namespace's quota would choose without it."""
    if not constrained.by_quota:
        return None
    return constrain(replace(spec, gpu_quota=None), recommended, pins, missed).replicas
