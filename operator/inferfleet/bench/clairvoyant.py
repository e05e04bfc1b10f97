"""The clairvoyant schedule: a per-window schedule, known in advance, searched to meet the
overall attainment target (over all requests) with the fewest GPU-hours. From the per-window
oracle's schedule (`bench.references`), replicas are taken away where they cost the fewest
misses per GPU-second saved, until the miss budget (less a safety share) is used, each step
confirmed by simulation. Also replayed without foresight, and with the least headroom that
meets the target so: the references for policies that react to the load.

Pure apart from the simulations, which are deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.baselines import ClairvoyantScaler
from inferfleet.bench.references import (
    DEFAULT_ORACLE_WINDOW_S,
    Oracle,
    Service,
    StaticBest,
    allowed_misses,
    attainment,
    fleetper_window,
    misses,
    responsible_roles,
    simulated_schedule,
    window_scores,
)
from inferfleet.sim.fleet import FleetConfig
from inferfleet.sim.run import FleetRun
from inferfleet.sim.workload import TraceRequest

MISS_BUDGET_MARGIN = 0.1
"""Share of the overall miss budget the clairvoyant search leaves unused (simulated misses of
a schedule change are predicted, not exact)."""
SEARCH_COST_FACTOR = 2
"""The clairvoyant search runs at most this many times the oracle's simulations (at least
`MIN_SEARCH_SIMULATIONS`)."""
MIN_SEARCH_SIMULATIONS = 6
LATE_HEADROOM_SIMULATIONS = 8
"""Simulations `late_headroom` may run: a factor up to 2.25 found within
`LATE_HEADROOM_PRECISION` (two to bracket it, six to halve the bracket)."""
LATE_HEADROOM_PRECISION = 0.02
LATE_HEADROOM_MAX = 3.0
"""The most headroom `late_headroom` tries: past it, the reference says none was found."""
LOWER_STEP_SHARE = 8
"""A search pass lowers a window by one replica in this many (at least one)."""


def schedule_gpu_seconds(
    needs: Sequence[Mapping[Role, int]],
    window_s: float,
    cold_start_s: float,
    gpus_per_replica: int,
    horizon: float,
) -> float:
    """The GPU-seconds the clairvoyant scaler asks for over the horizon (drains left out):
    what a schedule change saves, before a simulation confirms it."""
    scaler = ClairvoyantScaler(needs, window_s, cold_start_s)
    ticks = max(1, math.ceil(horizon / scaler.interval_s))
    held = sum(
        sum(scaler.desired(tick * scaler.interval_s, None, {}).values()) for tick in range(ticks)
    )
    return held * scaler.interval_s * gpus_per_replica


@dataclass(frozen=True)
class SearchPass:
    role: Role
    lowered: int
    """Windows tried one step lower (all at once, one simulation)."""
    accepted: int
    """Windows kept lower after confirmation (0: the pass changed nothing)."""
    predicted_misses: int
    misses: int
    """Misses of the schedule after the pass."""
    gpu_hours: float

    def to_dict(self) -> dict[str, object]:
        return {
            "role": self.role.value,
            "lowered": self.lowered,
            "accepted": self.accepted,
            "predictedMisses": self.predicted_misses,
            "misses": self.misses,
            "gpuHours": self.gpu_hours,
        }


@dataclass(frozen=True)
class LateHeadroom:
    """The clairvoyant run's fleets without foresight, every window's scaled by the least
    `factor` (found by bisection) that meets the attainment target: what a policy that knew
    every window's fleet the moment the window came, and no sooner, holds to meet it with a
    uniform headroom. None of `factor` when no factor tried met it."""

    factor: float | None
    run: FleetRun | None
    simulations: int
    tried: list[tuple[float, float]]
    """Every factor simulated and its attainment, in order."""


@dataclass(frozen=True)
class Clairvoyant:
    needs: list[dict[Role, int]]
    """The searched schedule (replayed by `ClairvoyantScaler`)."""
    run: FleetRun
    oracle: Oracle
    """The per-window oracle the search started from."""
    simulations: int
    """Simulations of the search, the oracle's left out."""
    allowed_misses: int
    aimed_misses: int
    """The miss budget less the safety share: what the search plans to use."""
    passes: list[SearchPass] = field(default_factory=list)
    started_from: str = "the per-window oracle"
    """The schedule the search lowered: the per-window oracle's, or the static-best fleet held
    in every window when that needed fewer GPU-hours."""
    late_headroom: LateHeadroom | None = None
    """The least headroom on the same fleets that meets the target without foresight."""
    unforeseen: FleetRun | None = None
    """The same fleets without foresight: each window's fleet asked for as the window starts,
    so it serves a cold start late. What a policy that knew each window's load the moment it
    came, and no sooner, would get from these fleets: where it misses the target, no policy
    that reacts to the load meets it with them, and the headroom to meet it is held ahead."""

    def served(self, window_s: float) -> list[dict[Role, int]]:
        return fleetper_window(self.run, window_s, len(self.needs))


def clairvoyant_schedule(
    requests: Sequence[TraceRequest],
    service: Service,
    config: FleetConfig,
    oracle: Oracle,
    window_s: float = DEFAULT_ORACLE_WINDOW_S,
    *,
    margin: float = MISS_BUDGET_MARGIN,
    max_simulations: int | None = None,
    static: StaticBest | None = None,
) -> Clairvoyant:
    """The fewest GPU-hours a per-window schedule known in advance needs to meet the overall
    attainment target, searched from the per-window oracle's schedule; and, given `static` (the
    static-best fleet) with fewer GPU-hours than that search found, searched again from the
    static fleet held in every window, the cheaper of the two kept. A flat schedule that meets
    the target is a schedule like any other: a reference that needed more GPU-hours than one
    would be no bound.

    A pass (the roles take turns) lowers every window of one role by one step (one replica in
    `LOWER_STEP_SHARE`) in one simulation and counts each window's extra misses. Windows are
    taken in order of GPU-seconds saved per extra miss while the predicted misses fit the
    budget: (1 - target) x requests, less `margin` of it, less the misses already spent. A
    window whose lowering saves nothing once the others are lower (a later window within a cold
    start holds the replicas anyway) is dropped when it costs misses. The chosen set is
    confirmed by simulation; when the confirmed run misses the target or saves nothing, the
    later half of the set is dropped and the rest confirmed again. A window whose extra misses
    alone overran the budget is left out of the role's later trials (its spill into the next
    windows would hide what they can give). The search stops when the budget less its margin is
    spent, when no role gives anything, or after `max_simulations` (default:
    `SEARCH_COST_FACTOR` times the oracle's). When the oracle itself misses the overall
    target, windows that miss are raised first. Deterministic."""
    searched = _search(requests, service, config, oracle, start=oracle.needs,
                       start_run=oracle.run, window_s=window_s, margin=margin,
                       max_simulations=max_simulations)  # fmt: skip
    if static is None or static.run.gpu_seconds() >= searched.run.gpu_seconds():
        return searched
    flat = [static.replicas] * len(oracle.needs)
    again = _search(requests, service, config, oracle, start=flat, start_run=static.run,
                    window_s=window_s, margin=margin, max_simulations=max_simulations,
                    started_from="the static-best fleet")  # fmt: skip
    cheaper = again if again.run.gpu_seconds() < searched.run.gpu_seconds() else searched
    return replace(cheaper, simulations=searched.simulations + again.simulations)


def without_foresight(
    requests: Sequence[TraceRequest],
    config: FleetConfig,
    clairvoyant: Clairvoyant,
    window_s: float = DEFAULT_ORACLE_WINDOW_S,
    *,
    target: float | None = None,
    max_simulations: int = LATE_HEADROOM_SIMULATIONS,
) -> Clairvoyant:
    """`clairvoyant` with its fleets also replayed without foresight (`unforeseen`): each
    window's fleet as the clairvoyant run served it, asked for as the window starts. Not its
    schedule: the search lowers a window that replicas ordered ahead for the next ones already
    cover, and that window's entry, replayed late, would starve it of what it ran with.

    With an attainment `target`, also the least headroom on those fleets that meets it late
    (`late_headroom`), in at most `max_simulations` more simulations."""
    served = clairvoyant.served(window_s)
    run = simulated_schedule(requests, config, served, window_s, foresight=False)
    headroom = None
    if target is not None:
        headroom = late_headroom(
            requests, config, served, window_s,
            target=target, unforeseen=run, max_simulations=max_simulations,
        )  # fmt: skip
    return replace(clairvoyant, unforeseen=run, late_headroom=headroom)


def late_headroom(
    requests: Sequence[TraceRequest],
    config: FleetConfig,
    fleets: Sequence[Mapping[Role, int]],
    window_s: float,
    *,
    target: float,
    unforeseen: FleetRun,
    max_simulations: int = LATE_HEADROOM_SIMULATIONS,
) -> LateHeadroom:
    """The factor on every window's fleet that meets `target` replayed without foresight
    (`unforeseen`: the factor 1), by bisection: upward by half (up to `LATE_HEADROOM_MAX`)
    until one meets it, then down within `LATE_HEADROOM_PRECISION` of one that missed. Counts
    are rounded to the nearest, so that the factor says the headroom held (rounded up, any
    factor above 1 would add a replica to every count). More replicas serve more requests in
    time, though not strictly (they reorder the queues): the factor is the least the
    bisection finds, and a slightly smaller one may also meet the target."""
    tried = [(1.0, attainment(unforeseen))]
    if tried[0][1] >= target:
        return LateHeadroom(1.0, unforeseen, 0, tried)

    def replay(factor: float) -> FleetRun:
        scaled = [
            {role: math.floor(factor * count + 0.5) for role, count in fleet.items()}
            for fleet in fleets
        ]
        run = simulated_schedule(requests, config, scaled, window_s, foresight=False)
        tried.append((factor, attainment(run)))
        return run

    low, high, met = 1.0, 1.0, None
    while met is None and len(tried) <= max_simulations and high < LATE_HEADROOM_MAX:
        low, high = high, min(LATE_HEADROOM_MAX, high * 1.5)
        run = replay(high)
        if tried[-1][1] >= target:
            met = run
    while (
        met is not None and high - low > LATE_HEADROOM_PRECISION and len(tried) <= max_simulations
    ):
        middle = (low + high) / 2
        run = replay(middle)
        if tried[-1][1] >= target:
            high, met = middle, run
        else:
            low = middle
    return LateHeadroom(high if met is not None else None, met, len(tried) - 1, tried)


def _search(
    requests: Sequence[TraceRequest],
    service: Service,
    config: FleetConfig,
    oracle: Oracle,
    *,
    start: Sequence[Mapping[Role, int]],
    start_run: FleetRun,
    window_s: float,
    margin: float,
    max_simulations: int | None,
    started_from: str = "the per-window oracle",
) -> Clairvoyant:
    """One search of `clairvoyant_schedule`, from `start` (whose run is `start_run`)."""
    horizon = config.horizon_s or max((r.arrival_s for r in requests), default=0.0)
    count = len(start)
    target = service.slo.attainment_target
    allowed = allowed_misses(len(requests), target)
    aimed = math.floor(allowed * (1 - margin))
    budget = max_simulations
    if budget is None:
        budget = max(MIN_SEARCH_SIMULATIONS, SEARCH_COST_FACTOR * oracle.simulations)
    gpus = service.replica.gpus
    needs = [dict(need) for need in start]
    run = start_run
    simulations = 0
    passes: list[SearchPass] = []

    def simulate_needs(schedule: Sequence[Mapping[Role, int]]) -> FleetRun:
        nonlocal simulations
        simulations += 1
        return simulated_schedule(requests, config, schedule, window_s)

    def cost(schedule: Sequence[Mapping[Role, int]]) -> float:
        return schedule_gpu_seconds(schedule, window_s, config.slowest_cold_start_s, gpus, horizon)

    # The oracle meets every window but for what no count absorbs; raise those first.
    while misses(run) > allowed and simulations < budget:
        raised = False
        for index, score in enumerate(window_scores(run, window_s, count)):
            if score.meets(target):
                continue
            for role in responsible_roles(service, score):
                ceiling = service.bounds[role].max_replicas
                if needs[index][role] < ceiling:
                    step = max(1, needs[index][role] // 4)
                    needs[index][role] = min(ceiling, needs[index][role] + step)
                    raised = True
        if not raised:
            break
        run = simulate_needs(needs)

    exhausted: set[Role] = set()
    # Windows whose lowering alone overran the whole budget: left out of later trials, where
    # the misses they spill into their neighbours would hide what the neighbours can give.
    frozen: dict[Role, set[int]] = {role: set() for role in service.roles}
    turn = 0
    while simulations < budget and misses(run) <= aimed and len(exhausted) < len(service.roles):
        role = service.roles[turn % len(service.roles)]
        turn += 1
        if role in exhausted:
            continue
        floor_ = service.bounds[role].min_replicas
        trial = [dict(need) for need in needs]
        lowered = [
            index
            for index in range(count)
            if needs[index][role] > max(1, floor_) and index not in frozen[role]
        ]
        for index in lowered:
            step = max(1, needs[index][role] // LOWER_STEP_SHARE)
            trial[index][role] = max(1, floor_, needs[index][role] - step)
        if not lowered:
            exhausted.add(role)
            continue
        trial_run = simulate_needs(trial)
        before = window_scores(run, window_s, count)
        after = window_scores(trial_run, window_s, count)
        extra = {i: max(0, after[i].missed - before[i].missed) for i in lowered}
        saved = {i: (needs[i][role] - trial[i][role]) * gpus * window_s for i in lowered}
        room = aimed - misses(run)
        overran = {i for i in lowered if extra[i] > room}
        frozen[role] |= overran
        accepted: list[int] = []
        predicted = 0
        for index in sorted(lowered, key=lambda i: (-saved[i] / max(extra[i], 0.5), i)):
            if predicted + extra[index] <= room:
                accepted.append(index)
                predicted += extra[index]

        def applied(
            chosen: Sequence[int],
            trial: Sequence[dict[Role, int]] = trial,
            needs: Sequence[dict[Role, int]] = needs,
        ) -> list[dict[Role, int]]:
            return [trial[i] if i in chosen else needs[i] for i in range(count)]

        full = cost(applied(accepted))
        for index in sorted(accepted, key=lambda i: (-extra[i], i)):
            without = [i for i in accepted if i != index]
            if extra[index] > 0 and cost(applied(without)) <= full:
                accepted, predicted = without, predicted - extra[index]
        candidate_run: FleetRun | None = None
        if accepted and len(accepted) == len(lowered):
            candidate_run = trial_run
        elif accepted and simulations < budget:
            candidate_run = simulate_needs(applied(accepted))
        while candidate_run is not None and not _better(candidate_run, run, allowed):
            accepted = accepted[: len(accepted) // 2]
            candidate_run = None
            if accepted and simulations < budget:
                candidate_run = simulate_needs(applied(accepted))
        if candidate_run is None:
            if not overran:
                exhausted.add(role)
            passes.append(SearchPass(role, len(lowered), 0, predicted, misses(run),
                                     run.gpu_seconds() / 3600))  # fmt: skip
            continue
        needs, run = applied(accepted), candidate_run
        exhausted.clear()
        passes.append(SearchPass(role, len(lowered), len(accepted), predicted, misses(run),
                                 run.gpu_seconds() / 3600))  # fmt: skip
    return Clairvoyant(needs, run, oracle, simulations, allowed, aimed, passes, started_from)


def _better(candidate: FleetRun, current: FleetRun, allowed: int) -> bool:
    return misses(candidate) <= allowed and candidate.gpu_seconds() < current.gpu_seconds()


# The static fleet to beat.
