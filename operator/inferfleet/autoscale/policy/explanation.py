"""What a decision says: the reason, the predicted effect per role, the message in words."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.constraints import Constrained
from inferfleet.autoscale.policy.demand import Demand
from inferfleet.autoscale.policy.history import Calibration
from inferfleet.autoscale.policy.sizing import Sizing, operating_point_at, transfer_s
from inferfleet.autoscale.policy.spec import (
    DECODING_ROLES,
    PREFILLING_ROLES,
    PolicySpec,
    Reason,
    RolePolicy,
)
from inferfleet.planning.load import OperatingPoint


@dataclass(frozen=True)
class RoleEstimate:
    """How one role was sized this tick (for status, Events and the simulator's plots)."""

    role: Role
    needed: int
    """Feed-forward: replicas the forecast load needs under the SLO (planner, concurrency, KV)."""
    recommended: int
    """After feedback and stabilisation, before constraints."""
    predicted: OperatingPoint | None
    """Per-replica operating point of the chosen count at the forecast load, as the planner
    gives it (None without load)."""
    feasible: bool
    """False when even max_replicas cannot hold the SLO at the forecast load."""
    predicted_ttft_s: float | None = None
    """Expected TTFT at the target's quantile for the chosen count (planner plus calibration,
    KV transfer included); None for a decode pool or without load."""
    predicted_tpot_s: float | None = None
    """Expected TPOT likewise; None for a prefill pool or without load."""


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def role_estimate(
    spec: PolicySpec,
    policy: RolePolicy,
    *,
    demand: Demand,
    sizing: Sizing,
    recommended: int,
    count: int,
    calibration: Calibration,
) -> RoleEstimate:
    rate = demand.forecast_requests_per_s
    point = operating_point_at(spec, policy, rate, count, demand) if rate > 0 else None
    ttft = tpot = None
    if point is not None and point.stable:
        if policy.role in PREFILLING_ROLES:
            ttft = point.ttft_p95_s + transfer_s(spec, policy, demand) + calibration.ttft_offset_s
        if policy.role in DECODING_ROLES:
            tpot = point.tpot_s * calibration.tpot_ratio
    return RoleEstimate(
        role=policy.role,
        needed=sizing.needed,
        recommended=recommended,
        predicted=point,
        feasible=sizing.feasible,
        predicted_ttft_s=ttft,
        predicted_tpot_s=tpot,
    )


def choose_reason(
    feedback_reason: Reason | None,
    missed: frozenset[Role],
    *,
    constrained: Constrained,
    grew: set[Role],
    shrank: set[Role],
    held_down: set[Role],
    learned: frozenset[Role],
    shortened: bool = False,
) -> Reason:
    if constrained.pinned:
        return Reason.PINNED
    if constrained.budget_cut:
        return Reason.QUOTA_EXHAUSTED if constrained.by_quota else Reason.BUDGET_EXHAUSTED
    if constrained.max_cut:
        return Reason.AT_MAX
    if grew and feedback_reason is not None and grew & (learned | missed):
        return feedback_reason
    if grew and (shrank or held_down):
        return Reason.REBALANCE
    if grew:
        return Reason.SCALE_UP_LOAD
    if shrank:
        return Reason.SCALE_DOWN_FORECASTS_HELD if shortened else Reason.SCALE_DOWN_STABLE
    if held_down:
        return Reason.STABILIZING
    return Reason.STEADY


def _tokens(per_s: float) -> str:
    if per_s >= 1e6:
        return f"{per_s / 1e6:.3g}M"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.3g}k"
    return f"{per_s:.3g}"


def _effect(spec: PolicySpec, estimate: RoleEstimate, count: int) -> str:
    plural = "replica holds" if count == 1 else "replicas hold"
    point = estimate.predicted
    if point is None:
        return f"{count} {plural} an idle load"
    if not point.stable:
        return f"{count} {plural} nothing: overloaded ({point.limit})"
    parts = []
    ttft, tpot = estimate.predicted_ttft_s, estimate.predicted_tpot_s
    if ttft is not None and spec.slo.ttft_p95_s is not None:
        parts.append(f"TTFT {ttft * 1e3:.0f} ms of {spec.slo.ttft_p95_s * 1e3:.0f}")
    if tpot is not None and spec.slo.tpot_p95_s is not None:
        parts.append(f"TPOT {tpot * 1e3:.1f} ms of {spec.slo.tpot_p95_s * 1e3:.0f}")
    return f"{count} {plural} " + (" and ".join(parts) or "the load")


def explain(
    spec: PolicySpec,
    *,
    demand: Demand,
    current: Mapping[Role, int],
    replicas: Mapping[Role, int],
    sizings: Mapping[Role, Sizing],
    estimates: Mapping[Role, RoleEstimate],
    note: str,
    constrained: Constrained,
    pins: Mapping[Role, int],
) -> str:
    arriving = demand.requests_per_s
    load = (
        f"{arriving:.3g} req/s arriving ({_tokens(arriving * demand.input_tokens)} prompt tok/s, "
        f"{demand.input_tokens}/{demand.output_tokens} tokens)"
    )
    if demand.burst_requests_per_s > 0:
        load += (
            f", capacity for {demand.burst_requests_per_s:.3g} req/s held for the bursts of the "
            f"last {spec.burst_memory_s / 60:.0f} min"
        )
    elif demand.forecast_requests_per_s > arriving * (1 + 1e-9):
        load += (
            f", {demand.forecast_requests_per_s:.3g} req/s forecast in {spec.cold_start_s:.0f} s"
        )
    parts = [load]
    for role in spec.role_names:
        before, after = current[role], replicas[role]
        effect = _effect(spec, estimates[role], after)
        change = f"{role.value} {before} -> {after}" if before != after else f"{role.value} {after}"
        detail = f"{change}: sized for {sizings[role].why}, {effect}"
        if not sizings[role].feasible:
            detail += f" (short: max {spec.role(role).max_replicas} replicas cannot hold the SLO)"
        if role in pins:
            detail += " (pinned)"
        if role in constrained.budget_cut and constrained.by_quota:
            held_for = f", after {spec.quota_yields_to}" if spec.quota_yields_to else ""
            detail += f" (the namespace's GPU quota leaves it {spec.gpu_quota} GPUs{held_for})"
        elif role in constrained.budget_cut:
            detail += f" (GPU budget {spec.gpu_budget} exhausted)"
        parts.append(detail)
    if note:
        parts.append(note)
    return "; ".join(parts)
