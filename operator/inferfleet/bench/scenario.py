"""Autoscaling scenarios: a YAML file naming a service (a ModelDeployment and an
InferenceService), a load (a trace replayed at a rate multiplier, or a synthetic pattern), a seed
and how long the simulated fleet's replicas take to serve; the load's requests, the service's
planning view and the simulated fleet's configuration.

Pure apart from `load_scenario`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.inference_service import InferenceServiceSpec, ReplicaBounds
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role, TopologyMode
from inferfleet.api.model_spec import WeightSource
from inferfleet.autoscale.baselines import (
    Bounds,
)
from inferfleet.autoscale.policy import PolicySpec, policy_spec
from inferfleet.bench import traces
from inferfleet.bench.references import (
    DEFAULT_ORACLE_WINDOW_S,
    Service,
)
from inferfleet.engines import roles_of
from inferfleet.planning.coldstart import estimate_cold_start
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.fleet import FleetConfig
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Slo


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
    """How long the simulated fleet's replicas take to serve (the service's own
    `coldStartSeconds` is what the policy is told)."""
    role_cold_start_s: Mapping[Role, float] = field(default_factory=dict)
    """Per role, where its replicas start faster or slower than `cold_start_s`."""
    weight_source: WeightSource | None = None
    """Where the fleet's weights come from, where `cold_start_s` is estimated from it
    (`with_weight_source`); None: `cold_start_s` is given."""
    scrape_interval_s: float = 15.0
    scrape_delay_s: float = 0.0
    metrics_window_s: float = 60.0
    oracle_window_s: float = DEFAULT_ORACLE_WINDOW_S
    pattern_options: Mapping[str, Any] = field(default_factory=dict)
    """Further options of `traces.synthetic` (rate_after, burst_rate, switch_s...)."""

    def __post_init__(self) -> None:
        roles = roles_of(self.deployment)
        stray = sorted(role.value for role in self.role_cold_start_s if role not in roles)
        if stray:
            raise ScenarioError(
                f"cold start given for {', '.join(stray)}: not a role of the deployment "
                f"({', '.join(role.value for role in roles)})"
            )


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
    "coldStartByRoleS": "role_cold_start_s",
    "weightSource": "weight_source",
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
    if "role_cold_start_s" in values:
        values["role_cold_start_s"] = _role_seconds(values["role_cold_start_s"], source)
    weights = values.pop("weight_source", None)
    if weights is not None and ({"cold_start_s", "role_cold_start_s"} & set(values)):
        raise ScenarioError(f"{source}: give weightSource or a cold start, not both")
    scenario = Scenario(deployment=deployment, service=service, **values)
    if weights is None:
        return scenario
    try:
        return with_weight_source(scenario, WeightSource(str(weights)))
    except ValueError:
        known = ", ".join(s.value for s in WeightSource)
        raise ScenarioError(f"{source}: weightSource {weights!r} is not one of {known}") from None


def _role_seconds(raw: object, source: str) -> dict[Role, float]:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{source}: coldStartByRoleS must map roles to seconds")
    try:
        seconds = {Role(str(role)): float(value) for role, value in raw.items()}
    except (ValueError, TypeError) as error:
        raise ScenarioError(f"{source}: coldStartByRoleS: {error}") from None
    if any(not 0 <= value < math.inf for value in seconds.values()):
        raise ScenarioError(f"{source}: coldStartByRoleS: seconds must be finite and >= 0")
    return seconds


def with_cold_start(scenario: Scenario, text: str) -> Scenario:
    """The scenario with its fleet's replicas starting as `text` says: `SECONDS` for every
    role, or `ROLE=SECONDS[,ROLE=SECONDS]` for some (the others as the scenario says). What
    the policy is told (the service's `coldStartSeconds`) is unchanged."""
    try:
        if "=" not in text:
            every = float(text)
            if not 0 <= every < math.inf:
                raise ValueError(text)
            return replace(scenario, cold_start_s=every, role_cold_start_s={})
        pairs = dict(item.split("=", 1) for item in text.split(","))
    except ValueError:
        raise ScenarioError(
            f"--cold-start: {text!r} is neither SECONDS nor ROLE=SECONDS[,ROLE=SECONDS]"
        ) from None
    roles = _role_seconds(pairs, "--cold-start")
    return replace(scenario, role_cold_start_s={**scenario.role_cold_start_s, **roles})


def with_weight_source(scenario: Scenario, source: WeightSource) -> Scenario:
    """The scenario with its fleet's weights read from `source`: every replica starts in the
    cold start estimated for it (`planning.coldstart`), and the service configures none, so the
    policy plans with that estimate as it would live."""
    replica = ReplicaConfig.from_spec(scenario.deployment, GpuCatalog.builtin())
    estimate = estimate_cold_start(replica, source, scenario.deployment.engine.name)
    autoscaling = scenario.service.autoscaling.model_copy(update={"cold_start_seconds": None})
    return replace(
        scenario,
        cold_start_s=round(estimate.seconds, 1),
        role_cold_start_s={},
        weight_source=source,
        service=scenario.service.model_copy(update={"autoscaling": autoscaling}),
    )


def load_scenario(path: Path | str) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read: {error.strerror}") from None
    return parse_scenario(text, str(path))


def scenario_requests(
    scenario: Scenario, traces_dir: Path | str, *, rate: float | None = None
) -> list[TraceRequest]:
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


def horizon_s(scenario: Scenario, requests: Sequence[TraceRequest], rate: float) -> float:
    """How long the load lasts, in simulated seconds."""
    if scenario.trace is not None and scenario.duration_s is not None:
        return scenario.duration_s / rate
    if scenario.trace is None:
        return scenario.duration_s or 3600.0
    return max((r.arrival_s for r in requests), default=0.0)


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
        policy=_told_weight_source(
            policy_spec(scenario.service, scenario.deployment, catalog), scenario
        ),
    )


def _told_weight_source(policy: PolicySpec, scenario: Scenario) -> PolicySpec:
    """The policy told the cold start estimated for the scenario's weight source, not for its
    deployment's `model.source` (which says nothing of a node-local copy)."""
    if scenario.weight_source is None or not policy.cold_start_estimated:
        return policy
    return replace(policy, cold_start_s=scenario.cold_start_s)


def fleet_config(
    scenario: Scenario, service: Service, horizon: float, initial: Mapping[Role, int]
) -> FleetConfig:
    return FleetConfig(
        replica=service.replica,
        slo=service.slo,
        disaggregated=service.disaggregated,
        initial_replicas=dict(initial),
        cold_start_s=scenario.cold_start_s,
        role_cold_start_s=dict(scenario.role_cold_start_s),
        prefix_caching=scenario.deployment.prefix_caching,
        scrape_interval_s=scenario.scrape_interval_s,
        scrape_delay_s=scenario.scrape_delay_s,
        metrics_window_s=scenario.metrics_window_s,
        horizon_s=horizon,
        wake_timeout_s=float(scenario.service.autoscaling.wake_timeout_seconds)
        if service.policy.scales_to_zero
        else None,
    )
