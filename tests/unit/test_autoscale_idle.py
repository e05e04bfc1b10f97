"""Scale to zero and back (`autoscale.policy.idle`): on purpose only, every pool together,
woken by the router's held requests, and nothing learned from the wake's waits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale import Decision, MetricsSnapshot, PolicyHistory, PolicySpec, Reason
from inferfleet.autoscale import decide as decide_tick
from inferfleet.autoscale.policy import LatencyFactors, OutcomeTally
from inferfleet.autoscale.policy.idle import requests_seen, waking
from tests.unit.test_autoscale_policy import (
    AGGREGATED,
    DISAGGREGATED,
    WINDOW_S,
    policy,
    snapshot,
)

TICK_S = 15.0
IDLE_S = 600.0
START_S = 50_000.0


def zero_policy(roles: tuple[Role, ...] = AGGREGATED) -> PolicySpec:
    return policy(roles, min_replicas=0, idle_before_zero_s=IDLE_S)


def idle_snapshot(at_s: float, replicas: Mapping[Role, int]) -> MetricsSnapshot:
    """No request in the window: none arriving, completed, in flight or held."""
    shot = snapshot(0.0, replicas, at_s=at_s, attainment=None, in_flight=0.0)
    service = replace(shot.service, arrivals_per_s=0.0, recent_arrivals_per_s=0.0)
    return replace(shot, service=service)


def held_snapshot(at_s: float, held: float, *, age_s: float = 5.0) -> MetricsSnapshot:
    """At zero replicas: no engine, the router holding `held` requests (pushed)."""
    shot = idle_snapshot(at_s, {})
    service = replace(shot.service, waiting_for_replicas=held)
    return replace(shot, service=service, newest_sample_age_s=age_s)


def run_idle(
    spec: PolicySpec,
    replicas: Mapping[Role, int],
    seconds: float,
    history: PolicyHistory | None = None,
    *,
    start_s: float = START_S,
) -> tuple[Decision, PolicyHistory, dict[Role, int]]:
    """Tick every TICK_S for `seconds` with no request, carrying the history and applying
    each decision."""
    history = history or PolicyHistory()
    current = dict(replicas)
    decision: Decision | None = None
    at_s = start_s
    while at_s <= start_s + seconds:
        decision = decide_tick(spec, idle_snapshot(at_s, current), current, history)
        history = decision.history
        current = dict(decision.replicas)
        at_s += TICK_S
    assert decision is not None
    return decision, history, current


def test_an_idle_service_goes_to_zero_after_its_idle_period_not_before() -> None:
    spec = zero_policy()
    before, history, current = run_idle(spec, {Role.AGGREGATED: 2}, IDLE_S - 2 * TICK_S)
    assert current == {Role.AGGREGATED: 1}
    assert before.reason is not Reason.SCALE_TO_ZERO

    after = decide_tick(spec, idle_snapshot(START_S + IDLE_S, current), current, history)
    assert after.replicas == {Role.AGGREGATED: 0}
    assert after.reason is Reason.SCALE_TO_ZERO
    assert "no request for 600 s" in after.message


def test_disaggregated_pools_go_to_zero_together_and_wake_together() -> None:
    spec = zero_policy(DISAGGREGATED)
    decision, history, current = run_idle(spec, {Role.PREFILL: 2, Role.DECODE: 3}, IDLE_S)
    assert current == {Role.PREFILL: 0, Role.DECODE: 0}
    assert decision.reason is Reason.SCALE_TO_ZERO

    at_s = START_S + IDLE_S + 3600.0
    woken = decide_tick(spec, held_snapshot(at_s, 1.0), current, history)
    assert woken.reason is Reason.WAKE_FROM_ZERO
    assert all(n >= 1 for n in woken.replicas.values())
    assert set(woken.replicas) == {Role.PREFILL, Role.DECODE}
    assert woken.message.startswith("requests arrived at zero replicas")


def test_at_zero_with_nothing_arriving_the_pools_stay_at_zero() -> None:
    spec = zero_policy()
    _, history, current = run_idle(spec, {Role.AGGREGATED: 1}, IDLE_S)
    assert current == {Role.AGGREGATED: 0}
    held, history, current = run_idle(spec, current, 3600.0, history, start_s=START_S + IDLE_S)
    assert current == {Role.AGGREGATED: 0}
    assert held.reason is Reason.IDLE_AT_ZERO


def test_a_restart_at_zero_does_not_wake_the_service() -> None:
    """With no history (an operator restarted, the status lost) and no request, the pools
    stay at zero: only a request wakes them."""
    spec = zero_policy()
    decision = decide_tick(spec, idle_snapshot(START_S, {}), {Role.AGGREGATED: 0}, PolicyHistory())
    assert decision.replicas == {Role.AGGREGATED: 0}
    assert decision.reason is Reason.IDLE_AT_ZERO


def test_idle_is_counted_from_the_first_tick_without_history() -> None:
    """An operator restarted without the history does not take a serving service to zero at
    once: the idle period starts when it first sees no request."""
    spec = zero_policy()
    first = decide_tick(
        spec, idle_snapshot(START_S, {Role.AGGREGATED: 1}), {Role.AGGREGATED: 1}, PolicyHistory()
    )
    assert first.replicas == {Role.AGGREGATED: 1}
    assert first.history.requests_seen_at_s == START_S


def test_a_request_restarts_the_idle_period() -> None:
    spec = zero_policy()
    _, history, current = run_idle(spec, {Role.AGGREGATED: 1}, IDLE_S / 2)
    busy_at = START_S + IDLE_S / 2 + TICK_S
    busy = decide_tick(spec, snapshot(1.0, current, at_s=busy_at), current, history)
    assert busy.history.requests_seen_at_s == busy_at
    _, _, current = run_idle(
        spec, busy.replicas, IDLE_S - 2 * TICK_S, busy.history, start_s=busy_at + TICK_S
    )
    assert current[Role.AGGREGATED] >= 1


@pytest.mark.parametrize(
    "spec",
    [
        policy(idle_before_zero_s=IDLE_S),
        # One pool alone may not go to zero: the other would hold GPUs and serve nothing.
        replace(
            zero_policy(DISAGGREGATED),
            roles=tuple(
                replace(r, min_replicas=1) if r.role is Role.DECODE else r
                for r in zero_policy(DISAGGREGATED).roles
            ),
        ),
    ],
    ids=["min-one", "one-pool-only"],
)
def test_without_every_pool_allowing_zero_the_service_never_goes_there(spec: PolicySpec) -> None:
    current = dict.fromkeys(spec.role_names, 1)
    _, _, current = run_idle(spec, current, 3 * IDLE_S)
    assert all(n >= 1 for n in current.values())


def test_a_pin_keeps_an_idle_service_from_zero() -> None:
    spec = zero_policy()
    history = PolicyHistory(requests_seen_at_s=START_S - 10 * IDLE_S)
    current = {Role.AGGREGATED: 2}
    pinned = decide_tick(
        spec, idle_snapshot(START_S, current), current, history, pins={Role.AGGREGATED: 2}
    )
    assert pinned.replicas == {Role.AGGREGATED: 2}
    unpinned = decide_tick(spec, idle_snapshot(START_S, current), current, history)
    assert unpinned.replicas == {Role.AGGREGATED: 0}


def test_stale_metrics_hold_zero_and_never_scale_a_serving_service_to_zero() -> None:
    spec = zero_policy()
    _, history, current = run_idle(spec, {Role.AGGREGATED: 1}, IDLE_S)
    stale_at = START_S + IDLE_S + TICK_S
    stale = held_snapshot(stale_at, 0.0, age_s=spec.stale_after_s + 1)
    held = decide_tick(spec, stale, current, history)
    assert (held.replicas, held.reason) == ({Role.AGGREGATED: 0}, Reason.STALE_METRICS)

    serving = {Role.AGGREGATED: 2}
    blind = decide_tick(spec, None, serving, PolicyHistory(requests_seen_at_s=0.0))
    assert blind.replicas == serving
    assert blind.reason is Reason.NO_METRICS


def test_held_requests_are_a_backlog_the_wake_sizes_for() -> None:
    """The requests the router held through a cold start all reach the first replicas at
    once: many held ask for more replicas than a few."""
    spec = zero_policy()
    _, history, current = run_idle(spec, {Role.AGGREGATED: 1}, IDLE_S)
    at_s = START_S + IDLE_S + 3600.0
    few = decide_tick(spec, held_snapshot(at_s, 1.0), current, history)
    many = decide_tick(spec, held_snapshot(at_s, 2000.0), current, history)
    assert few.replicas[Role.AGGREGATED] >= 1
    assert many.replicas[Role.AGGREGATED] > few.replicas[Role.AGGREGATED]


def test_the_wake_teaches_nothing_until_its_queue_drained_and_two_windows_passed() -> None:
    """The held requests miss their TTFT target by a cold start: the model did not err, and
    no lesson or calibration is taken from the windows they fill."""
    spec = zero_policy()
    _, history, current = run_idle(spec, {Role.AGGREGATED: 1}, IDLE_S)
    woke_at = START_S + IDLE_S + 3600.0
    woken = decide_tick(spec, held_snapshot(woke_at, 50.0), current, history)
    assert woken.history.woke_at_s == woke_at
    history, current = woken.history, dict(woken.replicas)
    tally = OutcomeTally(woke_at - 1000.0, 500.0, 499.0)
    history = replace(history, outcomes=tally)

    at_s = woke_at + 200.0
    missed = snapshot(2.0, current, at_s=at_s, attainment=0.2, ttft_p95_s=120.0)
    during = decide_tick(spec, missed, current, history)
    assert waking(missed, history)
    assert during.history.tightening == LatencyFactors()
    assert during.history.calibration == history.calibration
    assert during.history.outcomes == tally
    caught_up = during.history.wake_caught_up_at_s
    assert caught_up == at_s

    later = at_s + 2 * WINDOW_S
    after = snapshot(2.0, current, at_s=later, attainment=0.2, ttft_p95_s=120.0)
    assert not waking(after, during.history)
    ended = decide_tick(spec, after, current, during.history)
    assert ended.history.woke_at_s is None
    assert ended.history.outcomes != tally


def test_a_wake_is_not_caught_up_while_the_engines_hold_a_queue() -> None:
    spec = zero_policy()
    history = PolicyHistory(woke_at_s=START_S, requests_seen_at_s=START_S)
    current = {Role.AGGREGATED: 2}
    queued = snapshot(2.0, current, at_s=START_S + 150.0, waiting=40.0)
    decision = decide_tick(spec, queued, current, history)
    assert decision.history.woke_at_s == START_S
    assert decision.history.wake_caught_up_at_s is None


def test_requests_seen_reads_every_sign_of_a_request() -> None:
    quiet = idle_snapshot(START_S, {})
    assert not requests_seen(quiet)
    for change in (
        {"arrivals_per_s": 0.01},
        {"recent_arrivals_per_s": 0.1},
        {"requests_per_s": 0.01},
        {"in_flight_requests": 1.0},
        {"waiting_for_replicas": 1.0},
    ):
        assert requests_seen(replace(quiet, service=replace(quiet.service, **change))), change


def test_the_wake_history_survives_the_wire() -> None:
    history = PolicyHistory(requests_seen_at_s=12.5, woke_at_s=30.0, wake_caught_up_at_s=160.0)
    assert PolicyHistory.from_wire(history.to_wire()) == history
    assert PolicyHistory.from_wire(PolicyHistory().to_wire()) == PolicyHistory()


def test_min_replicas_zero_is_a_valid_pool_but_max_replicas_zero_is_not() -> None:
    spec = zero_policy()
    assert spec.scales_to_zero
    assert spec.awake().roles[0].min_replicas == 1
    with pytest.raises(ValueError, match="max_replicas >= 1"):
        policy(min_replicas=0, max_replicas=0)
