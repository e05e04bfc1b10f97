"""The references `bench autoscale` measures GPU-hours against, and the static fleet to beat.

* `fluid_bound`: per window, the GPU-seconds the work arriving in it needs at full efficiency,
  with no SLO and no queueing (the planner's roofline, `planning.performance.step_time`, its
  fixed costs left out). No schedule that serves every request in the load's duration holds
  fewer GPU-seconds. No simulation.
* `per_window_oracle`: per window, the fewest replicas per role that meet the attainment target
  for the requests arriving in it, asked for a cold start ahead. Every window separately, so it
  over-provisions for the overall target; it is where the clairvoyant search starts.
* `clairvoyant_schedule` (`bench.clairvoyant`): a per-window schedule, known in advance,
  searched from the oracle's to meet the overall attainment target with the fewest GPU-hours.
* `static_best`: the fewest replicas per role, held all the time, that meet the overall target:
  what a team sizing a static fleet by load test runs.

Pure apart from the simulations, which are deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.baselines import Bounds, ClairvoyantScaler, StaticScaler
from inferfleet.autoscale.policy import PolicySpec
from inferfleet.planning import capacity
from inferfleet.planning.memory import plan_memory
from inferfleet.planning.performance import StepLoad, step_time
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.fleet import FleetConfig, simulate
from inferfleet.sim.run import FleetRun
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Outcome, Slo

DEFAULT_ORACLE_WINDOW_S = 60.0


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
        needs, window_s, config.slowest_cold_start_s, lead_s=None if foresight else 0.0
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
            for role in responsible_roles(service, score):
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


def responsible_roles(service: Service, score: WindowScore) -> list[Role]:
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
