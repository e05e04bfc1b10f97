"""The live autoscaling loop of an InferenceService: Prometheus -> snapshot -> policy ->
replicas, with the decision, its inputs and its reason in status and Events.

One tick (`tick`), per ModelDeployment the service routes to:
1. read the snapshot the policy takes, with exactly the queries `autoscale.snapshot` documents
   (each with a timeout: a slow Prometheus delays this service's tick only; every service
   ticks on a timer of its own);
2. call the policy with the replicas each role runs now, the SRE pins and the history kept
   in the service's status (so an operator restart forgets nothing);
3. return the replicas as the service's status (`status.replicas`): the ModelDeployment's own
   reconcile reads the decision of the service that owns its autoscaling
   (`autoscale.ownership`) and applies it, so one path writes workloads and pins, the spec and
   the autoscaler never fight. A deployment another service autoscales is left alone, and
   the `Autoscaling` condition says which service owns it.

Prometheus unreachable, its answer malformed (an error, a matrix, a value that is not a
number) or its samples stale: the policy holds the last decision (never going to zero for
want of metrics) and `MetricsAvailable` turns False with the reason; it turns True again when
fresh samples come back.

`tick` reads and decides; the kopf handler writes what it returns. Apart from the queries and
handing its record to the operator's metrics (`settings.metrics`, `autoscale.metrics`) it is a
function of its arguments, so it is tested with a scripted metrics source.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.conditions import condition, find, with_condition
from inferfleet.api.inference_service import (
    AutoscalingPolicy,
    InferenceService,
    InferenceServiceStatus,
)
from inferfleet.api.model_deployment import ModelDeployment, Role
from inferfleet.api.pins import PinLimits, read_pin
from inferfleet.autoscale.advice import FleetReading, advise
from inferfleet.autoscale.diagnosis import diagnose
from inferfleet.autoscale.metrics import OperatorMetrics, RoleRecord, TickRecord
from inferfleet.autoscale.ownership import Claim, autoscaling_owner, claims_of
from inferfleet.autoscale.policy import (
    Decision,
    PolicyHistory,
    PolicySpec,
    Reason,
    decide,
    policy_spec,
)
from inferfleet.autoscale.queries import (
    DeploymentUsage,
    MalformedAnswerError,
    instant_value,
    labelled_values,
    observe,
    render,
    role_queries,
    service_queries,
    snapshot_from_answers,
)
from inferfleet.autoscale.quota import GpuClaim, GpuQuota
from inferfleet.autoscale.scalein import deletion_costs
from inferfleet.autoscale.snapshot import POD_IN_FLIGHT_QUERY, MetricsSnapshot, ServiceMetrics
from inferfleet.autoscale.tenants import TENANT_TOKENS_QUERY, TenantTokens, tenant_tokens
from inferfleet.engines import roles_of
from inferfleet.planning.replica import ReplicaConfig

METRICS_AVAILABLE = "MetricsAvailable"
AUTOSCALING = "Autoscaling"
WAKE_SLOWER_THAN_TIMEOUT = "WakeSlowerThanTimeout"
"""The Autoscaling condition's reason where a service that goes to zero plans a cold start no
shorter than its wake timeout: every request that wakes it would time out."""


@dataclass(frozen=True)
class AutoscalerSettings:
    prometheus_url: str | None = None
    """None: no metrics source, so no service is autoscaled (MetricsAvailable=False)."""
    interval_s: float = 15.0
    window_s: float = 60.0
    """The rate window of every `rate()` the snapshot takes."""
    recent_window_s: float = 30.0
    """The short window of the recent arrival rate (the fast path on a load step): at least
    two of Prometheus's scrape intervals (30 s for the default 15 s)."""
    query_budget_s: float = 5.0
    """Longest a tick waits on Prometheus, all its queries together."""
    metrics: OperatorMetrics | None = field(default=None, compare=False)
    """Where each tick's record goes (`inferfleet run --metrics-port`); None: nowhere."""


class MetricsUnavailableError(RuntimeError):
    """Prometheus could not answer, or answered what the snapshot cannot be read from; the
    message says why and `reason` names the kind (the MetricsAvailable condition's reason)."""

    def __init__(self, message: str, reason: str = "PrometheusUnavailable") -> None:
        super().__init__(message)
        self.reason = reason


# MetricsAvailable reasons besides PrometheusUnavailable: an error status (a query Prometheus
# refused or could not run), and an answer the snapshot cannot be read from.
QUERY_FAILED = "PrometheusQueryFailed"
MALFORMED_ANSWER = "PrometheusAnswerMalformed"


class MetricsSource(Protocol):
    def answers(self, queries: Mapping[str, str]) -> dict[str, float | None]:
        """Each query's single value (None when it returns no series)."""
        ...

    def series(self, name: str, query: str) -> list[tuple[dict[str, str], float]]:
        """Every series the query returns: its labels and its value."""
        ...


class PrometheusSource:
    """Instant queries through prometheus-api-client, one try each, all of them within one
    budget: a tick (this source's life) never waits on Prometheus longer than `budget_s`."""

    def __init__(self, url: str, budget_s: float = 5.0) -> None:
        # No retries inside a tick: the next tick is the retry, and a tick must stay short.
        self.client = PrometheusConnect(url=url, disable_ssl=True, retry=Retry(total=0))
        self.deadline = time.monotonic() + budget_s
        self.budget_s = budget_s

    def answers(self, queries: Mapping[str, str]) -> dict[str, float | None]:
        found: dict[str, float | None] = {}
        for name, query in queries.items():
            result = self._result(name, query)
            try:
                found[name] = instant_value(name, result)
            except MalformedAnswerError as error:
                raise MetricsUnavailableError(
                    f"{error} (query: {query})", MALFORMED_ANSWER
                ) from error
        return found

    def series(self, name: str, query: str) -> list[tuple[dict[str, str], float]]:
        try:
            return labelled_values(name, self._result(name, query))
        except MalformedAnswerError as error:
            raise MetricsUnavailableError(f"{error} (query: {query})", MALFORMED_ANSWER) from error

    def _result(self, name: str, query: str) -> object:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise MetricsUnavailableError(
                f"Prometheus answered too slowly (over {self.budget_s:g} s for a tick)"
            )
        try:
            return self.client.custom_query(query=query, timeout=left)
        # A body that is not JSON, or JSON without `data.result` (an error answered with
        # 200, say): the client indexes the body without checking it.
        except (requests.JSONDecodeError, KeyError, TypeError) as error:
            raise MetricsUnavailableError(
                f"{name}: Prometheus answered without a query result "
                f"({type(error).__name__}: {error})",
                MALFORMED_ANSWER,
            ) from error
        except PrometheusApiClientException as error:  # any HTTP status but 200
            raise MetricsUnavailableError(
                f"{name}: Prometheus answered with an error: {error}", QUERY_FAILED
            ) from error
        except requests.RequestException as error:
            raise MetricsUnavailableError(f"Prometheus did not answer: {error}") from error


@dataclass(frozen=True)
class DeploymentDecision:
    name: str
    decision: Decision
    changed: bool
    """Whether the replicas differ from what the deployment runs now."""


@dataclass(frozen=True)
class TickResult:
    status: dict[str, Any]
    """The InferenceService's status fields to write."""
    deployments: list[DeploymentDecision] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    """(reason, message, warning) to post on the InferenceService."""
    record: TickRecord | None = None
    """What the tick exports as the operator's metrics."""
    gpu_claim: GpuClaim | None = None
    """What the service asks of its namespace's GPU quota (None: no quota on GPUs)."""
    deletion_costs: dict[str, int] = field(default_factory=dict)
    """Per engine pod of a role this tick shrinks, its deletion cost (`autoscale.scalein`):
    set on the pods before the decision is written."""


def current_replicas(
    md: ModelDeployment, decided: Mapping[Role, int] | None = None
) -> dict[Role, int]:
    """What each role is asked to run now: this service's last decision (`decided`), else the
    autoscaler's choice the deployment records, else what status saw of the workloads, else
    the spec."""
    roles = roles_of(md.spec)
    counts: dict[Role, int] = {}
    if md.spec.topology.prefill is not None and Role.PREFILL in roles:
        counts[Role.PREFILL] = md.spec.topology.prefill.replicas
    serving = Role.DECODE if Role.DECODE in roles else Role.AGGREGATED
    counts[serving] = md.spec.replicas
    if md.status is not None:
        counts |= {r.role: r.desired for r in md.status.roles if r.role in roles and r.desired}
        if md.status.autoscaling is not None:
            counts |= {
                r.role: r.replicas for r in md.status.autoscaling.replicas if r.role in roles
            }
    counts |= {role: n for role, n in (decided or {}).items() if role in roles and n >= 0}
    return counts


def _pins(md: ModelDeployment, now: datetime, limits: PinLimits) -> dict[Role, int]:
    """The pin in force, judged as the deployment's reconcile judges it (so a pin it ignores
    is not honoured here either)."""
    annotations = md.metadata.get("annotations")
    pin, _problem = read_pin(
        annotations if isinstance(annotations, dict) else {},
        roles=roles_of(md.spec),
        now=now,
        limits=limits,
    )
    if pin is None or not pin.active(now):
        return {}
    return dict(pin.replicas)


def _history(service: InferenceService, deployment: str) -> PolicyHistory:
    state = (service.status.autoscaler_state if service.status else None) or {}
    stored = state.get(deployment)
    if not isinstance(stored, dict):
        return PolicyHistory()
    try:
        return PolicyHistory.from_wire(stored)
    except (KeyError, TypeError, ValueError):
        return PolicyHistory()  # written by another version: start afresh, do not crash


@dataclass
class _Reading:
    """What a tick has read so far, and the first thing that went wrong."""

    service_answers: dict[str, float | None]
    problem: tuple[str, str] | None
    first_snapshot: MetricsSnapshot | None = None
    tenants: dict[str, TenantTokens] | None = None
    """Tokens served per tenant (services with tenants; None: not read)."""


def _service_reading(
    service: InferenceService, source: MetricsSource | None, settings: AutoscalerSettings
) -> _Reading:
    if source is None:
        return _Reading(
            {}, ("NoMetricsSource", "the operator was started without --prometheus-url")
        )
    name, namespace = str(service.metadata.get("name")), str(service.metadata.get("namespace"))
    try:
        reading = _Reading(
            source.answers(
                service_queries(name, namespace, settings.window_s, settings.recent_window_s)
            ),
            None,
        )
    except MetricsUnavailableError as error:
        return _Reading({}, (error.reason, str(error)))
    if service.spec.tenants:
        query = render(
            TENANT_TOKENS_QUERY, service=name, namespace=namespace, window_s=settings.window_s
        )
        # Usage per tenant is a report, not an input of the decision: without it the tick
        # goes on, and status leaves the breakdown out.
        with contextlib.suppress(MetricsUnavailableError):
            reading.tenants = tenant_tokens(source.series("tenant_tokens", query))
    return reading


def _deletion_costs(
    source: MetricsSource | None,
    namespace: str,
    deployment: str,
    current: Mapping[Role, int],
    decided: Mapping[Role, int],
) -> dict[str, int]:
    """The deletion costs of the pods of the roles a scale-in shrinks; none where Prometheus
    does not say (the ReplicaSet then chooses as it would)."""
    costs: dict[str, int] = {}
    if source is None:
        return costs
    for role in (r for r, n in decided.items() if n < current.get(r, 0)):
        query = render(POD_IN_FLIGHT_QUERY, service="", namespace=namespace,
                       deployment=deployment, role=role)  # fmt: skip
        with contextlib.suppress(MetricsUnavailableError):
            costs |= deletion_costs(source.series("pod_in_flight", query))
    return costs


def _snapshot(
    reading: _Reading,
    source: MetricsSource | None,
    namespace: str,
    deployment: str,
    roles: Sequence[Role],
    *,
    settings: AutoscalerSettings,
    now_s: float,
) -> MetricsSnapshot | None:
    """The deployment's snapshot, or None (and the reading's problem says why)."""
    if reading.problem is not None or source is None:
        return None
    try:
        role_answers = {
            role: source.answers(role_queries(namespace, deployment, role, settings.window_s))
            for role in roles
        }
    except MetricsUnavailableError as error:
        reading.problem = (error.reason, str(error))
        return None
    snapshot = snapshot_from_answers(
        reading.service_answers,
        role_answers,
        taken_at_s=now_s,
        window_s=settings.window_s,
        recent_window_s=settings.recent_window_s,
    )
    if snapshot is None:
        reading.problem = ("NoRouterMetrics", "no router series in Prometheus yet")
    reading.first_snapshot = reading.first_snapshot or snapshot
    return snapshot


def _ownership(
    service: InferenceService,
    deployments: Mapping[str, ModelDeployment],
    claims: Mapping[str, Sequence[Claim]] | None,
) -> tuple[dict[str, ModelDeployment], dict[str, str]]:
    """The deployments this service autoscales, and those another service owns (by name)."""
    name = str(service.metadata.get("name"))
    owned: dict[str, ModelDeployment] = {}
    elsewhere: dict[str, str] = {}
    for deployment, md in deployments.items():
        if not autoscaled_by(service, deployment):
            continue
        recorded = md.status.autoscaling.service if md.status and md.status.autoscaling else None
        owner = (
            autoscaling_owner(recorded, claims.get(deployment, ())) if claims is not None else None
        )
        if owner is None or owner.service == name:
            owned[deployment] = md
        else:
            elsewhere[deployment] = owner.service
    return owned, elsewhere


def _own_decisions(service: InferenceService) -> dict[str, dict[Role, int]]:
    decided: dict[str, dict[Role, int]] = {}
    for entry in service.status.replicas if service.status else []:
        decided.setdefault(entry.deployment, {})[entry.role] = entry.replicas
    return decided


def tick(
    service: InferenceService,
    deployments: Mapping[str, ModelDeployment],
    source: MetricsSource | None,
    *,
    settings: AutoscalerSettings,
    now: datetime,
    claims: Mapping[str, Sequence[Claim]] | None = None,
    catalog: GpuCatalog | None = None,
    gpu_quota: GpuQuota | None = None,
    waiting: int = 0,
) -> TickResult:
    """One autoscaling tick of `service` over the `deployments` it references found in its
    namespace; `claims`: per deployment, every service's claim on it (None: it owns all it
    autoscales); `gpu_quota`: what the namespace's GPU quota leaves it (None: no quota);
    `waiting`: the requests its router pushed that it holds for want of a replica, where that
    is more than Prometheus has scraped yet (`render.wake`)."""
    catalog = catalog or GpuCatalog.builtin()
    name = str(service.metadata.get("name"))
    namespace = str(service.metadata.get("namespace"))
    now_s = now.timestamp()
    owned, elsewhere = _ownership(service, deployments, claims)
    reading = _service_reading(service, source, settings)
    weights = {ref.name: ref.weight for ref in service.spec.deployments}
    total_weight = sum(w for n, w in weights.items() if n in deployments) or 1
    before = _own_decisions(service)
    own = claims_of(service.to_wire())
    decisions: list[DeploymentDecision] = []
    usage: list[DeploymentUsage] = []
    state: dict[str, Any] = {}
    role_records: list[RoleRecord] = []
    quoted: list[tuple[str, PolicySpec, Decision]] = []
    costs: dict[str, int] = {}
    for deployment, md in sorted(owned.items()):
        spec = policy_spec(
            service.spec, md.spec, catalog, traffic_share=weights[deployment] / total_weight
        )
        spec = gpu_quota.limit(deployment, spec) if gpu_quota is not None else spec
        current = current_replicas(md, before.get(deployment))
        snapshot = with_pushed_wait(
            _snapshot(reading, source, namespace, deployment, spec.role_names,
                      settings=settings, now_s=now_s),
            waiting, current, now_s=now_s, window_s=settings.window_s,
        )  # fmt: skip
        decision = decide(
            spec, snapshot, current, _history(service, deployment),
            pins=_pins(md, now, own[deployment].pin_limits(spec.roles[0].gpus_per_replica)),
            now_s=now_s,
        )  # fmt: skip
        state[deployment] = decision.history.to_wire()
        quoted.append((deployment, spec, decision))
        if gpu_quota is not None:
            gpu_quota = gpu_quota.after(deployment, spec, decision.replicas)
        changed = any(decision.replicas.get(r) != current.get(r) for r in spec.role_names)
        costs |= _deletion_costs(source, namespace, deployment, current, decision.replicas)
        decisions.append(DeploymentDecision(deployment, decision, changed))
        role_records.extend(_role_records(deployment, spec, current, decision))
        if snapshot is not None:
            usage.append(_usage(deployment, md, decision.replicas, snapshot, spec, catalog=catalog))
    if reading.problem is None and any(
        d.decision.reason is Reason.STALE_METRICS for d in decisions
    ):
        reading.problem = ("MetricsStale", "the newest samples are older than the policy acts on")
    previous = service.status.to_wire() if service.status else {}
    conditions, events = _conditions(
        previous.get("conditions") or [], reading.problem, sorted(owned), elsewhere,
        quoted, generation=int(str(service.metadata.get("generation", 0))), now=now,
    )  # fmt: skip
    status = _tick_status(
        conditions, state, decisions, reading=reading, usage=usage, now=now, events=events
    )
    events += advice_events(previous.get("advice") or [], status.get("advice") or [])
    record = _tick_record(service, reading, role_records, at_s=now_s)
    if settings.metrics is not None:
        settings.metrics.record(record)
    claim = _gpu_claim(name, gpu_quota, quoted, now_s)
    return TickResult(status, decisions, events, record, claim, deletion_costs=costs)


def with_pushed_wait(
    snapshot: MetricsSnapshot | None,
    waiting: int,
    current: Mapping[Role, int],
    *,
    now_s: float,
    window_s: float,
) -> MetricsSnapshot | None:
    """The snapshot with the requests the router pushed that it holds, where Prometheus has
    fewer yet. Without a snapshot (Prometheus away, the router not scraped yet), a service at
    zero replicas is still woken by them: the push is itself a fresh measurement, of a service
    with no engine to read. A service that runs replicas keeps holding for want of metrics."""
    if waiting <= 0:
        return snapshot
    if snapshot is None:
        if any(n > 0 for n in current.values()):
            return None
        held = ServiceMetrics(0.0, float(waiting), waiting_for_replicas=float(waiting))
        return MetricsSnapshot(now_s, window_s, 0.0, held)
    if waiting <= snapshot.service.waiting_for_replicas:
        return snapshot
    pushed = replace(snapshot.service, waiting_for_replicas=float(waiting))
    return replace(snapshot, service=pushed)


def _tick_record(
    service: InferenceService, reading: _Reading, roles: Sequence[RoleRecord], *, at_s: float
) -> TickRecord:
    first = reading.first_snapshot
    return TickRecord(
        namespace=str(service.metadata.get("namespace")),
        service=str(service.metadata.get("name")),
        at_s=at_s,
        metrics_available=reading.problem is None,
        newest_sample_age_s=None if first is None else first.newest_sample_age_s,
        slo_attainment_target=service.spec.slo.attainment_target,
        roles=tuple(roles),
    )


def _gpu_claim(
    service: str,
    quota: GpuQuota | None,
    decided: Sequence[tuple[str, PolicySpec, Decision]],
    at_s: float,
) -> GpuClaim | None:
    """What a tick's decisions claim of the namespace's GPU quota (`autoscale.quota`): the
    GPUs the deployments' pods hold, and those the decisions would hold were there no quota
    (None: no quota on GPUs)."""
    if quota is None:
        return None
    wanted = sum(spec.gpus(decision.unquoted or decision.replicas) for _, spec, decision in decided)
    return GpuClaim(
        service=service,
        priority=quota.priority,
        slo_missed=any(decision.slo_missed for _, _, decision in decided),
        held=sum(quota.held(deployment, spec) for deployment, spec, _ in decided),
        wanted=wanted,
        at_s=at_s,
    )


def _usage(
    deployment: str,
    md: ModelDeployment,
    replicas: Mapping[Role, int],
    snapshot: MetricsSnapshot,
    spec: PolicySpec,
    *,
    catalog: GpuCatalog,
) -> DeploymentUsage:
    """A deployment's share of the service's performance, and the advice its fleet calls for."""
    config = ReplicaConfig.from_spec(md.spec, catalog)
    reading = FleetReading(
        snapshot.roles,
        prefix_blocks_per_s=sum(m.prefix_blocks_per_s for m in snapshot.roles.values()),
        prefix_blocks_seen_per_s=sum(m.prefix_blocks_seen_per_s for m in snapshot.roles.values()),
        mean_prompt_tokens=snapshot.service.mean_prompt_tokens,
        mean_output_tokens=snapshot.service.mean_output_tokens,
        requests_per_s=snapshot.service.requests_per_s * spec.traffic_share,
        replicas=replicas,
        slo=spec.slo,
    )
    return DeploymentUsage(
        config, replicas, snapshot.roles, deployment,
        advice=advise(md.spec, config, reading), diagnosis=diagnose(config, reading),
    )  # fmt: skip


def advice_events(
    previous: Sequence[Mapping[str, Any]], advice: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, bool]]:
    """An Event for each piece of advice a deployment was not given the tick before."""
    given = {(str(a.get("deployment")), str(a.get("reason"))) for a in previous}
    return [
        (str(a["reason"]), f"{a['deployment']}: {a['message']}", False)
        for a in advice
        if (a["deployment"], a["reason"]) not in given
    ]


def _tick_status(
    conditions: list[dict[str, Any]],
    state: dict[str, Any],
    decisions: Sequence[DeploymentDecision],
    *,
    reading: _Reading,
    usage: list[DeploymentUsage],
    now: datetime,
    events: list[tuple[str, str, bool]],
) -> dict[str, Any]:
    """The service's status fields a tick writes; appends an Event per replica change."""
    status: dict[str, Any] = {"conditions": conditions, "autoscalerState": state}
    status["replicas"] = [
        {"deployment": d.name, "role": role.value, "replicas": n}
        for d in decisions
        for role, n in sorted(d.decision.replicas.items())
    ]
    status["coldStarts"] = [
        {
            "deployment": d.name,
            "role": role.value,
            "measuredSeconds": list(starts.measured_s),
            "plannedSeconds": d.decision.cold_start_s,
        }
        for d in decisions
        if d.decision.cold_start_s is not None
        for role, starts in sorted(d.decision.history.cold_starts.items())
    ]
    if reading.first_snapshot is not None:
        observed = observe(reading.first_snapshot.service, usage, reading.tenants)
        status["observed"] = observed.to_wire()
        # Without metrics this tick, the advice stands as it was.
        status["advice"] = [
            {"deployment": u.deployment, **a.to_wire()} for u in usage for a in u.advice
        ]
        status["diagnosis"] = [
            {"deployment": u.deployment, **d.to_wire()} for u in usage for d in u.diagnosis
        ]
    moved = [d for d in decisions if d.changed]
    if moved:
        message = "; ".join(f"{d.name}: {d.decision.message}" for d in moved)
        status["lastDecision"] = {
            "time": now.isoformat(),
            "replicas": status["replicas"],
            "reason": moved[0].decision.reason.value,
            "message": message,
        }
        for d in moved:
            events.append((d.decision.reason.value, f"{d.name}: {d.decision.message}", False))
    # Written as the status model has it: what the CRD's schema accepts, in its wire form
    # (`observed` is already, with the nulls that clear figures undefined now).
    typed = InferenceServiceStatus.model_validate(
        {key: value for key, value in status.items() if key != "observed"}
    ).to_wire()
    return typed | ({"observed": status["observed"]} if "observed" in status else {})


def _role_records(
    deployment: str, spec: PolicySpec, current: Mapping[Role, int], decision: Decision
) -> list[RoleRecord]:
    return [
        RoleRecord(
            deployment=deployment,
            role=pool.role,
            current=current.get(pool.role, 0),
            desired=decision.replicas.get(pool.role, current.get(pool.role, 0)),
            min_replicas=pool.min_replicas,
            max_replicas=pool.max_replicas,
            gpus_per_replica=pool.gpus_per_replica,
            gpu_hourly_price_usd=pool.replica.gpu.hourly_price_usd,
            reason=decision.reason.value,
        )
        for pool in spec.roles
    ]


def _conditions(
    previous: Sequence[Mapping[str, Any]],
    problem: tuple[str, str] | None,
    owned: Sequence[str],
    elsewhere: Mapping[str, str],
    decided: Sequence[tuple[str, PolicySpec, Decision]],
    *,
    generation: int,
    now: datetime,
) -> tuple[list[dict[str, Any]], list[tuple[str, str, bool]]]:
    """The autoscaler's conditions (MetricsAvailable, Autoscaling) over `previous`, and the
    Events their changes call for."""
    # The deployments the namespace's GPU quota holds below what their load needs.
    short_of_quota = {
        name: decision.message
        for name, _, decision in decided
        if decision.reason is Reason.QUOTA_EXHAUSTED
    }
    # The deployments at zero whose held requests would time out before a replica serves.
    slow_wakes = {
        name: f"{name} starts in {decision.cold_start_s:.0f} s, the router holds requests "
        f"{spec.wake_timeout_s:.0f} s"
        for name, spec, decision in decided
        if spec.scales_to_zero
        and decision.cold_start_s is not None
        and decision.cold_start_s >= spec.wake_timeout_s
    }
    metrics = condition(
        previous, METRICS_AVAILABLE, status=problem is None,
        reason=problem[0] if problem else "MetricsFresh",
        message=problem[1] if problem else "router and engine series are fresh",
        generation=generation, now=now,
    )  # fmt: skip
    events: list[tuple[str, str, bool]] = []
    was_available = (find(previous, METRICS_AVAILABLE) or {}).get("status")
    if problem is not None and was_available != "False":
        events.append((problem[0], f"holding replicas: {problem[1]}", True))
    elif problem is None and was_available == "False":
        events.append(("MetricsAvailable", "fresh metrics again: autoscaling resumes", False))
    if elsewhere:
        taken = "; ".join(
            f"{md} is autoscaled by InferenceService {owner}"
            for md, owner in sorted(elsewhere.items())
        )
        message = f"{taken} (the claimant it records, else the oldest): its replicas are left alone"
        autoscaling = condition(
            previous, AUTOSCALING, status=False, reason="AutoscaledElsewhere",
            message=message + (f"; autoscales {', '.join(owned)}" if owned else ""),
            generation=generation, now=now,
        )  # fmt: skip
    elif short_of_quota:
        short = "; ".join(f"{md}: {why}" for md, why in sorted(short_of_quota.items()))
        autoscaling = condition(
            previous, AUTOSCALING, status=True, reason=Reason.QUOTA_EXHAUSTED.value,
            message=f"the namespace's GPU quota holds {', '.join(sorted(short_of_quota))} below "
            f"what the load needs ({short})",
            generation=generation, now=now,
        )  # fmt: skip
    elif slow_wakes:
        autoscaling = condition(
            previous, AUTOSCALING, status=True, reason=WAKE_SLOWER_THAN_TIMEOUT,
            message="requests that arrive at zero replicas will time out before one serves ("
            + "; ".join(why for _, why in sorted(slow_wakes.items()))
            + "): raise wakeTimeoutSeconds or make the cold start shorter (a weight cache)",
            generation=generation, now=now,
        )  # fmt: skip
    else:
        autoscaling = condition(
            previous, AUTOSCALING, status=True, reason="Autoscaling",
            message=f"autoscales {', '.join(owned) or 'nothing'}",
            generation=generation, now=now,
        )  # fmt: skip
    before = find(previous, AUTOSCALING) or {}
    if elsewhere and before.get("message") != autoscaling["message"]:
        events.append(("AutoscaledElsewhere", autoscaling["message"], True))
    if short_of_quota and before.get("reason") != Reason.QUOTA_EXHAUSTED.value:
        events.append((Reason.QUOTA_EXHAUSTED.value, autoscaling["message"], True))
    if autoscaling["reason"] == WAKE_SLOWER_THAN_TIMEOUT != before.get("reason"):
        events.append((WAKE_SLOWER_THAN_TIMEOUT, autoscaling["message"], True))
    return with_condition(with_condition(previous, metrics), autoscaling), events


def autoscaled_by(service: InferenceService, deployment: str) -> bool:
    """Whether `service` autoscales `deployment` (so its decisions stand)."""
    if service.spec.autoscaling.policy is not AutoscalingPolicy.GOODPUT:
        return False
    return any(ref.name == deployment and ref.weight > 0 for ref in service.spec.deployments)
