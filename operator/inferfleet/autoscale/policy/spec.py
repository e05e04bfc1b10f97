"""What the policy sizes: the pools, the SLO and the knobs, from the InferenceService and
the ModelDeployment (`policy_spec`); and the reasons it gives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.inference_service import InferenceServiceSpec, ReplicaBounds
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role, TopologyMode
from inferfleet.planning.capacity import Workload
from inferfleet.planning.coldstart import estimate_cold_start
from inferfleet.planning.performance import DEFAULT_EFFICIENCY, EfficiencyTerms
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.slo import Slo

PREFILLING_ROLES = frozenset({Role.AGGREGATED, Role.PREFILL})
DECODING_ROLES = frozenset({Role.AGGREGATED, Role.DECODE})
ROLE_ORDER = (Role.AGGREGATED, Role.PREFILL, Role.DECODE)


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
    SCALE_DOWN_FORECASTS_HELD = "ScaleDownForecastsHeld"
    """Demand stayed lower for one rate window, and over the whole stabilisation window every
    forecast covered the load that came and the SLO was met (`shorten_stabilization`)."""
    STABILIZING = "HoldStabilizing"
    """Demand is lower, but not yet for the whole stabilisation window."""
    STEADY = "Steady"
    """The current replicas are what the load needs."""
    AT_MAX = "LimitedByMaxReplicas"
    """More replicas are needed than maxReplicas allows."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    """More replicas are needed than the GPU budget allows."""
    QUOTA_EXHAUSTED = "QuotaExhausted"
    """More replicas are needed than the namespace's GPU quota leaves."""
    PINNED = "HoldPinned"
    """A pin fixes a role's replicas over the recommendation."""
    STALE_METRICS = "HoldStaleMetrics"
    """The newest metrics are too old to act on: the last decision holds."""
    NO_METRICS = "HoldNoMetrics"
    """No metrics at all: the last decision holds."""
    DISABLED = "AutoscalingDisabled"
    """autoscaling.policy is none: replicas come from the ModelDeployment."""
    SCALE_TO_ZERO = "ScaleToZeroIdle"
    """No request for the idle period: every pool to zero (`policy.idle`)."""
    IDLE_AT_ZERO = "HoldAtZero"
    """At zero replicas and no request arriving."""
    WAKE_FROM_ZERO = "WakeFromZero"
    """Requests arrived at zero replicas: every pool ordered back."""


@dataclass(frozen=True)
class RolePolicy:
    """One pool the policy sizes: what a replica is, and how many there may be."""

    role: Role
    replica: ReplicaConfig
    min_replicas: int = 1
    max_replicas: int = 10

    def __post_init__(self) -> None:
        if not (0 <= self.min_replicas <= self.max_replicas and self.max_replicas >= 1):
            raise ValueError(
                f"{self.role.value}: need 0 <= min_replicas <= max_replicas, max_replicas >= 1 "
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
    """The targets and the share of requests that should meet them."""
    gpu_budget: int | None = None
    gpu_quota: int | None = None
    """GPUs the namespace's ResourceQuota leaves this deployment: what its pods hold and what
    no pod holds yet. None: no quota on GPUs."""
    quota_yields_to: str = ""
    """In words, the other services' claims on the quota served before this one
    (`autoscale.quota`): what the explanation of a cut names."""
    scale_down_stabilization_s: float = 300.0
    shorten_stabilization: bool = True
    """Whether a pool may shrink after one rate window, not a whole stabilisation window, while
    the forecasts have held (`constraints.forecasts_held`)."""
    cold_start_s: float = 120.0
    """The configured cold start, or where none is, the one estimated from the weights' source
    and size (`planning.coldstart`); the policy plans with the measured one where they differ
    by more than `cold_start_tolerance` (`policy.coldstart`)."""
    cold_start_estimated: bool = False
    """Whether `cold_start_s` is the estimate (the service configures none)."""
    cold_start_tolerance: float = 0.25
    """How far, as a fraction of the configured cold start, a measured one may lie before it
    replaces it: the loop sees a replica serving up to a tick and a scrape late (15 s each by
    default, a quarter of the 120 s default)."""
    wake_timeout_s: float = 600.0
    """How long the router holds a request that arrives at zero replicas."""
    idle_before_zero_s: float = 600.0
    """How long no request may reach a service whose pools all allow zero replicas before
    they go to zero (`policy.idle`)."""
    enabled: bool = True
    expected_load: Workload | None = None
    """The mix to assume before any request has completed."""
    traffic_share: float = 1.0
    """Share of the service's traffic this deployment receives (its weight over the total)."""
    stale_after_s: float = 120.0
    """Metrics older than this are not acted on."""
    load_margin: float = 0.0
    """A fixed fraction of load sized for on top of the forecast; 0 by default: headroom
    comes from the growth measured within a cold start (`growth_quantile`) and the tail from
    the calibration at the planned attainment's quantile."""
    scale_down_margin: float = 0.1
    """A pool shrinks only to a count that holds this fraction more load again (hysteresis)."""
    backlog_drain_s: float = 30.0
    """Requests queued in the engines are sized to drain within this long: every arrival waits
    behind them meanwhile."""
    mix_memory_s: float = 300.0
    """How long the prompt/output lengths are remembered (an exponential average)."""
    trend_tolerance: float = 0.15
    """A rising trend is acted on when it adds more than this fraction within a cold start."""
    max_trend_growth: float = 1.2
    """The forecast never exceeds this multiple of the current demand."""
    growth_memory_s: float = 1800.0
    """How far back the demand's growth within a cold start is measured (see
    `growth_quantile`)."""
    growth_quantile: float = 0.9
    """The fleet holds headroom for this quantile of the growth the demand showed within a
    cold start over `growth_memory_s`: a replica ordered now serves only after one, and how
    fast this load moves is measured, not assumed."""
    min_growth_samples: int = 8
    """Growth measurements (pairs of ticks a cold start apart) below which no headroom is
    held for it (a trend is still acted on)."""
    burst_memory_s: float = 600.0
    """How far back the bursts the fleet holds capacity for are replayed (`burst_capacity`)."""
    burst_miss_share: float = 0.5
    """Share of the attainment target's miss budget that arrivals waiting out a burst may use."""
    burst_slack: float = 0.25
    """How much more than the rate it was sized for a pool serves before its queue grows: the
    planner sizes for a p95 TTFT within target, well short of saturation, and rounds up."""
    kv_target_usage: float = 0.85
    """Measured KV-cache usage above this asks for more replicas of the role."""
    feedback_gain: float = 1.15
    """Each attainment miss the model did not explain multiplies the load that the pools
    sized on the latency that missed are planned for by this factor."""
    lesson_gain: float = 2.0
    """A lesson adds this multiple of the attainment shortfall, as a share of the replicas
    running (at least one replica): 0.5 below target on 10 replicas adds 10."""
    max_tightening: float = 3.0
    """The most a lesson multiplies the load by."""
    tightening_half_life_s: float = 600.0
    """How fast a lesson's load factor relaxes towards 1 while the attainment target is met."""
    calibrate: bool = True
    """Plan against the targets corrected by what the planner misses (see
    PolicyHistory.calibration)."""
    ttft_offset_limit: float = 0.5
    """The TTFT calibration offset stays within this fraction of the TTFT target, either way."""
    tpot_ratio_limit: float = 3.0
    """The TPOT calibration ratio stays within [1 / limit, limit]."""
    miss_memory_s: float = 1800.0
    """After a miss taught a lesson, the role keeps the count that answered it this long while
    the load stays (so the target is not lost again as soon as the lesson relaxes)."""
    max_calibrated_growth: float = 2.0
    """Calibration and tightening together never ask for more than this multiple of the
    planner's own count for the raw targets (a bound on what a wrong lesson can cost)."""
    attainment_memory_s: float = 1800.0
    """How long completed requests count towards the attainment the policy judges itself on
    (an exponentially decayed tally): a window's shortfall within its noise teaches only when
    this longer tally is below the target too."""
    lowest_planned_attainment: float = 0.95
    """While the decayed tally holds the attainment target with misses to spare, windows are
    sized to serve as few as this share of their requests within the targets (in proportion
    to the share of the miss budget unspent): the target is judged over all requests, and a
    fleet sized to meet it in every window holds GPUs for misses it could afford. 0.95: the
    lowest quantile the router reports."""
    miss_significance: float = 2.0
    """A window's attainment is a miss by itself only when it is this many binomial standard
    errors below the target for the requests it counted (about 2.5% of windows at the target
    read lower by chance)."""
    recent_significance: float = 2.0
    """The recent arrival rate (a short window) raises the demand only by what it shows beyond
    this many Poisson standard errors of its count."""
    recent_change_significance: float = 3.0
    """A short window whose count is this many standard errors above what the load before it
    gives such a window shows a changed load: its own rate is the load (a load that does not
    move reads that high in about one window in 700)."""
    recent_change_min_requests: float = 10.0
    """A changed load is read at the short window's own rate only from this many requests
    counted in it (a standard error within a third of the rate); fewer, as from an idle
    service, count for their lower bound."""
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
        if self.gpu_quota is not None and self.gpu_quota < 0:
            raise ValueError(f"gpu_quota must be >= 0 (got {self.gpu_quota})")
        if not 0 < self.traffic_share <= 1:
            raise ValueError(f"traffic_share must be in (0, 1] (got {self.traffic_share})")

    @property
    def scales_to_zero(self) -> bool:
        """Whether every pool allows zero replicas (one pool alone at zero serves nothing)."""
        return all(r.min_replicas == 0 for r in self.roles)

    def awake(self) -> PolicySpec:
        """This spec as sized while the service serves: at least one replica per pool."""
        if all(r.min_replicas >= 1 for r in self.roles):
            return self
        roles = tuple(replace(r, min_replicas=max(1, r.min_replicas)) for r in self.roles)
        return replace(self, roles=roles)

    @property
    def disaggregated(self) -> bool:
        return any(r.role == Role.PREFILL for r in self.roles)

    def gpus(self, replicas: Mapping[Role, int]) -> int:
        """The GPUs `replicas` of this service's roles hold (roles it does not have: none)."""
        return sum(replicas.get(p.role, 0) * p.gpus_per_replica for p in self.roles)

    def role(self, role: Role) -> RolePolicy:
        for policy in self.roles:
            if policy.role == role:
                return policy
        raise KeyError(role)

    @property
    def attainment_target(self) -> float:
        return self.slo.attainment_target

    @property
    def gpu_limit(self) -> int | None:
        """The most GPUs the deployment may hold: the budget or the quota, the lower."""
        limits = [n for n in (self.gpu_budget, self.gpu_quota) if n is not None]
        return min(limits) if limits else None

    @property
    def quota_binds(self) -> bool:
        """Whether the namespace's quota, not the service's budget, sets `gpu_limit`."""
        return self.gpu_quota is not None and (
            self.gpu_budget is None or self.gpu_quota < self.gpu_budget
        )

    @property
    def role_names(self) -> tuple[Role, ...]:
        return tuple(r for r in ROLE_ORDER if any(p.role == r for p in self.roles))


FALLBACK_COLD_START_S: Final = 180.0
"""Planned for where nothing is configured and no estimate can be made (a source no engine
reads: the deployment is refused and serves nothing)."""


def estimated_cold_start_s(md_spec: ModelDeploymentSpec, replica: ReplicaConfig) -> float:
    """The cold start estimated from where the deployment's weights come from and their size."""
    source = md_spec.model.weight_source
    if source is None:
        return FALLBACK_COLD_START_S
    return estimate_cold_start(replica, source, md_spec.engine.name).seconds


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
    load = isvc_spec.expected_load
    cold_start_s = (
        float(autoscaling.cold_start_seconds)
        if autoscaling.cold_start_seconds is not None
        else estimated_cold_start_s(md_spec, replica)
    )
    return PolicySpec(
        roles=roles,
        slo=Slo.from_spec(isvc_spec.slo),
        gpu_budget=autoscaling.gpu_budget,
        scale_down_stabilization_s=float(autoscaling.scale_down_stabilization_seconds),
        shorten_stabilization=autoscaling.shorten_stabilization_when_forecasts_hold,
        cold_start_s=cold_start_s,
        cold_start_estimated=autoscaling.cold_start_seconds is None,
        idle_before_zero_s=float(autoscaling.scale_to_zero_idle_seconds),
        wake_timeout_s=float(autoscaling.wake_timeout_seconds),
        enabled=autoscaling.policy == "goodput",
        expected_load=None if load is None else Workload.from_spec(load),
        traffic_share=traffic_share,
    )
