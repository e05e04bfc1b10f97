"""The goodput autoscaling policy: (spec, metrics snapshot, current replicas, history) ->
(replicas per role, reason, new history). Pure: no I/O and no clock; time comes from the
snapshot, so the live controller and the fleet simulator drive the same function.

One tick, in order:

1. Demand. Requests/s arriving (router completions, plus the growth of the requests in flight,
   plus the engines' queues drained over a cold start), and the prompt/output mix (router means,
   else engine token rates, else the expected load). A least-squares trend over recent ticks
   projects the demand to now + cold start, since a replica ordered now serves only then.
2. Feed-forward. Each pool is sized with the planner (`inferfleet.planning.load`) for that
   demand: the prefill pool on TTFT (prefill service, queueing, KV transfer), the decode pool on
   TPOT, its batch limit and its KV cache, an aggregated pool on both. Measured concurrency and
   KV-cache usage give floors of their own (the decode pool must hold the sequences running
   now). As the mix shifts, each pool follows its own half of the work: prefill:decode rebalances.
3. Calibration and feedback. The planner plans against (target - weight x offset) /
   tightening. The offset is measured latency minus predicted latency at the replicas that
   served it (what the model misses for this workload; additive, so a fixed overhead the
   planner leaves out does not make more replicas look useful). The tightening is learned from
   attainment: a miss tightens the latency that missed (TTFT -> prefill or aggregated, TPOT ->
   decode or aggregated), with at least one replica more for the roles it concerns, once per
   cold start and only while the last lesson helped; it relaxes slowly while the target is met,
   and the count that answered the miss holds while the load that missed does
   (`miss_memory_s`), so attainment at the edge of its target does not cycle.
4. Scale-down stabilisation, as the HPA does: a role shrinks only to the highest recommendation
   of the last `scale_down_stabilization_s`, and only to a count that holds `scale_down_margin`
   more load (hysteresis), so steady load never oscillates. Calibration and tightening together
   never ask for more than `max_calibrated_growth` times the planner's own count.
5. Constraints, in one place: bounds, pins (the pinned count wins), GPU budget (given first to
   roles whose SLO is missed), never below one replica.

Stale or missing metrics hold the last decision.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.inference_service import InferenceServiceSpec, ReplicaBounds
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role, TopologyMode
from inferfleet.autoscale.snapshot import MetricsSnapshot, RoleMetrics
from inferfleet.planning.capacity import KV_TRANSFER_BYTES_PER_S, REFERENCE_REQUEST, Slo, Workload
from inferfleet.planning.load import OperatingPoint, operating_point
from inferfleet.planning.memory import kv_bytes_per_token, plan_memory
from inferfleet.planning.performance import (
    DEFAULT_EFFICIENCY,
    EfficiencyTerms,
    decode_step_seconds,
)
from inferfleet.planning.replica import ReplicaConfig

PREFILLING_ROLES = frozenset({Role.AGGREGATED, Role.PREFILL})
DECODING_ROLES = frozenset({Role.AGGREGATED, Role.DECODE})
_ROLE_ORDER = (Role.AGGREGATED, Role.PREFILL, Role.DECODE)


class Reason(StrEnum):
    """Why the policy chose what it chose (a condition/Event reason)."""

    SCALE_UP_LOAD = "ScaleUpLoad"
    """More load arrives, or is forecast within a cold start."""
    SCALE_UP_TTFT = "ScaleUpTtft"
    """Measured attainment below target, TTFT misses: more prefill (or aggregated) replicas."""
    SCALE_UP_TPOT = "ScaleUpTpot"
    """Measured attainment below target, TPOT misses: more decode (or aggregated) replicas."""
    REBALANCE = "Rebalance"
    """The prompt/output mix moved: one pool grows while the other shrinks."""
    SCALE_DOWN_STABLE = "ScaleDownStable"
    """Demand stayed lower for the whole stabilisation window."""
    STABILIZING = "HoldStabilizing"
    """Demand is lower, but not yet for the whole stabilisation window."""
    STEADY = "Steady"
    """The current replicas are what the load needs."""
    AT_MAX = "LimitedByMaxReplicas"
    """More replicas are needed than maxReplicas allows."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    """More replicas are needed than the GPU budget allows."""
    PINNED = "HoldPinned"
    """A pin fixes a role's replicas over the recommendation."""
    STALE_METRICS = "HoldStaleMetrics"
    """The newest metrics are too old to act on: the last decision holds."""
    NO_METRICS = "HoldNoMetrics"
    """No metrics at all: the last decision holds."""
    DISABLED = "AutoscalingDisabled"
    """autoscaling.policy is none: replicas come from the ModelDeployment."""


@dataclass(frozen=True)
class RolePolicy:
    """One pool the policy sizes: what a replica is, and how many there may be."""

    role: Role
    replica: ReplicaConfig
    min_replicas: int = 1
    max_replicas: int = 10

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"{self.role.value}: need 1 <= min_replicas <= max_replicas "
                f"(got {self.min_replicas}, {self.max_replicas})"
            )

    @property
    def gpus_per_replica(self) -> int:
        return self.replica.gpus


@dataclass(frozen=True)
class PolicySpec:
    """What the policy needs from the InferenceService (SLO, autoscaling) and the
    ModelDeployment (replica configuration, topology). Build it with `policy_spec`."""

    roles: tuple[RolePolicy, ...]
    """The aggregated pool, or the prefill and decode pools."""
    slo: Slo
    attainment_target: float = 0.99
    gpu_budget: int | None = None
    scale_down_stabilization_s: float = 300.0
    cold_start_s: float = 120.0
    enabled: bool = True
    expected_load: Workload | None = None
    """The mix to assume before any request has completed."""
    traffic_share: float = 1.0
    """Share of the service's traffic this deployment receives (its weight over the total)."""
    stale_after_s: float = 120.0
    """Metrics older than this are not acted on."""
    load_margin: float = 0.1
    """Pools are sized for this fraction more than the forecast load (burstiness above Poisson)."""
    scale_down_margin: float = 0.1
    """A pool shrinks only to a count that holds this fraction more load again (hysteresis)."""
    trend_tolerance: float = 0.15
    """A rising trend is acted on when it adds more than this fraction within a cold start."""
    max_trend_growth: float = 1.5
    """The forecast never exceeds this multiple of the current demand."""
    kv_target_usage: float = 0.85
    """Measured KV-cache usage above this asks for more replicas of the role."""
    feedback_gain: float = 1.15
    """Each attainment miss tightens the latency that missed by this factor."""
    max_tightening: float = 3.0
    tightening_half_life_s: float = 1800.0
    """How fast a tightening relaxes towards 1 while the attainment target is met."""
    calibrate: bool = True
    """Plan against the targets less the measured-minus-predicted latency (see
    PolicyHistory.calibration)."""
    calibration_limit: float = 0.5
    """The calibration offset stays within this fraction of its target, either way."""
    calibration_weight: float = 0.5
    """The share of the offset planned against: it is measured at p95 over a window that takes
    in bursts, and attainment feedback tightens further where that is not enough."""
    miss_memory_s: float = 1800.0
    """After a miss taught a lesson, the role keeps the count that answered it this long while
    the load stays (so the target is not lost again as soon as the lesson relaxes)."""
    max_calibrated_growth: float = 2.0
    """Calibration and tightening together never ask for more than this multiple of the
    planner's own count for the raw targets (a bound on what a wrong lesson can cost)."""
    min_requests_to_calibrate: float = 50.0
    """Completed requests in the rate window below which latency quantiles are too noisy."""
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY

    def __post_init__(self) -> None:
        names = [r.role for r in self.roles]
        if sorted(names) not in (sorted([Role.AGGREGATED]), sorted([Role.PREFILL, Role.DECODE])):
            raise ValueError(
                f"roles must be aggregated, or prefill and decode (got {[r.value for r in names]})"
            )
        if self.slo.ttft_p95_s is None and self.slo.tpot_p95_s is None:
            raise ValueError("the SLO needs a TTFT target, a TPOT target or both")
        if self.gpu_budget is not None and self.gpu_budget < 1:
            raise ValueError(f"gpu_budget must be >= 1 (got {self.gpu_budget})")
        if not 0 < self.traffic_share <= 1:
            raise ValueError(f"traffic_share must be in (0, 1] (got {self.traffic_share})")

    @property
    def disaggregated(self) -> bool:
        return any(r.role == Role.PREFILL for r in self.roles)

    def role(self, role: Role) -> RolePolicy:
        for policy in self.roles:
            if policy.role == role:
                return policy
        raise KeyError(role)

    @property
    def role_names(self) -> tuple[Role, ...]:
        return tuple(r for r in _ROLE_ORDER if any(p.role == r for p in self.roles))


def policy_spec(
    isvc_spec: InferenceServiceSpec,
    md_spec: ModelDeploymentSpec,
    catalog: GpuCatalog | None = None,
    *,
    traffic_share: float = 1.0,
) -> PolicySpec:
    """The policy's view of one ModelDeployment serving an InferenceService. With several
    deployments, `traffic_share` is this one's weight over the total."""
    replica = ReplicaConfig.from_spec(md_spec, catalog or GpuCatalog.builtin())
    autoscaling = isvc_spec.autoscaling

    def pool(role: Role, bounds: ReplicaBounds | None) -> RolePolicy:
        bounds = bounds or ReplicaBounds()
        return RolePolicy(role, replica, bounds.min_replicas, bounds.max_replicas)

    roles: tuple[RolePolicy, ...]
    if md_spec.topology.mode == TopologyMode.DISAGGREGATED:
        roles = (
            pool(Role.PREFILL, autoscaling.prefill),
            pool(Role.DECODE, autoscaling.decode),
        )
    else:
        roles = (pool(Role.AGGREGATED, autoscaling.aggregated),)
    slo = isvc_spec.slo
    load = isvc_spec.expected_load
    return PolicySpec(
        roles=roles,
        slo=Slo(
            ttft_p95_s=None if slo.ttft_p95_ms is None else slo.ttft_p95_ms / 1e3,
            tpot_p95_s=None if slo.tpot_p95_ms is None else slo.tpot_p95_ms / 1e3,
        ),
        attainment_target=slo.attainment_target,
        gpu_budget=autoscaling.gpu_budget,
        scale_down_stabilization_s=float(autoscaling.scale_down_stabilization_seconds),
        cold_start_s=float(autoscaling.cold_start_seconds),
        enabled=autoscaling.policy == "goodput",
        expected_load=None
        if load is None
        else Workload(load.requests_per_second, load.input_tokens, load.output_tokens),
        traffic_share=traffic_share,
    )


# --- History: what the caller stores between ticks (an annotation on the InferenceService).


@dataclass(frozen=True)
class Recommendation:
    """A tick's recommendation before constraints, kept for scale-down stabilisation."""

    at_s: float
    replicas: Mapping[Role, int]


@dataclass(frozen=True)
class DemandSample:
    """A tick's demand estimate, kept for the trend."""

    at_s: float
    requests_per_s: float
    in_flight_requests: float


@dataclass(frozen=True)
class MissFloor:
    """After a miss: the count that answered it, at what load, until when."""

    replicas: int
    requests_per_s: float
    until_s: float


@dataclass(frozen=True)
class LastDecision:
    at_s: float
    replicas: Mapping[Role, int]
    reason: Reason


@dataclass(frozen=True)
class LatencyFactors:
    """One factor per latency target; the planner plans against target / factor."""

    ttft: float = 1.0
    tpot: float = 1.0

    def to_wire(self) -> dict[str, float]:
        return {"ttft": self.ttft, "tpot": self.tpot}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> LatencyFactors:
        return cls(float(data.get("ttft", 1.0)), float(data.get("tpot", 1.0)))


@dataclass(frozen=True)
class LatencyOffsets:
    """Measured minus predicted latency, seconds, per target."""

    ttft_s: float = 0.0
    tpot_s: float = 0.0

    def to_wire(self) -> dict[str, float]:
        return {"ttftS": self.ttft_s, "tpotS": self.tpot_s}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> LatencyOffsets:
        return cls(float(data.get("ttftS", 0.0)), float(data.get("tpotS", 0.0)))


def planning_slo(spec: PolicySpec, offsets: LatencyOffsets, tightening: LatencyFactors) -> Slo:
    """The targets the planner plans against: each less (a share of) what the model misses,
    then tightened by what attainment taught."""
    slo, weight = spec.slo, spec.calibration_weight

    def target(value: float | None, offset: float, factor: float) -> float | None:
        return None if value is None else (value - weight * offset) / factor

    return Slo(
        ttft_p95_s=target(slo.ttft_p95_s, offsets.ttft_s, tightening.ttft),
        tpot_p95_s=target(slo.tpot_p95_s, offsets.tpot_s, tightening.tpot),
    )


@dataclass(frozen=True)
class PolicyHistory:
    """Small and immutable: recent recommendations and demand, when each role last grew, what
    the policy learned about latency, and the last decision taken on fresh metrics."""

    recommendations: tuple[Recommendation, ...] = ()
    demand: tuple[DemandSample, ...] = ()
    last_scale_up_s: Mapping[Role, float] = field(default_factory=dict)
    calibration: LatencyOffsets = LatencyOffsets()
    """Measured latency minus the planner's prediction at the running fleet (moving average):
    a model optimistic for this workload is corrected before attainment suffers, and a
    pessimistic one stops holding GPUs it does not need."""
    tightening: LatencyFactors = LatencyFactors()
    """Learned from attainment misses: how far below its target a latency must be planned for
    the attainment target to hold (the tail beyond the quantile measured)."""
    tightened_at_s: float | None = None
    attainment_when_tightened: float | None = None
    """The attainment that taught the last lesson: the next one needs it to have improved."""
    miss_floors: Mapping[Role, MissFloor] = field(default_factory=dict)
    last_decision: LastDecision | None = None

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON-able data (camelCase), for an annotation."""

        def counts(replicas: Mapping[Role, int]) -> dict[str, int]:
            return {role.value: n for role, n in sorted(replicas.items())}

        last = self.last_decision
        return {
            "recommendations": [
                {"atS": r.at_s, "replicas": counts(r.replicas)} for r in self.recommendations
            ],
            "demand": [
                {"atS": d.at_s, "requestsPerS": d.requests_per_s, "inFlight": d.in_flight_requests}
                for d in self.demand
            ],
            "lastScaleUpS": {role.value: t for role, t in sorted(self.last_scale_up_s.items())},
            "calibration": self.calibration.to_wire(),
            "tightening": self.tightening.to_wire(),
            "tightenedAtS": self.tightened_at_s,
            "attainmentWhenTightened": self.attainment_when_tightened,
            "missFloors": {
                role.value: {
                    "replicas": f.replicas,
                    "requestsPerS": f.requests_per_s,
                    "untilS": f.until_s,
                }
                for role, f in sorted(self.miss_floors.items())
            },
            "lastDecision": None
            if last is None
            else {"atS": last.at_s, "replicas": counts(last.replicas), "reason": last.reason.value},
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PolicyHistory:
        """The inverse of `to_wire`; raises ValueError (or KeyError/TypeError) on bad data."""

        def counts(raw: Mapping[str, Any]) -> dict[Role, int]:
            return {Role(role): int(n) for role, n in raw.items()}

        last = data.get("lastDecision")
        tightened = data.get("tightenedAtS")
        taught = data.get("attainmentWhenTightened")
        return cls(
            recommendations=tuple(
                Recommendation(float(r["atS"]), counts(r["replicas"]))
                for r in data.get("recommendations", [])
            ),
            demand=tuple(
                DemandSample(float(d["atS"]), float(d["requestsPerS"]), float(d["inFlight"]))
                for d in data.get("demand", [])
            ),
            last_scale_up_s={Role(r): float(t) for r, t in data.get("lastScaleUpS", {}).items()},
            calibration=LatencyOffsets.from_wire(data.get("calibration", {})),
            tightening=LatencyFactors.from_wire(data.get("tightening", {})),
            tightened_at_s=None if tightened is None else float(tightened),
            attainment_when_tightened=None if taught is None else float(taught),
            miss_floors={
                Role(role): MissFloor(
                    int(f["replicas"]), float(f["requestsPerS"]), float(f["untilS"])
                )
                for role, f in data.get("missFloors", {}).items()
            },
            last_decision=None
            if last is None
            else LastDecision(float(last["atS"]), counts(last["replicas"]), Reason(last["reason"])),
        )


# --- The decision.


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


@dataclass(frozen=True)
class Decision:
    replicas: Mapping[Role, int]
    reason: Reason
    message: str
    """In words: the inputs and the predicted effect of each change."""
    history: PolicyHistory
    """What the caller stores and passes to the next tick."""
    estimates: Mapping[Role, RoleEstimate] = field(default_factory=dict)


@dataclass(frozen=True)
class _Demand:
    requests_per_s: float
    """Arriving now (for this deployment)."""
    forecast_requests_per_s: float
    """Expected at now + cold start."""
    input_tokens: int
    output_tokens: int
    backlog_requests: float
    growth: float
    """How much the trend alone grows the load within a cold start (1: no trend)."""


@dataclass(frozen=True)
class _Sizing:
    needed: int
    feasible: bool
    why: str


def _role_metrics(snapshot: MetricsSnapshot, role: Role) -> RoleMetrics:
    return snapshot.roles.get(role) or RoleMetrics(role, 0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _mean_tokens(
    router_mean: float | None, engine_tokens_per_s: float, requests_per_s: float, fallback: int
) -> int:
    if router_mean is not None and router_mean >= 1:
        return round(router_mean)
    if requests_per_s > 0 and engine_tokens_per_s > 0:
        return max(1, round(engine_tokens_per_s / requests_per_s))
    return fallback


def _trend_slope(samples: Iterable[DemandSample]) -> float:
    """Least-squares slope of requests/s over time (0 with fewer than three samples)."""
    points = [(s.at_s, s.requests_per_s) for s in samples]
    if len(points) < 3:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread <= 0:
        return 0.0
    return sum((t - mean_t) * (r - mean_r) for t, r in points) / spread


# Increments in a row that make a ramp: one rise is a step or noise, three are a trend.
_RISING_INCREMENTS = 3


def _sustained_rise(samples: list[DemandSample]) -> float:
    """Requests/s gained per second by a load that keeps rising: the least-squares slope over
    the samples, when the last `_RISING_INCREMENTS` increments are all rises, and never more per
    second than the rise seen across the samples (a step is not a ramp, a plateau not a
    trend)."""
    if len(samples) <= _RISING_INCREMENTS:
        return 0.0
    tail = [s.requests_per_s for s in samples[-_RISING_INCREMENTS - 1 :]]
    if not all(later > earlier for earlier, later in itertools.pairwise(tail)):
        return 0.0
    last = samples[-1]
    slope = _trend_slope(samples)
    span_s = last.at_s - samples[0].at_s
    seen = (last.requests_per_s - samples[0].requests_per_s) / span_s if span_s > 0 else 0.0
    return max(0.0, min(slope, seen))


def _demand(spec: PolicySpec, snapshot: MetricsSnapshot, history: PolicyHistory) -> _Demand:
    service = snapshot.service
    share = spec.traffic_share
    prefill_role = Role.PREFILL if spec.disaggregated else Role.AGGREGATED
    decode_role = Role.DECODE if spec.disaggregated else Role.AGGREGATED
    prefill = _role_metrics(snapshot, prefill_role)
    decode = _role_metrics(snapshot, decode_role)
    fallback = spec.expected_load or REFERENCE_REQUEST
    completed = service.requests_per_s * share
    input_tokens = _mean_tokens(
        service.mean_prompt_tokens, prefill.prompt_tokens_per_s, completed, fallback.input_tokens
    )
    output_tokens = _mean_tokens(
        service.mean_output_tokens,
        decode.generation_tokens_per_s,
        completed,
        fallback.output_tokens,
    )
    # Completions lag arrivals when the fleet falls behind: what piles up in flight also arrived.
    # Measured against a sample at least a rate window old, as noisy as the rates themselves.
    in_flight = service.in_flight_requests * share
    baseline = next(
        (s for s in reversed(history.demand) if s.at_s <= snapshot.taken_at_s - snapshot.window_s),
        None,
    )
    growing = 0.0
    if baseline is not None:
        growing = max(
            0.0, (in_flight - baseline.in_flight_requests) / (snapshot.taken_at_s - baseline.at_s)
        )
    arriving = max(completed + growing, prefill.prompt_tokens_per_s / input_tokens)
    # Queued requests are drained by the replicas that start within a cold start.
    backlog = prefill.waiting_requests + (decode.waiting_requests if spec.disaggregated else 0.0)
    drain_s = max(spec.cold_start_s, snapshot.window_s)
    current = arriving + backlog / drain_s

    window_start = snapshot.taken_at_s - _trend_window_s(spec, snapshot)
    recent = [
        *(s for s in history.demand if window_start <= s.at_s < snapshot.taken_at_s),
        DemandSample(snapshot.taken_at_s, arriving, 0.0),
    ]
    # A replica ordered now serves after a cold start: project the trend that far.
    rise = _sustained_rise(recent) * spec.cold_start_s
    forecast, growth = current, 1.0
    if current > 0 and rise > spec.trend_tolerance * current:
        growth = min(1 + rise / current, spec.max_trend_growth)
        forecast = current * growth
    return _Demand(
        requests_per_s=arriving,
        forecast_requests_per_s=forecast,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        backlog_requests=backlog,
        growth=growth,
    )


def _trend_window_s(spec: PolicySpec, snapshot: MetricsSnapshot) -> float:
    return max(spec.cold_start_s, 2 * snapshot.window_s, 60.0)


def _meets(point: OperatingPoint, slo: Slo, extra_ttft_s: float = 0.0) -> bool:
    if not point.stable:
        return False
    if slo.ttft_p95_s is not None and point.ttft_p95_s + extra_ttft_s > slo.ttft_p95_s:
        return False
    return slo.tpot_p95_s is None or point.tpot_s <= slo.tpot_p95_s


# Per-replica rates are rounded up to a geometric grid (0.5% apart) before the planner sees
# them: a noisy load then reuses cached operating points, and rounding up only errs towards
# more capacity.
_RATE_GRID = 1.005


@functools.lru_cache(maxsize=8192)
def _cached_point(
    config: ReplicaConfig,
    *,
    grid_index: int,
    input_tokens: int,
    output_tokens: int,
    efficiency: EfficiencyTerms,
    role: Role,
) -> OperatingPoint:
    return operating_point(
        config,
        _RATE_GRID**grid_index,
        input_tokens,
        output_tokens,
        efficiency=efficiency,
        prefill=role in PREFILLING_ROLES,
        decode=role in DECODING_ROLES,
    )


def _point(
    spec: PolicySpec, policy: RolePolicy, rate: float, count: int, demand: _Demand
) -> OperatingPoint:
    """One replica's operating point when `count` replicas share `rate` req/s."""
    per_replica = rate / max(count, 1)
    if per_replica <= 0:
        return operating_point(
            policy.replica,
            0.0,
            demand.input_tokens,
            demand.output_tokens,
            efficiency=spec.efficiency,
            prefill=policy.role in PREFILLING_ROLES,
            decode=policy.role in DECODING_ROLES,
        )
    grid_index = math.ceil(math.log(per_replica) / math.log(_RATE_GRID) - 1e-9)
    return _cached_point(
        policy.replica,
        grid_index=grid_index,
        input_tokens=demand.input_tokens,
        output_tokens=demand.output_tokens,
        efficiency=spec.efficiency,
        role=policy.role,
    )


def _role_slo(slo: Slo, role: Role) -> Slo:
    """The targets a pool answers for: a prefill pool has no TPOT, a decode pool no TTFT."""
    if role == Role.PREFILL:
        return Slo(ttft_p95_s=slo.ttft_p95_s)
    if role == Role.DECODE:
        return Slo(tpot_p95_s=slo.tpot_p95_s)
    return slo


def _transfer_s(spec: PolicySpec, policy: RolePolicy, demand: _Demand) -> float:
    """The KV hand-off to the decode pool counts against the prefill pool's TTFT."""
    if policy.role != Role.PREFILL:
        return 0.0
    return demand.input_tokens * kv_bytes_per_token(policy.replica) / KV_TRANSFER_BYTES_PER_S


def _fewest_meeting(
    spec: PolicySpec,
    policy: RolePolicy,
    *,
    rate: float,
    demand: _Demand,
    slo: Slo,
    hint: int,
) -> int:
    """Fewest replicas (up to max_replicas + 1, meaning 'not enough') that hold the role's SLO
    at `rate` req/s. The search gallops from `hint` (the current count: under a steady load the
    answer is there, and two planner calls confirm it), then bisects."""
    if rate <= 0:
        return 1
    slo = _role_slo(slo, policy.role)
    extra = _transfer_s(spec, policy, demand)
    limit = policy.max_replicas + 1

    def meets(count: int) -> bool:
        return _meets(_point(spec, policy, rate, count, demand), slo, extra)

    start = min(max(hint, 1), limit)
    step = 1
    if meets(start):
        # Invariant: `high` meets, `low` does not (zero replicas never meet).
        high, low = start, start - 1
        while low > 0 and meets(low):
            high, step = low, step * 2
            low = max(0, high - step)
    else:
        low, high = start, min(limit, start + 1)
        while not meets(high):
            if high >= limit:
                return limit
            low, step = high, step * 2
            high = min(limit, high + step)
    while high - low > 1:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


def _sequences_per_replica(spec: PolicySpec, policy: RolePolicy, demand: _Demand, slo: Slo) -> int:
    """Sequences one replica holds at once within its KV cache (whole contexts reserved, as a
    no-eviction scheduler does), its batch limit and the TPOT target of a decode step."""
    config = policy.replica
    context = demand.input_tokens + demand.output_tokens
    slots = max(1, min(config.max_sequences, plan_memory(config).kv_capacity_tokens // context))
    target = slo.tpot_p95_s
    mean_context = demand.input_tokens + demand.output_tokens / 2

    def within_tpot(batch: int) -> bool:
        step = decode_step_seconds(config, batch, mean_context, spec.efficiency)
        return target is None or step <= target

    if within_tpot(slots):
        return slots
    low, high = 0, slots
    while high - low > 1:
        middle = (low + high) // 2
        if within_tpot(middle):
            low = middle
        else:
            high = middle
    return max(1, low)


def _size_role(
    spec: PolicySpec,
    policy: RolePolicy,
    *,
    demand: _Demand,
    metrics: RoleMetrics,
    slo: Slo,
    margin: float,
) -> _Sizing:
    """Replicas the forecast load needs: the planner's count for the SLO it is planned against
    (the targets over the calibration), and floors from the sequences and KV cache in use."""
    rate = demand.forecast_requests_per_s * (1 + margin)
    hint = max(1, metrics.ready_replicas)
    by_model = _fewest_meeting(spec, policy, rate=rate, demand=demand, slo=slo, hint=hint)
    if slo != spec.slo:
        planner_own = _fewest_meeting(
            spec, policy, rate=rate, demand=demand, slo=spec.slo, hint=hint
        )
        by_model = min(by_model, math.ceil(planner_own * spec.max_calibrated_growth))
    why = f"{rate:.3g} req/s of {demand.input_tokens}/{demand.output_tokens} tokens"
    needed = by_model
    if policy.role in DECODING_ROLES:
        # The sequences running and queued now, grown as the load is, must fit somewhere.
        sequences = (metrics.running_requests + metrics.waiting_requests) * demand.growth
        by_concurrency = math.ceil(
            sequences / _sequences_per_replica(spec, policy, demand, slo) - 1e-9
        )
        if by_concurrency > needed:
            needed = by_concurrency
            why = f"{sequences:.0f} sequences running or queued"
    if metrics.ready_replicas > 0 and metrics.kv_cache_usage > spec.kv_target_usage:
        by_kv = math.ceil(
            metrics.ready_replicas * metrics.kv_cache_usage / spec.kv_target_usage - 1e-9
        )
        if by_kv > needed:
            needed = by_kv
            why = f"KV cache {metrics.kv_cache_usage:.0%} full on {metrics.ready_replicas} replicas"
    feasible = needed <= policy.max_replicas
    return _Sizing(max(1, needed), feasible, why)


def _observed_latency(spec: PolicySpec, p95: float | None, p99: float | None) -> float | None:
    """The measured latency at the quantile the attainment target is judged at (p99 when the
    target asks for 99% and the router reports it), else p95."""
    if spec.attainment_target >= 0.99 and p99 is not None:
        return p99
    return p95


def _calibrate(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    history: PolicyHistory,
    demand: _Demand,
) -> LatencyOffsets:
    """Update the calibration from this snapshot: the latencies measured over the window
    against the planner's prediction for the replicas that served them (the ready ones) at the
    measured load. Skipped when too few requests completed, when the planner sees that fleet
    overloaded (a backlog drains; no steady state to compare with), and while replicas that
    were asked for join (the window mixes two fleets)."""
    previous = history.calibration
    service = snapshot.service
    now = snapshot.taken_at_s
    completed = service.requests_per_s * spec.traffic_share * snapshot.window_s
    ready = {r: _role_metrics(snapshot, r).ready_replicas for r in spec.role_names}
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

    def blend(
        old: float, measured: float | None, predicted: float | None, target: float | None
    ) -> float:
        if measured is None or predicted is None or target is None:
            return old
        if not math.isfinite(predicted):
            return old
        limit = spec.calibration_limit * target
        offset = min(limit, max(-limit, measured - predicted))
        return old + weight * (offset - old)

    ttft_predicted: float | None = None
    tpot_predicted: float | None = None
    for role in spec.role_names:
        policy = spec.role(role)
        point = _point(spec, policy, demand.requests_per_s, ready[role], demand)
        if not point.stable:
            return previous
        if role in PREFILLING_ROLES:
            ttft_predicted = point.ttft_p95_s + _transfer_s(spec, policy, demand)
        if role in DECODING_ROLES:
            tpot_predicted = point.tpot_s
    return LatencyOffsets(
        ttft_s=blend(
            previous.ttft_s,
            _observed_latency(spec, service.ttft_p95_s, service.ttft_p99_s),
            ttft_predicted,
            spec.slo.ttft_p95_s,
        ),
        tpot_s=blend(
            previous.tpot_s,
            _observed_latency(spec, service.tpot_p95_s, service.tpot_p99_s),
            tpot_predicted,
            spec.slo.tpot_p95_s,
        ),
    )


@dataclass(frozen=True)
class _Feedback:
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


def _feedback(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    current: Mapping[Role, int],
    history: PolicyHistory,
) -> _Feedback:
    service = snapshot.service
    attainment = service.attainment
    previous = history.tightening
    if attainment is None or attainment >= spec.attainment_target:
        elapsed = snapshot.taken_at_s - (
            history.last_decision.at_s if history.last_decision else snapshot.taken_at_s
        )
        relaxed = previous
        if attainment is not None:
            relaxed = LatencyFactors(
                _decayed(spec, previous.ttft, elapsed), _decayed(spec, previous.tpot, elapsed)
            )
        return _Feedback(frozenset(), relaxed, None, None, "")

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
        _role_metrics(snapshot, r).ready_replicas >= current.get(r, 0) for r in spec.role_names
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
        f"(p95 TTFT {_ms(service.ttft_p95_s)} of {_ms(spec.slo.ttft_p95_s)}, "
        f"p95 TPOT {_ms(service.tpot_p95_s)} of {_ms(spec.slo.tpot_p95_s)})"
    )
    return _Feedback(missed, previous, lesson, reason, note)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def _stabilised(
    spec: PolicySpec,
    role: Role,
    recommended: int,
    current: int,
    window: Iterable[Recommendation],
) -> int:
    """A role shrinks only to the highest recommendation within the stabilisation window."""
    if recommended >= current:
        return recommended
    highest = max((r.replicas.get(role, recommended) for r in window), default=recommended)
    return min(current, max(recommended, highest))


@dataclass(frozen=True)
class _Constrained:
    replicas: dict[Role, int]
    pinned: frozenset[Role]
    """Pinned roles whose pin overrode the recommendation."""
    budget_cut: frozenset[Role]
    max_cut: frozenset[Role]


def _constrain(
    spec: PolicySpec,
    wanted: Mapping[Role, int],
    pins: Mapping[Role, int],
    priority: frozenset[Role],
) -> _Constrained:
    """Every constraint, in one place: bounds, pins, the GPU budget, at least one replica."""
    replicas: dict[Role, int] = {}
    max_cut: set[Role] = set()
    pinned: set[Role] = set()
    for policy in spec.roles:
        role = policy.role
        want = wanted.get(role, policy.min_replicas)
        if role in pins:
            replicas[role] = pins[role]
            if pins[role] != max(1, min(want, policy.max_replicas)):
                pinned.add(role)
            continue
        if want > policy.max_replicas:
            max_cut.add(role)
        replicas[role] = max(1, policy.min_replicas, min(want, policy.max_replicas))

    budget_cut: set[Role] = set()
    if spec.gpu_budget is not None:
        budget_cut = _fit_budget(spec, replicas, pins, priority)
    return _Constrained(replicas, frozenset(pinned), frozenset(budget_cut), frozenset(max_cut))


def _fit_budget(
    spec: PolicySpec, replicas: dict[Role, int], pins: Mapping[Role, int], priority: frozenset[Role]
) -> set[Role]:
    """Cut unpinned roles to the budget, in place: each keeps its minReplicas (one replica when
    even those exceed the budget), then the roles whose SLO is missed are filled first, the rest
    after, evenly by the share of their want."""
    assert spec.gpu_budget is not None
    gpus = {p.role: p.gpus_per_replica for p in spec.roles}
    if sum(replicas[r] * gpus[r] for r in replicas) <= spec.gpu_budget:
        return set()
    wanted = dict(replicas)
    free = [r for r in spec.role_names if r not in pins]
    pinned_gpus = sum(replicas[r] * gpus[r] for r in replicas if r in pins)
    # minReplicas holds while the budget has room for it; one replica per role always does.
    minimums = {r: spec.role(r).min_replicas for r in free}
    fits_minimums = pinned_gpus + sum(minimums[r] * gpus[r] for r in free) <= spec.gpu_budget
    for role in free:
        replicas[role] = min(wanted[role], minimums[role]) if fits_minimums else 1
    left = spec.gpu_budget - sum(replicas[r] * gpus[r] for r in replicas)
    for tier in ([r for r in free if r in priority], [r for r in free if r not in priority]):
        while True:
            growable = [r for r in tier if replicas[r] < wanted[r] and gpus[r] <= left]
            if not growable:
                break
            role = min(growable, key=lambda r: (replicas[r] / wanted[r], _ROLE_ORDER.index(r)))
            replicas[role] += 1
            left -= gpus[role]
    return {r for r in free if replicas[r] < wanted[r]}


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
    constrained = _constrain(spec, held, pins, frozenset())
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
    demand = _demand(spec, snapshot, history)
    feedback = _feedback(spec, snapshot, current_counts, history)
    calibration = _calibrate(spec, snapshot, current_counts, history, demand)
    tightening = feedback.tightening

    def size(role: Role, extra_margin: float = 0.0) -> _Sizing:
        return _size_role(
            spec,
            spec.role(role),
            demand=demand,
            metrics=_role_metrics(snapshot, role),
            slo=planning_slo(spec, calibration, tightening),
            margin=spec.load_margin + extra_margin,
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
    # Hysteresis: a pool shrinks only to a count that would hold a little more load than it is
    # sized for, so a load at the edge between two counts does not flip between them.
    for role in roles:
        if sizings[role].needed < current_counts[role]:
            shrunk = size(role, spec.scale_down_margin)
            held = _Sizing(current_counts[role], shrunk.feasible, shrunk.why)
            sizings[role] = shrunk if shrunk.needed < current_counts[role] else held

    # A count that answered a miss holds while the load that missed does.
    floors = {
        role: floor
        for role, floor in history.miss_floors.items()
        if floor.until_s > now and role in roles
    } | {
        role: MissFloor(current_counts[role] + 1, demand.requests_per_s, now + spec.miss_memory_s)
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
    recommended: dict[Role, int] = {}
    for role in roles:
        want = sizings[role].needed
        if role in learned:
            want = max(want, current_counts[role] + 1)
        if role in feedback.missed:
            want = max(want, current_counts[role])
        want = max(want, holding.get(role, 0))
        raw[role] = want
        recommended[role] = _stabilised(spec, role, want, current_counts[role], past)

    constrained = _constrain(spec, recommended, pins, feedback.missed)
    replicas = constrained.replicas

    grew = {r for r in roles if replicas[r] > current_counts[r]}
    shrank = {r for r in roles if replicas[r] < current_counts[r]}
    held_down = {r for r in roles if raw[r] < current_counts[r] and r not in shrank}
    reason = _reason(
        feedback,
        constrained=constrained,
        grew=grew,
        shrank=shrank,
        held_down=held_down,
        learned=learned,
    )

    estimates = {
        role: _estimate(
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
    message = _message(
        spec,
        demand=demand,
        current=current_counts,
        replicas=replicas,
        sizings=sizings,
        estimates=estimates,
        feedback=feedback,
        constrained=constrained,
        pins=pins,
    )
    last_scale_up = dict(history.last_scale_up_s) | dict.fromkeys(grew, now)
    in_flight = snapshot.service.in_flight_requests * spec.traffic_share
    keep_after = now - max(spec.scale_down_stabilization_s, _trend_window_s(spec, snapshot))
    new_history = PolicyHistory(
        recommendations=(
            *past,
            Recommendation(now, raw),
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
    )
    return Decision(dict(replicas), reason, message, new_history, estimates)


def _estimate(
    spec: PolicySpec,
    policy: RolePolicy,
    *,
    demand: _Demand,
    sizing: _Sizing,
    recommended: int,
    count: int,
    calibration: LatencyOffsets,
) -> RoleEstimate:
    rate = demand.forecast_requests_per_s
    point = _point(spec, policy, rate, count, demand) if rate > 0 else None
    ttft = tpot = None
    if point is not None and point.stable:
        if policy.role in PREFILLING_ROLES:
            ttft = point.ttft_p95_s + _transfer_s(spec, policy, demand) + calibration.ttft_s
        if policy.role in DECODING_ROLES:
            tpot = point.tpot_s + calibration.tpot_s
    return RoleEstimate(
        role=policy.role,
        needed=sizing.needed,
        recommended=recommended,
        predicted=point,
        feasible=sizing.feasible,
        predicted_ttft_s=ttft,
        predicted_tpot_s=tpot,
    )


def _reason(
    feedback: _Feedback,
    *,
    constrained: _Constrained,
    grew: set[Role],
    shrank: set[Role],
    held_down: set[Role],
    learned: frozenset[Role],
) -> Reason:
    if constrained.pinned:
        return Reason.PINNED
    if constrained.budget_cut:
        return Reason.BUDGET_EXHAUSTED
    if constrained.max_cut:
        return Reason.AT_MAX
    if grew and feedback.reason is not None and grew & (learned | feedback.missed):
        return feedback.reason
    if grew and (shrank or held_down):
        return Reason.REBALANCE
    if grew:
        return Reason.SCALE_UP_LOAD
    if shrank:
        return Reason.SCALE_DOWN_STABLE
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


def _message(
    spec: PolicySpec,
    *,
    demand: _Demand,
    current: Mapping[Role, int],
    replicas: Mapping[Role, int],
    sizings: Mapping[Role, _Sizing],
    estimates: Mapping[Role, RoleEstimate],
    feedback: _Feedback,
    constrained: _Constrained,
    pins: Mapping[Role, int],
) -> str:
    arriving = demand.requests_per_s
    load = (
        f"{arriving:.3g} req/s arriving ({_tokens(arriving * demand.input_tokens)} prompt tok/s, "
        f"{demand.input_tokens}/{demand.output_tokens} tokens)"
    )
    if demand.forecast_requests_per_s > arriving * (1 + 1e-9):
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
        if role in constrained.budget_cut:
            detail += f" (GPU budget {spec.gpu_budget} exhausted)"
        parts.append(detail)
    if feedback.note:
        parts.append(feedback.note)
    return "; ".join(parts)
