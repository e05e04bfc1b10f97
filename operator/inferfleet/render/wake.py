"""The wake signal of a service that may be at zero replicas: how its router tells the
autoscaler at once that requests wait for a replica, without waiting for a scrape.

The operator renders one ConfigMap per such InferenceService (owned by it, labelled as the
router's objects are, `wake_config_map_name`) and lets the router's Role `get` and `patch`
that one ConfigMap by name, and nothing else. The router writes, by merge patch, the count of
requests it holds, its pod's name and the moment (`push_body`): when the first request is
held, every `WAKE_RENEW_S` while any is, and when none is left. The operator already watches
the ConfigMaps it renders; it ticks the service's autoscaler at once when a fresh count is
above zero (`pushed_wait`).

A ConfigMap rather than a Lease: the operator holds write access to the ConfigMaps of the
namespaces it watches already (the engines' configuration), where write access to Leases
cluster-wide would let it take over other controllers' leader elections. The operator's
apply sets the ConfigMap's metadata only; its data is the router's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from inferfleet.render.common import dns_label

WAITING_KEY: Final = "waitingForReplicas"
HOLDER_KEY: Final = "router"
PUSHED_AT_KEY: Final = "pushedAt"
WAKE_RENEW_S: Final = 5.0
"""How often a router pushes its count again while requests wait (a router that stopped is
not believed after `PUSH_FRESH_S`)."""
PUSH_FRESH_S: Final = 3 * WAKE_RENEW_S


def wake_config_map_name(service: str) -> str:
    return dns_label(f"{service}-router-wake")


@dataclass(frozen=True)
class PushedWait:
    """What a router last pushed: the requests it held, and when."""

    waiting: int
    at: datetime
    router: str

    def fresh(self, now: datetime) -> bool:
        return (now - self.at).total_seconds() <= PUSH_FRESH_S


def pushed_wait(config_map: Mapping[str, Any]) -> PushedWait | None:
    """The count a router pushed, from the ConfigMap as the API server stores it (None: none
    pushed, or not readable)."""
    data = config_map.get("data") or {}
    raw, at = data.get(WAITING_KEY), data.get(PUSHED_AT_KEY)
    if not isinstance(raw, str) or not raw.isdigit() or not isinstance(at, str):
        return None
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        return None
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return PushedWait(int(raw), moment, str(data.get(HOLDER_KEY) or ""))


def push_body(waiting: int, router: str, now: datetime) -> dict[str, Any]:
    """The merge patch a router sends to push `waiting` held requests."""
    return {
        "data": {
            WAITING_KEY: str(max(0, waiting)),
            HOLDER_KEY: router,
            PUSHED_AT_KEY: now.astimezone(UTC).isoformat(timespec="milliseconds"),
        }
    }
