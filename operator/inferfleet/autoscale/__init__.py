"""Autoscaling: the metrics a service is scaled on (`snapshot`) and the pure policy that turns
them into replicas per role (`policy`). Fetching the metrics and applying the decision live
elsewhere (the controller, the fleet simulator), so the same policy drives both."""

from inferfleet.autoscale.policy import (
    Decision,
    LatencyFactors,
    PolicyHistory,
    PolicySpec,
    Reason,
    RoleEstimate,
    RolePolicy,
    decide,
    policy_spec,
)
from inferfleet.autoscale.snapshot import MetricsSnapshot, RoleMetrics, ServiceMetrics

__all__ = [
    "Decision",
    "LatencyFactors",
    "MetricsSnapshot",
    "PolicyHistory",
    "PolicySpec",
    "Reason",
    "RoleEstimate",
    "RoleMetrics",
    "RolePolicy",
    "ServiceMetrics",
    "decide",
    "policy_spec",
]
