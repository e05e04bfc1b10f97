"""The fleet simulator scaled to zero and back: requests held while the pools wake, the wake
pushed to the scaler at once, a wait bounded by the router's timeout."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale import PolicySpec, RolePolicy
from inferfleet.bench.autoscale import GoodputScaler
from inferfleet.sim.fleet import PUSH_INTERVAL_S, FleetConfig, simulate
from inferfleet.sim.run import FleetRun
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Outcome, Slo
from tests.unit.planning_fixtures import replica
from tests.unit.test_fleet_sim import Schedule, check_conservation

SLO = Slo(ttft_p95_ms=1000, tpot_p95_ms=50)
COLD_START_S = 60.0
IDLE_S = 300.0
WAKE_AT_S = 2000.0


def sparse_load() -> list[TraceRequest]:
    """Ten requests in the first 20 s, then nothing until ten more from `WAKE_AT_S`."""
    early = [TraceRequest(2.0 * i, 500, 50) for i in range(10)]
    late = [TraceRequest(WAKE_AT_S + 2.0 * i, 500, 50) for i in range(10)]
    return early + late


def config(*, disaggregated: bool = False, wake_timeout_s: float | None = None) -> FleetConfig:
    return FleetConfig(
        replica(),
        SLO,
        disaggregated=disaggregated,
        cold_start_s=COLD_START_S,
        horizon_s=WAKE_AT_S + 600.0,
        wake_timeout_s=wake_timeout_s,
    )


def goodput(*, disaggregated: bool = False, min_replicas: int = 0) -> GoodputScaler:
    roles = (Role.PREFILL, Role.DECODE) if disaggregated else (Role.AGGREGATED,)
    pools = tuple(RolePolicy(r, replica(), min_replicas, 4) for r in roles)
    spec = PolicySpec(roles=pools, slo=SLO, cold_start_s=COLD_START_S, idle_before_zero_s=IDLE_S)
    return GoodputScaler(spec)


def held_through_wake(run: FleetRun) -> list[float]:
    return [r.ttft_s for r in run.records if r.arrival_s >= WAKE_AT_S and r.ttft_s is not None]


@pytest.mark.parametrize("disaggregated", [False, True], ids=["aggregated", "disaggregated"])
def test_an_idle_fleet_goes_to_zero_and_the_first_request_wakes_every_pool_at_once(
    disaggregated: bool,
) -> None:
    requests = sparse_load()
    scaler = goodput(disaggregated=disaggregated)
    run = simulate(requests, config(disaggregated=disaggregated), scaler)
    check_conservation(run, requests)
    roles = {life.role for life in run.replicas}
    idle_at = WAKE_AT_S - 10.0
    for role in roles:
        assert run.held(role, idle_at) == 0, role
    # The wake is ordered when the first request arrives (the router's push), not at the
    # scaler's next interval; every pool is ordered together.
    woken = [d for d in run.decisions if d.before == 0 and d.after >= 1]
    assert {d.role for d in woken} == roles
    assert all(d.time_s == WAKE_AT_S for d in woken)
    # Every request is answered; those held waited a cold start, and that wait is their TTFT.
    assert all(r.outcome is not Outcome.FAILED for r in run.records)
    waits = held_through_wake(run)
    assert len(waits) == 10
    assert min(waits) >= COLD_START_S - 20.0
    assert max(waits) <= COLD_START_S + 5.0
    # Cheaper than holding one replica per pool all along.
    floor = simulate(
        requests,
        config(disaggregated=disaggregated),
        goodput(disaggregated=disaggregated, min_replicas=1),
    )
    assert run.gpu_seconds() < 0.5 * floor.gpu_seconds()


def test_requests_held_past_the_wake_timeout_fail() -> None:
    timeout_s = COLD_START_S - 10.0
    requests = sparse_load()
    run = simulate(requests, config(wake_timeout_s=timeout_s), goodput())
    late = [r for r in run.records if r.arrival_s >= WAKE_AT_S]
    failed = [r for r in late if r.outcome is Outcome.FAILED]
    # The replica serves a cold start after the first arrival: those that arrived more than
    # the timeout before that fail, the others are served.
    ready_s = WAKE_AT_S + COLD_START_S
    assert [r.arrival_s < ready_s - timeout_s for r in late] == [
        r.outcome is Outcome.FAILED for r in late
    ]
    assert 0 < len(failed) < len(late)


def test_a_scaler_that_never_wakes_leaves_held_requests_failed_not_lost() -> None:
    requests = sparse_load()
    scaler = Schedule([(100.0, {Role.AGGREGATED: 0})])
    run = simulate(requests, replace(config(), drain_limit_s=60.0), scaler)
    check_conservation(run, requests)
    assert [r.outcome for r in run.records if r.arrival_s >= WAKE_AT_S] == [Outcome.FAILED] * 10
    # The pushes are rate limited: at most one per PUSH_INTERVAL_S while requests are held.
    assert len(scaler.snapshots) <= (
        (WAKE_AT_S + 600.0 + 60.0) / scaler.interval_s + 20.0 / PUSH_INTERVAL_S + 2
    )
    pushed = [s for s in scaler.snapshots if s is not None and s.service.waiting_for_replicas]
    assert max((s.service.waiting_for_replicas for s in pushed), default=0) == 10
