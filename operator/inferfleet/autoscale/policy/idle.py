"""Scale to zero and back, on purpose only (`RolePolicy.min_replicas` 0 on every pool).

A service whose pools all allow zero replicas goes to zero once no request has reached it for
`PolicySpec.idle_before_zero_s`: no arrival, none completed, none in flight and none held by
the router, at every tick over that period. Every pool goes together (a prefill pool
without its decode pool, or the reverse, serves nothing and still holds GPUs). At zero it
stays there until the router shows demand again; then every pool is ordered back at once
(a request needs each of them, and a pool woken after another would add its cold start to
the wait), sized as any tick sizes them, at least one replica each.

The requests held through a wake wait a cold start: they miss the TTFT target, and are
counted against the SLO as any request is, but their waits are the cold start's, not the
model's error, as are the waits of those queued behind them while the first replicas drain
the queue the wake built. From the wake until every pool serves again with no request queued
in its engines, and two rate windows more (one for the requests it held to finish, one whose
outcomes hold none of them), the policy neither learns lessons nor calibrates from the
window's outcomes (`waking`).

Idle is measured from the last tick that saw a request, kept in the history (so an operator
restart does not shorten it) and counted from the first tick that saw none when the history
knows no such tick: the policy never scales to zero for want of data. Stale or missing
metrics hold the last decision, zero included; the router's push (`ServiceMetrics.
waiting_for_replicas`) wakes the service without waiting for a scrape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.history import LastDecision, PolicyHistory
from inferfleet.autoscale.policy.spec import PolicySpec, Reason
from inferfleet.autoscale.snapshot import MetricsSnapshot


def requests_seen(snapshot: MetricsSnapshot) -> bool:
    """Whether the snapshot shows any request: arriving, completed, in flight or held by the
    router for want of a replica."""
    service = snapshot.service
    return any(
        value is not None and value > 0
        for value in (
            service.arrivals_per_s,
            service.recent_arrivals_per_s,
            service.requests_per_s,
            service.in_flight_requests,
            service.waiting_for_replicas,
        )
    )


@dataclass(frozen=True)
class IdleState:
    """What this tick knows about the service's idleness."""

    seen: bool
    """A request showed in this tick's snapshot."""
    idle_since_s: float
    """The last tick that saw a request (or the first that saw none, when none is known)."""
    at_zero: bool
    """Every pool runs (and has asked for) zero replicas."""

    def idle_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.idle_since_s)


def idle_state(
    snapshot: MetricsSnapshot, current: Mapping[Role, int], history: PolicyHistory
) -> IdleState:
    now = snapshot.taken_at_s
    seen = requests_seen(snapshot)
    known = history.requests_seen_at_s
    since = now if seen or known is None else known
    return IdleState(seen, since, all(n <= 0 for n in current.values()))


def zero_decision(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    state: IdleState,
    history: PolicyHistory,
    pins: Mapping[Role, int],
) -> tuple[dict[Role, int], Reason, str, PolicyHistory] | None:
    """Every pool at zero, with the reason and the history to keep, when the service is idle
    (or stays at zero with nothing arriving); None when the normal sizing decides. A pin
    holds its role, so a pinned service is never taken to zero."""
    if not spec.scales_to_zero or pins or state.seen:
        return None
    now = snapshot.taken_at_s
    idle_s = state.idle_s(now)
    if not state.at_zero and idle_s < spec.idle_before_zero_s:
        return None
    replicas = dict.fromkeys(spec.role_names, 0)
    if state.at_zero:
        reason = Reason.IDLE_AT_ZERO
        message = (
            f"no request for {idle_s:.0f} s: every pool stays at zero; the router holds the "
            "next request while the pools wake"
        )
    else:
        reason = Reason.SCALE_TO_ZERO
        message = (
            f"no request for {idle_s:.0f} s (scaleToZeroIdleSeconds "
            f"{spec.idle_before_zero_s:.0f}): every pool to zero; the router holds the next "
            "request while the pools wake"
        )
    kept = replace(
        history,
        requests_seen_at_s=state.idle_since_s,
        last_decision=LastDecision(now, dict(replicas), reason),
    )
    return replicas, reason, message, kept


def waking(snapshot: MetricsSnapshot, history: PolicyHistory) -> bool:
    """Whether the window's outcomes may hold requests that waited through a wake: from the
    wake until two rate windows after every pool served again with its queue drained."""
    if history.woke_at_s is None:
        return False
    served = history.wake_caught_up_at_s
    return served is None or snapshot.taken_at_s < served + 2 * snapshot.window_s


def wake_progress(
    spec: PolicySpec, snapshot: MetricsSnapshot, history: PolicyHistory, reason: Reason
) -> tuple[float | None, float | None]:
    """The wake's times to keep after this tick (`PolicyHistory.woke_at_s`,
    `wake_caught_up_at_s`), from the last tick's: begun (a `WAKE_FROM_ZERO` decision), caught
    up (every pool has a ready replica and no request queued in its engines), over (`waking`
    no more) or abandoned (at zero)."""
    now = snapshot.taken_at_s
    woke, served = history.woke_at_s, history.wake_caught_up_at_s
    if reason is Reason.WAKE_FROM_ZERO:
        return now, None
    if woke is None or reason in (Reason.SCALE_TO_ZERO, Reason.IDLE_AT_ZERO):
        return None, None
    if served is None:
        pools = [snapshot.role(r) for r in spec.role_names]
        if all(p is not None and p.ready_replicas >= 1 and p.waiting_requests < 1 for p in pools):
            return woke, now
        return woke, None
    return (woke, served) if waking(snapshot, history) else (None, None)


def woken(spec: PolicySpec, state: IdleState, replicas: Mapping[Role, int]) -> str | None:
    """What a tick that orders the pools back from zero says first (None: no wake)."""
    if not (spec.scales_to_zero and state.at_zero and any(n > 0 for n in replicas.values())):
        return None
    ordered = ", ".join(f"{role.value} {replicas[role]}" for role in spec.role_names)
    return f"requests arrived at zero replicas: every pool woken at once ({ordered})"
