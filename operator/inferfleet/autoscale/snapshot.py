"""What the autoscaling policy sees of a service: one snapshot of its metrics, per role and per
service, in exactly the shape the live controller reads from Prometheus.

Every field names the PromQL that fills it. `$S` is the InferenceService's name, `$NS` its
namespace, `$MD` the alternation of its ModelDeployments' names (`llama|llama-canary`), `$R` a
role (aggregated, prefill, decode) and `$w` the rate window (`window_s`, e.g. `1m`). Engine
series carry the pod labels `inferfleet.io/model-deployment` and `inferfleet.io/role`, as
Prometheus' Kubernetes discovery maps them (`inferfleet_io_model_deployment`,
`inferfleet_io_role`); router series carry `service` and `namespace`. A query that returns no
series leaves the field at 0 (engine sums) or None (router ratios and quantiles, which are
undefined without requests).

The fleet simulator fills the same fields from its own counters over the same window, so the
policy cannot tell a simulated fleet from a live one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferfleet.api.model_deployment import Role

# How the live controller selects one role's engine series and one service's router series.
ENGINE_SELECTOR = 'namespace="$NS",inferfleet_io_model_deployment=~"$MD",inferfleet_io_role="$R"'
ROUTER_SELECTOR = 'service="$S",namespace="$NS"'
# A role of one ModelDeployment in the routers' series (`deployment` is the name as it is).
ROUTER_ROLE_SELECTOR = 'namespace="$NS",deployment="$DN",role="$R"'

# The PromQL behind each field, as the live controller issues it (see the field docstrings).
ROLE_QUERIES: Mapping[str, str] = {
    "ready_replicas": f"count(vllm:num_requests_running{{{ENGINE_SELECTOR}}})",
    "running_requests": f"sum(vllm:num_requests_running{{{ENGINE_SELECTOR}}})",
    "waiting_requests": f"sum(vllm:num_requests_waiting{{{ENGINE_SELECTOR}}})",
    "running_seconds_per_s": (
        f"sum(rate(vllm:request_inference_time_seconds_sum{{{ENGINE_SELECTOR}}}[$w]))"
    ),
    "inter_token_mean_s": (
        f"sum(rate(vllm:inter_token_latency_seconds_sum{{{ENGINE_SELECTOR}}}[$w]))"
        f" / sum(rate(vllm:inter_token_latency_seconds_count{{{ENGINE_SELECTOR}}}[$w]))"
    ),
    "kv_cache_usage": f"avg(vllm:kv_cache_usage_perc{{{ENGINE_SELECTOR}}})",
    "prompt_tokens_per_s": f"sum(rate(vllm:prompt_tokens_total{{{ENGINE_SELECTOR}}}[$w]))",
    "generation_tokens_per_s": (
        f"sum(rate(vllm:generation_tokens_total{{{ENGINE_SELECTOR}}}[$w]))"
    ),
    "prefix_blocks_per_s": (
        f"sum(rate(inferfleet_router_prefix_blocks_total{{{ROUTER_ROLE_SELECTOR}}}[$w]))"
    ),
    "prefix_blocks_seen_per_s": (
        f"sum(rate(inferfleet_router_prefix_blocks_seen_total{{{ROUTER_ROLE_SELECTOR}}}[$w]))"
    ),
    "queue_p95_s": (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(vllm:request_queue_time_seconds_bucket{{{ENGINE_SELECTOR}}}[$w])))"
    ),
    "prefill_p95_s": (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(vllm:request_prefill_time_seconds_bucket{{{ENGINE_SELECTOR}}}[$w])))"
    ),
}
SERVICE_QUERIES: Mapping[str, str] = {
    "requests_per_s": f"sum(rate(inferfleet_router_requests_total{{{ROUTER_SELECTOR}}}[$w]))",
    "in_flight_requests": f"sum(inferfleet_router_in_flight_requests{{{ROUTER_SELECTOR}}})",
    "attainment": (
        f'sum(rate(inferfleet_router_requests_total{{{ROUTER_SELECTOR},outcome="met"}}[$w]))'
        f" / sum(rate(inferfleet_router_requests_total{{{ROUTER_SELECTOR}}}[$w]))"
    ),
    "ttft_p95_s": (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(inferfleet_router_ttft_seconds_bucket{{{ROUTER_SELECTOR}}}[$w])))"
    ),
    "tpot_p95_s": (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(inferfleet_router_tpot_seconds_bucket{{{ROUTER_SELECTOR}}}[$w])))"
    ),
    "ttft_p99_s": (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(inferfleet_router_ttft_seconds_bucket{{{ROUTER_SELECTOR}}}[$w])))"
    ),
    "tpot_p99_s": (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(inferfleet_router_tpot_seconds_bucket{{{ROUTER_SELECTOR}}}[$w])))"
    ),
    "mean_prompt_tokens": (
        f"sum(rate(inferfleet_router_prompt_tokens_total{{{ROUTER_SELECTOR}}}[$w]))"
        f" / sum(rate(inferfleet_router_requests_total{{{ROUTER_SELECTOR}}}[$w]))"
    ),
    "mean_squared_prompt_tokens": (
        f"sum(rate(inferfleet_router_prompt_tokens_squared_total{{{ROUTER_SELECTOR}}}[$w]))"
        f" / sum(rate(inferfleet_router_requests_total{{{ROUTER_SELECTOR}}}[$w]))"
    ),
    "mean_output_tokens": (
        f"sum(rate(inferfleet_router_output_tokens_total{{{ROUTER_SELECTOR}}}[$w]))"
        f" / sum(rate(inferfleet_router_requests_total{{{ROUTER_SELECTOR}}}[$w]))"
    ),
    "arrivals_per_s": f"sum(rate(inferfleet_router_arrivals_total{{{ROUTER_SELECTOR}}}[$w]))",
    "waiting_for_replicas": (f"sum(inferfleet_router_waiting_for_replicas{{{ROUTER_SELECTOR}}})"),
    "recent_arrivals_per_s": (
        f"sum(rate(inferfleet_router_arrivals_total{{{ROUTER_SELECTOR}}}[$r]))"
    ),
    "mean_arrival_prompt_tokens": (
        f"sum(rate(inferfleet_router_arrival_prompt_tokens_total{{{ROUTER_SELECTOR}}}[$w]))"
        f" / sum(rate(inferfleet_router_arrivals_total{{{ROUTER_SELECTOR}}}[$w]))"
    ),
}
# Per engine pod of one role, the requests it holds (running and queued): a scale-in takes the
# pods that hold fewest first (`autoscale.scalein`).
POD_IN_FLIGHT_QUERY = (
    f"sum by (pod) (vllm:num_requests_running{{{ENGINE_SELECTOR}}})"
    f" + sum by (pod) (vllm:num_requests_waiting{{{ENGINE_SELECTOR}}})"
)
# Staleness: the newest sample behind the snapshot, in seconds before the query time.
STALENESS_QUERY = (
    f"time() - max(timestamp(inferfleet_router_in_flight_requests{{{ROUTER_SELECTOR}}}))"
)

# Outcomes the router counts per completed request; only `met` counts towards goodput.
OUTCOMES = ("met", "missed_ttft", "missed_tpot", "missed_both", "failed")


def _check_non_negative(owner: str, **values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{owner}.{name} must be a finite number >= 0 (got {value})")


@dataclass(frozen=True)
class RoleMetrics:
    """Engine metrics of one role, over its ready replicas."""

    role: Role
    ready_replicas: int
    """Replicas whose engine is scraped and serving:
    `count(vllm:num_requests_running{<role>})`."""
    running_requests: float
    """Sequences in the running batches: `sum(vllm:num_requests_running{<role>})`."""
    waiting_requests: float
    """Requests queued in the engines: `sum(vllm:num_requests_waiting{<role>})`."""
    kv_cache_usage: float
    """Mean fraction of KV-cache blocks in use, 0..1: `avg(vllm:kv_cache_usage_perc{<role>})`."""
    prompt_tokens_per_s: float
    """Prompt tokens prefilled per second: `sum(rate(vllm:prompt_tokens_total{<role>}[$w]))`."""
    generation_tokens_per_s: float
    """Output tokens decoded per second:
    `sum(rate(vllm:generation_tokens_total{<role>}[$w]))`."""
    prefix_blocks_per_s: float = 0.0
    """Leading prompt blocks the routers sent this role to prefill, per second (a role that
    prefills: aggregated or prefill): `sum(rate(inferfleet_router_prefix_blocks_total
    {namespace="$NS",deployment="<name>",role="$R"}[$w]))`. Advice reads it, not the policy;
    the fleet simulator hashes no prompts and leaves it 0."""
    prefix_blocks_seen_per_s: float = 0.0
    """Of those, the blocks a recent prompt to the same pool began with:
    `sum(rate(inferfleet_router_prefix_blocks_seen_total{...}[$w]))`."""
    running_seconds_per_s: float = 0.0
    """Seconds requests spent running (prefill and decode) per second of the window, counted
    as each finishes: the mean running count by Little's law, a mean over the same window as
    the token rates (the instant gauge is not: early in a load, or on a young replica, it sets
    a full batch against rates the window still dilutes):
    `sum(rate(vllm:request_inference_time_seconds_sum{<role>}[$w]))`. 0: not measured (the
    fleet simulator); readers fall back to `running_requests`."""
    inter_token_mean_s: float | None = None
    """Mean time between a sequence's consecutive tokens, seconds: a decode step as the
    sequences in it saw it: `sum(rate(vllm:inter_token_latency_seconds_sum{<role>}[$w])) /
    sum(rate(vllm:inter_token_latency_seconds_count{<role>}[$w]))`; None: no token in the
    window, or not measured."""
    queue_p95_s: float | None = None
    """p95 of the time requests waited in the engines' queues before they ran, seconds; None
    when none was admitted in the window: `histogram_quantile(0.95, sum by (le)
    (rate(vllm:request_queue_time_seconds_bucket{<role>}[$w])))`. Advice reads it."""
    prefill_p95_s: float | None = None
    """p95 of the time requests spent prefilling once admitted, seconds (the same quantile of
    `vllm:request_prefill_time_seconds`). Beside `queue_p95_s`, it tells queueing from service
    time in the engines' share of TTFT."""

    @property
    def mean_running_requests(self) -> float:
        """Sequences running, over the rate window where the engines measured it, else now."""
        return self.running_seconds_per_s or self.running_requests

    @property
    def decode_steps_per_s(self) -> float:
        """Decode steps a replica takes per second while it decodes: one over the mean time
        between tokens, else (not measured) the output tokens each running sequence gets per
        second now; 0 with nothing decoding."""
        if self.inter_token_mean_s:
            return 1.0 / self.inter_token_mean_s
        if self.running_requests > 0:
            return self.generation_tokens_per_s / self.running_requests
        return 0.0

    def __post_init__(self) -> None:
        if self.ready_replicas < 0:
            raise ValueError(f"ready_replicas must be >= 0 (got {self.ready_replicas})")
        _check_non_negative(
            "RoleMetrics",
            running_requests=self.running_requests,
            running_seconds_per_s=self.running_seconds_per_s,
            inter_token_mean_s=self.inter_token_mean_s,
            waiting_requests=self.waiting_requests,
            kv_cache_usage=self.kv_cache_usage,
            prompt_tokens_per_s=self.prompt_tokens_per_s,
            generation_tokens_per_s=self.generation_tokens_per_s,
            prefix_blocks_per_s=self.prefix_blocks_per_s,
            prefix_blocks_seen_per_s=self.prefix_blocks_seen_per_s,
            queue_p95_s=self.queue_p95_s,
            prefill_p95_s=self.prefill_p95_s,
        )
        if self.kv_cache_usage > 1:
            raise ValueError(f"kv_cache_usage is a fraction, 0..1 (got {self.kv_cache_usage})")


@dataclass(frozen=True)
class ServiceMetrics:
    """What the router measured for the whole InferenceService, per request."""

    requests_per_s: float
    """Requests completed per second, of every outcome:
    `sum(rate(inferfleet_router_requests_total{service="$S"}[$w]))`."""
    in_flight_requests: float
    """Requests accepted and not yet finished (queued or running):
    `sum(inferfleet_router_in_flight_requests{service="$S"})`."""
    attainment: float | None = None
    """Fraction of completed requests that met both targets, None when none completed:
    `sum(rate(inferfleet_router_requests_total{service="$S",outcome="met"}[$w]))
    / sum(rate(inferfleet_router_requests_total{service="$S"}[$w]))`.
    Outcomes: met, missed_ttft, missed_tpot, missed_both, failed."""
    ttft_p95_s: float | None = None
    """p95 time to first token, seconds:
    `histogram_quantile(0.95, sum by (le) (rate(inferfleet_router_ttft_seconds_bucket
    {service="$S"}[$w])))`."""
    tpot_p95_s: float | None = None
    """p95 time per output token after the first, seconds:
    `histogram_quantile(0.95, sum by (le) (rate(inferfleet_router_tpot_seconds_bucket
    {service="$S"}[$w])))`."""
    ttft_p99_s: float | None = None
    """p99 time to first token, seconds (read when the attainment target is 99% or more):
    `histogram_quantile(0.99, sum by (le) (rate(inferfleet_router_ttft_seconds_bucket
    {service="$S"}[$w])))`."""
    tpot_p99_s: float | None = None
    """p99 time per output token, seconds:
    `histogram_quantile(0.99, sum by (le) (rate(inferfleet_router_tpot_seconds_bucket
    {service="$S"}[$w])))`."""
    mean_prompt_tokens: float | None = None
    """Mean prompt length of completed requests:
    `sum(rate(inferfleet_router_prompt_tokens_total{service="$S"}[$w]))
    / sum(rate(inferfleet_router_requests_total{service="$S"}[$w]))`."""
    mean_squared_prompt_tokens: float | None = None
    """Mean of the squared prompt lengths of completed requests (with the mean, their spread,
    which the prefill queue's wait depends on):
    `sum(rate(inferfleet_router_prompt_tokens_squared_total{service="$S"}[$w]))
    / sum(rate(inferfleet_router_requests_total{service="$S"}[$w]))`."""
    mean_output_tokens: float | None = None
    """Mean output length of completed requests:
    `sum(rate(inferfleet_router_output_tokens_total{service="$S"}[$w]))
    / sum(rate(inferfleet_router_requests_total{service="$S"}[$w]))`."""
    arrivals_per_s: float | None = None
    """Requests arriving per second (counted at arrival, not at the end: the fast path):
    `sum(rate(inferfleet_router_arrivals_total{service="$S"}[$w]))`; None from a router
    without the counter."""
    mean_arrival_prompt_tokens: float | None = None
    """Mean prompt length of arriving requests, as the router estimates it:
    `sum(rate(inferfleet_router_arrival_prompt_tokens_total{service="$S"}[$w]))
    / sum(rate(inferfleet_router_arrivals_total{service="$S"}[$w]))`."""
    recent_arrivals_per_s: float | None = None
    """Requests arriving per second over the short window `$r`
    (`MetricsSnapshot.recent_window_s`): a step in the load shows here a few scrapes after it
    happens, where the rate window `$w` still averages it with the load before it:
    `sum(rate(inferfleet_router_arrivals_total{service="$S"}[$r]))`; None from a router
    without the counter."""
    waiting_for_replicas: float = 0.0
    """Requests the router holds because a pool they need has no replica (a service scaled
    to zero, while it wakes): `sum(inferfleet_router_waiting_for_replicas{service="$S"})`, or
    the count a router pushed since the last scrape when it is larger (a wake does not wait
    for a scrape)."""

    def __post_init__(self) -> None:
        _check_non_negative(
            "ServiceMetrics",
            requests_per_s=self.requests_per_s,
            in_flight_requests=self.in_flight_requests,
            attainment=self.attainment,
            ttft_p95_s=self.ttft_p95_s,
            tpot_p95_s=self.tpot_p95_s,
            ttft_p99_s=self.ttft_p99_s,
            tpot_p99_s=self.tpot_p99_s,
            mean_prompt_tokens=self.mean_prompt_tokens,
            mean_squared_prompt_tokens=self.mean_squared_prompt_tokens,
            mean_output_tokens=self.mean_output_tokens,
            arrivals_per_s=self.arrivals_per_s,
            mean_arrival_prompt_tokens=self.mean_arrival_prompt_tokens,
            recent_arrivals_per_s=self.recent_arrivals_per_s,
            waiting_for_replicas=self.waiting_for_replicas,
        )
        if self.attainment is not None and self.attainment > 1:
            raise ValueError(f"attainment is a fraction, 0..1 (got {self.attainment})")


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one policy tick reads, taken at one instant."""

    taken_at_s: float
    """When the snapshot was taken, on a monotonic (live) or virtual (simulated) clock."""
    window_s: float
    """The rate window `$w` of every `rate(...)` above, in seconds."""
    newest_sample_age_s: float
    """Seconds between the newest sample behind the snapshot and `taken_at_s`:
    `time() - max(timestamp(inferfleet_router_in_flight_requests{service="$S"}))`.
    A scrape that stopped shows up here before it shows up anywhere else."""
    service: ServiceMetrics
    roles: Mapping[Role, RoleMetrics] = field(default_factory=dict)
    """The engine metrics of each role that has replicas (aggregated, or prefill and decode)."""
    recent_window_s: float | None = None
    """The short window `$r` of `ServiceMetrics.recent_arrivals_per_s`, in seconds (None:
    not measured)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.taken_at_s):
            raise ValueError(f"taken_at_s must be finite (got {self.taken_at_s})")
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"window_s must be > 0 (got {self.window_s})")
        recent = self.recent_window_s
        if recent is not None and not (0 < recent <= self.window_s):
            raise ValueError(f"recent_window_s must be in (0, window_s] (got {recent})")
        _check_non_negative("MetricsSnapshot", newest_sample_age_s=self.newest_sample_age_s)
        for role, metrics in self.roles.items():
            if metrics.role != role:
                raise ValueError(f"roles[{role.value}] holds the metrics of {metrics.role.value}")

    def role(self, role: Role) -> RoleMetrics | None:
        return self.roles.get(role)
