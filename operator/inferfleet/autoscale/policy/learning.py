"""Step 3 of a tick: what the policy learns from the running fleet: the calibration
(measured against predicted latency) and the load factor taught by attainment misses
(`PolicyHistory.tightening`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.demand import Demand, role_metrics
from inferfleet.autoscale.policy.explanation import ms
from inferfleet.autoscale.policy.history import (
    Calibration,
    LatencyFactors,
    OutcomeTally,
    PolicyHistory,
)
from inferfleet.autoscale.policy.sizing import operating_point_at, transfer_s
from inferfleet.autoscale.policy.spec import DECODING_ROLES, PREFILLING_ROLES, PolicySpec, Reason
from inferfleet.autoscale.snapshot import MetricsSnapshot
from inferfleet.planning.load import OperatingPoint
from inferfleet.slo import Slo


def planning_slo(spec: PolicySpec, calibration: Calibration) -> Slo:
    """The targets the planner plans against: each corrected by what the model misses for this
    workload (its tail beyond the quantile the planner predicts included)."""
    slo = spec.slo
    ttft = slo.ttft_p95_s
    tpot = slo.tpot_p95_s
    return Slo.in_seconds(
        ttft_p95_s=None if ttft is None else ttft - calibration.ttft_offset_s,
        tpot_p95_s=None if tpot is None else tpot / calibration.tpot_ratio,
        attainment_target=slo.attainment_target,
    )


def load_factor(tightening: LatencyFactors, role: Role) -> float:
    """How much more load than the demand `role` is planned for: the tightening of the
    latencies it answers for (TTFT: prefill and aggregated pools; TPOT: decode and
    aggregated)."""
    return max(
        tightening.ttft if role in PREFILLING_ROLES else 1.0,
        tightening.tpot if role in DECODING_ROLES else 1.0,
    )


# The quantiles the router's histograms are read at (`ServiceMetrics`).
_MEASURED_QUANTILES = (0.95, 0.99)


def planned_attainment(spec: PolicySpec, history: PolicyHistory) -> float:
    """The share of a window's requests the fleet is sized to serve within the targets: the
    attainment target, lowered while the decayed tally holds the target with misses to spare,
    in proportion to the share of the miss budget unspent, down to
    `lowest_planned_attainment`. The target is judged over all requests, not per window: a
    fleet that meets it in every window holds GPUs for misses it could have afforded."""
    target = spec.attainment_target
    lowest = min(target, spec.lowest_planned_attainment)
    tally = history.outcomes
    if tally is None or tally.attainment is None or target >= 1:
        return target
    # Too few requests to tell the spare misses from noise: one standard error of the tally
    # must be within half the miss share.
    if tally.requests < 4 * target / (1 - target):
        return target
    spare = (tally.attainment - target) / (1 - target)
    return target - min(1.0, max(0.0, spare)) * (target - lowest)


def _observed_latency(quantile: float, p95: float | None, p99: float | None) -> float | None:
    """The measured latency at `quantile`: log-linear between the p95 and p99 the router
    reports, held at the nearer of the two outside them (p95 alone without a p99)."""
    if p95 is None or p99 is None or p95 <= 0 or p99 <= 0:
        return p95 if p95 is not None else p99
    low, high = _MEASURED_QUANTILES
    share = min(1.0, max(0.0, (quantile - low) / (high - low)))
    latency: float = p95 * (p99 / p95) ** share
    return latency


def calibrate(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    history: PolicyHistory,
    demand: Demand,
) -> Calibration:
    """Update the calibration from this snapshot: the latencies measured over the window (at
    the quantile of `planned_attainment`) against the planner's prediction for the replicas
    that served them (the ready ones) at the measured load, TTFT as the difference and TPOT as
    the ratio (`Calibration`), each within its limit. Skipped when too few requests completed,
    when the planner sees that fleet overloaded (a backlog drains; no steady state to compare
    with), while a backlog the steady state does not hold was queued within the window
    (`_backlogged`), and while replicas that were asked for join (the window mixes two
    fleets)."""
    previous = history.calibration
    service = snapshot.service
    now = snapshot.taken_at_s
    quantile = planned_attainment(spec, history)
    completed = service.requests_per_s * spec.traffic_share * snapshot.window_s
    ready = {r: role_metrics(snapshot, r).ready_replicas for r in spec.role_names}
    joining = any(
        spec.cold_start_s
        <= now - history.last_scale_up_s.get(r, -math.inf)
        < spec.cold_start_s + snapshot.window_s
        for r in spec.role_names
    )
    if (
        not spec.calibrate
        or joining
        or min(ready.values()) < 1
        or completed < spec.min_requests_to_calibrate
    ):
        return previous
    elapsed = snapshot.taken_at_s - (history.last_decision.at_s if history.last_decision else 0)
    weight = min(1.0, max(0.0, elapsed) / snapshot.window_s)

    def blend(old: float, new: float | None) -> float:
        return old if new is None else old + weight * (new - old)

    ttft_predicted: float | None = None
    tpot_predicted: float | None = None
    for role in spec.role_names:
        policy = spec.role(role)
        point = operating_point_at(spec, policy, demand.requests_per_s, ready[role], demand)
        if not point.stable:
            return previous
        if role in PREFILLING_ROLES:
            if _backlogged(spec, snapshot, history, demand, point):
                return previous
            ttft_predicted = point.ttft_p95_s + transfer_s(spec, policy, demand)
        if role in DECODING_ROLES:
            tpot_predicted = point.tpot_s
    ttft = _observed_latency(quantile, service.ttft_p95_s, service.ttft_p99_s)
    tpot = _observed_latency(quantile, service.tpot_p95_s, service.tpot_p99_s)
    ttft_offset = tpot_ratio = None
    if ttft is not None and ttft_predicted is not None and spec.slo.ttft_p95_s is not None:
        limit = spec.ttft_offset_limit * spec.slo.ttft_p95_s
        ttft_offset = min(limit, max(-limit, ttft - ttft_predicted))
    if tpot is not None and tpot_predicted and spec.slo.tpot_p95_s is not None:
        limit = spec.tpot_ratio_limit
        tpot_ratio = min(limit, max(1 / limit, tpot / tpot_predicted))
    return Calibration(
        ttft_offset_s=blend(previous.ttft_offset_s, ttft_offset),
        tpot_ratio=blend(previous.tpot_ratio, tpot_ratio),
    )


def _backlogged(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    demand: Demand,
    point: OperatingPoint,
) -> bool:
    """Whether more requests queued in the engines within the rate window than the planner's
    steady state holds before their first token (Little's law: the rate times its mean TTFT),
    beyond `recent_change_significance` standard errors of that count: a backlog that built
    while too few replicas served. Its requests' waits fill the window's TTFT percentiles
    after the backlog is gone, and are not the model's error at the fleet that serves now."""
    since = snapshot.taken_at_s - snapshot.window_s
    queued = max(
        [demand.backlog_requests]
        + [sample.backlog_requests for sample in history.demand if sample.at_s > since]
    )
    expected = demand.requests_per_s * point.ttft_mean_s
    return queued > expected + spec.recent_change_significance * math.sqrt(max(expected, 1.0))


def tally_outcomes(
    spec: PolicySpec, snapshot: MetricsSnapshot, history: PolicyHistory
) -> OutcomeTally:
    """The decayed tally of completed and met requests, this tick's share of the window added:
    the requests completed since the last tally (at most one rate window's)."""
    now = snapshot.taken_at_s
    previous = history.outcomes
    service = snapshot.service
    if previous is None:
        elapsed, requests, met = snapshot.window_s, 0.0, 0.0
    else:
        elapsed = min(snapshot.window_s, max(0.0, now - previous.at_s))
        keep = math.exp(-max(0.0, now - previous.at_s) / spec.attainment_memory_s)
        requests, met = previous.requests * keep, previous.met * keep
    if service.attainment is None:
        return OutcomeTally(now, requests, met)
    completed = service.requests_per_s * spec.traffic_share * elapsed
    return OutcomeTally(now, requests + completed, met + completed * service.attainment)


def below_target(target: float, attainment: float, requests: float, significance: float) -> bool:
    """Attainment below `target` by more than `significance` binomial standard errors of
    `requests` requests."""
    if requests <= 0 or attainment >= target:
        return False
    error = math.sqrt(target * (1 - target) / requests)
    return attainment < target - significance * error


def _missed(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    attainment: float,
    tally: OutcomeTally,
) -> bool:
    """The window's attainment is below what the fleet was sized for (`planned_attainment`),
    and not by chance: beyond the window's noise, or with the longer tally below the target."""
    planned = planned_attainment(spec, history)
    if attainment >= planned:
        return False
    window_requests = snapshot.service.requests_per_s * spec.traffic_share * snapshot.window_s
    return below_target(planned, attainment, window_requests, spec.miss_significance) or (
        tally.attainment is not None
        and below_target(
            spec.attainment_target, tally.attainment, tally.requests, spec.miss_significance
        )
    )


@dataclass(frozen=True)
class Feedback:
    missed: frozenset[Role]
    """Roles whose target is missed (they get the budget first and never shrink)."""
    tightening: LatencyFactors
    """The tightening before this tick's lesson (relaxed when the target is met)."""
    lesson: LatencyFactors | None
    """The tightening a settled fleet's miss teaches; None when there is nothing to learn."""
    reason: Reason | None
    note: str


def _decayed(spec: PolicySpec, factor: float, elapsed_s: float) -> float:
    if elapsed_s <= 0 or factor <= 1:
        return max(1.0, factor)
    remaining: float = 0.5 ** (elapsed_s / spec.tightening_half_life_s)
    return 1 + (factor - 1) * remaining


def attainment_feedback(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    history: PolicyHistory,
    tally: OutcomeTally,
) -> Feedback:
    service = snapshot.service
    attainment = service.attainment
    previous = history.tightening
    if attainment is None or not _missed(spec, snapshot, history, attainment, tally):
        elapsed = snapshot.taken_at_s - (
            history.last_decision.at_s if history.last_decision else snapshot.taken_at_s
        )
        relaxed = previous
        if attainment is not None:
            relaxed = LatencyFactors(
                _decayed(spec, previous.ttft, elapsed), _decayed(spec, previous.tpot, elapsed)
            )
        return Feedback(frozenset(), relaxed, None, None, "")

    def ratio(measured: float | None, target: float | None) -> float:
        if measured is None or target is None:
            return 0.0
        return measured / target

    ttft = ratio(service.ttft_p95_s, spec.slo.ttft_p95_s)
    tpot = ratio(service.tpot_p95_s, spec.slo.tpot_p95_s)
    # A miss in the tail (p95 within target) goes to whichever latency is closer to its target.
    ttft_missed = ttft > 1 or (ttft >= tpot and ttft > 0)
    tpot_missed = tpot > 1 or (tpot > ttft)
    if not (ttft_missed or tpot_missed):
        # No latency measured: every pool may be short.
        ttft_missed = spec.slo.ttft_p95_s is not None
        tpot_missed = spec.slo.tpot_p95_s is not None
    missed = frozenset(
        role
        for role in spec.role_names
        if (ttft_missed and role in PREFILLING_ROLES) or (tpot_missed and role in DECODING_ROLES)
    )
    reason = Reason.SCALE_UP_TTFT if ttft_missed and ttft >= tpot else Reason.SCALE_UP_TPOT
    # Learn only from a settled fleet: every replica asked for is ready, and neither a scale-up
    # nor an earlier tightening is younger than a cold start and a window of metrics.
    now = snapshot.taken_at_s
    settle_s = spec.cold_start_s + snapshot.window_s
    settled = all(
        role_metrics(snapshot, r).ready_replicas >= current.get(r, 0) for r in spec.role_names
    ) and all(now - history.last_scale_up_s.get(r, -math.inf) >= settle_s for r in missed)
    if history.tightened_at_s is not None and now - history.tightened_at_s < settle_s:
        settled = False
    # A lesson that did not raise attainment shows a latency that replicas do not reduce (a
    # tail set by the requests themselves): tightening further would only add GPUs, so the
    # lesson is undone, and the next one waits for attainment to improve on it.
    helped = (
        history.attainment_when_tightened is None or attainment > history.attainment_when_tightened
    )
    lesson = None
    if settled and not helped:
        gain = spec.feedback_gain
        previous = LatencyFactors(
            max(1.0, previous.ttft / gain) if ttft_missed else previous.ttft,
            max(1.0, previous.tpot / gain) if tpot_missed else previous.tpot,
        )
    if settled and helped:
        gain, cap = spec.feedback_gain, spec.max_tightening
        lesson = LatencyFactors(
            min(cap, previous.ttft * gain) if ttft_missed else previous.ttft,
            min(cap, previous.tpot * gain) if tpot_missed else previous.tpot,
        )
    note = (
        f"attainment {attainment:.1%} below {spec.attainment_target:.1%} "
        f"(p95 TTFT {ms(service.ttft_p95_s)} of {ms(spec.slo.ttft_p95_s)}, "
        f"p95 TPOT {ms(service.tpot_p95_s)} of {ms(spec.slo.tpot_p95_s)})"
    )
    return Feedback(missed, previous, lesson, reason, note)
