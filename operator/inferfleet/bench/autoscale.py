"""`inferfleet bench autoscale`: scaling policies compared in the fleet simulator.

A scenario (YAML) names a service (a ModelDeployment and an InferenceService), a load (a trace
in ../shared/traces replayed at a rate multiplier, or a synthetic pattern), a seed and the
fleet's cold start. Every policy replays the same load open-loop through the same simulated
fleet (`inferfleet.sim.fleet`) and is scored on SLO attainment, goodput, goodput per GPU-hour,
GPU-hours (and their ratio to the clairvoyant oracle's), p95 TTFT and TPOT, reaction time to
load steps and direction changes per hour.

The oracle: per window (`oracle_window_s`), the fewest replicas per role that meet the SLO for
the requests arriving in it, known in advance and asked for a cold start ahead. It starts from
the planner's sizing for each window's rate and mean lengths, then is corrected by simulation:
windows that miss the attainment target get more replicas of the role that misses (TTFT:
prefill or aggregated, TPOT: decode or aggregated; one, or in proportion to twice the share of
requests missed) until every window meets it; then passes
take a replica away from each window that met it (one role per pass), put it back where that
made the window miss, and keep the pass when no window misses that met the target before.

Pure apart from `load_scenario`, `write_results` and `plot_scenario`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.inference_service import InferenceServiceSpec, ReplicaBounds
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role, TopologyMode
from inferfleet.autoscale.baselines import (
    Bounds,
    ClairvoyantScaler,
    HpaScaler,
    QueueScaler,
    StaticScaler,
    ThroughputPlanner,
    role_capacity,
)
from inferfleet.autoscale.policy import Decision, PolicyHistory, PolicySpec, decide, policy_spec
from inferfleet.autoscale.snapshot import MetricsSnapshot
from inferfleet.bench import traces
from inferfleet.bench.report import percentile
from inferfleet.planning import capacity
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.fleet import FleetConfig, FleetRun, Scaler, simulate
from inferfleet.slo import Outcome, Slo

POLICIES = ("goodput", "static-peak", "static-mean", "hpa", "keda", "planner", "oracle")
DEFAULT_ORACLE_WINDOW_S = 60.0
GOODPUT_INTERVAL_S = 15.0
LOAD_STEP_GROWTH = 1.25
"""A window whose planned GPUs exceed the previous window's by this factor is a load step."""


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    deployment: ModelDeploymentSpec
    service: InferenceServiceSpec
    trace: str | None = None
    """A trace file, relative to the traces directory; None: a synthetic pattern."""
    rate: float = 1.0
    """Trace: the rate multiplier. Pattern: requests/s."""
    start_s: float = 0.0
    duration_s: float | None = None
    """Trace seconds (recorded time) to replay, or the pattern's length."""
    pattern: str | None = None
    input_tokens: str = "1000"
    output_tokens: str = "200"
    seed: int = 0
    cold_start_s: float = 120.0
    scrape_interval_s: float = 15.0
    scrape_delay_s: float = 0.0
    metrics_window_s: float = 60.0
    oracle_window_s: float = DEFAULT_ORACLE_WINDOW_S
    pattern_options: Mapping[str, Any] = field(default_factory=dict)
    """Further options of `traces.synthetic` (rate_after, burst_rate, switch_s...)."""


_SCENARIO_FIELDS = {
    "name": "name",
    "description": "description",
    "trace": "trace",
    "rate": "rate",
    "startS": "start_s",
    "durationS": "duration_s",
    "pattern": "pattern",
    "inputTokens": "input_tokens",
    "outputTokens": "output_tokens",
    "seed": "seed",
    "coldStartS": "cold_start_s",
    "scrapeIntervalS": "scrape_interval_s",
    "scrapeDelayS": "scrape_delay_s",
    "metricsWindowS": "metrics_window_s",
    "oracleWindowS": "oracle_window_s",
    "patternOptions": "pattern_options",
}


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """A scenario from YAML: an `AutoscaleScenario` document, a ModelDeployment and an
    InferenceService (the service lists the deployment)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ScenarioError(f"{source}: not valid YAML: {error}") from None
    by_kind: dict[str, Mapping[str, Any]] = {}
    for document in documents:
        if not isinstance(document, dict) or "kind" not in document:
            raise ScenarioError(f"{source}: every document needs a kind")
        by_kind[str(document["kind"])] = document
    for kind in ("AutoscaleScenario", "ModelDeployment", "InferenceService"):
        if kind not in by_kind:
            raise ScenarioError(f"{source}: no {kind} document")
    body = by_kind["AutoscaleScenario"].get("spec") or {}
    if not isinstance(body, dict):
        raise ScenarioError(f"{source}: AutoscaleScenario.spec must be a mapping")
    unknown = set(body) - set(_SCENARIO_FIELDS)
    if unknown:
        raise ScenarioError(f"{source}: unknown AutoscaleScenario field(s) {sorted(unknown)}")
    try:
        deployment = ModelDeploymentSpec.model_validate(by_kind["ModelDeployment"]["spec"])
        service = InferenceServiceSpec.model_validate(by_kind["InferenceService"]["spec"])
    except (KeyError, ValueError) as error:
        raise ScenarioError(f"{source}: {error}") from None
    values: dict[str, Any] = {_SCENARIO_FIELDS[key]: value for key, value in body.items()}
    values.setdefault("name", str(by_kind["InferenceService"].get("metadata", {}).get("name")))
    values.setdefault("description", "")
    if (values.get("trace") is None) == (values.get("pattern") is None):
        raise ScenarioError(f"{source}: give exactly one of trace and pattern")
    for key in ("input_tokens", "output_tokens"):
        if key in values:
            values[key] = str(values[key])
    return Scenario(deployment=deployment, service=service, **values)


def load_scenario(path: Path | str) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read: {error.strerror}") from None
    return parse_scenario(text, str(path))


def scenario_requests(
    scenario: Scenario, traces_dir: Path | str, *, rate: float | None = None
) -> list[traces.TraceRequest]:
    """The scenario's schedule; `rate` overrides its rate (multiplier or requests/s)."""
    rate = scenario.rate if rate is None else rate
    if scenario.trace is not None:
        return traces.requests_from_trace(
            Path(traces_dir) / scenario.trace,
            rate_multiplier=rate,
            start_s=scenario.start_s,
            duration_s=scenario.duration_s,
        )
    return traces.synthetic(
        str(scenario.pattern),
        rate=rate,
        duration_s=scenario.duration_s or 3600.0,
        input_tokens=traces.parse_lengths(scenario.input_tokens),
        output_tokens=traces.parse_lengths(scenario.output_tokens),
        seed=scenario.seed,
        **_pattern_options(scenario.pattern_options),
    )


def _pattern_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`traces.synthetic` options, lengths after a mix shift parsed as on the command line."""
    return {
        key: traces.parse_lengths(str(value)) if key.endswith("_tokens_after") else value
        for key, value in options.items()
    }


def horizon_s(scenario: Scenario, requests: Sequence[traces.TraceRequest], rate: float) -> float:
    """How long the load lasts, in simulated seconds."""
    if scenario.trace is not None and scenario.duration_s is not None:
        return scenario.duration_s / rate
    if scenario.trace is None:
        return scenario.duration_s or 3600.0
    return max((r.arrival_s for r in requests), default=0.0)


# The service as the simulator and the baselines see it.


@dataclass(frozen=True)
class Service:
    replica: ReplicaConfig
    roles: tuple[Role, ...]
    slo: Slo
    bounds: Mapping[Role, Bounds]
    policy: PolicySpec

    @property
    def disaggregated(self) -> bool:
        return Role.PREFILL in self.roles


def service_of(scenario: Scenario, catalog: GpuCatalog | None = None) -> Service:
    catalog = catalog or GpuCatalog.builtin()
    replica = ReplicaConfig.from_spec(scenario.deployment, catalog)
    disaggregated = scenario.deployment.topology.mode == TopologyMode.DISAGGREGATED
    roles = (Role.PREFILL, Role.DECODE) if disaggregated else (Role.AGGREGATED,)
    autoscaling = scenario.service.autoscaling
    declared: dict[Role, ReplicaBounds | None] = {
        Role.AGGREGATED: autoscaling.aggregated,
        Role.PREFILL: autoscaling.prefill,
        Role.DECODE: autoscaling.decode,
    }
    bounds = {
        role: Bounds(
            (declared[role] or ReplicaBounds()).min_replicas,
            (declared[role] or ReplicaBounds()).max_replicas,
        )
        for role in roles
    }
    return Service(
        replica=replica,
        roles=roles,
        slo=Slo.from_spec(scenario.service.slo),
        bounds=bounds,
        policy=policy_spec(scenario.service, scenario.deployment, catalog),
    )


def fleet_config(
    scenario: Scenario, service: Service, horizon: float, initial: Mapping[Role, int]
) -> FleetConfig:
    return FleetConfig(
        replica=service.replica,
        slo=service.slo,
        disaggregated=service.disaggregated,
        initial_replicas=dict(initial),
        cold_start_s=scenario.cold_start_s,
        prefix_caching=scenario.deployment.prefix_caching,
        scrape_interval_s=scenario.scrape_interval_s,
        scrape_delay_s=scenario.scrape_delay_s,
        metrics_window_s=scenario.metrics_window_s,
        horizon_s=horizon,
    )


# The policy under test, behind the simulator's scaler interface.


@dataclass
class GoodputScaler:
    """The goodput policy (`autoscale.policy.decide`), its history carried between ticks as
    the live controller carries it."""

    spec: PolicySpec
    interval_s: float = GOODPUT_INTERVAL_S
    history: PolicyHistory = field(default_factory=PolicyHistory)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        decision = decide(self.spec, snapshot, current, self.history, now_s=now_s)
        self.history = decision.history
        if any(decision.replicas.get(r) != current.get(r) for r in decision.replicas):
            self.decisions.append((now_s, decision))
        return decision.replicas


# The oracle.


def _windows(
    requests: Sequence[traces.TraceRequest], horizon: float, window_s: float
) -> list[list[traces.TraceRequest]]:
    count = max(1, math.ceil(horizon / window_s))
    windows: list[list[traces.TraceRequest]] = [[] for _ in range(count)]
    for request in requests:
        windows[min(count - 1, int(request.arrival_s // window_s))].append(request)
    return windows


def planner_needs(
    service: Service, windows: Sequence[Sequence[traces.TraceRequest]], window_s: float
) -> list[dict[Role, int]]:
    """Per window, the planner's replicas per role for its rate and mean lengths."""
    slo = capacity.Slo(
        ttft_p95_s=None if service.slo.ttft_p95_ms is None else service.slo.ttft_p95_ms / 1e3,
        tpot_p95_s=None if service.slo.tpot_p95_ms is None else service.slo.tpot_p95_ms / 1e3,
    )
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
        """Per window, the replicas taking requests throughout it in the oracle's run: what
        met the SLO for that window's load."""
        return fleet_per_window(self.run, window_s, len(self.needs))


def fleet_per_window(run: FleetRun, window_s: float, windows: int) -> list[dict[Role, int]]:
    """Per window, the fewest replicas of each role that took requests at any time in it
    (sampled every second)."""
    roles = sorted({life.role for life in run.replicas}, key=lambda r: r.value)
    served: list[dict[Role, int]] = []
    for index in range(windows):
        start = index * window_s
        moments = [start + offset for offset in range(int(window_s))]
        served.append({role: min(run.accepting(role, t) for t in moments) for role in roles})
    return served


def _oracle_run(
    requests: Sequence[traces.TraceRequest],
    config: FleetConfig,
    needs: list[dict[Role, int]],
    window_s: float,
) -> FleetRun:
    scaler = ClairvoyantScaler(needs, window_s, config.cold_start_s)
    first = scaler.desired(0.0, None, {})
    return simulate(requests, replace(config, initial_replicas=dict(first)), scaler)


def clairvoyant_oracle(
    requests: Sequence[traces.TraceRequest],
    service: Service,
    config: FleetConfig,
    window_s: float = DEFAULT_ORACLE_WINDOW_S,
    *,
    max_raise_passes: int = 8,
    max_lower_passes: int = 4,
) -> Oracle:
    """The fewest replicas per window that meet the SLO, found as the module docstring says."""
    horizon = config.horizon_s or max((r.arrival_s for r in requests), default=0.0)
    windows = _windows(requests, horizon, window_s)
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

    run = _oracle_run(requests, config, needs, window_s)
    simulations += 1
    for _ in range(max_raise_passes):
        if not raise_missing(run):
            break
        run = _oracle_run(requests, config, needs, window_s)
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
        trial_run = _oracle_run(requests, config, trial, window_s)
        simulations += 1
        trial_scores = window_scores(trial_run, window_s, len(windows))
        missed = [index for index in lowered if not trial_scores[index].meets(target)]
        for index in missed:
            trial[index][role] += 1
        if missed:
            if len(missed) == len(lowered):
                continue
            trial_run = _oracle_run(requests, config, trial, window_s)
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


# Scoring.


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    attainment: float
    meets_target: bool
    goodput_rps: float
    goodput_per_gpu_hour: float
    gpu_hours: float
    gpu_hours_vs_oracle: float | None
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    reaction_s: float | None
    """Mean, over the load steps, of the time until the role's ready replicas reach the
    oracle's need for the step's window (None: no load step in the run)."""
    direction_changes_per_hour: float
    failed: int
    requests: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "attainment": self.attainment,
            "meetsTarget": self.meets_target,
            "goodputRps": self.goodput_rps,
            "goodputPerGpuHour": self.goodput_per_gpu_hour,
            "gpuHours": self.gpu_hours,
            "gpuHoursVsOracle": self.gpu_hours_vs_oracle,
            "ttftP95Ms": self.ttft_p95_ms,
            "tpotP95Ms": self.tpot_p95_ms,
            "reactionS": self.reaction_s,
            "directionChangesPerHour": self.direction_changes_per_hour,
            "failed": self.failed,
            "requests": self.requests,
        }


def direction_changes(run: FleetRun) -> int:
    """Per role, how often a scaling decision went the other way from the one before."""
    changes = 0
    last: dict[Role, int] = {}
    for decision in run.decisions:
        direction = 1 if decision.after > decision.before else -1
        previous = last.get(decision.role)
        if previous is not None and previous != direction:
            changes += 1
        last[decision.role] = direction
    return changes


def load_steps(needs: Sequence[Mapping[Role, int]], gpus_per_replica: int) -> list[int]:
    """Windows whose planned GPUs (the planner's sizing of their load) grow by
    `LOAD_STEP_GROWTH` or more over the window before."""
    steps = []
    for index in range(1, len(needs)):
        before = sum(needs[index - 1].values()) * gpus_per_replica
        after = sum(needs[index].values()) * gpus_per_replica
        if after > before and after >= before * LOAD_STEP_GROWTH:
            steps.append(index)
    return steps


def reaction_time(
    run: FleetRun, needs: Sequence[Mapping[Role, int]], window_s: float, steps: Iterable[int]
) -> float | None:
    """Mean time from each load step until every role has as many replicas taking requests as
    `needs` says for the step's window (capped at the end of the run)."""
    times: list[float] = []
    for index in steps:
        start = index * window_s
        need = needs[index]
        ready_by = start
        for role, wanted in need.items():
            moments = sorted(
                {start}
                | {
                    life.ready_s
                    for life in run.replicas
                    if life.role is role and life.ready_s is not None and life.ready_s > start
                }
            )
            reached = next(
                (moment for moment in moments if run.accepting(role, moment) >= wanted),
                run.horizon_s,
            )
            ready_by = max(ready_by, reached)
        times.append(ready_by - start)
    return sum(times) / len(times) if times else None


def score(
    policy: str,
    run: FleetRun,
    slo: Slo,
    *,
    oracle_gpu_hours: float | None,
    oracle_served: Sequence[Mapping[Role, int]],
    steps: Sequence[int],
    window_s: float,
) -> PolicyResult:
    records = run.records
    met = sum(1 for r in records if r.outcome is Outcome.MET)
    attainment = met / len(records) if records else 1.0
    gpu_hours = run.gpu_seconds() / 3600
    ttfts = sorted(r.ttft_s for r in records if r.ttft_s is not None)
    tpots = sorted(t for r in records if (t := r.tpot_s) is not None)
    hours = run.horizon_s / 3600
    return PolicyResult(
        policy=policy,
        attainment=attainment,
        meets_target=attainment >= slo.attainment_target,
        goodput_rps=met / run.horizon_s if run.horizon_s > 0 else 0.0,
        goodput_per_gpu_hour=met / gpu_hours if gpu_hours > 0 else 0.0,
        gpu_hours=gpu_hours,
        gpu_hours_vs_oracle=gpu_hours / oracle_gpu_hours if oracle_gpu_hours else None,
        ttft_p95_ms=percentile(ttfts, 95) * 1e3 if ttfts else None,
        tpot_p95_ms=percentile(tpots, 95) * 1e3 if tpots else None,
        reaction_s=reaction_time(run, oracle_served, window_s, steps),
        direction_changes_per_hour=direction_changes(run) / hours if hours > 0 else 0.0,
        failed=sum(1 for r in records if r.outcome is Outcome.FAILED),
        requests=len(records),
    )


# One scenario, every policy.


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    rate: float
    horizon_s: float
    requests: int
    results: list[PolicyResult]
    runs: dict[str, FleetRun]
    oracle: Oracle
    gpus_per_replica: int
    cpu_s: dict[str, float]
    goodput_decisions: list[tuple[float, str, str]] = field(default_factory=list)
    """The goodput policy's changes: time, reason and message."""


def _static_counts(needs: Sequence[Mapping[Role, int]], roles: Sequence[Role], *, peak: bool
                   ) -> dict[Role, int]:  # fmt: skip
    if peak:
        return {role: max(need[role] for need in needs) for role in roles}
    return {role: math.ceil(sum(need[role] for need in needs) / len(needs) - 1e-9)
            for role in roles}  # fmt: skip


def build_scaler(
    policy: str,
    service: Service,
    *,
    oracle: Oracle,
    window_s: float,
    cold_start_s: float,
    mix: tuple[int, int],
) -> tuple[Scaler, dict[Role, int]]:
    """The scaler of a policy and the replicas it starts with (warm at time 0): the oracle's
    first fleet for every policy that scales, so all start equally ready for the load. The
    static fleets are the largest and the mean (rounded up) of the oracle's served fleets."""
    clairvoyant = ClairvoyantScaler(oracle.needs, window_s, cold_start_s)
    first = dict(clairvoyant.desired(0.0, None, {}))
    slo = service.slo
    ttft = None if slo.ttft_p95_ms is None else slo.ttft_p95_ms / 1e3
    tpot = None if slo.tpot_p95_ms is None else slo.tpot_p95_ms / 1e3
    if policy == "goodput":
        return GoodputScaler(service.policy), first
    if policy in ("static-peak", "static-mean"):
        served = oracle.served(window_s)
        counts = _static_counts(served, service.roles, peak=policy == "static-peak")
        return StaticScaler(counts), counts
    if policy == "hpa":
        capacities = {
            role: role_capacity(
                service.replica,
                role,
                input_tokens=mix[0],
                output_tokens=mix[1],
                ttft_s=ttft,
                tpot_s=tpot,
            )
            for role in service.roles
        }
        return HpaScaler(capacities, service.bounds), first
    if policy == "keda":
        return QueueScaler(service.roles, service.bounds), first
    if policy == "planner":
        return ThroughputPlanner(
            service.replica, service.roles, service.bounds, ttft, tpot, mix
        ), first
    if policy == "oracle":
        return clairvoyant, first
    raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")


def run_scenario(
    scenario: Scenario,
    traces_dir: Path | str,
    policies: Sequence[str] = POLICIES,
    *,
    rate: float | None = None,
    cpu_clock: Callable[[], float] | None = None,
) -> ScenarioResult:
    """Every policy on the scenario's load; `cpu_clock` (e.g. `time.process_time`) times each."""
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    rate = scenario.rate if rate is None else rate
    requests = scenario_requests(scenario, traces_dir, rate=rate)
    horizon = horizon_s(scenario, requests, rate)
    service = service_of(scenario)
    window_s = scenario.oracle_window_s
    base = fleet_config(scenario, service, horizon, {})
    clock = cpu_clock or (lambda: 0.0)
    started = clock()
    oracle = clairvoyant_oracle(requests, service, base, window_s)
    cpu = {"oracle": clock() - started}
    mix = (
        max(1, round(sum(r.input_tokens for r in requests) / max(1, len(requests)))),
        max(1, round(sum(r.output_tokens for r in requests) / max(1, len(requests)))),
    )
    oracle_gpu_hours = oracle.run.gpu_seconds() / 3600
    served = oracle.served(window_s)
    steps = load_steps(oracle.planned, service.replica.gpus)
    runs: dict[str, FleetRun] = {}
    results: list[PolicyResult] = []
    goodput_decisions: list[tuple[float, str, str]] = []
    for policy in policies:
        if policy == "oracle":
            run = oracle.run
        else:
            scaler, initial = build_scaler(
                policy,
                service,
                oracle=oracle,
                window_s=window_s,
                cold_start_s=scenario.cold_start_s,
                mix=mix,
            )
            started = clock()
            run = simulate(requests, replace(base, initial_replicas=initial), scaler)
            cpu[policy] = clock() - started
            if isinstance(scaler, GoodputScaler):
                goodput_decisions = [
                    (at, decision.reason.value, decision.message)
                    for at, decision in scaler.decisions
                ]
        runs[policy] = run
        results.append(
            score(
                policy,
                run,
                service.slo,
                oracle_gpu_hours=oracle_gpu_hours,
                oracle_served=served,
                steps=steps,
                window_s=window_s,
            )
        )
    return ScenarioResult(
        scenario=scenario,
        rate=rate,
        horizon_s=horizon,
        requests=len(requests),
        results=results,
        runs=runs,
        oracle=oracle,
        gpus_per_replica=service.replica.gpus,
        cpu_s=cpu,
        goodput_decisions=goodput_decisions,
    )


# Output.


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_table(result: ScenarioResult) -> str:
    scenario = result.scenario
    slo = scenario.service.slo
    load = (
        f"{scenario.trace} x{result.rate:g}"
        if scenario.trace
        else f"{scenario.pattern} {result.rate:g} req/s"
    )
    lines = [
        f"### {scenario.name}",
        "",
        f"{scenario.description.strip()}".strip(),
        "",
        f"Load: {load}, {result.requests} requests over {result.horizon_s:,.0f} s; SLO p95 TTFT "
        f"{_fmt(slo.ttft_p95_ms, 0)} ms, TPOT {_fmt(slo.tpot_p95_ms, 0)} ms, attainment target "
        f"{slo.attainment_target:g}; cold start {scenario.cold_start_s:g} s; "
        f"{result.gpus_per_replica} GPU(s) per replica.",
        "",
        "| policy | attainment | meets target | goodput (req/s) | goodput / GPU-h | GPU-hours | "
        "GPU-h / oracle | p95 TTFT (ms) | p95 TPOT (ms) | reaction (s) | direction changes / h |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.results:
        lines.append(
            f"| {r.policy} | {r.attainment:.4f} | {'yes' if r.meets_target else 'no'} | "
            f"{r.goodput_rps:.2f} | {r.goodput_per_gpu_hour:,.0f} | {r.gpu_hours:.2f} | "
            f"{_fmt(r.gpu_hours_vs_oracle, 2)} | {_fmt(r.ttft_p95_ms, 0)} | "
            f"{_fmt(r.tpot_p95_ms, 1)} | {_fmt(r.reaction_s, 0)} | "
            f"{r.direction_changes_per_hour:.1f} |"
        )
    return "\n".join(lines) + "\n"


def result_json(result: ScenarioResult) -> dict[str, Any]:
    scenario = result.scenario
    return {
        "scenario": scenario.name,
        "trace": scenario.trace,
        "pattern": scenario.pattern,
        "rate": result.rate,
        "horizonS": result.horizon_s,
        "requests": result.requests,
        "slo": {
            "ttftP95Ms": scenario.service.slo.ttft_p95_ms,
            "tpotP95Ms": scenario.service.slo.tpot_p95_ms,
            "attainmentTarget": scenario.service.slo.attainment_target,
        },
        "coldStartS": scenario.cold_start_s,
        "gpusPerReplica": result.gpus_per_replica,
        "oracleWindowS": scenario.oracle_window_s,
        "plannedPerWindow": _per_window(result.oracle.planned),
        "oracleSchedule": _per_window(result.oracle.needs),
        "oracleServedPerWindow": _per_window(result.oracle.served(scenario.oracle_window_s)),
        "loadSteps": [
            i * scenario.oracle_window_s
            for i in load_steps(result.oracle.planned, result.gpus_per_replica)
        ],
        "oracleSimulations": result.oracle.simulations,
        "cpuSeconds": result.cpu_s,
        "policies": [r.to_dict() for r in result.results],
        "scaling": {
            policy: [[d.time_s, d.role.value, d.before, d.after] for d in run.decisions]
            for policy, run in result.runs.items()
        },
        "goodputDecisions": [
            {"atS": at, "reason": reason, "message": message}
            for at, reason, message in result.goodput_decisions
        ],
    }


def _per_window(needs: Sequence[Mapping[Role, int]]) -> list[dict[str, int]]:
    return [{role.value: count for role, count in need.items()} for need in needs]


def write_results(result: ScenarioResult, out_dir: Path | str, *, plots: bool = True
                  ) -> list[Path]:  # fmt: skip
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = result.scenario.name
    markdown = out / f"{name}.md"
    markdown.write_text(markdown_table(result))
    data = out / f"{name}.json"
    data.write_text(json.dumps(result_json(result), indent=2, allow_nan=False) + "\n")
    written = [markdown, data]
    if plots:
        written.extend(plot_scenario(result, out))
    return written


def _series(run: FleetRun, role: Role, end: float, step: float) -> tuple[list[float], list[int]]:
    times = [i * step for i in range(int(end // step) + 1)]
    return times, [run.held(role, t) for t in times]


def plot_scenario(result: ScenarioResult, out_dir: Path) -> list[Path]:
    """`<name>_replicas.png` (load, and replicas held per role by policy) and
    `<name>_attainment.png` (attainment of each window's arrivals, by policy)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    name = result.scenario.name
    window_s = result.scenario.oracle_window_s
    roles = list(next(iter(result.oracle.needs)).keys())
    any_run = next(iter(result.runs.values()))
    windows = max(1, math.ceil(result.horizon_s / window_s))
    arrivals = [0] * windows
    for record in any_run.records:
        arrivals[min(windows - 1, int(record.arrival_s // window_s))] += 1
    centres = [(i + 0.5) * window_s for i in range(windows)]

    figure, axes = pyplot.subplots(
        1 + len(roles), 1, figsize=(11, 3 + 2.6 * len(roles)), sharex=True
    )
    fine_s = max(10.0, result.horizon_s / 300)
    fine = [0] * (int(result.horizon_s // fine_s) + 1)
    for record in any_run.records:
        fine[min(len(fine) - 1, int(record.arrival_s // fine_s))] += 1
    axes[0].plot([(i + 0.5) * fine_s for i in range(len(fine))], [a / fine_s for a in fine],
                 color="grey", linewidth=0.8, label=f"per {fine_s:g} s")  # fmt: skip
    axes[0].plot(centres, [a / window_s for a in arrivals], color="black",
                 label=f"per {window_s:g} s")  # fmt: skip
    axes[0].legend(loc="upper left", fontsize="small")
    axes[0].set_ylabel("arrivals (req/s)")
    axes[0].set_title(f"{name}: load and replicas per role")
    axes[0].grid(alpha=0.3)
    step = max(5.0, result.horizon_s / 600)
    for axis, role in zip(axes[1:], roles, strict=True):
        for index, (policy, run) in enumerate(result.runs.items()):
            times, held = _series(run, role, result.horizon_s, step)
            style = "--" if policy == "oracle" else "-"
            axis.step(times, held, where="post", linestyle=style, label=policy,
                      color=f"C{index}", linewidth=1.2)  # fmt: skip
        axis.set_ylabel(f"{role.value} replicas held")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize="small", ncol=4)
    axes[-1].set_xlabel("time (s)")
    figure.tight_layout()
    replicas_path = out_dir / f"{name}_replicas.png"
    figure.savefig(replicas_path, dpi=100)
    pyplot.close(figure)

    figure, axis = pyplot.subplots(figsize=(11, 4.5))
    for index, (policy, run) in enumerate(result.runs.items()):
        scores = window_scores(run, window_s, windows)
        values = [s.met / s.requests if s.requests else math.nan for s in scores]
        style = "--" if policy == "oracle" else "-"
        axis.plot(centres, values, linestyle=style, label=policy, color=f"C{index}")
    target = result.scenario.service.slo.attainment_target
    axis.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
    axis.set_ylim(max(0.0, min(0.8, target - 0.2)), 1.005)
    axis.set_xlabel("arrival time (s)")
    axis.set_ylabel(f"attainment per {window_s:g} s window")
    axis.set_title(f"{name}: SLO attainment over time")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower left", fontsize="small", ncol=4)
    figure.tight_layout()
    attainment_path = out_dir / f"{name}_attainment.png"
    figure.savefig(attainment_path, dpi=100)
    pyplot.close(figure)
    return [replicas_path, attainment_path]
