"""Step 4 and 5 of a tick: scale-down stabilisation, and every constraint in one place
(bounds, pins, the GPU budget and quota)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.history import DemandSample, Recommendation
from inferfleet.autoscale.policy.spec import ROLE_ORDER, PolicySpec


def stabilised(
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


def forecasts_held(
    spec: PolicySpec, samples: Sequence[DemandSample], now: float, attainment: float | None
) -> bool:
    """Whether the model has been right for a whole stabilisation window, so that a pool may
    shrink after one rate window: the SLO met (`attainment`, the decayed tally, at or above its
    target), and no tick within the window saw arrivals above what the tick a cold start
    before it forecast, when replicas for them had to be ordered. Arrivals are the short
    window's beyond their counting noise (else the rate window's), so a load that only moves
    as noise does keeps its trust. A window the samples (oldest first) do not cover from its
    start is not trusted: after a restart, the full window applies.

    Stabilisation guards against a forecast that falls short: replicas removed on a dip come
    back a cold start late. Where every forecast of the window covered what came, the
    forecast now (with its headroom for growth) is what the pool is sized for, and waiting
    out the window holds replicas that nothing has needed."""
    if attainment is None or attainment < spec.attainment_target:
        return False
    start = now - spec.scale_down_stabilization_s
    if not samples or samples[0].at_s > start:
        return False
    times = [s.at_s for s in samples]
    for sample in samples[bisect.bisect_right(times, start) :]:
        ordered = bisect.bisect_right(times, sample.at_s - spec.cold_start_s)
        if ordered == 0:
            return False
        arrived = sample.recent_requests_per_s or sample.requests_per_s
        if arrived > samples[ordered - 1].forecast_requests_per_s:
            return False
    return True


@dataclass(frozen=True)
class Constrained:
    replicas: dict[Role, int]
    pinned: frozenset[Role]
    """Pinned roles whose pin overrode the recommendation."""
    budget_cut: frozenset[Role]
    max_cut: frozenset[Role]
    by_quota: bool = False
    """Whether `budget_cut` was cut to the namespace's GPU quota rather than the budget."""


def constrain(
    spec: PolicySpec,
    wanted: Mapping[Role, int],
    pins: Mapping[Role, int],
    priority: frozenset[Role],
) -> Constrained:
    """Every constraint, in one place: bounds, pins, the GPU budget and the namespace's GPU
    quota; zero only where minReplicas allows it (`policy.idle` decides when)."""
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
        replicas[role] = max(policy.min_replicas, min(want, policy.max_replicas))

    budget_cut: set[Role] = set()
    if spec.gpu_limit is not None:
        budget_cut = _fit_budget(spec, replicas, pins, priority, spec.gpu_limit)
    return Constrained(
        replicas,
        frozenset(pinned),
        frozenset(budget_cut),
        frozenset(max_cut),
        by_quota=bool(budget_cut) and spec.quota_binds,
    )


def _fit_budget(
    spec: PolicySpec,
    replicas: dict[Role, int],
    pins: Mapping[Role, int],
    priority: frozenset[Role],
    budget: int,
) -> set[Role]:
    """Cut unpinned roles to `budget` GPUs, in place: each keeps its minReplicas (one replica
    when even those exceed the budget), then the roles whose SLO is missed are filled first, the
    rest after, evenly by the share of their want."""
    gpus = {p.role: p.gpus_per_replica for p in spec.roles}
    if sum(replicas[r] * gpus[r] for r in replicas) <= budget:
        return set()
    wanted = dict(replicas)
    free = [r for r in spec.role_names if r not in pins]
    pinned_gpus = sum(replicas[r] * gpus[r] for r in replicas if r in pins)
    # minReplicas holds while the budget has room for it; one replica per role always does.
    minimums = {r: spec.role(r).min_replicas for r in free}
    fits_minimums = pinned_gpus + sum(minimums[r] * gpus[r] for r in free) <= budget
    for role in free:
        replicas[role] = min(wanted[role], minimums[role]) if fits_minimums else 1
    left = budget - sum(replicas[r] * gpus[r] for r in replicas)
    for tier in ([r for r in free if r in priority], [r for r in free if r not in priority]):
        while True:
            growable = [r for r in tier if replicas[r] < wanted[r] and gpus[r] <= left]
            if not growable:
                break
            role = min(growable, key=lambda r: (replicas[r] / wanted[r], ROLE_ORDER.index(r)))
            replicas[role] += 1
            left -= gpus[role]
    return {r for r in free if replicas[r] < wanted[r]}
