"""The goodput autoscaling policy on hand-made snapshots: a table of cases, then properties."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet.api.catalog import GpuType
from inferfleet.api.inference_service import InferenceServiceSpec
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.autoscale import (
    Decision,
    MetricsSnapshot,
    PolicyHistory,
    PolicySpec,
    Reason,
    RoleMetrics,
    RolePolicy,
    ServiceMetrics,
    decide,
    policy_spec,
)
from inferfleet.autoscale.policy import (
    Calibration,
    DemandSample,
    LastDecision,
    LatencyFactors,
    OutcomeTally,
    Recommendation,
    planning_slo,
)
from inferfleet.autoscale.policy.coldstart import (
    PlannedColdStart,
    planned_cold_start,
    track_cold_starts,
)
from inferfleet.autoscale.policy.constraints import forecasts_held
from inferfleet.autoscale.policy.demand import (
    Demand,
    burst_capacity,
    estimate_demand,
    growth_headroom,
    prompt_spread,
    recent_arrivals,
)
from inferfleet.autoscale.policy.history import ColdStarts, MixMemory
from inferfleet.autoscale.policy.learning import planned_attainment
from inferfleet.autoscale.policy.sizing import sequences_per_replica, size_role
from inferfleet.planning.capacity import (
    Workload,
    fewest_replicas,
    mean_tpot,
    meets_slo,
    plan_replica,
)
from inferfleet.planning.load import operating_point
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.slo import Slo
from tests.unit.planning_fixtures import replica

CONFIG = replica()  # Llama 3.1 8B on one H100
TP2 = replace(CONFIG, tensor=2)
SLO = Slo.in_seconds(ttft_p95_s=0.5, tpot_p95_s=0.05)
NOW = 10_000.0
WINDOW_S = 60.0
AGGREGATED = (Role.AGGREGATED,)
DISAGGREGATED = (Role.PREFILL, Role.DECODE)


def policy(
    roles: tuple[Role, ...] = AGGREGATED,
    *,
    config: ReplicaConfig = CONFIG,
    min_replicas: int = 1,
    max_replicas: int = 50,
    **settings: object,
) -> PolicySpec:
    pools = tuple(RolePolicy(r, config, min_replicas, max_replicas) for r in roles)
    return PolicySpec(roles=pools, slo=SLO, **settings)  # type: ignore[arg-type]


def planned(
    spec: PolicySpec,
    rate: float,
    input_tokens: int = 1000,
    output_tokens: int = 200,
    *,
    slo: Slo | None = None,
) -> dict[Role, int]:
    """What the capacity planner (its own search) says each pool needs for `rate` plus the
    policy's margin, under `slo` (default: the spec's): the feed-forward answer the policy must
    agree with."""
    capacity = plan_replica(
        spec.roles[0].replica,
        disaggregated=spec.disaggregated,
        replicas=1,
        prefill_replicas=1,
        workload=Workload(rate * (1 + spec.load_margin), input_tokens, output_tokens),
        slo=slo or spec.slo,
    )
    assert capacity.meets_slo, capacity.reason
    return {r.role: r.replicas for r in capacity.roles}


def running_at(rate: float, output_tokens: int = 200) -> float:
    return rate * (0.1 + output_tokens * 0.02)


def snapshot(
    rate: float,
    replicas: Mapping[Role, int],
    *,
    at_s: float = NOW,
    input_tokens: int = 1000,
    output_tokens: int = 200,
    attainment: float | None = 0.995,
    ttft_p95_s: float | None = None,
    tpot_p95_s: float | None = None,
    age_s: float = 5.0,
    waiting: float = 0.0,
    kv_cache_usage: float | Mapping[Role, float] = 0.3,
    in_flight: float | None = None,
) -> MetricsSnapshot:
    """A fleet at `rate` req/s: engine token rates as the mix gives them, and the sequences
    running as Little's law gives them for a typical latency."""
    running = running_at(rate, output_tokens)
    kv = (
        kv_cache_usage
        if isinstance(kv_cache_usage, Mapping)
        else dict.fromkeys(replicas, kv_cache_usage)
    )
    roles = {
        role: RoleMetrics(
            role=role,
            ready_replicas=count,
            running_requests=running if role != Role.PREFILL else 0.0,
            waiting_requests=waiting,
            kv_cache_usage=kv.get(role, 0.3),
            prompt_tokens_per_s=rate * input_tokens if role != Role.DECODE else 0.0,
            generation_tokens_per_s=rate * output_tokens if role != Role.PREFILL else 0.0,
        )
        for role, count in replicas.items()
    }
    service = ServiceMetrics(
        requests_per_s=rate,
        in_flight_requests=running + waiting if in_flight is None else in_flight,
        attainment=attainment,
        ttft_p95_s=ttft_p95_s,
        tpot_p95_s=tpot_p95_s,
        mean_prompt_tokens=input_tokens,
        mean_output_tokens=output_tokens,
    )
    return MetricsSnapshot(at_s, WINDOW_S, age_s, service, roles)


def tightened(ttft: float = 1.0, tpot: float = 1.0, slo: Slo = SLO) -> Slo:
    """The SLO with each target divided by its factor."""
    assert slo.ttft_p95_s is not None
    assert slo.tpot_p95_s is not None
    return Slo.in_seconds(
        ttft_p95_s=slo.ttft_p95_s / ttft,
        tpot_p95_s=slo.tpot_p95_s / tpot,
        attainment_target=slo.attainment_target,
    )


def recommended(at_s: float, replicas: Mapping[Role, int]) -> PolicyHistory:
    """A history whose only recommendation was `replicas`, at `at_s`."""
    return PolicyHistory(
        recommendations=(Recommendation(at_s, dict(replicas)),),
        last_decision=LastDecision(at_s, dict(replicas), Reason.STEADY),
    )


def gpus(spec: PolicySpec, replicas: Mapping[Role, int]) -> int:
    return sum(n * spec.role(r).gpus_per_replica for r, n in replicas.items())


@dataclass(frozen=True)
class Case:
    reason: str
    spec: PolicySpec
    snapshot: Callable[[], MetricsSnapshot | None]
    current: Mapping[Role, int]
    want: Callable[[], Mapping[Role, int]]
    want_reason: Reason
    history: PolicyHistory = field(default_factory=PolicyHistory)
    pins: Mapping[Role, int] = field(default_factory=dict)


AGG = policy()
DIS = policy(DISAGGREGATED)
# Feedback on attainment alone, without the latency calibration.
AGG_FEEDBACK = policy(calibrate=False)
DIS_FEEDBACK = policy(DISAGGREGATED, calibrate=False)
LOW, HIGH = 20.0, 150.0
BUDGET = 4
AGG_LOW, AGG_HIGH = planned(AGG, LOW), planned(AGG, HIGH)
# A pool shrinks to the count that holds its load with the scale-down margin on top.
AGG_SHRUNK = planned(replace(AGG, load_margin=AGG.load_margin + AGG.scale_down_margin), LOW)
DIS_LOW, DIS_HIGH = planned(DIS, LOW), planned(DIS, HIGH)
# Long-lived history: demand far in the past, recommendations outside every window.
SETTLED = NOW - 3600


CASES = [
    Case(
        reason="steady load at the planned replicas holds them",
        spec=AGG,
        snapshot=lambda: snapshot(HIGH, AGG_HIGH),
        current=AGG_HIGH,
        history=recommended(NOW - 30, AGG_HIGH),
        want=lambda: AGG_HIGH,
        want_reason=Reason.STEADY,
    ),
    Case(
        reason="a step up scales at once to what the planner sizes for the new load",
        spec=AGG,
        snapshot=lambda: snapshot(HIGH, AGG_LOW),
        current=AGG_LOW,
        history=recommended(NOW - 30, AGG_LOW),
        want=lambda: AGG_HIGH,
        want_reason=Reason.SCALE_UP_LOAD,
    ),
    Case(
        reason="a step up of a disaggregated service grows both pools as planned",
        spec=DIS,
        snapshot=lambda: snapshot(HIGH, DIS_LOW),
        current=DIS_LOW,
        history=recommended(NOW - 30, DIS_LOW),
        want=lambda: DIS_HIGH,
        want_reason=Reason.SCALE_UP_LOAD,
    ),
    Case(
        reason="a step down within the stabilisation window holds the replicas",
        spec=AGG,
        snapshot=lambda: snapshot(LOW, AGG_HIGH),
        current=AGG_HIGH,
        history=recommended(NOW - 100, AGG_HIGH),
        want=lambda: AGG_HIGH,
        want_reason=Reason.STABILIZING,
    ),
    Case(
        reason="a step down after the stabilisation window scales down to the planned replicas",
        spec=AGG,
        snapshot=lambda: snapshot(LOW, AGG_HIGH),
        current=AGG_HIGH,
        history=recommended(NOW - 400, AGG_HIGH),
        want=lambda: AGG_SHRUNK,
        want_reason=Reason.SCALE_DOWN_STABLE,
    ),
    Case(
        reason="an empty history (a restart) never scales down at once",
        spec=AGG,
        snapshot=lambda: snapshot(LOW, AGG_HIGH),
        current=AGG_HIGH,
        want=lambda: AGG_HIGH,
        want_reason=Reason.STABILIZING,
    ),
    Case(
        reason="stale metrics hold the last decision, not the current replicas",
        spec=AGG,
        snapshot=lambda: snapshot(HIGH, AGG_LOW, age_s=600),
        current={Role.AGGREGATED: 2},
        history=recommended(NOW - 30, {Role.AGGREGATED: 7}),
        want=lambda: {Role.AGGREGATED: 7},
        want_reason=Reason.STALE_METRICS,
    ),
    Case(
        reason="a missing snapshot holds the last decision",
        spec=DIS,
        snapshot=lambda: None,
        current={Role.PREFILL: 1, Role.DECODE: 1},
        history=recommended(NOW - 30, {Role.PREFILL: 3, Role.DECODE: 4}),
        want=lambda: {Role.PREFILL: 3, Role.DECODE: 4},
        want_reason=Reason.NO_METRICS,
    ),
    Case(
        reason="a missing snapshot with nothing decided yet never scales to zero",
        spec=DIS,
        snapshot=lambda: None,
        current={Role.PREFILL: 0, Role.DECODE: 0},
        want=lambda: {Role.PREFILL: 1, Role.DECODE: 1},
        want_reason=Reason.NO_METRICS,
    ),
    Case(
        reason="a pinned role keeps its pin against the load; the other follows the load",
        spec=DIS,
        snapshot=lambda: snapshot(HIGH, DIS_LOW),
        current=DIS_LOW,
        history=recommended(NOW - 30, DIS_LOW),
        pins={Role.DECODE: 9},
        want=lambda: {Role.PREFILL: DIS_HIGH[Role.PREFILL], Role.DECODE: 9},
        want_reason=Reason.PINNED,
    ),
    Case(
        reason="a pin wins over stale metrics too",
        spec=AGG,
        snapshot=lambda: snapshot(HIGH, AGG_LOW, age_s=600),
        current=AGG_LOW,
        history=recommended(NOW - 30, AGG_LOW),
        pins={Role.AGGREGATED: 6},
        want=lambda: {Role.AGGREGATED: 6},
        want_reason=Reason.STALE_METRICS,
    ),
    Case(
        reason="maxReplicas caps a scale-up and the reason says so",
        spec=policy(max_replicas=AGG_HIGH[Role.AGGREGATED] - 1),
        snapshot=lambda: snapshot(HIGH, AGG_LOW),
        current=AGG_LOW,
        history=recommended(NOW - 30, AGG_LOW),
        want=lambda: {Role.AGGREGATED: AGG_HIGH[Role.AGGREGATED] - 1},
        want_reason=Reason.AT_MAX,
    ),
    Case(
        reason="minReplicas holds a floor under a light load",
        spec=policy(min_replicas=AGG_LOW[Role.AGGREGATED] + 2),
        snapshot=lambda: snapshot(LOW, {Role.AGGREGATED: AGG_LOW[Role.AGGREGATED] + 2}),
        current={Role.AGGREGATED: AGG_LOW[Role.AGGREGATED] + 2},
        history=recommended(SETTLED, AGG_HIGH),
        want=lambda: {Role.AGGREGATED: AGG_LOW[Role.AGGREGATED] + 2},
        want_reason=Reason.STABILIZING,
    ),
    Case(
        reason="the GPU budget goes first to the pool whose target is missed (TTFT: prefill)",
        spec=policy(DISAGGREGATED, gpu_budget=BUDGET),
        snapshot=lambda: snapshot(HIGH, DIS_LOW, attainment=0.7, ttft_p95_s=2.0),
        current=DIS_LOW,
        history=recommended(NOW - 30, DIS_LOW),
        want=lambda: {Role.PREFILL: BUDGET - 1, Role.DECODE: 1},
        want_reason=Reason.BUDGET_EXHAUSTED,
    ),
    Case(
        reason="the GPU budget goes first to the pool whose target is missed (TPOT: decode)",
        spec=policy(DISAGGREGATED, gpu_budget=BUDGET),
        snapshot=lambda: snapshot(HIGH, DIS_LOW, attainment=0.7, tpot_p95_s=0.2),
        current=DIS_LOW,
        history=recommended(NOW - 30, DIS_LOW),
        want=lambda: {Role.PREFILL: 1, Role.DECODE: BUDGET - 1},
        want_reason=Reason.BUDGET_EXHAUSTED,
    ),
    Case(
        reason="TTFT misses at a steady load add an aggregated replica (feedback)",
        spec=AGG_FEEDBACK,
        snapshot=lambda: snapshot(HIGH, AGG_HIGH, attainment=0.9, ttft_p95_s=0.8),
        current=AGG_HIGH,
        history=recommended(NOW - 30, AGG_HIGH),
        want=lambda: {
            Role.AGGREGATED: max(
                AGG_HIGH[Role.AGGREGATED] + 1,
                planned(AGG, HIGH, slo=tightened(ttft=AGG_FEEDBACK.feedback_gain))[Role.AGGREGATED],
            )
        },
        want_reason=Reason.SCALE_UP_TTFT,
    ),
    Case(
        reason="TPOT misses grow the decode pool, not the prefill pool",
        spec=DIS_FEEDBACK,
        snapshot=lambda: snapshot(HIGH, DIS_HIGH, attainment=0.9, tpot_p95_s=0.07),
        current=DIS_HIGH,
        history=recommended(NOW - 30, DIS_HIGH),
        want=lambda: (
            DIS_HIGH
            | {
                Role.DECODE: max(
                    DIS_HIGH[Role.DECODE] + 1,
                    planned(DIS, HIGH, slo=tightened(tpot=DIS_FEEDBACK.feedback_gain))[Role.DECODE],
                )
            }
        ),
        want_reason=Reason.SCALE_UP_TPOT,
    ),
    Case(
        reason="misses within a cold start of the last scale-up wait for the new replicas",
        spec=AGG_FEEDBACK,
        snapshot=lambda: snapshot(HIGH, AGG_HIGH, attainment=0.9, ttft_p95_s=0.8),
        current=AGG_HIGH,
        history=replace(
            recommended(NOW - 30, AGG_HIGH), last_scale_up_s={Role.AGGREGATED: NOW - 60}
        ),
        want=lambda: AGG_HIGH,
        want_reason=Reason.STEADY,
    ),
    Case(
        reason="a role whose target is missed never shrinks, whatever the model says",
        spec=AGG_FEEDBACK,
        snapshot=lambda: snapshot(LOW, AGG_HIGH, attainment=0.9, ttft_p95_s=0.8),
        current=AGG_HIGH,
        history=replace(recommended(SETTLED, AGG_LOW), last_scale_up_s={Role.AGGREGATED: NOW - 60}),
        want=lambda: AGG_HIGH,
        want_reason=Reason.STEADY,
    ),
    Case(
        reason="a full KV cache on the decode pool asks for replicas in proportion",
        spec=DIS,
        snapshot=lambda: snapshot(
            LOW, {Role.PREFILL: 1, Role.DECODE: 4}, kv_cache_usage={Role.DECODE: 0.97}
        ),
        current={Role.PREFILL: 1, Role.DECODE: 4},
        history=recommended(NOW - 30, {Role.PREFILL: 1, Role.DECODE: 4}),
        want=lambda: {Role.PREFILL: 1, Role.DECODE: math.ceil(4 * 0.97 / 0.85)},
        want_reason=Reason.SCALE_UP_LOAD,
    ),
    Case(
        reason="policy none leaves the declared replicas alone",
        spec=policy(enabled=False),
        snapshot=lambda: snapshot(HIGH, {Role.AGGREGATED: 1}),
        current={Role.AGGREGATED: 1},
        want=lambda: {Role.AGGREGATED: 1},
        want_reason=Reason.DISABLED,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.reason for c in CASES])
def test_policy_cases(case: Case) -> None:
    decision = decide(case.spec, case.snapshot(), case.current, case.history, pins=case.pins)
    assert dict(decision.replicas) == dict(case.want()), decision.message
    assert decision.reason == case.want_reason, decision.message


def test_a_restart_holds_for_a_whole_stabilisation_window() -> None:
    history = PolicyHistory()
    for at_s in range(0, int(AGG.scale_down_stabilization_s), 30):
        decision = decide(AGG, snapshot(LOW, AGG_HIGH, at_s=NOW + at_s), AGG_HIGH, history)
        assert decision.replicas == AGG_HIGH, at_s
        history = decision.history
    later = NOW + AGG.scale_down_stabilization_s + 1
    decision = decide(AGG, snapshot(LOW, AGG_HIGH, at_s=later), AGG_HIGH, history)
    assert decision.replicas == AGG_SHRUNK


def test_the_sizes_under_test_differ() -> None:
    """The table only means something if low and high load need different fleets."""
    assert AGG_LOW[Role.AGGREGATED] < AGG_HIGH[Role.AGGREGATED]
    assert DIS_LOW[Role.PREFILL] < DIS_HIGH[Role.PREFILL]
    assert DIS_LOW[Role.DECODE] < DIS_HIGH[Role.DECODE]
    # The budget binds: the pools want more than it holds, and prefill more than it leaves.
    assert sum(DIS_HIGH.values()) > BUDGET
    assert DIS_HIGH[Role.PREFILL] > BUDGET - 1


def test_message_quotes_inputs_and_predicted_effect() -> None:
    decision = decide(DIS, snapshot(HIGH, DIS_LOW), DIS_LOW, recommended(NOW - 30, DIS_LOW))
    prefill = DIS_HIGH[Role.PREFILL]
    assert f"prefill {DIS_LOW[Role.PREFILL]} -> {prefill}" in decision.message
    assert f"{HIGH:g} req/s arriving" in decision.message
    assert f"{HIGH * 1000 / 1e3:.3g}k prompt tok/s" in decision.message
    estimate = decision.estimates[Role.PREFILL]
    assert estimate.predicted is not None
    assert estimate.predicted.stable
    assert estimate.predicted_ttft_s is not None
    assert estimate.predicted_ttft_s >= estimate.predicted.ttft_p95_s  # with the KV transfer
    assert f"TTFT {estimate.predicted_ttft_s * 1e3:.0f} ms of 500" in decision.message
    assert estimate.predicted_ttft_s <= 0.5


def test_budget_with_no_missed_role_is_shared_by_need() -> None:
    spec = policy(DISAGGREGATED, config=TP2, gpu_budget=2 * BUDGET)
    decision = decide(spec, snapshot(HIGH, DIS_LOW), DIS_LOW, recommended(NOW - 30, DIS_LOW))
    assert decision.reason == Reason.BUDGET_EXHAUSTED
    assert gpus(spec, decision.replicas) == 2 * BUDGET
    assert all(n >= 2 for n in decision.replicas.values())
    assert f"GPU budget {2 * BUDGET} exhausted" in decision.message


def test_a_namespace_quota_below_the_budget_caps_a_scale_up_and_says_so() -> None:
    spec = policy(DISAGGREGATED, config=TP2, gpu_budget=4 * BUDGET, gpu_quota=2 * BUDGET)
    decision = decide(spec, snapshot(HIGH, DIS_LOW), DIS_LOW, recommended(NOW - 30, DIS_LOW))
    assert decision.reason == Reason.QUOTA_EXHAUSTED
    assert gpus(spec, decision.replicas) == 2 * BUDGET
    assert f"the namespace's GPU quota leaves it {2 * BUDGET} GPUs" in decision.message
    # The budget is the lower: the budget is what binds, and the reason says that.
    spec = replace(spec, gpu_budget=2 * BUDGET, gpu_quota=8 * BUDGET)
    decision = decide(spec, snapshot(HIGH, DIS_LOW), DIS_LOW, recommended(NOW - 30, DIS_LOW))
    assert decision.reason == Reason.BUDGET_EXHAUSTED


SHIFT_RATE = 60.0
MIX_BEFORE, MIX_AFTER = (1000, 400), (3000, 50)


def test_mix_shift_to_longer_prompts_raises_the_prefill_to_decode_ratio() -> None:
    rate = SHIFT_RATE
    before = planned(DIS, rate, *MIX_BEFORE)
    history = recommended(SETTLED, before)
    shifted = snapshot(rate, before, input_tokens=MIX_AFTER[0], output_tokens=MIX_AFTER[1])
    decision = decide(DIS, shifted, before, history)
    after = decision.replicas
    assert after[Role.PREFILL] > before[Role.PREFILL]
    assert after[Role.PREFILL] / after[Role.DECODE] > before[Role.PREFILL] / before[Role.DECODE]
    assert dict(after) == planned(DIS, rate, *MIX_AFTER)
    assert decision.reason in {Reason.REBALANCE, Reason.SCALE_UP_LOAD}


def test_mix_shift_within_the_window_is_a_rebalance() -> None:
    """Prefill grows at once; decode's lower need waits out the stabilisation window."""
    rate = SHIFT_RATE
    before = planned(DIS, rate, *MIX_BEFORE)
    after_shift = planned(DIS, rate, *MIX_AFTER)
    assert after_shift[Role.DECODE] < before[Role.DECODE]
    decision = decide(
        DIS,
        snapshot(rate, before, input_tokens=MIX_AFTER[0], output_tokens=MIX_AFTER[1]),
        before,
        recommended(NOW - 30, before),
    )
    assert decision.reason == Reason.REBALANCE
    assert decision.replicas == {Role.PREFILL: after_shift[Role.PREFILL]} | {
        Role.DECODE: before[Role.DECODE]
    }


def test_rising_trend_sizes_for_the_load_a_cold_start_ahead() -> None:
    """A ramp seen over the last minutes: replicas ordered now serve after the cold start, so
    they are sized for the load expected then, not the load now."""
    slope = 0.3  # req/s gained per second: 36 req/s within a cold start
    samples = tuple(
        DemandSample(NOW - age, HIGH - slope * age, running_at(HIGH))
        for age in (150, 120, 90, 60, 30)
    )
    history = replace(recommended(NOW - 30, AGG_HIGH), demand=samples)
    decision = decide(AGG, snapshot(HIGH, AGG_HIGH), AGG_HIGH, history)
    ahead = HIGH + slope * AGG.cold_start_s
    assert dict(decision.replicas) == planned(AGG, ahead)
    assert decision.replicas[Role.AGGREGATED] > AGG_HIGH[Role.AGGREGATED]
    assert "forecast in 120 s" in decision.message


def test_a_step_is_not_extrapolated_as_a_trend() -> None:
    samples = tuple(DemandSample(NOW - age, LOW, running_at(HIGH)) for age in (120, 90, 60, 30))
    history = replace(recommended(NOW - 30, AGG_LOW), demand=samples)
    decision = decide(AGG, snapshot(HIGH, AGG_LOW), AGG_LOW, history)
    assert dict(decision.replicas) == AGG_HIGH


def test_requests_piling_up_in_flight_count_as_arrivals() -> None:
    """Completions lag arrivals when the fleet falls behind; the growth of the requests in
    flight is load that arrived too."""
    piled = 600.0
    samples = (DemandSample(NOW - WINDOW_S, HIGH, running_at(HIGH)),)
    history = replace(recommended(NOW - 30, AGG_HIGH), demand=samples)
    in_flight = running_at(HIGH) + piled
    decision = decide(AGG, snapshot(HIGH, AGG_HIGH, in_flight=in_flight), AGG_HIGH, history)
    assert dict(decision.replicas) == planned(AGG, HIGH + piled / WINDOW_S)


def test_prompts_whose_lengths_spread_widely_ask_for_more_prefill_replicas() -> None:
    """The same rate and mean length, with lengths as spread as production traces' (cv2 1):
    the prefill queue waits longer and long prompts set its tail. Decoding is unchanged."""
    alike = snapshot(HIGH, DIS_HIGH)
    spread = replace(alike, service=replace(alike.service, mean_squared_prompt_tokens=2e6))
    history = recommended(NOW - 30, DIS_HIGH)
    fixed = decide(DIS, alike, DIS_HIGH, history)
    assert dict(fixed.replicas) == DIS_HIGH
    widely = decide(DIS, spread, DIS_HIGH, history)
    assert widely.replicas[Role.PREFILL] > DIS_HIGH[Role.PREFILL]
    assert widely.replicas[Role.DECODE] == DIS_HIGH[Role.DECODE]


def test_a_spread_not_measured_is_planned_as_the_expected_load_declares_it() -> None:
    """A router that does not count squared prompt lengths: the spread the InferenceService's
    expected load declares is planned for, as if measured; without one, none."""
    alike = snapshot(HIGH, DIS_HIGH)
    unmeasured = replace(alike, service=replace(alike.service, mean_squared_prompt_tokens=None))
    measured = replace(alike, service=replace(alike.service, mean_squared_prompt_tokens=2e6))
    history = recommended(NOW - 30, DIS_HIGH)
    declared = replace(DIS, expected_load=Workload(HIGH, 1000, 200, input_tokens_cv2=1.0))
    assert dict(decide(DIS, unmeasured, DIS_HIGH, history).replicas) == DIS_HIGH
    widely = decide(DIS, measured, DIS_HIGH, history).replicas
    assert widely[Role.PREFILL] > DIS_HIGH[Role.PREFILL]
    assert decide(declared, unmeasured, DIS_HIGH, history).replicas == widely


@pytest.mark.parametrize(
    ("mean", "squared", "cv2"),
    [
        (None, None, None),  # not measured
        (1000.0, None, None),
        (1000.0, 1e6, 0.0),  # all alike
        (1000.0, 1.92e6, 0.9),  # rounded to a tenth
        (1000.0, 0.5e6, 0.0),  # below the mean's square: rounding noise, not a spread
        (10.0, 1e6, 4.0),  # capped
    ],
)
def test_the_spread_of_prompt_lengths_is_read_from_their_mean_square(
    mean: float | None, squared: float | None, cv2: float | None
) -> None:
    service = ServiceMetrics(1.0, 0.0, mean_prompt_tokens=mean, mean_squared_prompt_tokens=squared)
    assert prompt_spread(service) == (None if cv2 is None else pytest.approx(cv2))


def test_queued_requests_are_drained_within_the_drain_period_and_not_remembered() -> None:
    waiting = 300.0
    decision = decide(
        AGG, snapshot(HIGH, AGG_HIGH, waiting=waiting), AGG_HIGH, recommended(NOW - 30, AGG_HIGH)
    )
    assert dict(decision.replicas) == planned(AGG, HIGH + waiting / AGG.backlog_drain_s)
    assert decision.replicas[Role.AGGREGATED] > AGG_HIGH[Role.AGGREGATED]
    # Scale-down stabilisation remembers what the arrivals need, not the queue: once it has
    # drained, the fleet may go back at once.
    assert dict(decision.history.recommendations[-1].replicas) == AGG_HIGH


def fleet_latency(
    spec: PolicySpec, rate: float, current: Mapping[Role, int]
) -> tuple[float, float]:
    """The planner's TTFT p95 and TPOT for the fleet `current` at `rate` req/s."""
    ttft = tpot = 0.0
    for role, count in current.items():
        point = operating_point(
            spec.role(role).replica,
            rate / count,
            1000,
            200,
            prefill=role != Role.DECODE,
            decode=role != Role.PREFILL,
        )
        ttft = max(ttft, point.ttft_p95_s)
        tpot = max(tpot, point.tpot_s)
    # An overloaded fleet has long latencies, not infinite ones.
    return min(ttft, 30.0), min(tpot, 1.0)


@pytest.mark.parametrize("spec", [AGG, DIS], ids=["aggregated", "disaggregated"])
def test_steady_noisy_load_never_changes_direction(spec: PolicySpec) -> None:
    """Two hours of a stationary load with measurement noise (deterministic, +-8%), one tick
    every 30 s: the replicas may settle once, then never turn, and settle where the planner
    puts the load."""
    current = dict(planned(spec, LOW))
    history = PolicyHistory()
    counts: list[tuple[int, ...]] = []
    for tick in range(2 * 120):
        noise = 0.08 * math.sin(tick * 2.3) * math.cos(tick * 0.7)
        rate = HIGH * (1 + noise)
        # Latencies 20% above the planner's, noisy too: the calibration is in the loop.
        ttft, tpot = fleet_latency(spec, rate, current)
        observed = snapshot(
            rate,
            current,
            at_s=NOW + 30 * tick,
            input_tokens=round(1000 * (1 - noise / 2)),
            ttft_p95_s=ttft * 1.2 * (1 + noise),
            tpot_p95_s=tpot * 1.2 * (1 - noise),
        )
        decision = decide(spec, observed, current, history)
        current, history = dict(decision.replicas), decision.history
        counts.append(tuple(current[r] for r in spec.role_names))
    for index in range(len(spec.role_names)):
        series = [c[index] for c in counts]
        steps = [b - a for a, b in itertools.pairwise(series) if b != a]
        assert all(s > 0 for s in steps) or all(s < 0 for s in steps), series
        assert len(steps) <= 2, series
    # The model misses a fifth of the latency: the calibration learns it is optimistic.
    assert history.calibration.tpot_ratio > 1
    slo = planning_slo(spec, history.calibration)
    for role in spec.role_names:
        low = planned(spec, HIGH * 0.92, slo=slo)[role]
        high = planned(spec, HIGH * 1.08, slo=slo)[role]
        assert low <= current[role] <= high


def test_tightening_relaxes_while_the_target_is_met() -> None:
    history = replace(
        recommended(NOW - 30, AGG_HIGH), tightening=LatencyFactors(ttft=2.0, tpot=3.0)
    )
    later = NOW + AGG.tightening_half_life_s - 30
    decision = decide(AGG, snapshot(HIGH, AGG_HIGH, at_s=later), AGG_HIGH, history)
    assert decision.history.tightening.ttft == pytest.approx(1.5)
    assert decision.history.tightening.tpot == pytest.approx(2.0)


def test_a_miss_tightens_the_latency_that_missed_only() -> None:
    decision = decide(
        DIS_FEEDBACK,
        snapshot(HIGH, DIS_HIGH, attainment=0.9, ttft_p95_s=0.9),
        DIS_HIGH,
        recommended(NOW - 30, DIS_HIGH),
    )
    gain = DIS_FEEDBACK.feedback_gain
    assert decision.history.tightening == LatencyFactors(ttft=gain, tpot=1.0)
    assert decision.history.tightened_at_s == NOW
    assert decision.history.last_scale_up_s == {Role.PREFILL: NOW}


def test_a_miss_the_model_already_explains_teaches_nothing() -> None:
    """The fleet is short of what the load needs: the miss says nothing about the model."""
    decision = decide(
        AGG_FEEDBACK,
        snapshot(HIGH, AGG_LOW, attainment=0.5, ttft_p95_s=3.0),
        AGG_LOW,
        recommended(NOW - 30, AGG_LOW),
    )
    assert decision.history.tightening == LatencyFactors()
    assert dict(decision.replicas) == AGG_HIGH
    assert decision.reason == Reason.SCALE_UP_TTFT


def test_a_count_that_answered_a_miss_holds_while_the_load_does() -> None:
    """Without it, attainment at the edge of its target cycles: a miss adds a replica, the
    target is met, the lesson relaxes, the replica goes, the target is missed again."""
    count = AGG_HIGH[Role.AGGREGATED]
    missed = snapshot(HIGH, AGG_HIGH, attainment=0.98, ttft_p95_s=0.6)
    first = decide(AGG_FEEDBACK, missed, AGG_HIGH, recommended(NOW - 30, AGG_HIGH))
    grown = dict(first.replicas)
    assert grown[Role.AGGREGATED] > count
    floor = first.history.miss_floors[Role.AGGREGATED]
    assert floor.replicas == count + 1
    # Long after, the target met, the lesson relaxed away: the count holds at the same load...
    later = NOW + 2 * AGG_FEEDBACK.scale_down_stabilization_s
    relaxed = replace(first.history, tightening=LatencyFactors())
    held = decide(AGG_FEEDBACK, snapshot(HIGH, grown, at_s=later), grown, relaxed)
    assert held.replicas[Role.AGGREGATED] >= floor.replicas
    # ...not when the load that missed is gone, nor once the memory of it has expired.
    lighter = decide(AGG_FEEDBACK, snapshot(LOW, grown, at_s=later), grown, relaxed)
    assert lighter.replicas[Role.AGGREGATED] < floor.replicas
    expired = floor.until_s + AGG_FEEDBACK.scale_down_stabilization_s
    forgotten = decide(AGG_FEEDBACK, snapshot(HIGH, grown, at_s=expired), grown, relaxed)
    assert Role.AGGREGATED not in forgotten.history.miss_floors
    shrinking = replace(AGG, load_margin=AGG.load_margin + AGG.scale_down_margin)
    want = min(grown[Role.AGGREGATED], planned(shrinking, HIGH)[Role.AGGREGATED])
    assert forgotten.replicas == {Role.AGGREGATED: want}


def predicted_latency(spec: PolicySpec, rate: float, count: int) -> tuple[float, float]:
    """The planner's TTFT p95 and TPOT for one aggregated replica of `count` at `rate`."""
    point = operating_point(spec.roles[0].replica, rate / count, 1000, 200)
    return point.ttft_p95_s, point.tpot_s


def run_with_model_error(spec: PolicySpec, error: float, ticks: int) -> Decision:
    """Ticks of a fleet whose latencies are the planner's times `error` at whatever it runs."""
    start = planned(spec, HIGH)
    current, history = dict(start), recommended(NOW - 60, start)
    decision: Decision | None = None
    for tick in range(ticks):
        ttft, tpot = predicted_latency(spec, HIGH, current[Role.AGGREGATED])
        observed = snapshot(
            HIGH,
            current,
            at_s=NOW + 60 * tick,
            ttft_p95_s=ttft * error,
            tpot_p95_s=tpot * error,
        )
        decision = decide(spec, observed, current, history)
        current, history = dict(decision.replicas), decision.history
    assert decision is not None
    return decision


def calibrated(spec: PolicySpec, decision: Decision) -> Slo:
    return planning_slo(spec, decision.history.calibration)


def held_at_mean(spec: PolicySpec, rate: float, slo: Slo) -> int:
    """The fewest aggregated replicas whose planned mean TPOT (and p95 TTFT) hold `slo` at
    `rate` plus the policy's margin: what the policy holds to the targets it calibrated (it
    calibrates the tail it measures over the planner's mean TPOT)."""
    load = rate * (1 + spec.load_margin)
    config = spec.roles[0].replica
    count = fewest_replicas(
        lambda n: meets_slo(operating_point(config, load / n, 1000, 200), slo, tpot_of=mean_tpot)
    )
    assert count is not None
    return count


# Targets tight enough that latency, not stability, sets the count.
TIGHT = replace(AGG, slo=Slo.in_seconds(ttft_p95_s=0.2, tpot_p95_s=0.018))


def test_calibration_learns_an_optimistic_model() -> None:
    error = 1.6
    decision = run_with_model_error(TIGHT, error, ticks=12)
    final = decision.replicas[Role.AGGREGATED]
    # What the model misses at the fleet it settled on, and the count that covers it.
    assert decision.history.calibration.tpot_ratio == pytest.approx(error, rel=0.03)
    covering = held_at_mean(TIGHT, HIGH, calibrated(TIGHT, decision))
    assert covering > held_at_mean(TIGHT, HIGH, TIGHT.slo)
    # Scale-down hysteresis may hold one replica over the count that covers it, never fewer.
    assert covering <= final <= covering + 1


def test_calibration_relaxes_a_pessimistic_model() -> None:
    decision = run_with_model_error(TIGHT, 0.3, ticks=12)
    assert decision.history.calibration.tpot_ratio < 1
    assert decision.history.calibration.ttft_offset_s < 0
    relaxed = held_at_mean(TIGHT, HIGH, calibrated(TIGHT, decision))
    assert relaxed < held_at_mean(TIGHT, HIGH, TIGHT.slo)
    # The fleet shrinks to the relaxed count unless scale-down hysteresis holds one more.
    assert relaxed <= decision.replicas[Role.AGGREGATED] <= relaxed + 1


def test_a_latency_replicas_do_not_reduce_never_runs_away() -> None:
    """A tail set by the requests themselves (measured TPOT just above target at any count):
    the lesson that did not help is undone, and what calibration may add is bounded."""
    assert SLO.tpot_p95_s is not None
    current = dict(AGG_HIGH)
    history = recommended(NOW - 60, AGG_HIGH)
    for tick in range(60):
        observed = snapshot(
            HIGH,
            current,
            at_s=NOW + 60 * tick,
            attainment=0.97,
            tpot_p95_s=1.02 * SLO.tpot_p95_s,
        )
        decision = decide(AGG, observed, current, history)
        current, history = dict(decision.replicas), decision.history
    assert history.tightening == LatencyFactors()
    bound = math.ceil(AGG_HIGH[Role.AGGREGATED] * AGG.max_calibrated_growth)
    assert current[Role.AGGREGATED] <= bound


def test_latency_far_below_target_never_asks_for_more() -> None:
    """Fixed overheads (network, tokenisation) the planner leaves out shift the latency, they do
    not make more replicas useful."""
    assert SLO.ttft_p95_s is not None
    overhead = 0.4 * SLO.ttft_p95_s
    current, history = dict(AGG_HIGH), recommended(NOW - 60, AGG_HIGH)
    for tick in range(12):
        observed = snapshot(HIGH, current, at_s=NOW + 60 * tick, ttft_p95_s=overhead)
        decision = decide(AGG, observed, current, history)
        current, history = dict(decision.replicas), decision.history
    assert current == AGG_HIGH


def test_calibration_compares_with_the_replicas_that_served() -> None:
    """While asked-for replicas start, the latencies measured are those of the ready ones."""
    ready = AGG_HIGH[Role.AGGREGATED]
    asked = {Role.AGGREGATED: ready + 2}
    ttft, tpot = predicted_latency(AGG, HIGH, ready)
    error = 1.3
    observed = snapshot(
        HIGH, {Role.AGGREGATED: ready}, ttft_p95_s=ttft * error, tpot_p95_s=tpot * error
    )
    history = replace(recommended(NOW - WINDOW_S, asked), last_scale_up_s={Role.AGGREGATED: NOW})
    decision = decide(AGG, observed, asked, history)
    assert decision.history.calibration.tpot_ratio == pytest.approx(error, rel=0.03)


def test_calibration_skips_the_window_in_which_replicas_join() -> None:
    ready = AGG_HIGH[Role.AGGREGATED]
    ttft, tpot = predicted_latency(AGG, HIGH, ready)
    observed = snapshot(HIGH, AGG_HIGH, ttft_p95_s=ttft * 1.3, tpot_p95_s=tpot * 1.3)
    joined = NOW - AGG.cold_start_s - WINDOW_S / 2
    history = replace(
        recommended(NOW - WINDOW_S, AGG_HIGH), last_scale_up_s={Role.AGGREGATED: joined}
    )
    decision = decide(AGG, observed, AGG_HIGH, history)
    assert decision.history.calibration == Calibration()


def test_calibration_skips_a_window_in_which_a_backlog_was_queued() -> None:
    """A backlog that built while too few replicas served fills the window's TTFT percentiles
    after it has drained: the model's error at the fleet serving now is not measured there.
    The steady state at HIGH holds about the rate times its mean TTFT before a first token
    (a few requests); a queue of 200 half a window ago is a backlog, a queue of that few is
    not."""
    ready = AGG_HIGH[Role.AGGREGATED]
    ttft, tpot = predicted_latency(AGG, HIGH, ready)
    observed = snapshot(HIGH, AGG_HIGH, ttft_p95_s=ttft * 1.3 + 20.0, tpot_p95_s=tpot)

    def queued(backlog: float) -> PolicyHistory:
        sample = DemandSample(NOW - WINDOW_S / 2, HIGH, 0.0, HIGH, HIGH, backlog)
        return replace(recommended(NOW - WINDOW_S, AGG_HIGH), demand=(sample,))

    after_backlog = decide(AGG, observed, AGG_HIGH, queued(200.0))
    assert after_backlog.history.calibration == Calibration()
    steady = decide(AGG, observed, AGG_HIGH, queued(2.0))
    assert steady.history.calibration.ttft_offset_s > 0


def test_a_load_at_the_edge_between_two_counts_does_not_shrink() -> None:
    """Hysteresis: the smaller count must hold the scale-down margin on top of the usual one."""
    count = AGG_HIGH[Role.AGGREGATED]
    with_hysteresis = replace(AGG, load_margin=AGG.load_margin + AGG.scale_down_margin)
    edge = next(
        rate
        for rate in (HIGH * (1 - step / 100) for step in range(1, 60))
        if planned(AGG, rate)[Role.AGGREGATED] < count
    )
    assert planned(with_hysteresis, edge)[Role.AGGREGATED] == count
    history = recommended(SETTLED, AGG_HIGH)
    decision = decide(AGG, snapshot(edge, AGG_HIGH), AGG_HIGH, history)
    assert decision.replicas == AGG_HIGH
    assert decision.reason == Reason.STEADY


def test_now_past_the_snapshot_makes_it_stale() -> None:
    fresh = snapshot(HIGH, AGG_LOW)
    history = recommended(NOW - 30, AGG_LOW)
    assert decide(AGG, fresh, AGG_LOW, history).reason == Reason.SCALE_UP_LOAD
    late = NOW + AGG.stale_after_s
    decision = decide(AGG, fresh, AGG_LOW, history, now_s=late)
    assert decision.reason == Reason.STALE_METRICS
    assert decision.history == history


def test_history_survives_its_wire_form() -> None:
    decision = decide(
        DIS,
        snapshot(HIGH, DIS_HIGH, attainment=0.9, ttft_p95_s=0.9),
        DIS_HIGH,
        replace(recommended(NOW - 30, DIS_HIGH), demand=(DemandSample(NOW - 30, HIGH, 12.0),)),
    )
    wire = decision.history.to_wire()
    assert PolicyHistory.from_wire(wire) == decision.history
    assert wire["lastDecision"]["reason"] == decision.reason.value


def test_policy_spec_from_the_resources() -> None:
    md = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.3-70b", "source": "hf://meta-llama/Llama-3.3-70B-Instruct"},
            "engine": {"name": "vllm"},
            "gpu": {"type": "H100-80GB"},
            "parallelism": {"tensor": 4},
            "batching": {"maxModelLength": 16384},
            "topology": {"mode": "disaggregated", "prefill": {"replicas": 2}},
        }
    )
    isvc = InferenceServiceSpec.model_validate(
        {
            "deployments": [{"name": "llama"}],
            "slo": {"ttftP95Ms": 800, "tpotP95Ms": 60, "attainmentTarget": 0.95},
            "autoscaling": {
                "policy": "goodput",
                "prefill": {"minReplicas": 2, "maxReplicas": 6},
                "gpuBudget": 64,
                "scaleDownStabilizationSeconds": 600,
                "coldStartSeconds": 240,
            },
        }
    )
    spec = policy_spec(isvc, md)
    assert spec.role_names == DISAGGREGATED
    assert spec.enabled
    assert (spec.role(Role.PREFILL).min_replicas, spec.role(Role.PREFILL).max_replicas) == (2, 6)
    assert spec.role(Role.DECODE).gpus_per_replica == 4
    assert spec.slo == Slo(ttft_p95_ms=800, tpot_p95_ms=60, attainment_target=0.95)
    assert (spec.attainment_target, spec.gpu_budget) == (0.95, 64)
    assert (spec.scale_down_stabilization_s, spec.cold_start_s) == (600, 240)
    assert spec.shorten_stabilization
    autoscaling = isvc.autoscaling.model_copy(
        update={"shorten_stabilization_when_forecasts_hold": False}
    )
    assert not policy_spec(
        isvc.model_copy(update={"autoscaling": autoscaling}), md
    ).shorten_stabilization
    declared = InferenceServiceSpec.model_validate(
        {"deployments": [{"name": "llama"}], "slo": {"ttftP95Ms": 800}}
    )
    assert not policy_spec(declared, md).enabled


# --- Properties.

ROLE_SETS = st.sampled_from([AGGREGATED, DISAGGREGATED])
Scenario = tuple[
    PolicySpec, MetricsSnapshot | None, dict[Role, int], PolicyHistory, dict[Role, int]
]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    roles = draw(ROLE_SETS)
    tensor = draw(st.sampled_from([1, 2]))
    config = replace(CONFIG, tensor=tensor)
    pools = []
    for role in roles:
        low = draw(st.integers(1, 4))
        pools.append(RolePolicy(role, config, low, draw(st.integers(low, 12))))
    floor = len(roles) * tensor
    budget = draw(st.none() | st.integers(floor, floor * 12))
    spec = PolicySpec(
        roles=tuple(pools),
        slo=replace(SLO, attainment_target=draw(st.sampled_from([0.9, 0.99]))),
        gpu_budget=budget,
        gpu_quota=draw(st.none() | st.integers(floor, floor * 12)),
    )
    current = {r: draw(st.integers(0, 15)) for r in roles}
    at_s = NOW + draw(st.floats(0, 600))
    observed: MetricsSnapshot | None = snapshot(
        draw(st.floats(0, 200)),
        current,
        at_s=at_s,
        input_tokens=draw(st.integers(1, 8000)),
        output_tokens=draw(st.integers(1, 2000)),
        attainment=draw(st.none() | st.floats(0, 1)),
        ttft_p95_s=draw(st.none() | st.floats(0.01, 5)),
        tpot_p95_s=draw(st.none() | st.floats(0.001, 0.5)),
        age_s=draw(st.floats(0, 300)),
        waiting=draw(st.floats(0, 500)),
        kv_cache_usage=draw(st.floats(0, 1)),
    )
    if draw(st.integers(0, 4)) == 0:
        observed = None
    previous = {r: draw(st.integers(1, 15)) for r in roles}
    history = replace(
        recommended(NOW - draw(st.floats(0, 900)), previous),
        demand=(DemandSample(NOW - 60, draw(st.floats(0, 200)), draw(st.floats(0, 500))),),
    )
    pins = {r: draw(st.integers(0, 20)) for r in roles if draw(st.integers(0, 4)) == 0}
    return spec, observed, current, history, pins


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_replicas_stay_within_one_and_max(scenario: Scenario) -> None:
    spec, observed, current, history, pins = scenario
    decision = decide(spec, observed, current, history, pins=pins)
    assert set(decision.replicas) == set(spec.role_names)
    for role, count in decision.replicas.items():
        if role in pins:
            assert count == pins[role]
            continue
        assert 1 <= count <= spec.role(role).max_replicas
        floors = sum(pins.get(p.role, p.min_replicas) * p.gpus_per_replica for p in spec.roles)
        if spec.gpu_limit is None or spec.gpu_limit >= floors:
            assert count >= spec.role(role).min_replicas


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_never_exceeds_the_gpu_budget_or_quota(scenario: Scenario) -> None:
    spec, observed, current, history, _ = scenario
    decision = decide(spec, observed, current, history)
    for limit in (spec.gpu_budget, spec.gpu_quota):
        if limit is not None:
            assert gpus(spec, decision.replicas) <= limit


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_deterministic(scenario: Scenario) -> None:
    spec, observed, current, history, pins = scenario
    first: Decision = decide(spec, observed, current, history, pins=pins)
    again = decide(spec, observed, dict(current), history, pins=dict(pins))
    assert first == again


# What the policy judges itself on: attainment over all requests, not per window.


def tally(requests: float, attainment: float, at_s: float = NOW - 15) -> PolicyHistory:
    return replace(
        recommended(at_s, AGG_HIGH),
        outcomes=OutcomeTally(at_s, requests, requests * attainment),
    )


@pytest.mark.parametrize(
    ("history", "want"),
    [
        (PolicyHistory(), 0.99),
        (tally(30_000, 0.99), 0.99),
        (tally(30_000, 0.9), 0.99),
        # The whole budget to spare: the lowest planned.
        (tally(30_000, 1.0), 0.95),
        # Half the budget spent: halfway.
        (tally(30_000, 0.995), 0.97),
        # Too few requests to tell spare misses from noise (fewer than 4 x 0.99 / 0.01).
        (tally(390, 1.0), 0.99),
    ],
    ids=["no tally", "at target", "below target", "all met", "half spent", "too few"],
)
def test_planned_attainment_spends_the_budget_the_tally_leaves(
    history: PolicyHistory, want: float
) -> None:
    assert planned_attainment(AGG, history) == pytest.approx(want)


def test_a_shortfall_within_the_windows_noise_teaches_nothing() -> None:
    """0.985 over a window of 160 req/s for 60 s is 2.6 standard errors below 0.99 (a miss);
    over a window of 5 req/s it is noise, unless the longer tally is below the target too."""
    spec = AGG_FEEDBACK
    small = {Role.AGGREGATED: 1}
    quiet = decide(
        spec, snapshot(5.0, small, attainment=0.985), small, recommended(NOW - 30, small)
    )
    assert quiet.history.tightening == LatencyFactors()
    assert quiet.reason not in (Reason.SCALE_UP_TTFT, Reason.SCALE_UP_TPOT)
    behind = replace(recommended(NOW - 30, small), outcomes=OutcomeTally(NOW - 15, 20_000, 19_700))
    taught = decide(spec, snapshot(5.0, small, attainment=0.985), small, behind)
    assert taught.history.tightening != LatencyFactors()
    busy = decide(
        spec, snapshot(HIGH, AGG_HIGH, attainment=0.985), AGG_HIGH, recommended(NOW - 30, AGG_HIGH)
    )
    assert busy.history.tightening != LatencyFactors()


def test_a_missed_role_holds_the_replicas_that_served_the_miss_not_those_starting() -> None:
    """Replicas asked for to answer a miss are not held by it: once they have been seen
    serving (a cold start and a rate window after they were asked for) and the load that asked
    for them is gone, the sizing alone says whether they are still needed. Before that, the
    fleet is not shrunk: what it last grew by has not been measured yet."""
    ready = AGG_LOW[Role.AGGREGATED]
    asked = {Role.AGGREGATED: ready + 6}
    observed = snapshot(LOW, {Role.AGGREGATED: ready}, attainment=0.5)
    for ordered_s, held in ((30.0, True), (AGG_FEEDBACK.cold_start_s + WINDOW_S, False)):
        history = replace(
            recommended(NOW - 400, asked), last_scale_up_s={Role.AGGREGATED: NOW - ordered_s}
        )
        decision = decide(AGG_FEEDBACK, observed, asked, history)
        if held:
            assert dict(decision.replicas) == asked
        else:
            assert decision.replicas[Role.AGGREGATED] < asked[Role.AGGREGATED]
            assert decision.replicas[Role.AGGREGATED] >= ready


def demand_samples(rates: list[float], every_s: float = 15.0) -> tuple[DemandSample, ...]:
    start = NOW - every_s * len(rates)
    return tuple(DemandSample(start + i * every_s, r, 0.0) for i, r in enumerate(rates))


@pytest.mark.parametrize(
    ("rates", "want"),
    [
        # Flat: no headroom.
        ([100.0] * 60, 0.0),
        # 10% more every cold start (120 s, 8 ticks), steadily: 10%.
        ([100.0 * 1.1 ** (i / 8) for i in range(60)], 0.1),
        # Faster than the forecast may go: capped at max_trend_growth.
        ([100.0 * 1.5 ** (i / 8) for i in range(60)], AGG.max_trend_growth - 1),
        # Falling: none.
        ([100.0 * 0.9 ** (i / 8) for i in range(60)], 0.0),
        # Too short a history to measure: none.
        ([100.0 * 1.1 ** (i / 8) for i in range(12)], 0.0),
    ],
    ids=["flat", "steady growth", "capped", "falling", "too short"],
)
def test_growth_headroom_is_measured_from_the_demands_own_history(
    rates: list[float], want: float
) -> None:
    assert growth_headroom(AGG, demand_samples(rates)) == pytest.approx(want, abs=1e-6)


def test_growth_within_counting_noise_holds_no_headroom() -> None:
    """5 req/s counted over a minute (300 requests) reads +-4% by chance: no headroom for it;
    the same swing at 500 req/s is real growth."""
    swing = [1.04 if (i // 8) % 2 else 0.96 for i in range(60)]
    noisy = demand_samples([5.0 * f for f in swing])
    assert growth_headroom(AGG, noisy, WINDOW_S) == 0.0
    busy = demand_samples([500.0 * f for f in swing])
    assert growth_headroom(AGG, busy, WINDOW_S) > 0.05


def test_a_load_that_grew_fast_before_is_sized_with_headroom() -> None:
    """The same demand now, sized with the growth this load showed within a cold start."""
    grew = demand_samples([HIGH * 0.9 ** ((60 - i) / 8) for i in range(60)])
    history = replace(recommended(NOW - 30, AGG_HIGH), demand=grew[:-1])
    decision = decide(AGG, snapshot(HIGH, AGG_HIGH), AGG_HIGH, history)
    assert decision.replicas[Role.AGGREGATED] > AGG_HIGH[Role.AGGREGATED]


def test_a_lesson_is_sized_by_the_tallys_shortfall_not_one_windows() -> None:
    """A burst that one window missed almost entirely, on a fleet whose tally is near the
    target: one lesson, not a doubled fleet."""
    count = AGG_HIGH[Role.AGGREGATED]
    history = replace(
        recommended(NOW - 30, AGG_HIGH), outcomes=OutcomeTally(NOW - 15, 50_000, 49_450)
    )
    decision = decide(AGG_FEEDBACK, snapshot(HIGH, AGG_HIGH, attainment=0.5), AGG_HIGH, history)
    assert decision.history.tightening != LatencyFactors()
    assert count < decision.replicas[Role.AGGREGATED] <= count + max(2, count // 4)


def counted(
    base: MetricsSnapshot,
    *,
    arrivals: float,
    recent: float | None = None,
    recent_window_s: float | None = None,
) -> MetricsSnapshot:
    """`base` from a router that counts arrivals: over the rate window, and over a short one."""
    service = replace(base.service, arrivals_per_s=arrivals, recent_arrivals_per_s=recent)
    return replace(base, service=service, recent_window_s=recent_window_s)


def test_counted_arrivals_are_the_load_while_a_backlog_drains() -> None:
    """Completions and prefilled prompts run ahead of arrivals while engines work through a
    backlog: a router that counts arrivals says what the load is."""
    draining = snapshot(2 * HIGH, AGG_HIGH)
    decision = decide(
        AGG, counted(draining, arrivals=HIGH), AGG_HIGH, recommended(NOW - 30, AGG_HIGH)
    )
    assert dict(decision.replicas) == AGG_HIGH


RECENT_WINDOW_S = 15.0


def recent_lower_bound(rate: float, window_s: float = RECENT_WINDOW_S) -> float:
    counted_requests = rate * window_s
    return (counted_requests - AGG.recent_significance * math.sqrt(counted_requests)) / window_s


def measured_before(rate: float, at_s: float = NOW - 30) -> PolicyHistory:
    """A history whose last tick, `at_s`, measured `rate` arriving and held AGG_LOW."""
    return replace(recommended(at_s, AGG_LOW), demand=(DemandSample(at_s, rate, 0.0),))


def test_a_step_in_the_recent_window_is_sized_for_before_the_rate_window_sees_it() -> None:
    """Fifteen seconds after a step from LOW to HIGH the rate window still reads mostly LOW;
    the recent window shows HIGH, far beyond what the load before it gives such a window: the
    load changed, and the fleet is sized for it at once (not for its noise's lower bound, and
    then a little more at each tick)."""
    step = snapshot(LOW, AGG_LOW)
    rate_window = LOW + (HIGH - LOW) * RECENT_WINDOW_S / WINDOW_S
    seen = counted(step, arrivals=rate_window, recent=HIGH, recent_window_s=RECENT_WINDOW_S)
    decision = decide(AGG, seen, AGG_LOW, measured_before(LOW))
    assert dict(decision.replicas) == planned(AGG, HIGH)
    assert decision.replicas[Role.AGGREGATED] > planned(AGG, rate_window)[Role.AGGREGATED]


@pytest.mark.parametrize(
    ("before", "after", "window_s"),
    [(0.5, 3.0, 5.0), (0.0, 2.0, 5.0), (8.0, 24.0, 30.0), (LOW, HIGH, RECENT_WINDOW_S)],
)
def test_a_changed_load_is_read_from_the_short_window_at_its_own_rate(
    before: float, after: float, window_s: float
) -> None:
    """A step seen whole in the short window (small counts included: 15 requests where 2.5
    were due) is the load from then on."""
    rate_window = before + (after - before) * window_s / WINDOW_S
    seen = counted(
        snapshot(before, AGG_LOW), arrivals=rate_window, recent=after, recent_window_s=window_s
    )
    history = measured_before(before, NOW - window_s)
    assert recent_arrivals(AGG, seen, history) == pytest.approx(after)
    # Without a tick a short window before this one, nothing to compare with: the lower bound.
    assert recent_arrivals(AGG, seen, PolicyHistory()) == pytest.approx(
        recent_lower_bound(after, window_s)
    )
    too_recent = measured_before(before, NOW - window_s / 2)
    assert recent_arrivals(AGG, seen, too_recent) == recent_arrivals(AGG, seen, PolicyHistory())


def test_a_few_arrivals_at_an_idle_service_count_for_their_lower_bound() -> None:
    """Six requests in five seconds where none came before: load came, but six requests do not
    say how much; a fleet sized for their point estimate would hold GPUs for noise."""
    seen = counted(snapshot(0.0, AGG_LOW), arrivals=0.2, recent=1.2, recent_window_s=5.0)
    history = measured_before(0.0, NOW - 5.0)
    assert recent_arrivals(AGG, seen, history) == pytest.approx(recent_lower_bound(1.2, 5.0))


@pytest.mark.parametrize("rate", [0.5, 3.0, 20.0, 150.0])
@pytest.mark.parametrize("window_s", [5.0, 15.0, 30.0])
def test_a_short_window_within_chance_of_the_load_before_it_is_read_at_its_lower_bound(
    rate: float, window_s: float
) -> None:
    """Two standard errors of its own count high (one window in 40 of a load that does not
    move) is not a change: the reading counts for its lower bound, below itself."""
    high = rate + 2 * math.sqrt(max(rate * window_s, 1.0)) / window_s
    seen = counted(snapshot(rate, AGG_LOW), arrivals=rate, recent=high, recent_window_s=window_s)
    history = measured_before(rate, NOW - window_s)
    assert recent_arrivals(AGG, seen, history) == pytest.approx(recent_lower_bound(high, window_s))
    assert recent_arrivals(AGG, seen, history) < high


@pytest.mark.parametrize("rate", [0.5, 3.0, 20.0, 150.0])
@pytest.mark.parametrize("window_s", [5.0, 15.0, 30.0])
def test_a_recent_window_reading_high_by_chance_raises_no_demand(
    rate: float, window_s: float
) -> None:
    """A load that does not move reads one standard error high in a sixth of its short
    windows: such a reading stays below the load itself, so it never scales up."""
    noisy = rate + math.sqrt(rate / window_s)
    step = counted(snapshot(rate, AGG_LOW), arrivals=rate, recent=noisy, recent_window_s=window_s)
    plain = counted(snapshot(rate, AGG_LOW), arrivals=rate)
    history = measured_before(rate)
    assert (
        decide(AGG, step, AGG_LOW, history).replicas
        == decide(AGG, plain, AGG_LOW, history).replicas
    )


@pytest.mark.parametrize(
    ("why", "waiting", "tpot_p95_s", "floor"),
    [
        ("no request queues: the replicas running them hold them", 0.0, 0.04, False),
        ("requests queue at target speed: they must fit somewhere", 50.0, 0.04, True),
        (
            "requests queue behind steps slower than the target: the sequences last longer "
            "than the load needs at target speed",
            50.0,
            0.06,
            False,
        ),
    ],
)
def test_the_sequences_in_the_engines_set_a_floor_only_while_requests_queue_at_target_speed(
    why: str, waiting: float, tpot_p95_s: float, floor: bool
) -> None:
    """Ten times the sequences the load holds at its rate, in engines whose KV cache is full
    (as when a step left long sequences behind)."""
    running = 10 * running_at(HIGH)
    base = snapshot(HIGH, AGG_HIGH, waiting=waiting, kv_cache_usage=0.8, tpot_p95_s=tpot_p95_s)
    roles = {
        role: replace(metrics, running_requests=running) for role, metrics in base.roles.items()
    }
    decision = decide(
        AGG, counted(replace(base, roles=roles), arrivals=HIGH), AGG_HIGH,
        recommended(NOW - 30, AGG_HIGH),
    )  # fmt: skip
    drained = planned(AGG, HIGH + waiting / AGG.backlog_drain_s)
    if floor:
        assert decision.replicas[Role.AGGREGATED] > drained[Role.AGGREGATED], why
    else:
        assert dict(decision.replicas) == drained, why


def test_the_sequence_floor_fits_them_at_the_targets_decode_step_not_the_tightened_one() -> None:
    """What calibration and attainment taught act through the planner's count; the floor asks
    only whether the sequences fit (KV cache, batch limit, the target's decode step)."""
    pool = AGG.role(Role.AGGREGATED)
    demand = Demand(LOW, LOW, 1000, 200, 50.0, 0.0, 1.0)
    metrics = RoleMetrics(Role.AGGREGATED, 2, 1000.0, 50.0, 0.5, LOW * 1000, LOW * 200)
    sizing = size_role(
        AGG, pool, demand=demand, metrics=metrics, slo=tightened(tpot=4.0), margin=0.0
    )
    fits = sequences_per_replica(AGG, pool, demand, AGG.slo)
    assert fits > sequences_per_replica(AGG, pool, demand, tightened(tpot=4.0))
    assert sizing.needed == math.ceil(1050.0 / fits)
    assert "sequences running or queued" in sizing.why


def _samples(
    rates: list[float], forecasts: list[float] | None = None, every_s: float = 15.0
) -> list[DemandSample]:
    planned = forecasts or [5.0] * len(rates)
    return [
        DemandSample(i * every_s, rate, 0.0, rate, forecast)
        for i, (rate, forecast) in enumerate(zip(rates, planned, strict=True))
    ]


def _burst(samples: list[DemandSample], **settings: float) -> float:
    given = {
        "lag_s": 30.0,
        "slack": 0.0,
        "wait_budget_s": 0.75,
        "late_share": 0.005,
        "min_samples": 8,
    }
    return burst_capacity(samples, **{**given, **settings})  # type: ignore[arg-type]


def test_bursts_the_forecasts_missed_are_held_capacity_for_by_replaying_them() -> None:
    """15 s bursts at 40 req/s over a load of 5 that the forecasts (5 req/s) never saw coming:
    a fluid queue draining at C builds (40 - C) x 15 requests of backlog, which must drain
    within the wait budget (0.75 s): C x 0.75 >= (40 - C) x 15, so C >= 38.1 req/s."""
    bursty = _samples([5, 5, 5, 40, 5, 5, 5, 40, 5, 5, 5, 5, 5])
    assert _burst(bursty) == pytest.approx(600 / 15.75, rel=1e-3)
    # With 15 s to wait out a burst, half the burst's rate drains it in time: C >= 20.
    assert _burst(bursty, wait_budget_s=15.0) == pytest.approx(20.0, rel=1e-3)
    # A pool that serves a quarter more than it was sized for needs a quarter less held.
    assert _burst(bursty, slack=0.25) == pytest.approx(600 / 15.75 / 1.25, rel=1e-3)
    # Too few samples with a forecast a cold start before them: nothing.
    assert _burst(bursty[:8]) == 0


def test_a_load_the_forecasts_kept_up_with_asks_for_no_burst_capacity() -> None:
    flat = _samples([10.0] * 13, [10.0] * 13)
    assert _burst(flat) == 0
    # A ramp whose forecasts ran ahead of it by the growth a cold start brings.
    rising = [5.0 + i for i in range(13)]
    assert _burst(_samples(rising, [rate + 2.5 for rate in rising])) == 0
    # The same ramp, forecast at the rate it had then, queues a cold start behind; but it rose
    # once: the trend answers it, not capacity held for bursts.
    assert _burst(_samples(rising, rising)) == 0
    # One burst is a step as far as anyone can tell.
    assert _burst(_samples([5, 5, 5, 40, 5, 5, 5, 5, 5, 5, 5, 5, 5])) == 0


def test_a_bursty_load_keeps_capacity_between_its_bursts() -> None:
    spec = policy(cold_start_s=30.0)
    quiet = snapshot(5.0, {Role.AGGREGATED: 2})
    rates = [5, 5, 5, 60, 5, 5, 5, 60, 5, 5, 5, 5]

    def history(recent: list[int]) -> PolicyHistory:
        return PolicyHistory(
            demand=tuple(
                DemandSample(NOW - 15.0 * (len(recent) - i), 5.0, 0.0, rate, 5.0)
                for i, rate in enumerate(recent)
            )
        )

    held = decide(spec, quiet, {Role.AGGREGATED: 2}, history(rates))
    plain = decide(spec, quiet, {Role.AGGREGATED: 2}, history([5] * len(rates)))
    assert held.replicas[Role.AGGREGATED] > plain.replicas[Role.AGGREGATED]
    assert "held for the bursts of the last 10 min" in held.message
    assert "bursts" not in plain.message


def test_a_lesson_plans_for_more_load_not_for_a_tighter_latency() -> None:
    """Decode reads the weights at every step, so TPOT barely moves with the load (here an 8B
    model on an L40S, TPOT target 35 ms): the 15% a lesson teaches asks for about 15% more
    replicas, where the same 15% off the TPOT target would ask for several times that."""
    spec = replace(
        policy(config=replica(gpu=GpuType.L40S_48GB), max_replicas=100),
        slo=Slo.in_seconds(ttft_p95_s=1.0, tpot_p95_s=0.035),
    )
    pool = spec.role(Role.AGGREGATED)
    rate = 30.0
    demand = Demand(rate, rate, 1000, 200, 0.0, 0.0, 1.0)
    metrics = RoleMetrics(Role.AGGREGATED, 10, 0.0, 0.0, 0.3, rate * 1000, rate * 200)
    gain = spec.feedback_gain

    def needed(slo: Slo, factor: float = 1.0) -> int:
        return size_role(
            spec, pool, demand=demand, metrics=metrics, slo=slo, margin=0.0, load_factor=factor
        ).needed

    untaught = needed(spec.slo)
    taught = needed(spec.slo, gain)
    tighter_target = needed(Slo.in_seconds(ttft_p95_s=1.0, tpot_p95_s=0.035 / gain))
    assert untaught < taught <= math.ceil(untaught * gain)
    assert tighter_target - untaught > 2 * (taught - untaught)


# --- Scale-down stabilisation shortened while the forecasts hold.

TICK_S = 15.0


def _forecast_history(
    spec: PolicySpec,
    *,
    arrived: Callable[[float], float],
    forecast: Callable[[float], float],
    replicas: Callable[[float], Mapping[Role, int]],
    attainment: float = 0.995,
) -> PolicyHistory:
    """Ticks every 15 s over the stabilisation window and a cold start before it: what arrived
    and what was forecast at each (by its time), what each recommended, and a tally of 10,000
    requests at `attainment`."""
    since = NOW - spec.scale_down_stabilization_s - spec.cold_start_s - TICK_S
    ticks = [since + i * TICK_S for i in range(int((NOW - since) / TICK_S))]
    return PolicyHistory(
        recommendations=tuple(
            Recommendation(t, dict(replicas(t)))
            for t in ticks
            if t > NOW - spec.scale_down_stabilization_s
        ),
        demand=tuple(DemandSample(t, arrived(t), 0.0, arrived(t), forecast(t)) for t in ticks),
        last_decision=LastDecision(ticks[-1], dict(replicas(ticks[-1])), Reason.STEADY),
        outcomes=OutcomeTally(ticks[-1], 10_000.0, 10_000.0 * attainment),
    )


def _dropped(t: float) -> bool:
    """The load fell from HIGH to LOW a little more than one rate window before NOW."""
    return t > NOW - WINDOW_S - TICK_S


def _load(t: float) -> float:
    return LOW if _dropped(t) else HIGH


def _fleet(t: float) -> Mapping[Role, int]:
    return AGG_SHRUNK if _dropped(t) else AGG_HIGH


def test_a_pool_shrinks_after_one_rate_window_when_the_forecasts_held() -> None:
    """Every forecast of the window covered what came a cold start later (10% above it) and
    the SLO was met: once demand has been lower for a rate window, the pool shrinks, where the
    full window would hold the replicas the higher load needed four minutes longer."""
    history = _forecast_history(
        AGG, arrived=_load, forecast=lambda t: 1.1 * _load(t), replicas=_fleet
    )
    decision = decide(AGG, snapshot(LOW, AGG_HIGH), AGG_HIGH, history)
    # Down to what it sizes for now, as it would after the whole window.
    sized = decision.estimates[Role.AGGREGATED].needed
    assert decision.replicas == {Role.AGGREGATED: sized}, decision.message
    assert sized < AGG_HIGH[Role.AGGREGATED]
    assert decision.reason == Reason.SCALE_DOWN_FORECASTS_HELD
    assert "scale-down after 60 s of lower demand, not 300 s" in decision.message
    assert "attainment (99.5%) met its target" in decision.message

    held = decide(
        replace(AGG, shorten_stabilization=False), snapshot(LOW, AGG_HIGH), AGG_HIGH, history
    )
    assert held.replicas == AGG_HIGH
    assert held.reason == Reason.STABILIZING


def test_a_load_above_its_forecast_or_a_missed_slo_keeps_the_whole_window() -> None:
    """One tick whose arrivals stood above what was forecast a cold start before it (a burst
    the forecast did not see), or attainment below its target: the model has not been right,
    and the pool waits out the whole stabilisation window."""
    burst_at = NOW - 210  # a tick of the window

    def bursty(t: float) -> float:
        return 3 * HIGH if t == burst_at else _load(t)

    cases = {
        "burst": _forecast_history(
            AGG, arrived=bursty, forecast=lambda t: 1.1 * _load(t), replicas=_fleet
        ),
        "missed": _forecast_history(
            AGG, arrived=_load, forecast=lambda t: 1.1 * _load(t), replicas=_fleet, attainment=0.98
        ),
    }
    for name, history in cases.items():
        assert history.outcomes is not None
        assert not forecasts_held(AGG, history.demand, NOW, history.outcomes.attainment), name
        decision = decide(AGG, snapshot(LOW, AGG_HIGH), AGG_HIGH, history)
        assert decision.replicas == AGG_HIGH, name
        assert decision.reason == Reason.STABILIZING, name


def test_forecasts_held_reads_the_whole_window_and_the_forecast_a_cold_start_before() -> None:
    spec = policy(scale_down_stabilization_s=60.0, cold_start_s=30.0)
    # Ticks every 15 s from 0 to 150; the window at 150 is (90, 150]: its ticks are 105 to 150,
    # each judged against the forecast of the tick at least 30 s before it.
    rates = [10.0] * 11
    assert forecasts_held(spec, _samples(rates, [10.0] * 11), 150.0, 0.995)
    # Arrivals above the forecast a cold start before them, within the window: not held.
    forecasts = [10.0] * 11
    forecasts[5] = 9.0  # the tick at 75 forecast 9; 105 (two ticks later) had 10
    assert not forecasts_held(spec, _samples(rates, forecasts), 150.0, 0.995)
    # The same before the window no longer counts.
    forecasts = [10.0] * 11
    forecasts[2] = 9.0  # at 30: judged the tick at 60, outside the window
    assert forecasts_held(spec, _samples(rates, forecasts), 150.0, 0.995)
    # The arrivals beyond their counting noise are what is judged: a rate window reading above
    # the forecast with a short window within it is noise.
    noisy = [
        DemandSample(s.at_s, 11.0, 0.0, 10.0, s.forecast_requests_per_s)
        for s in _samples(rates, [10.0] * 11)
    ]
    assert forecasts_held(spec, noisy, 150.0, 0.995)
    # No attainment, or one below the target: not held.
    assert not forecasts_held(spec, _samples(rates, [10.0] * 11), 150.0, None)
    assert not forecasts_held(spec, _samples(rates, [10.0] * 11), 150.0, 0.98)
    # Samples that begin inside the window (a restart) do not cover it.
    assert not forecasts_held(spec, _samples(rates, [10.0] * 11)[7:], 150.0, 0.995)


def test_while_the_load_drains_longer_answers_completing_are_not_taken_as_a_shift() -> None:
    """As a load falls, the requests still completing are those that live long: their mean
    output reads long. Where completions outnumber arrivals beyond counting noise, a longer
    mean is neither planned for nor learned (what was remembered holds), and prompts are read
    from the arrivals alone; where they do not, a longer mean is a shift, acted on at once."""
    history = PolicyHistory(mix=MixMemory(NOW - 15, 1000.0, 200.0))
    base = snapshot(10.0, AGG_LOW, input_tokens=1300, output_tokens=400)

    def arriving(per_s: float) -> MetricsSnapshot:
        service = replace(base.service, arrivals_per_s=per_s, mean_arrival_prompt_tokens=1100.0)
        return replace(base, service=service)

    draining = estimate_demand(AGG, arriving(2.0), history)
    assert (draining.input_tokens, draining.output_tokens) == (1100, 200)
    assert draining.mix is not None
    assert draining.mix.output_tokens == 200.0
    steady = estimate_demand(AGG, arriving(10.0), history)
    assert (steady.input_tokens, steady.output_tokens) == (1300, 400)
    # 10 completed against 9 arrived a second, over a minute: within counting noise.
    assert estimate_demand(AGG, arriving(9.0), history).output_tokens == 400


# The cold start planned for, measured per role (`policy.coldstart`).

TICK_S = 15.0


def _ticked(history: PolicyHistory, at_s: float, replicas: Mapping[Role, int]) -> PolicyHistory:
    return replace(history, last_decision=LastDecision(at_s, dict(replicas), Reason.STEADY))


def test_a_scale_up_is_timed_until_its_first_new_replica_serves() -> None:
    grown = {Role.AGGREGATED: AGG_HIGH[Role.AGGREGATED] + 2}
    ordered = snapshot(HIGH, AGG_HIGH, at_s=NOW)
    history = _ticked(PolicyHistory(), NOW - TICK_S, AGG_HIGH)
    tracked = track_cold_starts(history, ordered, AGG_HIGH, grown)
    assert tracked[Role.AGGREGATED] == ColdStarts(NOW, AGG_HIGH[Role.AGGREGATED])
    # Still starting a tick later: nothing measured yet.
    history = replace(_ticked(history, NOW, grown), cold_starts=tracked)
    later = snapshot(HIGH, AGG_HIGH, at_s=NOW + TICK_S)
    tracked = track_cold_starts(history, later, grown, grown)
    assert tracked[Role.AGGREGATED].measured_s == ()
    # One more replica serves at the tick 300 s after the order: it came up within the last
    # tick, so half a tick is taken off.
    history = replace(_ticked(history, NOW + 300 - TICK_S, grown), cold_starts=tracked)
    one_up = {Role.AGGREGATED: AGG_HIGH[Role.AGGREGATED] + 1}
    tracked = track_cold_starts(history, snapshot(HIGH, one_up, at_s=NOW + 300), grown, grown)
    assert tracked[Role.AGGREGATED] == ColdStarts(measured_s=(300 - TICK_S / 2,))


def test_a_scale_up_cancelled_or_ordered_while_replicas_start_measures_nothing() -> None:
    count = AGG_HIGH[Role.AGGREGATED]
    history = replace(
        _ticked(PolicyHistory(), NOW - TICK_S, AGG_HIGH),
        cold_starts={Role.AGGREGATED: ColdStarts(NOW - 60, count, (200.0,))},
    )
    # Cancelled: the pool goes back to what served before the order came up.
    tracked = track_cold_starts(history, snapshot(HIGH, AGG_HIGH), AGG_HIGH, AGG_HIGH)
    assert tracked[Role.AGGREGATED] == ColdStarts(measured_s=(200.0,))
    # Ordered while one of the current replicas still starts: the first to serve could be that
    # one, so it is not timed.
    starting = {Role.AGGREGATED: count - 1}
    grown = {Role.AGGREGATED: count + 2}
    tracked = track_cold_starts(PolicyHistory(), snapshot(HIGH, starting), AGG_HIGH, grown)
    assert tracked[Role.AGGREGATED] == ColdStarts()
    # Nor while replicas taken away still drain (and are still counted).
    draining = {Role.AGGREGATED: count + 1}
    tracked = track_cold_starts(PolicyHistory(), snapshot(HIGH, draining), AGG_HIGH, grown)
    assert tracked[Role.AGGREGATED] == ColdStarts()
    # A replica lost while the scale-up starts: the first new one to serve ends the timing.
    history = replace(
        _ticked(PolicyHistory(), NOW - TICK_S, grown),
        cold_starts={Role.AGGREGATED: ColdStarts(NOW - 100, count)},
    )
    lost = {Role.AGGREGATED: count - 1}
    tracked = track_cold_starts(history, snapshot(HIGH, lost), grown, grown)
    assert tracked[Role.AGGREGATED] == ColdStarts(NOW - 100, count - 1)
    history = replace(_ticked(history, NOW, grown), cold_starts=tracked)
    back = snapshot(HIGH, AGG_HIGH, at_s=NOW + TICK_S)
    tracked = track_cold_starts(history, back, grown, grown)
    assert tracked[Role.AGGREGATED] == ColdStarts(measured_s=(100 + TICK_S / 2,))


@pytest.mark.parametrize(
    ("measured", "planned_s", "role"),
    [
        ({}, 120.0, None),
        ({Role.PREFILL: (140.0,)}, 120.0, None),  # within the loop's resolution
        ({Role.PREFILL: (300.0, 240.0), Role.DECODE: (130.0,)}, 300.0, Role.PREFILL),
        ({Role.PREFILL: (40.0,), Role.DECODE: (45.0, 50.0)}, 50.0, Role.DECODE),
    ],
)
def test_the_slowest_roles_measurements_replace_a_configured_cold_start_they_contradict(
    measured: Mapping[Role, tuple[float, ...]], planned_s: float, role: Role | None
) -> None:
    history = PolicyHistory(
        cold_starts={r: ColdStarts(measured_s=times) for r, times in measured.items()}
    )
    assert planned_cold_start(DIS, history) == PlannedColdStart(planned_s, role)


def test_a_measured_cold_start_sizes_the_forecast_and_says_so() -> None:
    # 12 req/s within the configured 120 s, not a trend to act on; 30 req/s within 300 s is.
    slope = 0.1
    samples = tuple(
        DemandSample(NOW - age, HIGH - slope * age, running_at(HIGH))
        for age in (150, 120, 90, 60, 30)
    )
    history = replace(recommended(NOW - 30, AGG_HIGH), demand=samples)
    configured = decide(AGG, snapshot(HIGH, AGG_HIGH), AGG_HIGH, history)
    slow = replace(history, cold_starts={Role.AGGREGATED: ColdStarts(measured_s=(300.0,))})
    measured = decide(AGG, snapshot(HIGH, AGG_HIGH), AGG_HIGH, slow)
    assert "forecast in" not in configured.message
    assert "forecast in 300 s" in measured.message
    assert "as measured (aggregated), not the 120 s configured" in measured.message
    assert measured.replicas[Role.AGGREGATED] > configured.replicas[Role.AGGREGATED]
    # What was measured, and the scale-up now awaited, survive the history's wire form.
    assert measured.history.cold_starts[Role.AGGREGATED].ordered_at_s == NOW
    assert PolicyHistory.from_wire(measured.history.to_wire()) == measured.history
