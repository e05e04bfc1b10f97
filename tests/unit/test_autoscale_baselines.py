"""Baseline scalers and the per-window oracle, on hand-made snapshots and a short simulation."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.api.model_spec import WeightSource
from inferfleet.autoscale.baselines import (
    Bounds,
    ClairvoyantScaler,
    HpaScaler,
    QueueScaler,
    RoleCapacity,
    StaticScaler,
    ThroughputPlanner,
    role_capacity,
)
from inferfleet.autoscale.snapshot import MetricsSnapshot, RoleMetrics, ServiceMetrics
from inferfleet.bench.autoscale import (
    direction_changes,
    load_steps,
    markdown_table,
    result_json,
    run_scenario,
)
from inferfleet.bench.references import Service, per_window_oracle, window_scores
from inferfleet.bench.scenario import parse_scenario, with_cold_start, with_weight_source
from inferfleet.planning.load import OperatingPoint, operating_point
from inferfleet.sim.fleet import FleetConfig
from inferfleet.sim.run import FleetRun, ScaleDecision
from inferfleet.slo import Slo
from tests.unit.bench_fixtures import tiny_scenario
from tests.unit.planning_fixtures import replica

AGG = Role.AGGREGATED
CAPACITY = {AGG: RoleCapacity(requests_per_s=5.0, concurrency=10.0, prompt_tokens_per_s=5000.0,
                              output_tokens_per_s=1000.0)}  # fmt: skip
BOUNDS = {AGG: Bounds(1, 20), Role.PREFILL: Bounds(1, 20), Role.DECODE: Bounds(1, 20)}


def snapshot(
    at: float,
    *,
    ready: int = 4,
    running: float = 0.0,
    waiting: float = 0.0,
    role: Role = AGG,
    prompt_per_s: float = 0.0,
    output_per_s: float = 0.0,
    mix: tuple[float, float] | None = None,
) -> MetricsSnapshot:
    metrics = RoleMetrics(role, ready, running, waiting, 0.1, prompt_per_s, output_per_s)
    service = ServiceMetrics(
        requests_per_s=1.0,
        in_flight_requests=running + waiting,
        mean_prompt_tokens=None if mix is None else mix[0],
        mean_output_tokens=None if mix is None else mix[1],
    )
    return MetricsSnapshot(at, 60.0, 0.0, service, {role: metrics})


@dataclass(frozen=True)
class HpaCase:
    reason: str
    running: float
    current: int
    wanted: int


@pytest.mark.parametrize(
    "case",
    [
        HpaCase("at target: hold", running=4 * 10 * 0.7, current=4, wanted=4),
        HpaCase("within the 10% tolerance: hold", running=4 * 10 * 0.75, current=4, wanted=4),
        HpaCase("above: ceil(load / (concurrency x target))", running=45, current=4, wanted=7),
        HpaCase("far above: at most double (or +4) per sync", running=200, current=4, wanted=8),
        HpaCase("below, first sync: the window holds the current count", 7, current=4, wanted=4),
    ],
    ids=lambda case: case.reason,
)
def test_hpa(case: HpaCase) -> None:
    hpa = HpaScaler(CAPACITY, BOUNDS)
    wanted = hpa.desired(15.0, snapshot(15.0, running=case.running), {AGG: case.current})
    assert wanted[AGG] == case.wanted


def test_hpa_scales_down_only_after_its_window() -> None:
    hpa = HpaScaler(CAPACITY, BOUNDS)
    assert hpa.desired(0.0, snapshot(0.0, running=28), {AGG: 4})[AGG] == 4
    low = snapshot(15.0, running=7)
    for at in range(15, 300, 15):
        assert hpa.desired(float(at), low, {AGG: 4})[AGG] == 4
    assert hpa.desired(300.0, low, {AGG: 4})[AGG] == 1


def test_keda_follows_the_queue_and_cools_down_for_300_s() -> None:
    keda = QueueScaler([AGG], BOUNDS, waiting_per_replica=5.0)
    assert keda.desired(0.0, snapshot(0.0, waiting=30), {AGG: 4})[AGG] == 6
    # The queue empties: KEDA recommends the minimum, but only after the cooldown.
    assert keda.desired(30.0, snapshot(30.0, waiting=0), {AGG: 6})[AGG] == 6
    assert keda.desired(270.0, snapshot(270.0, waiting=0), {AGG: 6})[AGG] == 6
    assert keda.desired(301.0, snapshot(301.0, waiting=0), {AGG: 6})[AGG] == 1


def test_no_metrics_hold_every_baseline() -> None:
    current = {AGG: 3}
    planner = ThroughputPlanner(replica(), [AGG], BOUNDS, 1.0, 0.05, (1000, 200))
    for scaler in (HpaScaler(CAPACITY, BOUNDS), QueueScaler([AGG], BOUNDS), planner):
        assert scaler.desired(0.0, None, current) == current
    assert StaticScaler({AGG: 5}).desired(0.0, None, current) == {AGG: 5}


def _meets(point: OperatingPoint, role: Role, ttft_s: float, tpot_s: float) -> bool:
    ttft_ok = role is Role.DECODE or point.ttft_p95_s <= ttft_s
    tpot_ok = role is Role.PREFILL or point.tpot_s <= tpot_s
    return point.stable and ttft_ok and tpot_ok


@pytest.mark.parametrize("role", [AGG, Role.DECODE])
def test_role_capacity_is_the_highest_rate_that_meets_the_slo(role: Role) -> None:
    config = replica(max_model_length=8192)
    cap = role_capacity(config, role, input_tokens=1000, output_tokens=200, ttft_s=0.5,
                        tpot_s=0.04)  # fmt: skip

    def point(rate: float) -> OperatingPoint:
        return operating_point(
            config, rate, 1000, 200, prefill=role is not Role.DECODE,
            decode=role is not Role.PREFILL,
        )  # fmt: skip

    assert _meets(point(cap.requests_per_s * 0.99), role, 0.5, 0.04)
    assert not _meets(point(cap.requests_per_s * 1.02), role, 0.5, 0.04)
    assert cap.prompt_tokens_per_s == pytest.approx(cap.requests_per_s * 1000)


def test_the_throughput_planner_sizes_each_pool_from_its_token_rate() -> None:
    config = replica(max_model_length=8192)
    roles = [Role.PREFILL, Role.DECODE]
    planner = ThroughputPlanner(config, roles, BOUNDS, 0.5, 0.04, (1000, 200))
    prefill_cap = role_capacity(
        config, Role.PREFILL, input_tokens=1000, output_tokens=200, ttft_s=0.5, tpot_s=0.04
    )
    decode_cap = role_capacity(
        config, Role.DECODE, input_tokens=1000, output_tokens=200, ttft_s=0.5, tpot_s=0.04
    )
    prompt_per_s = 3.5 * prefill_cap.prompt_tokens_per_s
    output_per_s = 1.5 * decode_cap.output_tokens_per_s
    metrics = {
        Role.PREFILL: RoleMetrics(Role.PREFILL, 2, 0, 0, 0.0, prompt_per_s, 0.0),
        Role.DECODE: RoleMetrics(Role.DECODE, 2, 0, 0, 0.0, 0.0, output_per_s),
    }
    service = ServiceMetrics(1.0, 0.0, mean_prompt_tokens=1000, mean_output_tokens=200)
    wanted = planner.desired(
        180.0, MetricsSnapshot(180.0, 60.0, 0.0, service, metrics), dict.fromkeys(roles, 2)
    )
    assert wanted == {Role.PREFILL: 4, Role.DECODE: 2}


def test_the_oracle_asks_for_a_window_a_cold_start_ahead() -> None:
    needs = [{AGG: 1}, {AGG: 1}, {AGG: 1}, {AGG: 5}, {AGG: 2}, {AGG: 2}, {AGG: 2}]
    oracle = ClairvoyantScaler(needs, window_s=60.0, cold_start_s=120.0, interval_s=5.0)
    # Window 3 starts at 180 s: its replicas are asked for by 60 s, so they serve from 180 s.
    assert oracle.desired(50.0, None, {})[AGG] == 1
    assert oracle.desired(60.0, None, {})[AGG] == 5
    assert oracle.desired(239.0, None, {})[AGG] == 5
    # Past the step, only what the next cold start's windows need.
    assert oracle.desired(240.0, None, {})[AGG] == 2
    # Without foresight, window 3 is asked for as it starts.
    unforeseen = replace(oracle, lead_s=0.0)
    assert unforeseen.desired(179.0, None, {})[AGG] == 1
    assert unforeseen.desired(180.0, None, {})[AGG] == 5
    assert unforeseen.desired(240.0, None, {})[AGG] == 2


SCENARIO = tiny_scenario()


def test_the_oracle_meets_the_slo_in_every_window_with_few_replicas() -> None:
    from inferfleet.bench.scenario import scenario_requests, service_of  # noqa: PLC0415

    scenario = parse_scenario(SCENARIO)
    requests = scenario_requests(scenario, ".")
    service: Service = service_of(scenario)
    config = FleetConfig(service.replica, service.slo, cold_start_s=30.0, horizon_s=240.0)
    oracle = per_window_oracle(requests, service, config, window_s=60.0, max_lower_passes=1)
    scores = window_scores(oracle.run, 60.0, 4)
    assert all(score.meets(0.95) for score in scores)
    # The step shows in the needs, and the fleet is never larger than the peak needs.
    assert max(n[AGG] for n in oracle.needs[2:]) > oracle.needs[0][AGG]
    assert load_steps(oracle.planned, 1)
    peak = max(n[AGG] for n in oracle.needs)
    assert all(life.role is AGG for life in oracle.run.replicas)
    assert max(oracle.run.held(AGG, t) for t in range(0, 240, 5)) <= peak


def test_direction_changes_count_reversals_per_role() -> None:
    decisions = [
        ScaleDecision(0, AGG, 1, 2),
        ScaleDecision(10, AGG, 2, 3),
        ScaleDecision(20, AGG, 3, 2),
        ScaleDecision(30, AGG, 2, 4),
        ScaleDecision(40, Role.PREFILL, 2, 1),
    ]
    run = FleetRun([], [], decisions, 3600.0, 3600.0, {}, {}, 0)
    assert direction_changes(run) == 2


def test_a_scenario_names_its_load_once() -> None:
    body = SCENARIO.replace("pattern: step,", "pattern: step, trace: x.csv,")
    with pytest.raises(ValueError, match="exactly one of trace and pattern"):
        parse_scenario(body)
    assert math.isclose(parse_scenario(SCENARIO).rate, 1.0)
    assert Slo(1000, 50).attainment_target == 0.99


def test_a_scenarios_replicas_may_start_slower_than_the_service_says() -> None:
    body = SCENARIO.replace("coldStartS: 30", "coldStartS: 30, coldStartByRoleS: {aggregated: 90}")
    scenario = parse_scenario(body)
    assert scenario.role_cold_start_s == {Role.AGGREGATED: 90.0}
    for bad, why in [
        ("{router: 9}", "router"),
        ("[90]", "must map roles"),
        ("{aggregated: -1}", ">= 0"),
        ("{prefill: 9}", "not a role of the deployment"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_scenario(SCENARIO.replace("coldStartS: 30", f"coldStartByRoleS: {bad}"))
    every = with_cold_start(scenario, "300")
    assert (every.cold_start_s, every.role_cold_start_s) == (300.0, {})
    assert with_cold_start(every, "aggregated=45").role_cold_start_s == {Role.AGGREGATED: 45.0}
    for bad in ("slow", "aggregated", "aggregated=45,", "inf"):
        with pytest.raises(ValueError, match="--cold-start"):
            with_cold_start(scenario, bad)
    with pytest.raises(ValueError, match="decode: not a role"):
        with_cold_start(scenario, "decode=45")


def test_a_scenarios_fleet_may_start_as_estimated_for_where_its_weights_come_from() -> None:
    from inferfleet.bench.scenario import service_of  # noqa: PLC0415

    body = SCENARIO.replace("engine: {name: sim}", "engine: {name: vllm}").replace(
        "autoscaling: {policy: goodput,", "autoscaling: {policy: goodput, coldStartSeconds: 30,"
    )
    network = parse_scenario(body.replace("coldStartS: 30", "weightSource: network"))
    cache = with_weight_source(parse_scenario(body), WeightSource.CACHE)
    # Llama-3.1-8B from the hub: download 62 s, load 32 s, engine start 200 s; from a volume,
    # no download.
    assert network.cold_start_s == pytest.approx(294, rel=0.02)
    assert cache.cold_start_s == pytest.approx(232, rel=0.02)
    for scenario in (network, cache):
        # What the service configured is dropped: the policy plans with the estimate.
        assert scenario.service.autoscaling.cold_start_seconds is None
        assert service_of(scenario).policy.cold_start_s == scenario.cold_start_s
        assert service_of(scenario).policy.cold_start_estimated
    with pytest.raises(ValueError, match="not both"):
        parse_scenario(body.replace("coldStartS: 30", "coldStartS: 30, weightSource: cache"))
    with pytest.raises(ValueError, match="weightSource 'disk' is not one of network"):
        parse_scenario(body.replace("coldStartS: 30", "weightSource: disk"))


def test_bench_autoscale_writes_the_table_the_json_and_the_plots(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from inferfleet.cli import app  # noqa: PLC0415

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SCENARIO.replace("durationS: 240", "durationS: 150"))
    out = tmp_path / "results"
    result = CliRunner().invoke(
        app,
        ["bench", "autoscale", "--spec", str(spec), "--out", str(out), "--traces-dir", ".",
         "--policy", "goodput", "--policy", "static-peak", "--policy", "oracle"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| goodput |" in result.output
    data = json.loads((out / "tiny.json").read_text())
    # "oracle" is still taken for the clairvoyant schedule.
    assert [p["policy"] for p in data["policies"]] == ["goodput", "static-peak", "clairvoyant"]
    clairvoyant = data["policies"][-1]
    assert clairvoyant["gpuHoursVsClairvoyant"] == pytest.approx(1.0)
    assert clairvoyant["gpuHoursVsFluidBound"] > 1.0
    assert "Cheapest baseline that meets the target" in result.output
    assert (out / "tiny.md").read_text().startswith("### tiny")
    for name in ("tiny_replicas.png", "tiny_attainment.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


IDLE_SCENARIO = (
    SCENARIO.replace(
        "pattern: step, rate: 1, durationS: 240",
        "pattern: sessions, rate: 1, durationS: 3000",
    )
    .replace(
        "patternOptions: {rate_after: 16, switch_s: 100}",
        "patternOptions: {session_every_s: 500, session_s: 120}",
    )
    .replace(
        "aggregated: {minReplicas: 1, maxReplicas: 8}}",
        "aggregated: {minReplicas: 0, maxReplicas: 8}, scaleToZeroIdleSeconds: 60, "
        "coldStartSeconds: 30}",
    )
)


def test_a_service_that_scales_to_zero_is_compared_with_its_one_replica_floor() -> None:
    scenario = parse_scenario(IDLE_SCENARIO)
    result = run_scenario(scenario, ".", ["goodput", "goodput-floor", "static-peak"])
    by_policy = {r.policy: r for r in result.results}
    assert list(by_policy) == ["goodput", "goodput-floor", "static-peak"]
    zero, floor = by_policy["goodput"], by_policy["goodput-floor"]
    assert zero.gpu_hours < floor.gpu_hours
    assert zero.attainment < floor.attainment  # the requests held while it wakes
    wake = result.wake
    assert wake is not None
    assert wake.wakes >= 2
    assert wake.requests > 0
    assert wake.failed == 0
    # Held for a cold start (30 s) at most, and the first of each wake for about that long.
    assert wake.ttft_max_s is not None
    assert 20.0 <= wake.ttft_max_s <= 30.0 + 5.0
    text = markdown_table(result)
    assert "held at one replica per pool" in text
    assert f"Wakes: {wake.wakes};" in text
    assert result_json(result)["wake"]["requests"] == wake.requests
    # A service held at one replica or more has no floor to compare with.
    steady = run_scenario(parse_scenario(SCENARIO), ".", ["goodput", "goodput-floor"])
    assert [r.policy for r in steady.results] == ["goodput"]
    assert steady.wake is None
