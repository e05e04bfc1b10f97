"""The router's Prometheus series: each request's SLO outcome, measured where users see it.

Engine histograms give TTFT and TPOT separately; whether a request met the SLO needs both for
the same request, so the router counts outcomes itself. Every series carries `service` (the
InferenceService); the controller reads, over a window `w`:

* attainment: `sum(rate(inferfleet_router_requests_total{service="S",outcome="met"}[w]))
  / sum(rate(inferfleet_router_requests_total{service="S"}[w]))`;
* goodput: the numerator alone (requests per second that met the SLO);
* p95 TTFT / TPOT: `histogram_quantile(0.95, sum by (le) (rate(
  inferfleet_router_ttft_seconds_bucket{service="S"}[w])))` (and `..._tpot_seconds_...`);
* the mix: `rate(inferfleet_router_prompt_tokens_total[w])` and `..._output_tokens_total`
  over the request rate, and the prompts' spread from `..._prompt_tokens_squared_total`;
* how much prompts repeat a recent prompt's prefix:
  `rate(inferfleet_router_prefix_blocks_seen_total[w]) / rate(..._prefix_blocks_total[w])`.

Per tenant (with tenants, `router.tenants`): finished requests by outcome
(`inferfleet_router_tenant_requests_total{service,tenant,outcome}`), their prompt and output
tokens (`inferfleet_router_tenant_tokens_total{service,tenant,kind}`, kind `prompt` or
`output`) and the requests refused over the tenant's limits or models
(`inferfleet_router_tenant_rejected_requests_total{service,tenant,reason}`): usage, and each
tenant's attainment, from the router that served it.

`role` on the per-role series: `aggregated`, or `prefill` and `decode` for a disaggregated
pair, so time spent in each pool is visible (`inferfleet_router_upstream_seconds`: prefill =
the prefill call, decode and aggregated = time to the first token of that call).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inferfleet.slo import TPOT_BUCKETS_S, TTFT_BUCKETS_S, Outcome

E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


@dataclass(frozen=True, slots=True)
class Finished:
    """A request judged against the SLO, as its series count it."""

    deployment: str
    outcome: Outcome
    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None
    prompt_tokens: int | None
    """The engine's count; None when it reported none."""
    output_tokens: int
    tenant: str | None = None
    prompt_tokens_estimate: int | None = None
    """The router's own count of the prompt, for a request the engine reported none for."""


class RouterMetrics:
    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.service = service
        labels = ("service", "deployment")
        self.requests = Counter(
            "inferfleet_router_requests",
            "Requests finished, by SLO outcome: met, missed_ttft, missed_tpot, missed_both, "
            "failed (an error answered, or a stream cut).",
            (*labels, "outcome"),
            registry=self.registry,
        )
        self.cancelled = Counter(
            "inferfleet_router_cancelled_requests",
            "Requests the client abandoned before the answer ended (not judged).",
            labels,
            registry=self.registry,
        )
        self.rejected = Counter(
            "inferfleet_router_rejected_requests",
            "Requests answered without reaching a replica, by reason.",
            ("service", "reason"),
            registry=self.registry,
        )
        self.ttft = Histogram(
            "inferfleet_router_ttft_seconds",
            "Time to first token, from the request's arrival at the router.",
            labels,
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "inferfleet_router_tpot_seconds",
            "Time per output token after the first, per request of two tokens or more.",
            labels,
            buckets=TPOT_BUCKETS_S,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "inferfleet_router_e2e_seconds",
            "Time from arrival to the end of the answer.",
            labels,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.arrivals = Counter(
            "inferfleet_router_arrivals",
            "Requests accepted and routed to a deployment, counted as they arrive (the load now, "
            "where finished requests show it only once they end).",
            labels,
            registry=self.registry,
        )
        self.arrival_prompt_tokens = Counter(
            "inferfleet_router_arrival_prompt_tokens",
            "Prompt tokens of arriving requests as the router estimates them (characters / 4; "
            "token ids exactly): the prompt mix now, before any of it finishes.",
            labels,
            registry=self.registry,
        )
        self.prefix_blocks = Counter(
            "inferfleet_router_prefix_blocks",
            "Leading blocks of the prompts sent to be prefilled (the first 64 blocks of a "
            "prompt, as the router hashes them for affinity).",
            (*labels, "role"),
            registry=self.registry,
        )
        self.prefix_blocks_seen = Counter(
            "inferfleet_router_prefix_blocks_seen",
            "Of those, the leading blocks that a prompt sent to the same pool recently began "
            "with: the share of prompts a prefix cache could serve, whether or not the "
            "engines keep one.",
            (*labels, "role"),
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "inferfleet_router_prompt_tokens",
            "Prompt tokens of finished requests, as the engine reported them, or as the router "
            "estimates them where it reported none (a failed request): with the requests, the "
            "mean prompt length of the load, failures included.",
            labels,
            registry=self.registry,
        )
        self.prompt_tokens_squared = Counter(
            "inferfleet_router_prompt_tokens_squared",
            "Sum of the squared prompt lengths of finished requests: with the prompt tokens and "
            "the requests, how widely prompt lengths spread (the prefill queue waits on it).",
            labels,
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "inferfleet_router_output_tokens",
            "Output tokens sent to clients.",
            labels,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "inferfleet_router_in_flight_requests",
            "Requests between arrival and the end of their answer.",
            ("service",),
            registry=self.registry,
        )
        self.waiting_for_replicas = Gauge(
            "inferfleet_router_waiting_for_replicas",
            "Requests held because no replica of a deployment they may go to serves (a service "
            "scaled to zero, while it wakes): the autoscaler wakes the service on it.",
            ("service",),
            registry=self.registry,
        )
        self.upstream = Histogram(
            "inferfleet_router_upstream_seconds",
            "Per role: a prefill call's duration, or the time to first token of a serving call.",
            (*labels, "role"),
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "inferfleet_router_upstream_errors",
            "Failed calls to replicas, by role and kind (connect, status, stream, handoff; key: "
            "the engine refused the key presented, as engines not restarted since a key "
            "rotation refuse the new one).",
            (*labels, "role", "kind"),
            registry=self.registry,
        )
        self.retries = Counter(
            "inferfleet_router_retries",
            "Calls sent again to another replica (only before anything reached the client).",
            (*labels, "role"),
            registry=self.registry,
        )
        self.replicas = Gauge(
            "inferfleet_router_replicas",
            "Replicas known per role, by health.",
            (*labels, "role", "state"),
            registry=self.registry,
        )
        tenant = ("service", "tenant")
        self.tenant_requests = Counter(
            "inferfleet_router_tenant_requests",
            "Requests finished per tenant, by SLO outcome (as inferfleet_router_requests).",
            (*tenant, "outcome"),
            registry=self.registry,
        )
        self.tenant_tokens = Counter(
            "inferfleet_router_tenant_tokens",
            "Tokens per tenant of the requests finished: kind prompt or output.",
            (*tenant, "kind"),
            registry=self.registry,
        )
        self.tenant_rejected = Counter(
            "inferfleet_router_tenant_rejected_requests",
            "Requests of a tenant refused over its limits (rate_limited) or models (forbidden).",
            (*tenant, "reason"),
            registry=self.registry,
        )
        self.in_flight.labels(service).set(0)
        self.waiting_for_replicas.labels(service).set(0)

    def declare_tenant(self, tenant: str) -> None:
        """Create a tenant's series at zero (see `declare`)."""
        for outcome in Outcome:
            self.tenant_requests.labels(self.service, tenant, outcome.value)
        for kind in ("prompt", "output"):
            self.tenant_tokens.labels(self.service, tenant, kind)

    def declare(self, deployment: str) -> None:
        """Create a deployment's outcome series at zero, so that `rate()` and `increase()`
        see the first request of each outcome (a series born at 1 hides it)."""
        for outcome in Outcome:
            self.requests.labels(self.service, deployment, outcome.value)
        for series in (self.cancelled, self.ttft, self.tpot, self.e2e):
            series.labels(self.service, deployment)
        for series in (
            self.prompt_tokens,
            self.prompt_tokens_squared,
            self.output_tokens,
            self.arrivals,
            self.arrival_prompt_tokens,
        ):
            series.labels(self.service, deployment)

    def finished(self, request: Finished) -> None:
        labels = (self.service, request.deployment)
        self.requests.labels(*labels, request.outcome.value).inc()
        self.e2e.labels(*labels).observe(request.e2e_s)
        if request.ttft_s is not None:
            self.ttft.labels(*labels).observe(request.ttft_s)
        if request.tpot_s is not None:
            self.tpot.labels(*labels).observe(request.tpot_s)
        prompt = request.prompt_tokens
        if prompt is None:
            prompt = request.prompt_tokens_estimate
        if prompt is not None:
            self.prompt_tokens.labels(*labels).inc(prompt)
            self.prompt_tokens_squared.labels(*labels).inc(prompt**2)
        if request.output_tokens:
            self.output_tokens.labels(*labels).inc(request.output_tokens)
        if request.tenant is None:
            return
        per_tenant = (self.service, request.tenant)
        self.tenant_requests.labels(*per_tenant, request.outcome.value).inc()
        if request.prompt_tokens is not None:
            self.tenant_tokens.labels(*per_tenant, "prompt").inc(request.prompt_tokens)
        if request.output_tokens:
            self.tenant_tokens.labels(*per_tenant, "output").inc(request.output_tokens)
