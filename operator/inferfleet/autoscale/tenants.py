"""Usage and cost per tenant, from the router's per-tenant token counters (pure).

A service's GPUs cost what its replicas' GPUs cost an hour, whoever sends the requests. Each
tenant's share is the share of the tokens it was served, weighted as the engines spend on
them: a prompt token at 1, an output token at 2 (each decoded token is a step of its own,
where a prompt is prefilled in chunks), the weights the router's fair share charges too
(`router.fairness`). Idle capacity is shared the same way: the shares add up to the whole
cost, so that a platform team can charge back the GPUs it pays for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferfleet.api.inference_service import TenantCost
from inferfleet.router.fairness import OUTPUT_WEIGHT, PROMPT_WEIGHT

TENANT_TOKENS_QUERY = (
    'sum by (tenant, kind) (rate(inferfleet_router_tenant_tokens_total{namespace="$NS",'
    'service="$S"}[$w]))'
)
"""Each tenant's prompt and output tokens a second, over the rate window."""


@dataclass(frozen=True)
class TenantTokens:
    prompt_per_s: float = 0.0
    output_per_s: float = 0.0

    @property
    def weighted(self) -> float:
        return PROMPT_WEIGHT * self.prompt_per_s + OUTPUT_WEIGHT * self.output_per_s


def tenant_tokens(series: Sequence[tuple[Mapping[str, str], float]]) -> dict[str, TenantTokens]:
    """The answer of `TENANT_TOKENS_QUERY` (labels and value per series) by tenant."""
    found: dict[str, dict[str, float]] = {}
    for labels, value in series:
        tenant, kind = labels.get("tenant"), labels.get("kind")
        if tenant and kind in ("prompt", "output"):
            found.setdefault(tenant, {})[kind] = max(0.0, value)
    return {
        tenant: TenantTokens(kinds.get("prompt", 0.0), kinds.get("output", 0.0))
        for tenant, kinds in found.items()
    }


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    tokens: TenantTokens
    share: float
    cost_per_hour_usd: float

    def to_wire(self) -> dict[str, Any]:
        return TenantCost(
            name=self.tenant,
            prompt_tokens_per_second=round(self.tokens.prompt_per_s, 2),
            output_tokens_per_second=round(self.tokens.output_per_s, 2),
            share=round(self.share, 4),
            cost_per_hour_usd=round(self.cost_per_hour_usd, 4),
        ).model_dump(mode="json", by_alias=True)


def tenant_usage(tokens: Mapping[str, TenantTokens], hourly_usd: float) -> tuple[TenantUsage, ...]:
    """Each tenant's share of the tokens served and of the GPUs' cost an hour, by name;
    nothing when no tenant was served."""
    total = sum(t.weighted for t in tokens.values())
    if total <= 0:
        return ()
    return tuple(
        TenantUsage(name, t, t.weighted / total, hourly_usd * t.weighted / total)
        for name, t in sorted(tokens.items())
    )
