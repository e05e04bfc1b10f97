"""How a rollout replaces a ModelDeployment's replicas (`spec.rollout`)."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from inferfleet.api.common import MAX_REPLICAS, CrossFieldRule, WireModel

DEFAULT_DRAIN_SECONDS: Final = 50
MAX_DRAIN_SECONDS: Final = 24 * 3600


class RolloutSpec(WireModel):
    """How a change of the pods' template replaces a pool's replicas."""

    max_surge: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Replicas started above the pool's count while old ones are replaced: each "
        "holds GPUs of its own. 0: no spare GPU is needed, and up to maxUnavailable replicas "
        "stop serving at a time (the autoscaler's advice says when the load then misses the "
        "SLO).",
    )
    max_unavailable: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description="Replicas that may stop serving at a time during a rollout.",
    )
    drain_seconds: int = Field(
        default=DEFAULT_DRAIN_SECONDS,
        ge=0,
        le=MAX_DRAIN_SECONDS,
        description="How long a replica that goes away (a rollout, a scale-in, a node drain) "
        "keeps serving the streams it holds once the routers stop sending it requests, before "
        "those still running are cut: the engine's own drain timeout (vLLM's "
        "--shutdown-timeout), within the pod's grace. Longer streams need more; every replica "
        "going away holds its GPUs that long at most.",
    )


ROLLOUT_RULES: tuple[CrossFieldRule[RolloutSpec], ...] = (
    CrossFieldRule(
        cel="self.maxSurge + self.maxUnavailable >= 1",
        message="a rollout needs a spare replica (maxSurge) or one it may take down "
        "(maxUnavailable): both 0 would never progress",
        holds=lambda r: r.max_surge + r.max_unavailable >= 1,
        field_path=".maxUnavailable",
    ),
)
RolloutSpec.cross_field_rules = ROLLOUT_RULES
