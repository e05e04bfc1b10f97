"""SRE pins: fixed replicas per role, with a reason and an expiry, set as an annotation so that
the spec (owned by Git) stays untouched:

    kubectl annotate modeldeployment llama inferfleet.io/pin='{"replicas": {"decode": 6},
      "reason": "INC-1234 launch traffic", "until": "2026-11-22T06:00:00Z"}'

The operator honours a valid, unexpired pin over the spec and any autoscaler, says so in status
and Events, and returns to the spec when it expires. A malformed pin is ignored with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from inferfleet.api.model_deployment import Role

PIN_ANNOTATION = "inferfleet.io/pin"


class Pin(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: dict[Role, int] = Field(min_length=1)
    reason: str = Field(min_length=1, max_length=1024)
    until: AwareDatetime

    def active(self, now: datetime) -> bool:
        return now < self.until

    def describe(self) -> str:
        counts = ", ".join(f"{role.value}={n}" for role, n in sorted(self.replicas.items()))
        return f"pinned {counts} until {self.until.isoformat()}: {self.reason}"


def read_pin(annotations: Mapping[str, str]) -> tuple[Pin | None, str | None]:
    """The pin in the annotations (None when absent), or why it is ignored."""
    text = annotations.get(PIN_ANNOTATION)
    if text is None:
        return None, None
    try:
        pin = Pin.model_validate_json(text)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'pin'}: {e['msg']}" for e in error.errors()
        )
        return None, f"{PIN_ANNOTATION} ignored: {problems}"
    if any(count < 0 for count in pin.replicas.values()):
        return None, f"{PIN_ANNOTATION} ignored: replica counts cannot be negative"
    return pin, None
