"""Names held and objects refused, remembered per namespace until it is time to try again."""

from __future__ import annotations

from inferfleet.reconcile.desired import ObjectKey
from inferfleet.reconcile.held import RECHECK_S, HeldBack

SERVICE = ObjectKey("v1", "Service", "llama-aggregated")
DEPLOYMENT = ObjectKey("apps/v1", "Deployment", "llama-aggregated")


def test_each_is_held_in_its_namespace_until_the_recheck() -> None:
    now = [0.0]
    held = HeldBack(clock=lambda: now[0])
    held.foreign("a", SERVICE)
    held.refused("a", DEPLOYMENT, "exceeded quota")
    assert held.in_namespace("a") == (frozenset({SERVICE}), {DEPLOYMENT: "exceeded quota"})
    assert held.in_namespace("b") == (frozenset(), {})
    now[0] = RECHECK_S - 1
    held.refused("a", DEPLOYMENT, "denied by policy")  # the latest refusal, held anew
    assert held.in_namespace("a") == (frozenset({SERVICE}), {DEPLOYMENT: "denied by policy"})
    now[0] = RECHECK_S
    assert held.in_namespace("a") == (frozenset(), {DEPLOYMENT: "denied by policy"})
    now[0] = 2 * RECHECK_S
    assert held.in_namespace("a") == (frozenset(), {})
