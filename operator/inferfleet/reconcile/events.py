"""Events as objects with a name that says which occurrence they report (pure).

An Event is posted before the status that records its cause is written, under a name derived
from what it reports: the object's uid, the reason, the message and the occurrence (by default
the resourceVersion the outcome was computed from; `Applied` names its generation). An operator
that dies between posting and writing status, or a new leader that takes over there, computes
the same outcome from the same stored object, and its create of the same name is refused as
already there: each occurrence is reported once, none lost, none twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

REPORTING_COMPONENT = "inferfleet-operator"
MESSAGE_LIMIT = 1024
"""What `kubectl describe` shows of a message without wrapping a screen; the API's own limit
is larger, the rest is cut with an ellipsis."""
_NAME_PREFIX_LIMIT = 200  # an object name is at most 253 characters: prefix, dot, digest


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False
    occurrence: str | None = None
    """What makes this one occurrence (posted once however often it is computed); None: the
    object's state it was computed from (its resourceVersion)."""


def event_name(about: Mapping[str, Any], event: Event) -> str:
    """The Event's object name: the same for every computation of one occurrence."""
    metadata = about.get("metadata") or {}
    occurrence = event.occurrence or f"rv {metadata.get('resourceVersion', '')}"
    identity = "\0".join((str(metadata.get("uid", "")), event.reason, event.message, occurrence))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return f"{str(metadata.get('name', 'object'))[:_NAME_PREFIX_LIMIT]}.{digest}"


def event_object(
    about: Mapping[str, Any], event: Event, *, now: datetime, instance: str
) -> dict[str, Any]:
    """The core/v1 Event reporting `event` about the object `about` (as stored)."""
    metadata = about.get("metadata") or {}
    message = event.message
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 1] + "…"
    stamp = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(about, event),
            "namespace": str(metadata.get("namespace", "")),
        },
        "involvedObject": {
            "apiVersion": str(about.get("apiVersion", "")),
            "kind": str(about.get("kind", "")),
            "name": str(metadata.get("name", "")),
            "namespace": str(metadata.get("namespace", "")),
            "uid": str(metadata.get("uid", "")),
        },
        "reason": event.reason,
        "message": message,
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
