"""`inferfleet bench autoscale`: scaling policies compared in the fleet simulator.

A scenario (YAML) names a service (a ModelDeployment and an InferenceService), a load (a trace
in ../shared/traces replayed at a rate multiplier, or a synthetic pattern), a seed and the
fleet's cold start. Every policy replays the same load open-loop through the same simulated
fleet (`inferfleet.sim.fleet`) and is scored on SLO attainment, goodput, goodput per GPU-hour,
GPU-hours (and their ratio to the two references: the clairvoyant schedule of
`bench.clairvoyant` and the fluid lower bound of `bench.references`), p95 TTFT and TPOT,
reaction time to load steps and direction changes per hour.

Scenarios are read by `bench.scenario`. Pure apart from `write_results` and `plot_scenario`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.baselines import (
    ClairvoyantScaler,
    HpaScaler,
    QueueScaler,
    StaticScaler,
    ThroughputPlanner,
    role_capacity,
)
from inferfleet.autoscale.policy import Decision, PolicyHistory, PolicySpec, decide
from inferfleet.autoscale.snapshot import MetricsSnapshot
from inferfleet.bench.clairvoyant import Clairvoyant, clairvoyant_schedule, without_foresight
from inferfleet.bench.reference_report import per_window, references_json, references_line
from inferfleet.bench.references import (
    FluidBound,
    Oracle,
    Service,
    StaticBest,
    fluid_bound,
    per_window_oracle,
    static_best,
    static_counts,
    window_scores,
)
from inferfleet.bench.report import percentile
from inferfleet.bench.scenario import (
    Scenario,
    fleet_config,
    horizon_s,
    scenario_requests,
    service_of,
)
from inferfleet.sim.fleet import Scaler, simulate
from inferfleet.sim.run import FleetRun
from inferfleet.slo import Outcome, Slo

BASELINES = ("static-best", "static-peak", "static-mean", "hpa", "keda", "planner")
"""The policies the goodput policy has to beat (the clairvoyant schedule is a reference)."""
FLOOR = "goodput-floor"
"""The goodput policy held at one replica per pool: run only where the service scales to zero,
as what scaling to zero saves against."""
POLICIES = ("goodput", FLOOR, *BASELINES, "clairvoyant")
POLICY_ALIASES = {"oracle": "clairvoyant"}
"""Names the command line still takes for a policy."""
GOODPUT_INTERVAL_S = 15.0
LOAD_STEP_GROWTH = 1.25
"""A window whose planned GPUs exceed the previous window's by this factor is a load step."""


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


# Scoring.


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    attainment: float
    meets_target: bool
    goodput_rps: float
    goodput_per_gpu_hour: float
    gpu_hours: float
    gpu_hours_vs_clairvoyant: float | None
    gpu_hours_vs_fluid_bound: float | None
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    reaction_s: float | None
    """Mean, over the load steps, of the time until the role's ready replicas reach the
    clairvoyant schedule's served fleet for the step's window (None: no load step in the
    run)."""
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
            "gpuHoursVsClairvoyant": self.gpu_hours_vs_clairvoyant,
            "gpuHoursVsFluidBound": self.gpu_hours_vs_fluid_bound,
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
    clairvoyant_gpu_hours: float | None,
    fluid_gpu_hours: float | None,
    served: Sequence[Mapping[Role, int]],
    steps: Sequence[int],
    window_s: float,
) -> PolicyResult:
    records = run.records
    met = sum(1 for r in records if r.outcome is Outcome.MET)
    share_met = met / len(records) if records else 1.0
    gpu_hours = run.gpu_seconds() / 3600
    ttfts = sorted(r.ttft_s for r in records if r.ttft_s is not None)
    tpots = sorted(t for r in records if (t := r.tpot_s) is not None)
    hours = run.horizon_s / 3600
    return PolicyResult(
        policy=policy,
        attainment=share_met,
        meets_target=share_met >= slo.attainment_target,
        goodput_rps=met / run.horizon_s if run.horizon_s > 0 else 0.0,
        goodput_per_gpu_hour=met / gpu_hours if gpu_hours > 0 else 0.0,
        gpu_hours=gpu_hours,
        gpu_hours_vs_clairvoyant=gpu_hours / clairvoyant_gpu_hours
        if clairvoyant_gpu_hours
        else None,
        gpu_hours_vs_fluid_bound=gpu_hours / fluid_gpu_hours if fluid_gpu_hours else None,
        ttft_p95_ms=percentile(ttfts, 95) * 1e3 if ttfts else None,
        tpot_p95_ms=percentile(tpots, 95) * 1e3 if tpots else None,
        reaction_s=reaction_time(run, served, window_s, steps),
        direction_changes_per_hour=direction_changes(run) / hours if hours > 0 else 0.0,
        failed=sum(1 for r in records if r.outcome is Outcome.FAILED),
        requests=len(records),
    )


@dataclass(frozen=True)
class Wakes:
    """The requests that arrived while the entry pool had no replica serving (held by the
    router until one did), and their TTFT, the wait included."""

    wakes: int
    """Times the pools were ordered back from zero."""
    requests: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_max_s: float | None
    failed: int

    def to_dict(self) -> dict[str, Any]:
        def ms(value: float | None) -> float | None:
            return None if value is None else value * 1e3

        return {
            "wakes": self.wakes,
            "requests": self.requests,
            "ttftP50Ms": ms(self.ttft_p50_s),
            "ttftP95Ms": ms(self.ttft_p95_s),
            "ttftMaxMs": ms(self.ttft_max_s),
            "failed": self.failed,
        }


def wakes(run: FleetRun, entry_role: Role) -> Wakes:
    held = [r for r in run.records if run.accepting(entry_role, r.arrival_s) == 0]
    ttfts = sorted(t for r in held if (t := r.ttft_s) is not None)
    woken = sum(1 for d in run.decisions if d.role is entry_role and d.before == 0 and d.after)
    return Wakes(
        wakes=woken,
        requests=len(held),
        ttft_p50_s=percentile(ttfts, 50) if ttfts else None,
        ttft_p95_s=percentile(ttfts, 95) if ttfts else None,
        ttft_max_s=ttfts[-1] if ttfts else None,
        failed=sum(1 for r in held if r.outcome is Outcome.FAILED),
    )


def cheapest_baseline(results: Sequence[PolicyResult]) -> PolicyResult | None:
    """The baseline with the fewest GPU-hours among those that meet the target."""
    meeting = [r for r in results if r.policy in BASELINES and r.meets_target]
    return min(meeting, key=lambda r: r.gpu_hours, default=None)


# One scenario, every policy.


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    rate: float
    horizon_s: float
    requests: int
    results: list[PolicyResult]
    runs: dict[str, FleetRun]
    clairvoyant: Clairvoyant
    fluid: FluidBound
    gpus_per_replica: int
    cpu_s: dict[str, float]
    static_best: StaticBest | None = None
    goodput_decisions: list[tuple[float, str, str]] = field(default_factory=list)
    """The goodput policy's changes: time, reason and message."""
    wake: Wakes | None = None
    """Where the service scales to zero: the goodput policy's wakes."""

    @property
    def oracle(self) -> Oracle:
        return self.clairvoyant.oracle


def build_scaler(
    policy: str,
    service: Service,
    *,
    clairvoyant: Clairvoyant,
    window_s: float,
    cold_start_s: float,
    mix: tuple[int, int],
) -> tuple[Scaler, dict[Role, int]]:
    """The scaler of a policy and the replicas it starts with (warm at time 0): the clairvoyant
    schedule's first fleet for every policy that scales, so all start equally ready for the
    load. The static fleets are the largest and the mean (rounded up) of the fleets that
    served each window in the clairvoyant schedule's run (static-best is searched by
    `run_scenario`)."""
    schedule = ClairvoyantScaler(clairvoyant.needs, window_s, cold_start_s)
    first = dict(schedule.desired(0.0, None, {}))
    slo = service.slo
    ttft = None if slo.ttft_p95_ms is None else slo.ttft_p95_ms / 1e3
    tpot = None if slo.tpot_p95_ms is None else slo.tpot_p95_ms / 1e3
    if policy == "goodput":
        return GoodputScaler(service.policy), first
    if policy == FLOOR:
        return GoodputScaler(service.policy.awake()), first
    if policy in ("static-peak", "static-mean"):
        served = clairvoyant.served(window_s)
        counts = static_counts(served, service.roles, peak=policy == "static-peak")
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
    if policy == "clairvoyant":
        return schedule, first
    raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")


def policy_names(policies: Iterable[str]) -> list[str]:
    """The policies asked for, aliases resolved, each once, in the order asked."""
    names: list[str] = []
    for policy in policies:
        name = POLICY_ALIASES.get(policy, policy)
        if name not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if name not in names:
            names.append(name)
    return names


def run_scenario(
    scenario: Scenario,
    traces_dir: Path | str,
    policies: Sequence[str] = POLICIES,
    *,
    rate: float | None = None,
    cpu_clock: Callable[[], float] | None = None,
) -> ScenarioResult:
    """Every policy on the scenario's load; `cpu_clock` (e.g. `time.process_time`) times each."""
    names = policy_names(policies)
    rate = scenario.rate if rate is None else rate
    requests = scenario_requests(scenario, traces_dir, rate=rate)
    horizon = horizon_s(scenario, requests, rate)
    service = service_of(scenario)
    window_s = scenario.oracle_window_s
    base = fleet_config(scenario, service, horizon, {})
    clock = cpu_clock or (lambda: 0.0)
    fluid = fluid_bound(
        requests, service, horizon, window_s, prefix_caching=scenario.deployment.prefix_caching
    )
    started = clock()
    oracle = per_window_oracle(requests, service, base, window_s)
    cpu = {"oracle": clock() - started}
    # The static fleet to beat, and a start of the clairvoyant search: from the oracle's peak,
    # down to the fluid bound's mean GPUs (no fewer can do the work within the load's duration).
    started = clock()
    peak = static_counts(oracle.needs, service.roles, peak=True)
    best = static_best(requests, service, base, peak, fluid.static_floor(horizon))
    cpu["static-best"] = clock() - started
    started = clock()
    clairvoyant = without_foresight(
        requests,
        base,
        clairvoyant_schedule(requests, service, base, oracle, window_s, static=best),
        window_s,
        target=service.slo.attainment_target,
    )
    cpu["clairvoyant"] = clock() - started
    mix = (
        max(1, round(sum(r.input_tokens for r in requests) / max(1, len(requests)))),
        max(1, round(sum(r.output_tokens for r in requests) / max(1, len(requests)))),
    )
    clairvoyant_gpu_hours = clairvoyant.run.gpu_seconds() / 3600
    served = clairvoyant.served(window_s)
    steps = load_steps(oracle.planned, service.replica.gpus)
    runs: dict[str, FleetRun] = {}
    results: list[PolicyResult] = []
    goodput_decisions: list[tuple[float, str, str]] = []
    wake: Wakes | None = None
    for policy in names:
        if policy == FLOOR and not service.policy.scales_to_zero:
            continue
        started = clock()
        if policy == "clairvoyant":
            run = clairvoyant.run
        elif policy == "static-best":
            run = best.run
        else:
            scaler, initial = build_scaler(
                policy,
                service,
                clairvoyant=clairvoyant,
                window_s=window_s,
                cold_start_s=base.slowest_cold_start_s,
                mix=mix,
            )
            run = simulate(requests, replace(base, initial_replicas=initial), scaler)
            if isinstance(scaler, GoodputScaler) and policy == "goodput":
                goodput_decisions = [
                    (at, decision.reason.value, decision.message)
                    for at, decision in scaler.decisions
                ]
                if service.policy.scales_to_zero:
                    wake = wakes(run, base.entry_role)
        if policy not in ("clairvoyant", "static-best"):
            cpu[policy] = clock() - started
        runs[policy] = run
        results.append(
            score(
                policy,
                run,
                service.slo,
                clairvoyant_gpu_hours=clairvoyant_gpu_hours,
                fluid_gpu_hours=fluid.gpu_hours,
                served=served,
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
        clairvoyant=clairvoyant,
        fluid=fluid,
        gpus_per_replica=service.replica.gpus,
        cpu_s=cpu,
        static_best=best,
        goodput_decisions=goodput_decisions,
        wake=wake,
    )


# Output.


def _cold_starts(scenario: Scenario) -> str:
    """The fleet's cold start in words, and what the policy is told where that differs."""
    roles = scenario.role_cold_start_s
    if roles:
        words = ", ".join(f"{role.value} {seconds:g} s" for role, seconds in sorted(roles.items()))
        words += f", else {scenario.cold_start_s:g} s"
    else:
        words = f"{scenario.cold_start_s:g} s"
    if scenario.weight_source is not None:
        return f"{words}, estimated for weights from {scenario.weight_source.value}"
    told = scenario.service.autoscaling.cold_start_seconds
    if told is None:
        words += " (the service's coldStartSeconds: unset, its estimate planned for)"
    elif roles or told != scenario.cold_start_s:
        words += f" (the service's coldStartSeconds: {told:g} s)"
    return words


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
        f"{slo.attainment_target:g}; cold start {_cold_starts(scenario)}; "
        f"{result.gpus_per_replica} GPU(s) per replica.",
        "",
        "| policy | attainment | meets target | goodput (req/s) | goodput / GPU-h | GPU-hours | "
        "GPU-h / clairvoyant | GPU-h / fluid bound | p95 TTFT (ms) | p95 TPOT (ms) | "
        "reaction (s) | direction changes / h |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.results:
        lines.append(
            f"| {r.policy} | {r.attainment:.4f} | {'yes' if r.meets_target else 'no'} | "
            f"{r.goodput_rps:.2f} | {r.goodput_per_gpu_hour:,.0f} | {r.gpu_hours:.2f} | "
            f"{_fmt(r.gpu_hours_vs_clairvoyant, 2)} | {_fmt(r.gpu_hours_vs_fluid_bound, 2)} | "
            f"{_fmt(r.ttft_p95_ms, 0)} | "
            f"{_fmt(r.tpot_p95_ms, 1)} | {_fmt(r.reaction_s, 0)} | "
            f"{r.direction_changes_per_hour:.1f} |"
        )
    lines.extend(["", *summary_lines(result)])
    return "\n".join(lines) + "\n"


def summary_lines(result: ScenarioResult) -> list[str]:
    """The references, and the goodput policy against the cheapest baseline that meets the
    target."""
    lines = [references_line(result.fluid, result.clairvoyant), ""]
    cheapest = cheapest_baseline(result.results)
    goodput = next((r for r in result.results if r.policy == "goodput"), None)
    if cheapest is None:
        lines.append("Cheapest baseline that meets the target: none of those run.")
    elif goodput is None:
        lines.append(
            f"Cheapest baseline that meets the target: {cheapest.policy}, "
            f"{cheapest.gpu_hours:.2f} GPU-h."
        )
    else:
        lines.append(
            f"Cheapest baseline that meets the target: {cheapest.policy}, "
            f"{cheapest.gpu_hours:.2f} GPU-h; goodput uses "
            f"{goodput.gpu_hours / cheapest.gpu_hours:.2f}x its GPU-hours"
            f"{'' if goodput.meets_target else ' and misses the target'}."
        )
    floor = next((r for r in result.results if r.policy == FLOOR), None)
    if goodput is not None and floor is not None:
        lines += [
            "",
            f"Scaled to zero, goodput uses {goodput.gpu_hours / floor.gpu_hours:.2f}x the "
            f"GPU-hours of the same policy held at one replica per pool ({floor.gpu_hours:.2f} "
            f"GPU-h, attainment {floor.attainment:.4f}).",
        ]
    wake = result.wake
    if wake is not None:
        lines += [
            "",
            f"Wakes: {wake.wakes}; {wake.requests} requests arrived with no replica serving and "
            f"waited for one: TTFT p50 {_fmt(wake.ttft_p50_s, 1)} s, p95 "
            f"{_fmt(wake.ttft_p95_s, 1)} s, max {_fmt(wake.ttft_max_s, 1)} s, the wait "
            f"included; {wake.failed} failed.",
        ]
    return lines


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
        "coldStartByRoleS": {r.value: t for r, t in sorted(scenario.role_cold_start_s.items())},
        "weightSource": None if scenario.weight_source is None else scenario.weight_source.value,
        "gpusPerReplica": result.gpus_per_replica,
        "oracleWindowS": scenario.oracle_window_s,
        "plannedPerWindow": per_window(result.oracle.planned),
        **references_json(
            result.fluid, result.clairvoyant, result.static_best, scenario.oracle_window_s
        ),
        "loadSteps": [
            i * scenario.oracle_window_s
            for i in load_steps(result.oracle.planned, result.gpus_per_replica)
        ],
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
        "wake": None if result.wake is None else result.wake.to_dict(),
    }


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
    roles = list(next(iter(result.clairvoyant.needs)).keys())
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
    plotted = dict(result.runs)
    plotted.setdefault("clairvoyant", result.clairvoyant.run)
    fluid = result.fluid.gpus()
    for axis, role in zip(axes[1:], roles, strict=True):
        for index, (policy, run) in enumerate(plotted.items()):
            times, held = _series(run, role, result.horizon_s, step)
            style = "--" if policy == "clairvoyant" else "-"
            axis.step(times, held, where="post", linestyle=style, label=policy,
                      color=f"C{index}", linewidth=1.2)  # fmt: skip
        bound = [w[role] / result.gpus_per_replica for w in fluid]
        axis.step([i * window_s for i in range(windows)] + [result.horizon_s], bound + bound[-1:],
                  where="post", linestyle=":", color="black", label="fluid bound")  # fmt: skip
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
        style = "--" if policy == "clairvoyant" else "-"
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
