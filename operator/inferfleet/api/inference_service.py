"""InferenceService: the endpoint users call, its SLO and how it scales."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints

from inferfleet.api.common import MAX_REPLICAS, Condition, CrossFieldRule, StatusModel, WireModel
from inferfleet.api.model_deployment import FleetAdvice, Role, RoleDiagnosis
from inferfleet.api.model_spec import MODEL_NAME_PATTERN

KIND = "InferenceService"
PLURAL = "inferenceservices"

MAX_VARIANTS = 8
MAX_TENANTS = 64
TENANT_NAME_PATTERN = r"^[a-z0-9]([a-z0-9\-]*[a-z0-9])?$"


class DeploymentRef(WireModel):
    name: str = Field(
        description="Name of a ModelDeployment in the same namespace (never another one).",
        min_length=1,
        max_length=253,
        pattern=MODEL_NAME_PATTERN,
    )
    weight: int = Field(
        default=100,
        ge=0,
        le=1000,
        description="Relative share of traffic (canary, or heterogeneous GPU variants).",
    )


class SloSpec(WireModel):
    ttft_p95_ms: float | None = Field(
        default=None,
        gt=0,
        le=600_000,
        description="Time to first token each request should meet, in ms (judged at p95).",
    )
    tpot_p95_ms: float | None = Field(
        default=None,
        gt=0,
        le=60_000,
        description="Time per output token after the first each request should meet, in ms "
        "(judged at p95).",
    )
    attainment_target: float = Field(
        default=0.99,
        ge=0.5,
        le=1.0,
        description="Fraction of requests that must meet both targets; goodput counts them.",
    )


SLO_RULES: tuple[CrossFieldRule[SloSpec], ...] = (
    CrossFieldRule(
        cel="has(self.ttftP95Ms) || has(self.tpotP95Ms)",
        message="an SLO needs ttftP95Ms, tpotP95Ms or both",
        holds=lambda s: s.ttft_p95_ms is not None or s.tpot_p95_ms is not None,
        reason="FieldValueRequired",
    ),
)
SloSpec.cross_field_rules = SLO_RULES


DEFAULT_INPUT_TOKENS_CV = 1.0
"""How widely prompt lengths spread when nobody says: as widely as exponentially distributed
lengths. The Azure LLM inference traces of 2023 measure 0.96 (conversation and code)."""
MAX_INPUT_TOKENS_CV = 2.0
"""Beyond this a few outliers set the spread, and say little of the load."""


class LoadSpec(WireModel):
    requests_per_second: float = Field(gt=0, le=1_000_000, description="Expected peak req/s.")
    input_tokens: int = Field(ge=1, le=10_485_760, description="Mean prompt length (tokens).")
    output_tokens: int = Field(ge=1, le=1_048_576, description="Mean output length (tokens).")
    input_tokens_cv: float = Field(
        default=DEFAULT_INPUT_TOKENS_CV,
        ge=0,
        le=MAX_INPUT_TOKENS_CV,
        description="How widely prompt lengths spread: their standard deviation over their "
        "mean. Varied lengths queue longer for prefill, and the longest set the p95 TTFT. 0: "
        "every prompt inputTokens long; 1 (the default): as varied as exponentially "
        "distributed lengths, near what production chat and code traffic measures.",
    )


class ReplicaBounds(WireModel):
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Fewest replicas of the role. 0 (with the goodput policy; on both pools "
        "of a disaggregated deployment): after scaleToZeroIdleSeconds without a request the "
        "pools go to zero, and the router holds the next requests while they wake.",
    )
    max_replicas: int = Field(
        default=10, ge=1, le=MAX_REPLICAS, description="Most replicas of the role."
    )


BOUNDS_RULES: tuple[CrossFieldRule[ReplicaBounds], ...] = (
    CrossFieldRule(
        cel="self.minReplicas <= self.maxReplicas",
        message="minReplicas cannot exceed maxReplicas",
        holds=lambda b: b.min_replicas <= b.max_replicas,
        field_path=".minReplicas",
    ),
)
ReplicaBounds.cross_field_rules = BOUNDS_RULES


class AutoscalingPolicy(StrEnum):
    NONE = "none"
    GOODPUT = "goodput"


class AutoscalingSpec(WireModel):
    policy: AutoscalingPolicy = Field(
        strict=False,
        default=AutoscalingPolicy.NONE,
        description="none: replicas come from the ModelDeployments. goodput: hold the SLO with "
        "the fewest GPUs.",
    )
    aggregated: ReplicaBounds | None = Field(
        default=None, description="Bounds of aggregated replicas."
    )
    prefill: ReplicaBounds | None = Field(default=None, description="Bounds of the prefill pool.")
    decode: ReplicaBounds | None = Field(default=None, description="Bounds of the decode pool.")
    gpu_budget: int | None = Field(
        default=None, ge=1, le=100_000, description="Most GPUs the service may hold at once."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=86_400,
        description="How long demand must stay low before replicas are removed.",
    )
    shorten_stabilization_when_forecasts_hold: bool = Field(
        default=True,
        description="Once the SLO has been met and no load arrived above what was forecast for "
        "it a cold start before, for a whole scaleDownStabilizationSeconds, remove replicas "
        "after one metrics window of lower demand. false: always wait "
        "scaleDownStabilizationSeconds, as the HPA does.",
    )
    cold_start_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Expected time from a new replica to serving (image pull, weight load). "
        "Unset: estimated from where each ModelDeployment's weights come from and their size "
        "(its status.plan.coldStart). The goodput policy measures each role's and plans with "
        "the slowest role's measured one where they differ by more than a quarter.",
    )
    scale_to_zero_idle_seconds: int = Field(
        default=600,
        ge=60,
        le=604_800,
        description="Where every pool has minReplicas 0: how long no request may arrive "
        "before the pools go to zero.",
    )
    wake_timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=3_600,
        description="Where every pool has minReplicas 0: how long the router holds a request "
        "that arrives at zero replicas for the pools to wake, before a 503 with Retry-After. "
        "Longer than coldStartSeconds.",
    )

    @property
    def zero_allowed(self) -> bool:
        """Whether some pool's bounds allow zero replicas."""
        return any(b is not None and b.min_replicas == 0 for b in (self.aggregated, self.prefill))

    def scales_to_zero(self, *, disaggregated: bool) -> bool:
        """Whether the goodput policy may take a deployment of this topology to zero."""
        pools = (self.prefill, self.decode) if disaggregated else (self.aggregated,)
        zero = all(bounds is not None and bounds.min_replicas == 0 for bounds in pools)
        return self.policy == AutoscalingPolicy.GOODPUT and zero


AUTOSCALING_RULES: tuple[CrossFieldRule[AutoscalingSpec], ...] = (
    CrossFieldRule(
        cel="(has(self.prefill) && self.prefill.minReplicas == 0) == "
        "(has(self.decode) && self.decode.minReplicas == 0)",
        message="prefill and decode go to zero together: set minReplicas 0 on both or neither",
        holds=lambda a: (
            (a.prefill is not None and a.prefill.min_replicas == 0)
            == (a.decode is not None and a.decode.min_replicas == 0)
        ),
        field_path=".prefill",
    ),
    CrossFieldRule(
        cel="!((has(self.aggregated) && self.aggregated.minReplicas == 0) || "
        "(has(self.prefill) && self.prefill.minReplicas == 0)) || "
        "!has(self.coldStartSeconds) || self.wakeTimeoutSeconds > self.coldStartSeconds",
        message="requests held while the pools wake would time out before a replica starts: "
        "wakeTimeoutSeconds must exceed coldStartSeconds",
        holds=lambda a: (
            not a.zero_allowed
            or a.cold_start_seconds is None
            or a.wake_timeout_seconds > a.cold_start_seconds
        ),
        field_path=".wakeTimeoutSeconds",
    ),
)
AutoscalingSpec.cross_field_rules = AUTOSCALING_RULES


class TenantPriority(StrEnum):
    """When the engines are full, interactive requests wait ahead of batch ones (and a full
    queue sheds batch first); within a priority, tenants share by tokens served."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


class TenantLimits(WireModel):
    requests_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Requests a second (a token bucket holding one second's worth).",
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000_000,
        description="Prompt plus max_tokens a minute (a bucket holding one minute's worth); "
        "what a request did not use is given back.",
    )
    max_concurrent_requests: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Requests running at once."
    )


class Tenant(WireModel):
    """A team or application that calls the endpoint with keys of its own."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=TENANT_NAME_PATTERN,
        description="The tenant, as the router's answers and metrics name it.",
    )
    api_key_secret: str = Field(
        min_length=1,
        max_length=253,
        pattern=MODEL_NAME_PATTERN,
        description="A Secret in the same namespace: each of its values is an API key of this "
        "tenant (add a new key, move clients over, delete the old: no restart).",
    )
    models: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=MAX_VARIANTS,
        description="Served model names the tenant may ask for; empty: every one.",
    )
    limits: TenantLimits = Field(
        default_factory=TenantLimits, description="How much it may ask; unset: no limit."
    )
    priority: TenantPriority = Field(
        strict=False,
        default=TenantPriority.INTERACTIVE,
        description="interactive or batch: when the engines are full, interactive requests go "
        "first and batch ones are shed first; tenants of one priority share by tokens served.",
    )


class InferenceServiceSpec(WireModel):
    deployments: list[DeploymentRef] = Field(
        min_length=1,
        max_length=MAX_VARIANTS,
        description="ModelDeployments that serve this endpoint, with traffic weights.",
    )
    slo: SloSpec = Field(description="The latency targets each request should meet.")
    expected_load: LoadSpec | None = Field(
        default=None, description="Expected peak load, for the initial capacity plan."
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="How replicas follow demand."
    )
    tenants: list[Tenant] = Field(
        default_factory=list,
        max_length=MAX_TENANTS,
        description="Who may call the endpoint, each with its API keys and limits; with any, "
        "every request needs a tenant's key (Authorization: Bearer). Empty: anyone may.",
    )


SERVICE_RULES: tuple[CrossFieldRule[InferenceServiceSpec], ...] = (
    CrossFieldRule(
        cel="self.deployments.all(d, self.deployments.filter(e, e.name == d.name).size() == 1)",
        message="each ModelDeployment may be listed once",
        holds=lambda s: len({d.name for d in s.deployments}) == len(s.deployments),
        field_path=".deployments",
        reason="FieldValueDuplicate",
    ),
    CrossFieldRule(
        cel="self.deployments.exists(d, d.weight > 0)",
        message="at least one deployment needs a weight above zero",
        holds=lambda s: any(d.weight > 0 for d in s.deployments),
        field_path=".deployments",
    ),
    CrossFieldRule(
        cel="!has(self.tenants) || "
        "self.tenants.all(t, self.tenants.filter(u, u.name == t.name).size() == 1)",
        message="each tenant may be listed once",
        holds=lambda s: len({t.name for t in s.tenants}) == len(s.tenants),
        field_path=".tenants",
        reason="FieldValueDuplicate",
    ),
)
InferenceServiceSpec.cross_field_rules = SERVICE_RULES


class TenantCost(StatusModel):
    name: str = Field(description="The tenant.")
    prompt_tokens_per_second: float = Field(ge=0, description="Prompt tokens/s it was served.")
    output_tokens_per_second: float = Field(ge=0, description="Output tokens/s it was served.")
    share: float = Field(
        ge=0, le=1, description="Its share of the tokens served (prompt 1, output 2 each)."
    )
    cost_per_hour_usd: float = Field(
        ge=0, description="Its share of the service's GPU cost an hour, in US dollars."
    )


class ObservedPerformance(StatusModel):
    ttft_p95_ms: float | None = Field(default=None, description="Observed p95 TTFT, ms.")
    tpot_p95_ms: float | None = Field(default=None, description="Observed p95 TPOT, ms.")
    attainment: float | None = Field(
        default=None, description="Fraction of requests that met both SLO targets."
    )
    goodput_rps: float | None = Field(
        default=None, description="Requests per second that met the SLO."
    )
    output_tokens_per_second: float | None = Field(default=None, description="Output tokens/s.")
    cost_per_million_output_tokens_usd: float | None = Field(
        default=None, description="GPU cost per 1M output tokens at the current load."
    )
    mfu: float | None = Field(default=None, description="Model FLOPs utilisation (0-1).")
    mbu: float | None = Field(default=None, description="Memory bandwidth utilisation (0-1).")
    cost_per_hour_usd: float | None = Field(
        default=None, description="GPU cost an hour of the replicas held, in US dollars."
    )
    tenants: list[TenantCost] = Field(
        default_factory=list,
        max_length=MAX_TENANTS,
        description="Per tenant: tokens served, share and cost an hour, over the rate window.",
    )


class RoleReplicas(StatusModel):
    deployment: str = Field(description="The ModelDeployment.")
    role: Role = Field(description="aggregated, prefill or decode.")
    replicas: int = Field(ge=0, description="Replicas.")


class RoleColdStart(StatusModel):
    deployment: str = Field(description="The ModelDeployment.")
    role: Role = Field(description="aggregated, prefill or decode.")
    measured_seconds: list[float] = Field(
        default_factory=list,
        max_length=16,
        description="The cold starts the autoscaler measured, newest last: from the tick that "
        "ordered a scale-up to the tick that saw one more replica serving, less half a tick.",
    )
    planned_seconds: float = Field(
        ge=0,
        description="The cold start the autoscaler plans this deployment with: the slowest "
        "role's measured where it differs from coldStartSeconds (unset: the deployment's "
        "estimated cold start) by more than a quarter, else that.",
    )


class DeploymentAdvice(FleetAdvice):
    deployment: str = Field(description="The ModelDeployment.")


class DeploymentDiagnosis(RoleDiagnosis):
    deployment: str = Field(description="The ModelDeployment.")


class ScalingDecision(StatusModel):
    time: datetime = Field(description="When the decision was taken.")
    replicas: list[RoleReplicas] = Field(description="Replicas per deployment and role it chose.")
    reason: str = Field(description="Why, as a CamelCase reason (e.g. ScaleUpTtft).")
    message: str = Field(
        default="", description="The inputs, the predicted effect and the action, in words."
    )


class InferenceServiceStatus(StatusModel):
    observed_generation: int | None = Field(
        default=None, description="metadata.generation this status was computed from."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, MetricsAvailable, SloMet."
    )
    url: str | None = Field(default=None, description="Where users call the endpoint.")
    observed: ObservedPerformance | None = Field(
        default=None, description="Live performance against the SLO."
    )
    replicas: list[RoleReplicas] = Field(default_factory=list, description="Replicas per role.")
    advice: list[DeploymentAdvice] | None = Field(
        default=None,
        max_length=64,
        description="What the running fleet suggests changing in each ModelDeployment this "
        "service autoscales, with its inputs and predicted effect; an Event when it is new.",
    )
    diagnosis: list[DeploymentDiagnosis] | None = Field(
        default=None,
        max_length=64,
        description="Per ModelDeployment this service autoscales and per role: compute- or "
        "bandwidth-bound, KV-cache pressure, queueing against prefill, in words and figures.",
    )
    cold_starts: list[RoleColdStart] = Field(
        default_factory=list,
        max_length=64,
        description="Per deployment and role, the cold starts measured and the one planned with.",
    )
    last_decision: ScalingDecision | None = Field(
        default=None, description="The last scaling decision and its reason."
    )
    autoscaler_state: dict[str, Any] | None = Field(
        default=None,
        description="The autoscaler's memory between ticks (recent recommendations and demand, "
        "what it learned of latency), per ModelDeployment; kept here so a restart forgets nothing.",
    )


class InferenceService(WireModel):
    """An InferenceService as stored by the API server."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["inferfleet.io/v1alpha1"] = Field(
        default="inferfleet.io/v1alpha1", description="API version."
    )
    kind: Literal["InferenceService"] = Field(default="InferenceService", description="Kind.")
    metadata: dict[str, object] = Field(default_factory=dict, description="Object metadata.")
    spec: InferenceServiceSpec = Field(description="Desired state.")
    status: InferenceServiceStatus | None = Field(default=None, description="Observed state.")
