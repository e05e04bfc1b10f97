"""From Prometheus answers to the policy's snapshot, and to what status says of a service's
live performance. Pure: the controller runs the queries, this module fills in their blanks and
reads their answers.

`instant_value` is where a Prometheus answer is read: anything but one finite sample of an
instant vector (or none) is refused with `MalformedAnswerError`, which says what was wrong.

The queries are the ones `autoscale.snapshot` documents field by field; `render` substitutes a
service, its namespace, one ModelDeployment, a role and the rate window.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from inferfleet.api.inference_service import ObservedPerformance
from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.advice import Advice, measured_mbu
from inferfleet.autoscale.diagnosis import RoleDiagnosis
from inferfleet.autoscale.snapshot import (
    ROLE_QUERIES,
    SERVICE_QUERIES,
    STALENESS_QUERY,
    MetricsSnapshot,
    RoleMetrics,
    ServiceMetrics,
)
from inferfleet.autoscale.tenants import TenantTokens, TenantUsage, tenant_usage
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.render.common import label_value

STALENESS = "newest_sample_age_s"


def _quoted(value: str) -> str:
    """A label value inside a PromQL string: backslashes and quotes escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _window(window_s: float) -> str:
    return f"{max(1, round(window_s))}s"


def render(
    template: str,
    *,
    service: str,
    namespace: str,
    deployment: str = "",
    role: Role | None = None,
    window_s: float = 60.0,
    recent_window_s: float | None = None,
) -> str:
    """A query of `autoscale.snapshot` with its `$` placeholders filled in."""
    values = {
        "$NS": _quoted(namespace),
        "$S": _quoted(service),
        # A regex inside a PromQL string: regex-escaped first, then string-escaped (`\.` is
        # written `\\.`; a bare `\-` is a PromQL parse error).
        # Engines are selected by the pod label the renderer puts on them, which is the name
        # itself only up to 63 characters (longer names are truncated with a digest).
        "$MD": _quoted(re.escape(label_value(deployment))),
        # Routers label their series with the name as it is.
        "$DN": _quoted(deployment),
        "$R": "" if role is None else role.value,
        "$w": _window(window_s),
        "$r": _window(window_s if recent_window_s is None else recent_window_s),
    }
    # Longest first: `$S` must not eat the start of another placeholder.
    for key in sorted(values, key=len, reverse=True):
        template = template.replace(key, values[key])
    return template


def service_queries(
    service: str, namespace: str, window_s: float, recent_window_s: float | None = None
) -> dict[str, str]:
    """Field -> PromQL for the router's view of a service, and its staleness."""
    queries = {
        name: render(
            query,
            service=service,
            namespace=namespace,
            window_s=window_s,
            recent_window_s=recent_window_s,
        )
        for name, query in SERVICE_QUERIES.items()
    }
    queries[STALENESS] = render(STALENESS_QUERY, service=service, namespace=namespace)
    return queries


def role_queries(namespace: str, deployment: str, role: Role, window_s: float) -> dict[str, str]:
    """Field -> PromQL for one role of one ModelDeployment."""
    return {
        name: render(
            query,
            service="",
            namespace=namespace,
            deployment=deployment,
            role=role,
            window_s=window_s,
        )
        for name, query in ROLE_QUERIES.items()
    }


# Ratios and quantiles: Prometheus answers NaN for 0/0 (no request completed) and +Inf for a
# quantile past the last bucket. Every other field is a sum, count, mean or age, which a
# healthy Prometheus answers with a finite number.
MAY_BE_UNDEFINED: frozenset[str] = frozenset(
    {
        "attainment",
        "ttft_p95_s",
        "tpot_p95_s",
        "ttft_p99_s",
        "tpot_p99_s",
        "mean_prompt_tokens",
        "mean_squared_prompt_tokens",
        "mean_output_tokens",
        "mean_arrival_prompt_tokens",
        "queue_p95_s",
        "prefill_p95_s",
        "inter_token_mean_s",
    }
)


class MalformedAnswerError(ValueError):
    """A Prometheus answer the snapshot cannot be read from; the message says what was wrong."""


class _Sample(BaseModel):
    """One series of an instant vector: `{"metric": {...}, "value": [time, "value"]}`."""

    model_config = ConfigDict(extra="ignore")
    metric: dict[str, str]
    value: tuple[float, str]


_INSTANT_VECTOR: TypeAdapter[list[_Sample]] = TypeAdapter(list[_Sample])


def instant_value(field: str, result: object) -> float | None:
    """The single value of `result` (an instant query's `data.result`) for `field`; None when
    it holds no series. Raises MalformedAnswerError for anything else: not an instant vector
    (a matrix, a scalar, missing keys), more than one series, a value that is not a number, or
    NaN/Inf for a field that needs a number."""
    try:
        samples = _INSTANT_VECTOR.validate_python(result)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'result'}: {e['msg']}"
            for e in error.errors()[:3]
        )
        raise MalformedAnswerError(f"{field}: not an instant vector ({problems})") from None
    if not samples:
        return None
    if len(samples) > 1:
        raise MalformedAnswerError(f"{field}: {len(samples)} series where one was expected")
    text = samples[0].value[1]
    try:
        value = float(text)
    except ValueError:
        raise MalformedAnswerError(f"{field}: value {text[:40]!r} is not a number") from None
    if not math.isfinite(value) and field not in MAY_BE_UNDEFINED:
        raise MalformedAnswerError(f"{field}: value {text!r} where a finite number is needed")
    return value


def labelled_values(field: str, result: object) -> list[tuple[dict[str, str], float]]:
    """Every series of `result` (an instant vector) with its labels and its finite value;
    MalformedAnswerError for anything but an instant vector of numbers."""
    try:
        samples = _INSTANT_VECTOR.validate_python(result)
    except ValidationError:
        raise MalformedAnswerError(f"{field}: not an instant vector") from None
    found = []
    for sample in samples:
        try:
            value = float(sample.value[1])
        except ValueError:
            raise MalformedAnswerError(
                f"{field}: value {sample.value[1][:40]!r} is not a number"
            ) from None
        if math.isfinite(value):
            found.append((sample.metric, value))
    return found


def _finite(value: float | None) -> float | None:
    """Prometheus answers NaN for 0/0 and +Inf for a quantile past the last bucket: neither is
    a measurement the policy can use."""
    if value is None or not math.isfinite(value):
        return None
    return max(0.0, value)


def snapshot_from_answers(
    service_answers: Mapping[str, float | None],
    role_answers: Mapping[Role, Mapping[str, float | None]],
    *,
    taken_at_s: float,
    window_s: float,
    recent_window_s: float | None = None,
) -> MetricsSnapshot | None:
    """The snapshot the answers describe; None when the router has no series at all (nothing
    scraped yet, or the service has no router)."""
    age = _finite(service_answers.get(STALENESS))
    if age is None:
        return None

    def answer(name: str) -> float | None:
        return _finite(service_answers.get(name))

    attainment = answer("attainment")
    service = ServiceMetrics(
        requests_per_s=answer("requests_per_s") or 0.0,
        in_flight_requests=answer("in_flight_requests") or 0.0,
        attainment=None if attainment is None else min(1.0, attainment),
        ttft_p95_s=answer("ttft_p95_s"),
        tpot_p95_s=answer("tpot_p95_s"),
        ttft_p99_s=answer("ttft_p99_s"),
        tpot_p99_s=answer("tpot_p99_s"),
        mean_prompt_tokens=answer("mean_prompt_tokens"),
        mean_squared_prompt_tokens=answer("mean_squared_prompt_tokens"),
        mean_output_tokens=answer("mean_output_tokens"),
        arrivals_per_s=answer("arrivals_per_s"),
        mean_arrival_prompt_tokens=answer("mean_arrival_prompt_tokens"),
        recent_arrivals_per_s=answer("recent_arrivals_per_s"),
        waiting_for_replicas=answer("waiting_for_replicas") or 0.0,
    )
    roles = {}
    for role, answers in role_answers.items():

        def value(name: str, answers: Mapping[str, float | None] = answers) -> float:
            return _finite(answers.get(name)) or 0.0

        roles[role] = RoleMetrics(
            role=role,
            ready_replicas=round(value("ready_replicas")),
            running_requests=value("running_requests"),
            running_seconds_per_s=value("running_seconds_per_s"),
            inter_token_mean_s=_finite(answers.get("inter_token_mean_s")) or None,
            waiting_requests=value("waiting_requests"),
            kv_cache_usage=min(1.0, value("kv_cache_usage")),
            prompt_tokens_per_s=value("prompt_tokens_per_s"),
            generation_tokens_per_s=value("generation_tokens_per_s"),
            prefix_blocks_per_s=value("prefix_blocks_per_s"),
            prefix_blocks_seen_per_s=value("prefix_blocks_seen_per_s"),
            queue_p95_s=_finite(answers.get("queue_p95_s")),
            prefill_p95_s=_finite(answers.get("prefill_p95_s")),
        )
    return MetricsSnapshot(
        taken_at_s=taken_at_s, window_s=window_s, newest_sample_age_s=age,
        service=service, roles=roles,
        recent_window_s=None if recent_window_s is None else min(recent_window_s, window_s),
    )  # fmt: skip


@dataclass(frozen=True)
class DeploymentUsage:
    """One ModelDeployment's share of a service's live performance."""

    replica: ReplicaConfig
    replicas: Mapping[Role, int]
    """Replicas held per role (GPUs are paid for from the moment they are asked for)."""
    roles: Mapping[Role, RoleMetrics]
    deployment: str = ""
    advice: tuple[Advice, ...] = ()
    """What the running fleet suggests changing in it (`autoscale.advice`)."""
    diagnosis: tuple[RoleDiagnosis, ...] = ()
    """What limits each of its pools (`autoscale.diagnosis`)."""


@dataclass(frozen=True)
class Observed:
    """What status reports of a service's live performance (`status.observed`)."""

    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    attainment: float | None
    goodput_rps: float | None
    output_tokens_per_second: float | None
    cost_per_million_output_tokens_usd: float | None
    mfu: float | None
    mbu: float | None
    cost_per_hour_usd: float | None = None
    tenants: tuple[TenantUsage, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        """As `ObservedPerformance` has it, with every field present: a figure that is undefined
        now is null, which removes the stale one from the stored status (a merge patch)."""
        figures = {
            "ttft_p95_ms": _rounded(self.ttft_p95_ms, 1),
            "tpot_p95_ms": _rounded(self.tpot_p95_ms, 2),
            "attainment": _rounded(self.attainment, 4),
            "goodput_rps": _rounded(self.goodput_rps, 3),
            "output_tokens_per_second": _rounded(self.output_tokens_per_second, 1),
            "cost_per_million_output_tokens_usd": _rounded(
                self.cost_per_million_output_tokens_usd, 3
            ),
            "mfu": _rounded(self.mfu, 4),
            "mbu": _rounded(self.mbu, 4),
            "cost_per_hour_usd": _rounded(self.cost_per_hour_usd, 4),
        }
        known: dict[str, Any] = {k: v for k, v in figures.items() if v is not None}
        known["tenants"] = [tenant.to_wire() for tenant in self.tenants]
        return ObservedPerformance.model_validate(known).model_dump(mode="json", by_alias=True)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def observe(
    service: ServiceMetrics,
    usage: Sequence[DeploymentUsage],
    tenant_tokens: Mapping[str, TenantTokens] | None = None,
) -> Observed:
    """Live performance: latency and attainment as the router measured them; throughput, cost
    and efficiency from the engines' token rates and the model's shape.

    MFU: 2 x active parameters FLOPs per token processed (prompt and output), over the GPUs'
    peak (attention FLOPs left out, so a lower bound). MBU: the weights are read once per
    decode step, at the steps a replica takes while it decodes (`advice.measured_mbu`);
    KV-cache reads are left out (a lower bound too). Cost per tenant: the GPUs' cost
    shared by the tokens each tenant was served (`tenant_tokens`, `tenant_usage`)."""
    gpus = flops = peak_flops = bytes_read = peak_bytes = hourly = tokens = 0.0
    for deployment in usage:
        config = deployment.replica
        active = config.model.active_parameters
        for role, count in deployment.replicas.items():
            gpus += count * config.gpus
            hourly += count * config.gpus * config.gpu.hourly_price_usd
            peak_flops += count * config.gpus * config.linear_flops_rate
            peak_bytes += count * config.gpus * config.gpu.memory_bandwidth
            metrics = deployment.roles.get(role)
            if metrics is None:
                continue
            flops += 2 * active * (metrics.prompt_tokens_per_s + metrics.generation_tokens_per_s)
            tokens += metrics.generation_tokens_per_s
            if metrics.decode_steps_per_s > 0 and metrics.ready_replicas > 0:
                gpus_serving = config.gpus * metrics.ready_replicas
                bytes_read += (
                    measured_mbu(config, metrics) * config.gpu.memory_bandwidth * gpus_serving
                )
    attainment = service.attainment
    return Observed(
        ttft_p95_ms=None if service.ttft_p95_s is None else service.ttft_p95_s * 1e3,
        tpot_p95_ms=None if service.tpot_p95_s is None else service.tpot_p95_s * 1e3,
        attainment=attainment,
        goodput_rps=None if attainment is None else attainment * service.requests_per_s,
        output_tokens_per_second=tokens if gpus else None,
        cost_per_million_output_tokens_usd=hourly / 3600 / tokens * 1e6 if tokens > 0 else None,
        mfu=min(1.0, flops / peak_flops) if peak_flops else None,
        mbu=min(1.0, bytes_read / peak_bytes) if peak_bytes else None,
        cost_per_hour_usd=hourly if gpus else None,
        tenants=tenant_usage(tenant_tokens or {}, hourly),
    )
