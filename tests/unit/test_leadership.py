"""Leader election's timing: the pure decisions, then candidates over an in-memory Lease with
the API server's optimistic concurrency, on a simulated clock (a leader's death and the
follower's takeover in microseconds), and the renewal thread on a real clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet.kube.lease import LeaseConflictError, LeaseRecord, lease_spec, micro_time
from inferfleet.reconcile.leadership import (
    ElectionTiming,
    LeaderElector,
    Move,
    Observation,
    Renewed,
    candidate_identity,
    claim,
    decide,
    default_namespace,
    election_loop_alive,
    follower_delay,
    held_until,
    observe,
    released,
    renew_deadline_passed,
    renew_timeout,
)

TIMING = ElectionTiming()
EPOCH = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
HELD_BY_B = LeaseRecord("b", 10, EPOCH, EPOCH, 3)


# The pure decisions ------------------------------------------------------------------------


def test_default_timing_hands_over_within_15_s() -> None:
    worst = TIMING.lease_duration_s + 2 * TIMING.retry_period_s * (1 + TIMING.jitter)
    assert worst < 15.0
    # A dying leader stops before a follower may act, with a margin.
    assert TIMING.lease_duration_s - TIMING.renew_deadline_s >= 3.0
    assert TIMING.lease_duration_seconds == 10


@pytest.mark.parametrize(
    ("lease", "deadline", "retry"),
    [(7.0, 7.0, 2.0), (10.0, 2.2, 2.0), (10.0, 7.0, 0.0)],
    ids=["lease-not-past-deadline", "deadline-within-a-retry", "no-retry-period"],
)
def test_inconsistent_timing_is_refused(lease: float, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError, match="must"):
        ElectionTiming(lease, deadline, retry)


def test_fractional_lease_is_written_rounded_up() -> None:
    assert ElectionTiming(2.5, 1.0, 0.5).lease_duration_seconds == 3


def test_the_same_record_keeps_its_clock_and_a_change_restarts_it() -> None:
    first = observe(None, HELD_BY_B, 100.0)
    assert observe(first, HELD_BY_B, 105.0) == Observation(HELD_BY_B, 100.0)
    renewed = replace(HELD_BY_B, renew_time=EPOCH + timedelta(seconds=2))
    assert observe(first, renewed, 105.0) == Observation(renewed, 105.0)
    assert observe(first, None, 106.0) == Observation(None, 106.0)


@pytest.mark.parametrize(
    ("record", "now", "move"),
    [
        (None, 100.0, Move.CREATE),
        (replace(HELD_BY_B, holder="a"), 100.0, Move.RENEW),
        # Ours even when long unrenewed: renew, never wait for ourselves.
        (replace(HELD_BY_B, holder="a"), 500.0, Move.RENEW),
        (HELD_BY_B, 100.0, Move.WAIT),
        (HELD_BY_B, 109.999, Move.WAIT),
        (HELD_BY_B, 110.0, Move.TAKE),
        (released(HELD_BY_B, EPOCH), 100.0, Move.TAKE),
    ],
    ids=["no-lease", "ours", "ours-stale", "theirs", "theirs-last-ms", "theirs-expired", "free"],
)
def test_decide(record: LeaseRecord | None, now: float, move: Move) -> None:
    assert decide(Observation(record, 100.0), "a", now) is move


def test_expiry_is_counted_from_our_observation_not_the_holders_clock() -> None:
    # renewTime an hour ago by the holder's clock: skewed, or just written. Seen now, valid now.
    skewed = replace(HELD_BY_B, renew_time=EPOCH - timedelta(hours=1))
    assert decide(Observation(skewed, 100.0), "a", 100.0) is Move.WAIT
    assert held_until(Observation(skewed, 100.0)) == 110.0
    # The holder's own duration counts, not ours.
    assert held_until(Observation(replace(skewed, lease_duration_s=30), 100.0)) == 130.0
    assert held_until(Observation(released(skewed, EPOCH), 100.0)) is None


def test_claim_counts_transitions_and_keeps_acquire_time_on_renewal() -> None:
    later = EPOCH + timedelta(seconds=4)
    created = claim(None, "a", EPOCH, TIMING)
    assert created == LeaseRecord("a", 10, EPOCH, EPOCH, 0)
    assert claim(created, "a", later, TIMING) == LeaseRecord("a", 10, EPOCH, later, 0)
    assert claim(HELD_BY_B, "a", later, TIMING) == LeaseRecord("a", 10, later, later, 4)
    assert claim(released(HELD_BY_B, EPOCH), "a", later, TIMING).transitions == 4


def test_release_frees_the_lease_and_keeps_the_count() -> None:
    assert released(HELD_BY_B, EPOCH) == LeaseRecord("", 1, EPOCH, EPOCH, 3)


@given(draw=st.floats(0.0, 0.999), now=st.floats(100.0, 120.0))
def test_follower_waits_a_jittered_retry_or_until_the_lease_runs_out(
    draw: float, now: float
) -> None:
    observation = Observation(HELD_BY_B, 100.0)
    delay = follower_delay(observation, now, TIMING, draw)
    assert 0.05 <= delay <= TIMING.retry_period_s * (1 + TIMING.jitter)
    assert now + delay <= max(110.0, now) + 0.05
    free = follower_delay(Observation(None, 100.0), now, TIMING, draw)
    assert free == pytest.approx(TIMING.retry_period_s * (1 + TIMING.jitter * draw))


def test_renewal_deadline_and_request_timeouts() -> None:
    assert not renew_deadline_passed(100.0, 106.9, TIMING)
    assert renew_deadline_passed(100.0, 107.0, TIMING)
    assert renew_timeout(100.0, 100.0, TIMING) == TIMING.retry_period_s
    # A request never runs past the deadline.
    assert renew_timeout(100.0, 106.5, TIMING) == pytest.approx(0.5)
    assert renew_timeout(100.0, 108.0, TIMING) == 0.1


def test_a_stuck_follower_loop_is_not_alive() -> None:
    assert election_loop_alive(100.0, 110.0, TIMING)
    assert not election_loop_alive(100.0, 200.0, TIMING)


def test_identity_and_namespace_defaults(tmp_path: Path) -> None:
    assert candidate_identity("inferfleet-operator-7d9f-x2", "node-1", "1a2b") == (
        "inferfleet-operator-7d9f-x2_1a2b"
    )
    assert candidate_identity(None, "laptop", "1a2b") == "laptop_1a2b"
    mounted = tmp_path / "namespace"
    mounted.write_text("ml-serving\n")
    assert default_namespace(mounted) == "ml-serving"
    assert default_namespace(tmp_path / "absent") == "default"


def test_lease_times_go_out_with_six_fractional_digits() -> None:
    # The client writes datetime.isoformat(), which drops a zero fraction the API refuses.
    spec = lease_spec(LeaseRecord("a", 10, EPOCH, EPOCH + timedelta(microseconds=250), 2))
    assert spec.acquire_time is not None
    assert spec.renew_time is not None
    assert spec.acquire_time.isoformat() == "2026-11-23T12:00:00.000001+00:00"
    assert spec.renew_time.isoformat() == "2026-11-23T12:00:00.000250+00:00"
    assert micro_time(EPOCH.astimezone()).tzinfo == UTC
    assert spec.holder_identity == "a"
    assert spec.lease_transitions == 2
    assert lease_spec(released(HELD_BY_B, EPOCH)).holder_identity is None


# Candidates over one in-memory Lease, on a simulated clock ------------------------------------


class MemoryLease:
    """One Lease with the API server's rules: create fails if it exists, replace fails unless
    at the current resourceVersion; `down` makes every call fail as an unreachable server."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False
        self.writes: list[LeaseRecord] = []

    @property
    def where(self) -> str:
        return "test/lease"

    def _reachable(self) -> None:
        if self.down:
            raise OSError("connection refused")

    def read(self, timeout_s: float) -> tuple[LeaseRecord, str] | None:
        self._reachable()
        return None if self.record is None else (self.record, str(self.version))

    def _write(self, record: LeaseRecord) -> str:
        self.record = record
        self.version += 1
        self.writes.append(record)
        return str(self.version)

    def create(self, record: LeaseRecord, timeout_s: float) -> str:
        self._reachable()
        if self.record is not None:
            raise LeaseConflictError("exists")
        return self._write(record)

    def replace(self, record: LeaseRecord, resource_version: str, timeout_s: float) -> str:
        self._reachable()
        if resource_version != str(self.version):
            raise LeaseConflictError("stale")
        return self._write(record)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)


def candidate(store: MemoryLease, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(store, identity, TIMING, clock=clock, wall_clock=clock.wall)


def test_first_candidate_creates_the_lease_and_the_second_follows() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    assert a.attempt(1.0) is Move.CREATE
    assert b.attempt(1.0) is Move.WAIT
    assert (a.leading, b.leading, b.leader) == (True, False, "a")
    clock.now += 2
    assert a.attempt(1.0) is Move.RENEW
    assert [(w.holder, w.transitions) for w in store.writes] == [("a", 0), ("a", 0)]
    assert store.writes[1].acquire_time == store.writes[0].acquire_time


def test_of_two_candidates_taking_an_expired_lease_at_once_one_wins() -> None:
    store, clock = MemoryLease(), Clock()
    store.create(HELD_BY_B, 1.0)
    a, c = candidate(store, "a", clock), candidate(store, "c", clock)
    assert a.attempt(1.0) is Move.WAIT
    assert c.attempt(1.0) is Move.WAIT
    clock.now += 10
    # Both read the same expired record; a writes first, c's replace is at a stale version.
    read = store.read
    stale = read(1.0)
    store.read = lambda timeout_s: stale  # type: ignore[method-assign]
    assert a.attempt(1.0) is Move.TAKE
    with pytest.raises(LeaseConflictError):
        c.attempt(1.0)
    store.read = read  # type: ignore[method-assign]
    assert c.attempt(1.0) is Move.WAIT
    assert (a.leading, c.leading, c.leader) == (True, False, "a")
    assert store.record is not None
    assert store.record.transitions == 4


def simulate_death(death_after_s: float, draws: list[float]) -> tuple[float, float]:
    """Leader a renews every retry period and dies `death_after_s` after taking the lease;
    follower b tries as `acquire` would. Returns (takeover - death, takeover - a's last renewal
    sent)."""
    store, clock = MemoryLease(), Clock()
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    a.attempt(1.0)
    death = clock.now + death_after_s
    next_renewal = clock.now + TIMING.retry_period_s
    b_next = clock.now + 0.3
    for draw in draws * 100:
        if next_renewal <= b_next and next_renewal < death:
            clock.now = next_renewal
            assert a.renew_once() is Renewed.YES
            next_renewal += TIMING.retry_period_s
            continue
        clock.now = b_next
        b.attempt(1.0)
        if b.leading:
            assert a.last_renewed_at is not None
            return clock.now - death, clock.now - a.last_renewed_at
        assert b._observation is not None
        b_next = clock.now + follower_delay(b._observation, clock.now, TIMING, draw)
    raise AssertionError("never took over")


@settings(max_examples=300)
@given(
    death_after_s=st.floats(0.5, 60.0),
    draws=st.lists(st.floats(0.0, 0.999), min_size=1, max_size=8),
)
def test_follower_takes_over_within_15_s_and_never_before_the_leader_stopped(
    death_after_s: float, draws: list[float]
) -> None:
    after_death, after_last_renewal = simulate_death(death_after_s, draws)
    # The last renewal is seen within one jittered retry, and the lease taken as it runs out.
    assert after_death <= TIMING.lease_duration_s + TIMING.retry_period_s * (1 + TIMING.jitter)
    assert after_death < 15.0
    # The leader stops acting renew_deadline after its last renewal; the follower acts only
    # a whole lease after it.
    assert after_last_renewal >= TIMING.lease_duration_s > TIMING.renew_deadline_s


def test_a_released_lease_is_taken_at_the_next_try() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    a.attempt(1.0)
    b.attempt(1.0)
    a.release()
    assert a.leader == "a"  # what a saw last; it does not read again
    clock.now += 0.5
    assert b.attempt(1.0) is Move.TAKE
    assert b.leading
    assert [w.holder for w in store.writes] == ["a", "", "b"]
    assert store.writes[-1].transitions == 1


def test_release_writes_nothing_once_the_lease_is_someone_elses() -> None:
    store, clock = MemoryLease(), Clock()
    a = candidate(store, "a", clock)
    a.attempt(1.0)
    assert store.record is not None
    store.replace(replace(store.record, holder="intruder"), str(store.version), 1.0)
    assert a.renew_once() is Renewed.LOST
    a.release()
    assert store.record.holder == "intruder"


def test_renewal_reports_failures_and_a_lease_taken_over() -> None:
    store, clock = MemoryLease(), Clock()
    a = candidate(store, "a", clock)
    a.attempt(1.0)
    store.down = True
    clock.now += 2
    assert a.renew_once() is Renewed.FAILED
    store.down = False
    assert a.renew_once() is Renewed.YES
    assert store.record is not None
    store.replace(released(store.record, clock.wall()), str(store.version), 1.0)
    # Released behind its back: not ours any more, even though nobody holds it.
    assert a.renew_once() is Renewed.LOST


def test_acquire_returns_when_stopped_while_following() -> None:
    store = MemoryLease()
    store.create(HELD_BY_B, 1.0)
    follower = LeaderElector(store, "a", ElectionTiming(10.0, 7.0, 0.05))
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()
    assert follower.acquire(stop) is False
    assert follower.leader == "b"
    timer.join()


# The renewal thread on a real clock ---------------------------------------------------------

FAST = ElectionTiming(lease_duration_s=1.0, renew_deadline_s=0.6, retry_period_s=0.1)


def leading(store: MemoryLease) -> LeaderElector:
    elector = LeaderElector(store, "a", FAST)
    assert elector.acquire(threading.Event())
    return elector


def test_renewal_keeps_the_lease_and_stops_without_writing_after() -> None:
    store = MemoryLease()
    elector = leading(store)
    lost: list[str] = []
    renewal = elector.start_renewing(lost.append)
    time.sleep(0.55)
    renewal.stop()
    writes = len(store.writes)
    assert writes >= 3, store.writes
    time.sleep(0.25)
    assert len(store.writes) == writes
    assert lost == []


def test_leader_that_cannot_renew_gives_up_at_its_deadline() -> None:
    store = MemoryLease()
    elector = leading(store)
    lost = threading.Event()
    reasons: list[str] = []

    def on_lost(why: str) -> None:
        reasons.append(why)
        lost.set()

    store.down = True
    started = time.monotonic()
    renewal = elector.start_renewing(on_lost)
    assert lost.wait(5.0)
    took = time.monotonic() - started
    renewal.stop()
    # Not before the deadline, and well before the lease runs out for a follower.
    assert FAST.renew_deadline_s - 0.05 <= took < FAST.lease_duration_s, took
    assert reasons == ["not renewed within 0.6 s"]


def test_leader_whose_lease_is_taken_gives_up_at_once() -> None:
    store = MemoryLease()
    elector = leading(store)
    lost = threading.Event()
    reasons: list[str] = []
    assert store.record is not None
    store.replace(replace(store.record, holder="intruder"), str(store.version), 1.0)

    def on_lost(why: str) -> None:
        reasons.append(why)
        lost.set()

    started = time.monotonic()
    renewal = elector.start_renewing(on_lost)
    assert lost.wait(5.0)
    assert time.monotonic() - started < FAST.renew_deadline_s
    renewal.stop()
    assert reasons == ["the lease is held by intruder"]
