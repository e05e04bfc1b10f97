"""Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection package
(and so controller-runtime) does it: holderIdentity, leaseDurationSeconds, acquireTime,
renewTime and leaseTransitions in the Lease's spec, every write a replace at the
resourceVersion read (optimistic concurrency: of two candidates writing at once, one gets 409).

Why not `kubernetes.leaderelection` (client 37.0.2): it keeps no leaseTransitions, cannot release
the lease on shutdown, sets no request timeouts (a hung call outlives the renew deadline), judges
expiry by the wall clock, takes no ApiClient of ours, and is untyped.

A candidate judges a lease held by another by its *own* monotonic clock: the lease is valid for
leaseDurationSeconds after this candidate first saw its current record, whatever the holder's
clock wrote in renewTime (no trust in clock skew between nodes). The leader stops acting when
`renew_deadline_s` passes since the start of its last successful renewal. Because a follower
saw that renewal no earlier than it was sent, the old leader has stopped at least
`lease_duration_s - renew_deadline_s` before anyone else may take over.

The timing decisions are pure functions of (what was observed, when, now); `LeaderElector`
does the API calls and the waiting."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Final, Protocol

from inferfleet.kube.lease import TRANSIENT_ERRORS, LeaseRecord

logger = logging.getLogger(__name__)

DEFAULT_ELECTION_ID: Final = "inferfleet-operator"
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


# Timing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ElectionTiming:
    """How long a lease lasts, how long a leader keeps trying to renew it, how often anyone
    tries. The defaults hand over within 15 s of a leader's death: its last renewal is at most
    `retry_period_s` old when it dies, a follower sees it within one (jittered) retry after it
    was written, and wakes up just as the lease runs out, so the lease is taken within
    lease 10 + retry 2 x (1 + jitter 0.2) = 12.4 s, plus two API calls. The renew deadline (7 s)
    leaves a dying leader 3 s to stop before a follower may act, and three tries at a renewal
    before it gives up (controller-runtime's defaults are 15/10/2: slower to hand over)."""

    lease_duration_s: float = 10.0
    renew_deadline_s: float = 7.0
    retry_period_s: float = 2.0
    # A follower's retries are spread over [1, 1 + jitter] retry periods, as client-go's
    # JitterUntil does, so candidates that start together do not write together.
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError("the lease must outlast the renew deadline")
        if not self.renew_deadline_s > self.retry_period_s * (1 + self.jitter):
            raise ValueError("the renew deadline must allow more than one jittered retry")
        if self.retry_period_s <= 0 or self.jitter < 0:
            raise ValueError("the retry period must be positive and the jitter not negative")

    @property
    def lease_duration_seconds(self) -> int:
        """The Lease's integral leaseDurationSeconds, rounded up: never shorter than meant."""
        return max(1, int(-(-self.lease_duration_s // 1)))


@dataclass(frozen=True)
class Observation:
    """The record last read (None: no Lease exists) and the monotonic time this candidate first
    saw it: a lease's validity is counted from there."""

    record: LeaseRecord | None
    observed_at: float


class Move(StrEnum):
    CREATE = "create"  # no Lease yet: create it holding it
    TAKE = "take"  # released, or not renewed for its whole duration: write ourselves in
    RENEW = "renew"  # ours: extend it
    WAIT = "wait"  # another's, still valid


def observe(previous: Observation | None, record: LeaseRecord | None, now: float) -> Observation:
    """The same record as before keeps its clock running; any change (a renewal, a new holder)
    restarts it."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def held_until(observation: Observation) -> float | None:
    """The monotonic time the observed holder's lease runs out; None when nobody holds it."""
    record = observation.record
    if record is None or not record.holder:
        return None
    return observation.observed_at + record.lease_duration_s


def decide(observation: Observation, identity: str, now: float) -> Move:
    record = observation.record
    if record is None:
        return Move.CREATE
    if record.holder == identity:
        return Move.RENEW
    expiry = held_until(observation)
    if expiry is None or expiry <= now:
        return Move.TAKE
    return Move.WAIT


def claim(
    record: LeaseRecord | None, identity: str, wall_now: datetime, timing: ElectionTiming
) -> LeaseRecord:
    """The record to write to hold the lease: a renewal keeps acquireTime and the count of
    transitions; a change of holder (from anyone, or a released lease) counts one."""
    if record is not None and record.holder == identity:
        return replace(record, lease_duration_s=timing.lease_duration_seconds, renew_time=wall_now)
    return LeaseRecord(
        holder=identity,
        lease_duration_s=timing.lease_duration_seconds,
        acquire_time=wall_now,
        renew_time=wall_now,
        transitions=0 if record is None else record.transitions + 1,
    )


def released(record: LeaseRecord, wall_now: datetime) -> LeaseRecord:
    """What a leader writes as it stops (client-go's ReleaseOnCancel): no holder, so a follower
    takes it at its next try instead of waiting out the lease."""
    return LeaseRecord(
        holder="",
        lease_duration_s=1,
        acquire_time=wall_now,
        renew_time=wall_now,
        transitions=record.transitions,
    )


def follower_delay(
    observation: Observation, now: float, timing: ElectionTiming, draw: float
) -> float:
    """Seconds until a follower tries again: a jittered retry period (`draw` in [0, 1)), or less
    when the observed lease runs out sooner, so that it is taken the moment it may be."""
    delay = timing.retry_period_s * (1 + timing.jitter * draw)
    expiry = held_until(observation)
    if expiry is not None:
        delay = min(delay, max(expiry - now, 0.0))
    # A floor, so that a lease about to run out is not read in a busy loop.
    return max(delay, 0.05)


def renew_deadline_passed(last_renewed_at: float, now: float, timing: ElectionTiming) -> bool:
    """`last_renewed_at`: when the last successful renewal (or the acquisition) was *sent*."""
    return now - last_renewed_at >= timing.renew_deadline_s


def renew_timeout(last_renewed_at: float, now: float, timing: ElectionTiming) -> float:
    """How long one renewal request may take: a retry period, and never past the deadline."""
    return max(0.1, min(timing.retry_period_s, last_renewed_at + timing.renew_deadline_s - now))


def election_loop_alive(last_attempt_at: float, now: float, timing: ElectionTiming) -> bool:
    """A follower's liveness: its loop tried within a few retry periods (a stuck loop would
    never take over, and a restart is the cure)."""
    return now - last_attempt_at <= 3 * timing.retry_period_s * (1 + timing.jitter) + 10.0


def candidate_identity(pod_name: str | None, hostname: str, suffix: str) -> str:
    """The pod's name (unique while it lives) or the host's, with a random suffix so that two
    processes of one pod or host, or a restarted one, are never taken for each other."""
    return f"{pod_name or hostname}_{suffix}"


def default_identity() -> str:
    return candidate_identity(
        os.environ.get("POD_NAME"), socket.gethostname(), uuid.uuid4().hex[:8]
    )


def default_namespace(service_account_namespace: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """In a pod: its own namespace, from the service account mount. Elsewhere: `default`."""
    try:
        return service_account_namespace.read_text().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True)
class LeaderElection:
    """What `inferfleet run --leader-elect` elects with: the Lease `name` in `namespace`."""

    namespace: str
    name: str = DEFAULT_ELECTION_ID
    owner: str | None = None
    """The operator's Deployment in `namespace`, named as the Lease's owner (removing the
    operator removes the Lease); None: the Lease outlives it."""
    identity: str = field(default_factory=default_identity)
    timing: ElectionTiming = field(default_factory=ElectionTiming)


# The Lease in the API -------------------------------------------------------------------------


class LeaseStore(Protocol):
    """One Lease: read it with its resourceVersion, create it, replace it at a resourceVersion."""

    @property
    def where(self) -> str:
        """namespace/name, for logs."""
        ...

    def read(self, timeout_s: float) -> tuple[LeaseRecord, str] | None: ...

    def create(self, record: LeaseRecord, timeout_s: float) -> str: ...

    def replace(self, record: LeaseRecord, resource_version: str, timeout_s: float) -> str: ...


class Renewed(StrEnum):
    YES = "renewed"
    FAILED = "failed"  # the call failed; try again until the deadline
    LOST = "lost"  # another holds the lease


class LeaderElector:
    """One candidate. `acquire` blocks until it holds the lease; `start_renewing` keeps it in
    a thread and calls `on_lost` once when it cannot (another holds it, or the renew deadline
    passed); `release` hands it over as the process stops."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timing: ElectionTiming,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.identity = identity
        self.timing = timing
        self._clock = clock
        self._wall_clock = wall_clock
        self._observation: Observation | None = None
        self._resource_version: str | None = None
        self.last_attempt_at = clock()
        self.last_renewed_at: float | None = None
        self._lost = threading.Lock()

    def now(self) -> float:
        return self._clock()

    @property
    def leader(self) -> str:
        """The holder last seen ('' when none)."""
        record = self._observation.record if self._observation else None
        return record.holder if record else ""

    @property
    def leading(self) -> bool:
        return self.leader == self.identity

    def _see(self, found: tuple[LeaseRecord, str] | None, now: float) -> None:
        before = self.leader if self._observation else None
        record, self._resource_version = found if found else (None, None)
        self._observation = observe(self._observation, record, now)
        if self.leader != before and not self.leading:
            if self.leader:
                logger.info("leader election: %s leads; %s follows", self.leader, self.identity)
            else:
                logger.info("leader election: the lease is free")

    def attempt(self, timeout_s: float) -> Move:
        """One read and, when the decision says so, one write. Returns what it decided; it holds
        the lease afterwards iff `leading`. Raises on a failed call (the caller retries)."""
        started = self._clock()
        self.last_attempt_at = started
        self._see(self.store.read(timeout_s), started)
        assert self._observation is not None
        move = decide(self._observation, self.identity, started)
        if move is Move.WAIT:
            return move
        record = claim(self._observation.record, self.identity, self._wall_clock(), self.timing)
        if move is Move.CREATE:
            version = self.store.create(record, timeout_s)
        else:
            assert self._resource_version is not None
            version = self.store.replace(record, self._resource_version, timeout_s)
        self._resource_version = version
        self._observation = Observation(record, started)
        self.last_renewed_at = started
        if move is not Move.RENEW:
            logger.info(
                "leader election: %s leads (Lease %s, transition %d)",
                self.identity, self.store.where, record.transitions,
            )  # fmt: skip
        return move

    def acquire(self, stop: threading.Event) -> bool:
        """Try until the lease is ours (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                self.attempt(self.timing.retry_period_s)
            except TRANSIENT_ERRORS as error:
                logger.warning("leader election: cannot read or take the lease: %s", error)
            if self.leading:
                return True
            observation = self._observation or Observation(None, self._clock())
            stop.wait(follower_delay(observation, self._clock(), self.timing, random.random()))
        return False

    def start_renewing(self, on_lost: Callable[[str], None]) -> Renewal:
        renewal = Renewal(self, on_lost)
        renewal.start()
        return renewal

    def renew_once(self) -> Renewed:
        """One renewal try. Raises nothing: a failed call is `Renewed.FAILED`."""
        assert self.last_renewed_at is not None
        timeout = renew_timeout(self.last_renewed_at, self.now(), self.timing)
        try:
            move = self.attempt(timeout)
        except TRANSIENT_ERRORS as error:
            logger.warning("leader election: renewal failed: %s", error)
            return Renewed.FAILED
        # Anything but our own record means someone else wrote it: lost at once, whatever
        # the decision would be for a follower.
        return Renewed.YES if move is Move.RENEW else Renewed.LOST

    def release(self) -> None:
        """Write the lease free, if it is still ours; a failure only makes followers wait out
        the lease."""
        record = self._observation.record if self._observation else None
        if record is None or record.holder != self.identity or self._resource_version is None:
            return
        try:
            self.store.replace(
                released(record, self._wall_clock()),
                self._resource_version,
                self.timing.retry_period_s,
            )
        except TRANSIENT_ERRORS as error:
            logger.warning("leader election: could not release the lease: %s", error)
            return
        logger.info("leader election: %s released the lease", self.identity)


class Renewal:
    """The leader's renewals, in a thread, and a watchdog that calls `on_lost` at the renew
    deadline even if a request hangs past its timeout."""

    def __init__(self, elector: LeaderElector, on_lost: Callable[[str], None]) -> None:
        self.elector = elector
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._lost_once = threading.Lock()
        self._threads = [
            threading.Thread(target=self._renew, name="lease-renewal", daemon=True),
            threading.Thread(target=self._watch, name="lease-deadline", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop renewing, and wait for a renewal in flight (so that nothing writes after)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _lose(self, why: str) -> None:
        if self._lost_once.acquire(blocking=False):
            self._stop.set()
            self._on_lost(why)

    def _renew(self) -> None:
        elector = self.elector
        timing = elector.timing
        while not self._stop.wait(timing.retry_period_s):
            while not self._stop.is_set():
                outcome = elector.renew_once()
                if outcome is Renewed.YES:
                    break
                if outcome is Renewed.LOST:
                    self._lose(f"the lease is held by {elector.leader or 'nobody'}")
                    return
                assert elector.last_renewed_at is not None
                left = elector.last_renewed_at + timing.renew_deadline_s - elector.now()
                if left <= 0:
                    self._lose(f"not renewed within {timing.renew_deadline_s:g} s")
                    return
                self._stop.wait(min(timing.retry_period_s, left))

    def _watch(self) -> None:
        timing = self.elector.timing
        while not self._stop.wait(0.25):
            renewed = self.elector.last_renewed_at
            if renewed is not None and renew_deadline_passed(renewed, self.elector.now(), timing):
                self._lose(f"not renewed within {timing.renew_deadline_s:g} s")
                return
