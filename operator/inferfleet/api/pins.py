"""SRE pins: fixed replicas per role, with a reason and an expiry, set as an annotation so that
the spec (owned by Git) stays untouched:

    kubectl annotate modeldeployment llama inferfleet.io/pin='{"replicas": {"decode": 6},
      "reason": "INC-1234 launch traffic", "until": "2026-11-22T06:00:00Z"}'

The operator honours a valid, unexpired pin over the spec and any autoscaler, says so in status
and Events, and returns to the spec when it expires. A pin that breaks any rule is ignored as a
whole (never applied in part), with the field, the value and the rule in the warning.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, Strict, ValidationError

from inferfleet.api.common import MAX_REPLICAS
from inferfleet.api.model_deployment import Role

PIN_ANNOTATION = "inferfleet.io/pin"

# A pin is an incident's override of Git and of the autoscaler. A week spans a weekend and an
# on-call handover; a hold longer than that belongs in the spec, where it is reviewed, rather
# than in an annotation that is easily forgotten.
MAX_PIN_DURATION = timedelta(days=7)

# The longest value quoted back in a refusal (an Event message must stay readable).
_QUOTED_CHARS = 80

ReplicaCount = Annotated[int, Field(ge=0, le=MAX_REPLICAS)]


class Pin(BaseModel):
    # Strict, as the API's own types are: `true`, `"4"` and `4.0` are not replica counts.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Role names arrive as JSON strings: the enum opts out of strictness to accept them.
    replicas: dict[Annotated[Role, Strict(False)], ReplicaCount] = Field(min_length=1)
    reason: str = Field(min_length=1, max_length=1024, pattern=r"\S")
    until: AwareDatetime

    def active(self, now: datetime) -> bool:
        return now < self.until

    def describe(self) -> str:
        counts = ", ".join(f"{role.value}={n}" for role, n in sorted(self.replicas.items()))
        return f"pinned {counts} until {self.until.isoformat()}: {self.reason}"


def _quoted(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 3] + "..."


def _problems(error: ValidationError) -> str:
    described = []
    for problem in error.errors():
        # A refused role name is reported at its place, replicas.<name>, not pydantic's [key].
        field = ".".join(str(part) for part in problem["loc"] if part != "[key]") or "pin"
        got = "" if problem["type"] == "missing" else f" (got {_quoted(problem['input'])})"
        described.append(f"{field}: {problem['msg']}{got}")
    return "; ".join(described)


@dataclass(frozen=True)
class PinLimits:
    """What the InferenceService that autoscales the deployment allows: a pin overrides its
    decisions, never its bounds or its GPU budget (a pin past them is a typo or belongs in
    the service's spec, where it is reviewed)."""

    service: str
    max_replicas: Mapping[Role, int]
    gpus_per_replica: int
    gpu_budget: int | None = None

    def problem(self, pin: Pin) -> str | None:
        for role, n in sorted(pin.replicas.items()):
            most = self.max_replicas.get(role)
            if most is not None and n > most:
                return (
                    f"replicas.{role.value}: {n} is more than maxReplicas {most} of "
                    f"InferenceService {self.service}, which autoscales this deployment"
                )
        gpus = sum(pin.replicas.values()) * self.gpus_per_replica
        if self.gpu_budget is not None and gpus > self.gpu_budget:
            return (
                f"replicas: {gpus} GPUs ({self.gpus_per_replica} per replica) is more than the "
                f"gpuBudget {self.gpu_budget} of InferenceService {self.service}"
            )
        return None


def read_pin(
    annotations: Mapping[str, str],
    *,
    roles: Collection[Role],
    now: datetime,
    limits: PinLimits | None = None,
) -> tuple[Pin | None, str | None]:
    """The pin in the annotations (None when absent), or why it is ignored. `roles` are the
    deployment's own: a pin may name no other. An expired pin is returned (it is simply not
    active); one that would last past `now` + MAX_PIN_DURATION is refused, and so is one past
    the `limits` of the service that autoscales the deployment."""
    text = annotations.get(PIN_ANNOTATION)
    if text is None:
        return None, None
    try:
        pin = Pin.model_validate_json(text)
    except ValidationError as error:
        return None, f"{PIN_ANNOTATION} ignored: {_problems(error)}"
    foreign = sorted(set(pin.replicas) - set(roles))
    if foreign:
        names = ", ".join(role.value for role in foreign)
        has = ", ".join(sorted(role.value for role in roles)) or "none"
        return None, (
            f"{PIN_ANNOTATION} ignored: replicas: a pin may only name the deployment's roles "
            f"({has}) (got {names})"
        )
    latest = now + MAX_PIN_DURATION
    if pin.until > latest:
        return None, (
            f"{PIN_ANNOTATION} ignored: until: a pin may last at most {MAX_PIN_DURATION.days} "
            f"days, to {latest.isoformat(timespec='seconds')} at the latest "
            f"(got {pin.until.isoformat()})"
        )
    beyond = limits.problem(pin) if limits is not None else None
    if beyond is not None:
        return None, f"{PIN_ANNOTATION} ignored: {beyond}"
    return pin, None
