"""The fleet simulator: conservation, KV capacity, GPU accounting, queueing theory, scaling
mechanics, metrics snapshots, determinism and a short replay of a real trace."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.snapshot import MetricsSnapshot
from inferfleet.bench import traces
from inferfleet.bench.autoscale import GoodputScaler
from inferfleet.bench.references import planner_needs, windows_of
from inferfleet.bench.scenario import load_scenario, service_of
from inferfleet.sim.fleet import FleetConfig, simulate
from inferfleet.sim.rates import histogram_quantile
from inferfleet.sim.run import FleetRun, RequestRecord
from inferfleet.sim.scheduler import EngineCore, EngineRequest
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import TTFT_BUCKETS_S, Outcome, Slo
from tests.unit.planning_fixtures import replica

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
SLO = Slo(ttft_p95_ms=1000, tpot_p95_ms=50)


@dataclass
class Schedule:
    """A scaler that asks for fixed replica counts from given times on."""

    changes: list[tuple[float, dict[Role, int]]]
    interval_s: float = 5.0
    snapshots: list[MetricsSnapshot | None] = field(default_factory=list)

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        self.snapshots.append(snapshot)
        wanted = dict(current)
        for at, counts in self.changes:
            if now_s >= at:
                wanted = dict(counts)
        return wanted


def poisson_load(rate: float, duration_s: float, seed: int = 1) -> list[TraceRequest]:
    return traces.poisson(
        rate,
        duration_s,
        input_tokens=traces.Uniform(200, 2000),
        output_tokens=traces.Uniform(10, 300),
        seed=seed,
    )


def check_conservation(run: FleetRun, requests: list[TraceRequest]) -> None:
    assert len(run.records) == len(requests)
    assert [r.index for r in run.records] == list(range(len(requests)))
    for record in run.records:
        assert record.outcome is not None
        if record.outcome is Outcome.FAILED:
            continue
        assert record.first_token_s is not None
        assert record.finish_s is not None
        assert record.arrival_s <= record.first_token_s <= record.finish_s
        assert record.replica is not None


def fingerprint(records: list[RequestRecord]) -> list[tuple[object, ...]]:
    return [
        (r.index, r.first_token_s, r.finish_s, r.replica, r.prefill_replica, r.outcome)
        for r in records
    ]


# Invariants.


@pytest.mark.parametrize("disaggregated", [False, True])
def test_every_request_ends_exactly_once_while_the_fleet_scales(disaggregated: bool) -> None:
    requests = poisson_load(8.0, 240.0)
    roles = (Role.PREFILL, Role.DECODE) if disaggregated else (Role.AGGREGATED,)
    scaler = Schedule(
        [
            (30.0, dict.fromkeys(roles, 3)),
            (120.0, dict.fromkeys(roles, 1)),
            (150.0, dict.fromkeys(roles, 2)),
        ]
    )
    config = FleetConfig(
        replica(max_model_length=8192), SLO, disaggregated=disaggregated, cold_start_s=20.0
    )
    run = simulate(requests, config, scaler)
    check_conservation(run, requests)
    assert all(r.outcome is not Outcome.FAILED for r in run.records)
    if disaggregated:
        assert all(r.prefill_replica is not None for r in run.records)
        lives = {life.replica: life for life in run.replicas}
        assert all(lives[r.replica].role is Role.DECODE for r in run.records if r.replica)
    # Scaled up, down, and up again: replicas asked for and given back.
    assert {d.after for d in run.decisions} >= {1, 2, 3}
    assert any(life.released_s is not None for life in run.replicas)


def test_kv_capacity_is_never_exceeded_under_memory_pressure() -> None:
    requests = poisson_load(6.0, 120.0)
    config = FleetConfig(replica(max_model_length=8192), SLO, kv_capacity_blocks=600)
    run = simulate(requests, config)
    check_conservation(run, requests)
    assert run.kv_capacity_blocks[0] == 600
    # The cache filled up (the pressure was real) and never overflowed.
    assert max(run.peak_kv_blocks_used.values()) > 0.9 * 600
    for replica_id, peak in run.peak_kv_blocks_used.items():
        assert peak <= run.kv_capacity_blocks[replica_id]


def test_requests_too_long_for_the_engine_fail_and_are_counted_once() -> None:
    requests = [TraceRequest(0.0, 100, 10), TraceRequest(1.0, 9000, 10), TraceRequest(2.0, 50, 5)]
    run = simulate(requests, FleetConfig(replica(max_model_length=8192), SLO))
    assert [r.outcome for r in run.records] == [Outcome.MET, Outcome.FAILED, Outcome.MET]


def test_gpu_seconds_are_the_integral_of_replicas_held() -> None:
    requests = poisson_load(3.0, 300.0)
    config = FleetConfig(
        replica(max_model_length=8192, tensor=2), SLO, cold_start_s=30.0, horizon_s=300.0
    )
    scaler = Schedule([(40.0, {Role.AGGREGATED: 4}), (200.0, {Role.AGGREGATED: 2})])
    run = simulate(requests, config, scaler)
    # Integrate replicas held, sampled finely, times GPUs per replica.
    step = 0.05
    integral = sum(
        run.held(Role.AGGREGATED, (i + 0.5) * step) * step for i in range(int(300.0 / step))
    )
    assert run.gpu_seconds() == pytest.approx(integral * 2, rel=2e-3)
    # GPUs count from the request, not from readiness: 3 replicas asked at 40 s.
    started = [life for life in run.replicas if life.requested_s == 40.0]
    assert len(started) == 3
    for life in started:
        assert life.ready_s == pytest.approx(70.0)


# Queueing theory.


def test_one_replica_serving_one_request_at_a_time_queues_as_m_d_1() -> None:
    """Poisson arrivals, one server, deterministic service: mean wait rho / (2 mu (1 - rho))."""
    config = replica(max_model_length=4096, max_sequences=1)
    prompt, output = 512, 40
    alone = simulate([TraceRequest(0.0, prompt, output)], FleetConfig(config, SLO))
    service_s = alone.records[0].finish_s
    assert service_s is not None
    rho = 0.6
    rate = rho / service_s
    requests = traces.poisson(
        rate, 6000 * service_s, input_tokens=prompt, output_tokens=output, seed=7
    )
    run = simulate(requests, FleetConfig(config, SLO))
    check_conservation(run, requests)
    waits = [(r.finish_s - r.arrival_s) - service_s for r in run.records if r.finish_s is not None]
    assert min(waits) > -1e-9  # service is deterministic: never faster than alone
    mu = 1 / service_s
    expected = rho / (2 * mu * (1 - rho))
    assert sum(waits) / len(waits) == pytest.approx(expected, rel=0.1)


# Scaling mechanics.


def test_new_replicas_serve_only_after_their_cold_start() -> None:
    requests = poisson_load(10.0, 200.0)
    config = FleetConfig(replica(max_model_length=8192), SLO, cold_start_s=60.0)
    run = simulate(requests, config, Schedule([(50.0, {Role.AGGREGATED: 3})]))
    lives = {life.replica: life for life in run.replicas}
    late = [life for life in run.replicas if life.requested_s > 0]
    assert late
    assert all(life.ready_s == pytest.approx(life.requested_s + 60.0) for life in late)
    for record in run.records:
        life = lives[record.replica] if record.replica is not None else None
        assert life is not None
        assert life.ready_s is not None
        assert record.arrival_s >= life.ready_s


def test_each_role_starts_in_its_own_cold_start() -> None:
    requests = poisson_load(4.0, 400.0)
    config = FleetConfig(
        replica(max_model_length=8192), SLO, disaggregated=True, cold_start_s=60.0,
        role_cold_start_s={Role.PREFILL: 150.0},
    )  # fmt: skip
    grown = {Role.PREFILL: 2, Role.DECODE: 2}
    run = simulate(requests, config, Schedule([(50.0, grown)]))
    late = {life.role: life for life in run.replicas if life.requested_s > 0}
    assert set(late) == {Role.PREFILL, Role.DECODE}
    prefill, decode = late[Role.PREFILL], late[Role.DECODE]
    assert prefill.ready_s == pytest.approx(prefill.requested_s + 150.0)
    assert decode.ready_s == pytest.approx(decode.requested_s + 60.0)
    assert config.slowest_cold_start_s == 150.0


def test_the_policy_plans_with_the_cold_start_it_measures_in_the_simulator() -> None:
    # The service says 30 s; the fleet's replicas take 150 s. The same function that runs live
    # times its scale-ups from the snapshots and plans with what it measured.
    scenario = load_scenario(REPO / "benchmarks" / "autoscale" / "chat.yaml")
    service = service_of(scenario)
    policy = replace(service.policy, cold_start_s=30.0)
    requests = traces.poisson(
        2.0, 200.0, input_tokens=traces.Uniform(500, 1500), output_tokens=traces.Uniform(100, 300)
    ) + [
        replace(r, arrival_s=r.arrival_s + 200.0)
        for r in traces.poisson(
            12.0, 400.0, input_tokens=traces.Uniform(500, 1500),
            output_tokens=traces.Uniform(100, 300), seed=2,
        )
    ]  # fmt: skip
    config = FleetConfig(
        service.replica, service.slo, initial_replicas={Role.AGGREGATED: 1}, cold_start_s=150.0
    )
    scaler = GoodputScaler(policy)
    simulate(requests, config, scaler)
    measured = scaler.history.cold_starts[Role.AGGREGATED].measured_s
    assert measured
    # Seen a tick and a scrape after it served, less half a tick.
    assert all(150.0 - 15.0 <= m <= 150.0 + 15.0 for m in measured)
    assert any(
        "as measured (aggregated), not the 30 s configured" in d.message
        for _, d in scaler.decisions
    )


def test_a_replica_taken_away_drains_before_it_gives_its_gpus_back() -> None:
    # Long answers, so replicas hold requests when the fleet shrinks at 60 s.
    requests = traces.poisson(
        6.0, 120.0, input_tokens=500, output_tokens=traces.Uniform(500, 1500), seed=3
    )
    config = FleetConfig(replica(max_model_length=8192), SLO, initial_replicas={Role.AGGREGATED: 3})
    run = simulate(requests, config, Schedule([(60.0, {Role.AGGREGATED: 1})]))
    check_conservation(run, requests)
    drained = [life for life in run.replicas if life.released_s is not None]
    assert len(drained) == 2
    assert all(life.drain_s == 60.0 for life in drained)
    assert run.accepting(Role.AGGREGATED, 61.0) == 1
    assert run.serving(Role.AGGREGATED, 61.0) == 3
    for life in drained:
        assert life.released_s is not None
        served = [r for r in run.records if r.replica == life.replica]
        # It finished what it held when asked to go, and took nothing new after.
        assert any(r.finish_s is not None and r.finish_s > 60.0 for r in served)
        assert all(r.arrival_s <= 60.0 for r in served)
        assert life.released_s == pytest.approx(max(r.finish_s or 0.0 for r in served))


def test_prompts_sharing_a_prefix_go_where_it_is_cached() -> None:
    shared = tuple(range(8))
    rng = random.Random(5)
    # Odd requests share an 8-block prefix; each then has blocks of its own.
    hashes = [(*(shared if i % 2 else ()), 1000 + i, 2000 + i, 3000 + i) for i in range(40)]
    requests = [
        TraceRequest(i * 0.5, len(h) * 512 + rng.randint(1, 100), 20, h)
        for i, h in enumerate(hashes)
    ]
    config = FleetConfig(
        replica(max_model_length=16384), SLO, initial_replicas={Role.AGGREGATED: 4}
    )
    run = simulate(requests, config)
    check_conservation(run, requests)
    sharing = {r.replica for r in run.records if r.index % 2}
    assert len(sharing) == 1


# Metrics.


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    bounds = (0.1, 0.5, 1.0)
    # 10 observations <= 0.1, 30 more <= 0.5, 60 more <= 1.0, none above.
    cumulative = [10, 40, 100, 100]
    # Rank 95 of 100 lies in (0.5, 1.0], 55 of its 60 observations in.
    assert histogram_quantile(0.95, bounds, cumulative) == pytest.approx(0.5 + 0.5 * 55 / 60)
    assert histogram_quantile(0.05, bounds, cumulative) == pytest.approx(0.05)
    # In the +Inf bucket: the highest finite bound.
    assert histogram_quantile(0.99, bounds, [0, 0, 50, 100]) == 1.0
    assert histogram_quantile(0.95, bounds, [0, 0, 0, 0]) is None


def test_snapshots_report_what_the_fleet_did_over_the_window() -> None:
    requests = traces.poisson(10.0, 360.0, input_tokens=800, output_tokens=100, seed=2)
    scaler = Schedule([], interval_s=40.0)
    config = FleetConfig(replica(max_model_length=8192), SLO, initial_replicas={Role.AGGREGATED: 2})
    run = simulate(requests, config, scaler)
    check_conservation(run, requests)
    late = [s for s in scaler.snapshots if s is not None and s.taken_at_s >= 120]
    assert len(late) >= 4
    for snapshot in late:
        metrics = snapshot.roles[Role.AGGREGATED]
        assert metrics.ready_replicas == 2
        # Router and engines agree with the schedule's rate and lengths.
        assert snapshot.service.requests_per_s == pytest.approx(10.0, rel=0.25)
        assert snapshot.service.mean_prompt_tokens == pytest.approx(800)
        assert snapshot.service.mean_squared_prompt_tokens == pytest.approx(800**2)
        assert snapshot.service.mean_output_tokens == pytest.approx(100)
        assert snapshot.service.arrivals_per_s == pytest.approx(10.0, rel=0.25)
        assert snapshot.service.mean_arrival_prompt_tokens == pytest.approx(800)
        assert metrics.prompt_tokens_per_s == pytest.approx(8000, rel=0.25)
        assert metrics.generation_tokens_per_s == pytest.approx(1000, rel=0.25)
        assert snapshot.service.attainment == pytest.approx(1.0)
        ttft = snapshot.service.ttft_p95_s
        assert ttft is not None
        assert 0 < ttft <= TTFT_BUCKETS_S[-1]
        assert snapshot.newest_sample_age_s < config.scrape_interval_s


def test_arrivals_show_a_load_before_it_completes() -> None:
    """One replica for a load it cannot hold: completions lag, arrivals do not."""
    requests = traces.poisson(10.0, 120.0, input_tokens=4000, output_tokens=300, seed=3)
    scaler = Schedule([], interval_s=60.0)
    config = FleetConfig(replica(max_model_length=8192), SLO, initial_replicas={Role.AGGREGATED: 1})
    simulate(requests, config, scaler)
    [snapshot] = [s for s in scaler.snapshots if s is not None and s.taken_at_s == 120.0]
    arrivals = snapshot.service.arrivals_per_s
    assert arrivals == pytest.approx(10.0, rel=0.25)
    assert arrivals is not None
    assert snapshot.service.requests_per_s < 0.8 * arrivals


def test_the_recent_window_shows_a_step_the_rate_window_still_averages() -> None:
    """Twenty seconds after a step from 2 to 20 req/s the 60 s rate window reads between the
    two; the recent window (two scrapes) reads the new rate."""
    requests = traces.step(
        2.0, 20.0, 120.0, switch_s=100.0, input_tokens=800, output_tokens=100, seed=4
    )
    scaler = Schedule([], interval_s=10.0)
    config = FleetConfig(
        replica(max_model_length=8192), SLO, initial_replicas={Role.AGGREGATED: 4},
        scrape_interval_s=5.0,
    )  # fmt: skip
    simulate(requests, config, scaler)
    [snapshot] = [s for s in scaler.snapshots if s is not None and s.taken_at_s == 120.0]
    assert snapshot.recent_window_s == 10.0
    recent = snapshot.service.recent_arrivals_per_s
    arrivals = snapshot.service.arrivals_per_s
    assert recent is not None
    assert arrivals is not None
    assert recent == pytest.approx(20.0, rel=0.3)
    assert arrivals < 0.6 * recent


def test_a_scrape_delay_ages_the_snapshot() -> None:
    requests = poisson_load(4.0, 200.0)
    scaler = Schedule([], interval_s=50.0)
    config = FleetConfig(replica(max_model_length=8192), SLO, scrape_delay_s=40.0)
    simulate(requests, config, scaler)
    ages = [s.newest_sample_age_s for s in scaler.snapshots if s is not None]
    assert ages
    assert all(age >= 40.0 for age in ages)


# Determinism.


def test_the_same_load_and_scaler_give_the_same_run() -> None:
    def run_once(seed: int) -> FleetRun:
        scaler = Schedule([(30.0, {Role.PREFILL: 2, Role.DECODE: 2})])
        config = FleetConfig(replica(max_model_length=8192), SLO, disaggregated=True)
        return simulate(poisson_load(6.0, 120.0, seed=seed), config, scaler)

    first, second = run_once(1), run_once(1)
    assert fingerprint(first.records) == fingerprint(second.records)
    assert first.gpu_seconds() == second.gpu_seconds()
    assert fingerprint(run_once(2).records) != fingerprint(first.records)


def test_the_simulated_engine_is_the_scheduler_core() -> None:
    """One replica, no scaler: each request's first token and end are those of the core
    driven step by step on its own."""
    requests = poisson_load(3.0, 60.0)
    config = replica(max_model_length=8192)
    run = simulate(requests, FleetConfig(config, SLO))
    core = EngineCore(config)
    first: dict[int, float] = {}
    ends: dict[int, float] = {}
    now, index = 0.0, 0
    while index < len(requests) or core.has_work:
        while index < len(requests) and requests[index].arrival_s <= now:
            request = requests[index]
            core.add_request(EngineRequest(str(index), request.input_tokens, request.output_tokens))
            index += 1
        if not core.has_work:
            now = requests[index].arrival_s
            continue
        result = core.step(now)
        for request_id in result.first_tokens:
            first[int(request_id)] = result.end_s
        for request_id in result.finished:
            ends[int(request_id)] = result.end_s
        now = result.end_s
    assert {r.index: r.first_token_s for r in run.records} == first
    assert {r.index: r.finish_s for r in run.records} == ends


# A real trace, with the goodput policy.


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not beside the checkout")
def test_a_few_minutes_of_the_chat_trace_under_the_goodput_policy() -> None:
    scenario = load_scenario(REPO / "benchmarks" / "autoscale" / "chat.yaml")
    service = service_of(scenario)
    requests = traces.requests_from_trace(
        TRACES / "azure2023_conv.csv", rate_multiplier=2.0, start_s=600.0, duration_s=480.0
    )
    # Started as every policy in the benchmark starts: sized by the planner for its first load.
    first = planner_needs(service, windows_of(requests, 240.0, 60.0), 60.0)[0]
    config = FleetConfig(
        service.replica,
        service.slo,
        initial_replicas=first,
        cold_start_s=scenario.cold_start_s,
        horizon_s=240.0,
    )
    scaler = GoodputScaler(service.policy)
    run = simulate(requests, config, scaler)
    check_conservation(run, requests)
    assert run.snapshots >= 240.0 / scaler.interval_s - 1
    attainment = sum(r.outcome is Outcome.MET for r in run.records) / len(run.records)
    assert attainment >= 0.9
    held = run.gpu_seconds() / 240.0
    assert 1 <= held <= service.bounds[Role.AGGREGATED].max_replicas
    assert math.isfinite(held)
