"""The references `bench autoscale` measures GPU-hours against, and the static fleet to beat.

* `fluid_bound`: per window, the GPU-seconds the work arriving in it needs at full efficiency,
  with no SLO and no queueing (the planner's roofline, `planning.performance.step_time`, its
  fixed costs left out). No schedule that serves every request in the load's duration holds
  fewer GPU-seconds. No simulation.
* `per_window_oracle`: per window, the fewest replicas per role that meet the attainment target
  for the requests arriving in it, asked for a cold start ahead. Every window separately, so it
  over-provisions for the overall target; it is where the clairvoyant search starts.
* `clairvoyant_schedule`: a per-window schedule, known in advance, searched to meet the
  overall attainment target (over all requests) with the fewest GPU-hours: from the oracle's
  schedule, replicas are taken away where they cost the fewest misses per GPU-second saved,
  until the miss budget (less a safety share) is used, each step confirmed by simulation.
* `static_best`: the fewest replicas per role, held all the time, that meet the overall target:
  what a team sizing a static fleet by load test runs.

Pure apart from the simulations, which are deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.baselines import Bounds, ClairvoyantScaler, StaticScaler
from inferfleet.autoscale.policy import PolicySpec
from inferfleet.planning import capacity
from inferfleet.planning.memory import plan_memory
from inferfleet.planning.performance import StepLoad, step_time
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.fleet import FleetConfig, FleetRun, simulate
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Outcome, Slo

DEFAULT_ORACLE_WINDOW_S = 60.0
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


@dataclass(frozen=True)
class Service:
    """The service as the simulator, the baselines and the references see it."""

    replica: ReplicaConfig
    roles: tuple[Role, ...]
    slo: Slo
    bounds: Mapping[Role, Bounds]
    policy: PolicySpec

    @property
    def disaggregated(self) -> bool:
        return Role.PREFILL in self.roles


def windows_of(
    requests: Sequence[TraceRequest], horizon: float, window_s: float
) -> list[list[TraceRequest]]:
    """The requests by the window they arrive in."""
    count = max(1, math.ceil(horizon / window_s))
    windows: list[list[TraceRequest]] = [[] for _ in range(count)]
    for request in requests:
        windows[min(count - 1, int(request.arrival_s // window_s))].append(request)
    return windows


# The fluid lower bound.


@dataclass(frozen=True)
class FluidBound:
    window_s: float
    gpu_seconds: list[dict[Role, float]]
    """Per window and role, the GPU-seconds its arrivals need at full efficiency."""

    @property
    def gpu_hours(self) -> float:
        return sum(sum(w.values()) for w in self.gpu_seconds) / 3600

    def gpus(self) -> list[dict[Role, float]]:
        """Per window and role, the GPUs busy throughout the window at full efficiency."""
        return [{role: s / self.window_s for role, s in w.items()} for w in self.gpu_seconds]

    def static_floor(self, horizon: float, gpus_per_replica: int = 1) -> dict[Role, int]:
        """Per role, the replicas busy all the load's duration at full efficiency, rounded
        down: a static fleet with fewer cannot do the work in that time."""
        roles = {role for window in self.gpu_seconds for role in window}
        return {
            role: int(sum(w.get(role, 0.0) for w in self.gpu_seconds) / horizon / gpus_per_replica)
            for role in roles
        }


@dataclass(frozen=True)
class FluidRates:
    """Seconds of one replica per unit of work, at the planner's peaks times its fitted
    efficiency terms (`step_time`, without per-step overhead and communication)."""

    prefill_token_s: float
    """Linear layers, per prompt token (compute-bound)."""
    decode_token_s: float
    """Linear layers, per output token, compute only (output head included)."""
    weight_read_s: float
    """Reading the weights once: one decode step, at any batch."""
    prefill_pair_s: float
    """Prefill attention, per (token, attended position) pair."""
    context_token_s: float
    """Decode attention, per cached token read in a step."""


_LARGE = 10**7


def fluid_rates(replica: ReplicaConfig) -> FluidRates:
    # A step of many tokens makes the linear layers compute-bound (and an MoE read every
    # expert), so linear_s / tokens is the compute time per token.
    prefill = step_time(replica, StepLoad(prefill_tokens=_LARGE))
    decode = step_time(replica, StepLoad(decode_sequences=_LARGE))
    # One sequence's step is bound by reading the weights, the fewest (an MoE: fewest experts).
    weights_s = step_time(replica, StepLoad(decode_sequences=1)).linear_s
    pairs = step_time(replica, StepLoad(prefill_attention_pairs=float(_LARGE)))
    context = step_time(replica, StepLoad(decode_context_tokens=_LARGE))
    return FluidRates(
        prefill_token_s=prefill.linear_s / _LARGE,
        decode_token_s=decode.linear_s / _LARGE,
        weight_read_s=weights_s,
        prefill_pair_s=pairs.attention_s / _LARGE,
        context_token_s=context.attention_s / _LARGE,
    )


def fluid_bound(
    requests: Sequence[TraceRequest],
    service: Service,
    horizon: float,
    window_s: float = DEFAULT_ORACLE_WINDOW_S,
    *,
    prefix_caching: bool = True,
) -> FluidBound:
    """Per window, the GPU-seconds of the work arriving in it at full efficiency:

    linear = max(P x prefill_token + D x decode_token, ceil(D / B) x weight_read)
    attention = pairs x prefill_pair + context x context_token

    P: prompt tokens not in a prefix cache (with prefix caching, a block seen before anywhere
    in the load is free, as if one cache held everything); D: output tokens; B: the largest
    decode batch, max_sequences or the sequences of the window's mean decode context (prompt
    plus half the output, weighted by output) the KV cache holds; pairs: causal attention
    pairs of the prefilled tokens; context: the cached tokens each output token reads. Times
    GPUs per replica. Disaggregated, the prefill part is the prefill role's and the rest the
    decode role's; aggregated, one replica does both and shares the weight reads."""
    replica = service.replica
    rates = fluid_rates(replica)
    kv_tokens = plan_memory(replica).kv_capacity_tokens
    seen: set[int] = set()
    bound: list[dict[Role, float]] = []
    for window in windows_of(requests, horizon, window_s):
        prompt = pairs = output = context = 0.0
        for request in window:
            cached = _cached_tokens(request, seen) if prefix_caching else 0
            new = max(1, request.input_tokens - cached)
            prompt += new
            pairs += new * (cached + new / 2)
            output += request.output_tokens
            context += request.output_tokens * (request.input_tokens + request.output_tokens / 2)
        batch = replica.max_sequences
        if output > 0:
            batch = max(1, min(batch, int(kv_tokens // max(1.0, context / output))))
        weight_reads = math.ceil(output / batch) * rates.weight_read_s
        prefill_s = prompt * rates.prefill_token_s + pairs * rates.prefill_pair_s
        decode_linear = output * rates.decode_token_s
        attention_s = context * rates.context_token_s
        gpus = replica.gpus
        if service.disaggregated:
            bound.append(
                {
                    Role.PREFILL: prefill_s * gpus,
                    Role.DECODE: (max(decode_linear, weight_reads) + attention_s) * gpus,
                }
            )
        else:
            linear = max(prompt * rates.prefill_token_s + decode_linear, weight_reads)
            total = linear + pairs * rates.prefill_pair_s + attention_s
            bound.append({Role.AGGREGATED: total * gpus})
    return FluidBound(window_s, bound)


def _cached_tokens(request: TraceRequest, seen: set[int]) -> int:
    """Leading prompt tokens whose blocks some earlier prompt had (chained block keys); adds
    this prompt's blocks to `seen`."""
    key = 0
    cached_blocks = 0
    leading = True
    for value in request.prefix_hashes:
        key = hash((key, value))
        if leading and key in seen:
            cached_blocks += 1
        else:
            leading = False
            seen.add(key)
    return min(request.input_tokens, cached_blocks * request.hash_block_tokens)


# The per-window oracle.


def planner_needs(
    service: Service, windows: Sequence[Sequence[TraceRequest]], window_s: float
) -> list[dict[Role, int]]:
    """Per window, the planner's replicas per role for its rate and mean lengths."""
    slo = service.slo
    needs: list[dict[Role, int]] = []
    for window in windows:
        if not window:
            needs.append(dict.fromkeys(service.roles, 1))
            continue
        workload = capacity.Workload(
            len(window) / window_s,
            max(1, round(sum(r.input_tokens for r in window) / len(window))),
            max(1, round(sum(r.output_tokens for r in window) / len(window))),
        )
        plan = capacity.plan_replica(
            service.replica,
            disaggregated=service.disaggregated,
            replicas=1,
            prefill_replicas=1,
            workload=workload,
            slo=slo,
        )
        needs.append(
            {
                role.role: service.bounds[role.role].clamp(role.replicas)
                for role in plan.roles
                if role.role in service.roles
            }
        )
    return needs


@dataclass(frozen=True)
class WindowScore:
    requests: int
    met: int
    missed_ttft: int
    missed_tpot: int

    @property
    def missed(self) -> int:
        return self.requests - self.met

    def meets(self, target: float) -> bool:
        return self.requests == 0 or self.met >= target * self.requests


def window_scores(run: FleetRun, window_s: float, windows: int) -> list[WindowScore]:
    """Outcomes of the requests arriving in each window."""
    counts = [[0, 0, 0, 0] for _ in range(windows)]
    for record in run.records:
        index = min(windows - 1, int(record.arrival_s // window_s))
        row = counts[index]
        row[0] += 1
        if record.outcome is Outcome.MET:
            row[1] += 1
        if record.outcome in (Outcome.MISSED_TTFT, Outcome.MISSED_BOTH, Outcome.FAILED):
            row[2] += 1
        if record.outcome in (Outcome.MISSED_TPOT, Outcome.MISSED_BOTH):
            row[3] += 1
    return [WindowScore(*row) for row in counts]


def misses(run: FleetRun) -> int:
    return sum(1 for record in run.records if record.outcome is not Outcome.MET)


def attainment(run: FleetRun) -> float:
    return 1 - misses(run) / len(run.records) if run.records else 1.0


@dataclass(frozen=True)
class Oracle:
    needs: list[dict[Role, int]]
    """The searched schedule the clairvoyant scaler replays (a window's replicas are asked for
    a cold start ahead, so a window below a later one's need is not binding)."""
    planned: list[dict[Role, int]]
    """The planner's sizing of each window, before the search."""
    run: FleetRun
    simulations: int

    def served(self, window_s: float) -> list[dict[Role, int]]:
        """Per window, the replicas taking requests throughout it in the run: what met the SLO
        for that window's load."""
        return fleetper_window(self.run, window_s, len(self.needs))


def fleetper_window(run: FleetRun, window_s: float, windows: int) -> list[dict[Role, int]]:
    """Per window, the fewest replicas of each role that took requests at any time in it
    (sampled every second)."""
    roles = sorted({life.role for life in run.replicas}, key=lambda r: r.value)
    served: list[dict[Role, int]] = []
    for index in range(windows):
        start = index * window_s
        moments = [start + offset for offset in range(int(window_s))]
        served.append({role: min(run.accepting(role, t) for t in moments) for role in roles})
    return served


def simulated_schedule(
    requests: Sequence[TraceRequest],
    config: FleetConfig,
    needs: Sequence[Mapping[Role, int]],
    window_s: float,
    *,
    foresight: bool = True,
) -> FleetRun:
    """The run of a per-window schedule, its first window's fleet warm at time 0; without
    `foresight`, each window's fleet is asked for as the window starts."""
    scaler = ClairvoyantScaler(
        needs, window_s, config.cold_start_s, lead_s=None if foresight else 0.0
    )
    first = scaler.desired(0.0, None, {})
    return simulate(requests, replace(config, initial_replicas=dict(first)), scaler)


def per_window_oracle(
    requests: Sequence[TraceRequest],
    service: Service,
    config: FleetConfig,
    window_s: float = DEFAULT_ORACLE_WINDOW_S,
    *,
    max_raise_passes: int = 8,
    max_lower_passes: int = 4,
) -> Oracle:
    """Per window, the fewest replicas per role that meet the SLO for its arrivals.

    Starts from the planner's sizing of each window (its rate and mean lengths), then corrects
    it by simulation: windows that miss the attainment target get more replicas of the role
    that misses (TTFT: prefill or aggregated, TPOT: decode or aggregated; one, or in proportion
    to twice the share of requests missed) until every window meets it; then passes take a
    replica away from each window that met it (one role per pass), put it back where that made
    the window miss, and keep the pass when no window misses that met the target before."""
    horizon = config.horizon_s or max((r.arrival_s for r in requests), default=0.0)
    windows = windows_of(requests, horizon, window_s)
    needs = planner_needs(service, windows, window_s)
    planned = [dict(need) for need in needs]
    target = service.slo.attainment_target
    simulations = 0

    def raise_missing(run: FleetRun) -> bool:
        scores = window_scores(run, window_s, len(windows))
        raised = False
        for index, score in enumerate(scores):
            if score.meets(target):
                continue
            # In proportion to the share missed: a burst that most requests miss needs many.
            missed = 1 - score.met / score.requests
            for role in _responsible(service, score):
                bounds = service.bounds[role]
                if needs[index][role] < bounds.max_replicas:
                    step = max(1, round(needs[index][role] * min(1.0, 2 * missed)))
                    needs[index][role] = min(bounds.max_replicas, needs[index][role] + step)
                    raised = True
        return raised

    run = simulated_schedule(requests, config, needs, window_s)
    simulations += 1
    for _ in range(max_raise_passes):
        if not raise_missing(run):
            break
        run = simulated_schedule(requests, config, needs, window_s)
        simulations += 1

    # Passes down: every window that met the target tries one replica less of one role (the
    # roles take turns); windows that then miss get it back. A pass is kept when no window
    # misses that met the target before.
    for attempt in range(max_lower_passes):
        scores = window_scores(run, window_s, len(windows))
        role = service.roles[attempt % len(service.roles)]
        trial = [dict(need) for need in needs]
        lowered = [
            index
            for index, score in enumerate(scores)
            if score.meets(target) and trial[index][role] > service.bounds[role].min_replicas
        ]
        for index in lowered:
            trial[index][role] -= 1
        if not lowered:
            continue
        trial_run = simulated_schedule(requests, config, trial, window_s)
        simulations += 1
        trial_scores = window_scores(trial_run, window_s, len(windows))
        missed = [index for index in lowered if not trial_scores[index].meets(target)]
        for index in missed:
            trial[index][role] += 1
        if missed:
            if len(missed) == len(lowered):
                continue
            trial_run = simulated_schedule(requests, config, trial, window_s)
            simulations += 1
            trial_scores = window_scores(trial_run, window_s, len(windows))
        newly_missed = any(
            before.meets(target) and not after.meets(target)
            for before, after in zip(scores, trial_scores, strict=True)
        )
        if not newly_missed:
            needs, run = trial, trial_run
    return Oracle(needs, planned, run, simulations)


def _responsible(service: Service, score: WindowScore) -> list[Role]:
    if not service.disaggregated:
        return [Role.AGGREGATED]
    roles = []
    if score.missed_ttft >= score.missed_tpot or score.missed_ttft > 0:
        roles.append(Role.PREFILL)
    if score.missed_tpot > 0:
        roles.append(Role.DECODE)
    return roles


# The clairvoyant schedule.


def allowed_misses(requests: int, target: float) -> int:
    """The most requests that may miss while attainment (met over all) stays at the target."""
    allowed = math.floor((1 - target) * requests + 1e-9)
    while allowed > 0 and (requests - allowed) / requests < target:
        allowed -= 1
    return max(0, allowed)


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
        return schedule_gpu_seconds(schedule, window_s, config.cold_start_s, gpus, horizon)

    # The oracle meets every window but for what no count absorbs; raise those first.
    while misses(run) > allowed and simulations < budget:
        raised = False
        for index, score in enumerate(window_scores(run, window_s, count)):
            if score.meets(target):
                continue
            for role in _responsible(service, score):
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


def static_counts(
    needs: Sequence[Mapping[Role, int]], roles: Sequence[Role], *, peak: bool
) -> dict[Role, int]:
    """Per role, the largest count of a schedule, or its mean rounded up."""
    if peak:
        return {role: max(need[role] for need in needs) for role in roles}
    return {
        role: math.ceil(sum(need[role] for need in needs) / len(needs) - 1e-9) for role in roles
    }


@dataclass(frozen=True)
class StaticBest:
    replicas: dict[Role, int]
    run: FleetRun
    simulations: int
    tried: list[tuple[dict[Role, int], float]]
    """Every fleet simulated and its attainment, in order."""


def static_best(
    requests: Sequence[TraceRequest],
    service: Service,
    config: FleetConfig,
    start: Mapping[Role, int],
    floor: Mapping[Role, int],
) -> StaticBest:
    """The fewest replicas per role, held all the time, that meet the overall attainment
    target: from `start` (raised, doubling, while it misses), a bisection on each role's count
    in turn (prefill first) down to `floor`, the other roles held at their count so far."""
    target = service.slo.attainment_target
    tried: list[tuple[dict[Role, int], float]] = []
    runs: dict[tuple[int, ...], FleetRun] = {}

    def run_of(counts: Mapping[Role, int]) -> FleetRun:
        key = tuple(counts[role] for role in service.roles)
        if key not in runs:
            fleet = dict(counts)
            runs[key] = simulate(requests, replace(config, initial_replicas=fleet),
                                 StaticScaler(fleet))  # fmt: skip
            tried.append((fleet, attainment(runs[key])))
        return runs[key]

    def meets(counts: Mapping[Role, int]) -> bool:
        return attainment(run_of(counts)) >= target

    counts = {role: service.bounds[role].clamp(start[role]) for role in service.roles}
    while not meets(counts):
        grown = {
            role: min(service.bounds[role].max_replicas, 2 * counts[role]) for role in service.roles
        }
        if grown == counts:
            break
        counts = grown
    if meets(counts):
        for role in service.roles:
            low = min(counts[role], service.bounds[role].clamp(floor.get(role, 1)))
            high = counts[role]
            while low < high:
                middle = (low + high) // 2
                if meets({**counts, role: middle}):
                    high = middle
                else:
                    low = middle + 1
            counts[role] = high
    return StaticBest(counts, run_of(counts), len(runs), tried)


# Reported.
