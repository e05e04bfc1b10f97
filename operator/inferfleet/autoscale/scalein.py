"""Which engine pods a scale-in removes: those that hold the fewest requests, so that the fewest
streams wait out a drain (and none outlasts the grace period).

A Deployment's ReplicaSet removes, among ready pods, those with the lowest
`controller.kubernetes.io/pod-deletion-cost` first. When a tick shrinks a role, the operator
sets each of that role's pods' cost to the requests it holds (running and queued, as
Prometheus last scraped them: `snapshot.POD_IN_FLIGHT_QUERY`) just before it writes the
decision that lowers the replicas. Pure: the query's answer in, the annotations out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MAX_COST = 2**31 - 1
"""The annotation is an int32."""


def deletion_costs(series: Sequence[tuple[Mapping[str, str], float]]) -> dict[str, int]:
    """Per pod, its deletion cost: the requests it holds, rounded (pods without a `pod` label
    are left out)."""
    costs: dict[str, int] = {}
    for labels, value in series:
        pod = labels.get("pod")
        if pod:
            costs[pod] = min(MAX_COST, max(0, round(value)))
    return costs


def cost_patch(cost: int) -> dict[str, object]:
    """The merge patch that sets a pod's deletion cost."""
    return {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
