"""A namespace's GPU quota shared by priority between the services that autoscale in it
(`autoscale.quota`): what each service's tick may take of the GPUs no pod holds."""

from __future__ import annotations

from typing import Any

from inferfleet.autoscale.quota import GpuClaim, Priorities, quota_share

INTERACTIVE = 100_000
BATCH = 1_000


def claim(service: str, priority: int, *, held: int, wanted: int, missed: bool = False) -> GpuClaim:
    return GpuClaim(service, priority, missed, held, wanted, at_s=0.0)


def test_alone_a_service_may_take_every_gpu_left() -> None:
    share = quota_share("chat", BATCH, False, 3, [claim("chat", BATCH, held=2, wanted=5)])
    assert (share.left, share.yields_to) == (3, ())


def test_a_higher_priority_service_waiting_is_served_before_a_lower_one_grows() -> None:
    waiting = claim("chat", INTERACTIVE, held=2, wanted=5)  # waits for 3
    share = quota_share("etl", BATCH, False, 4, [waiting])
    assert (share.left, share.yields_to) == (1, (waiting,))
    # Nothing left after it: the lower one keeps what its pods hold and grows by nothing.
    share = quota_share("etl", BATCH, True, 2, [waiting])
    assert (share.left, share.yields_to) == (0, (waiting,))
    assert waiting.describe() == "chat (priority 100000, waits for 3)"


def test_claims_ahead_are_served_highest_priority_first_and_all_held_back() -> None:
    top = claim("search", INTERACTIVE + 1, held=0, wanted=1)
    second = claim("chat", INTERACTIVE, held=2, wanted=4, missed=True)
    share = quota_share("etl", BATCH, False, 10, [second, top])
    assert (share.left, share.yields_to) == (7, (top, second))


def test_a_lower_or_satisfied_claim_holds_nothing_back() -> None:
    claims = [
        claim("etl", BATCH, held=1, wanted=6, missed=True),  # lower
        claim("search", INTERACTIVE, held=4, wanted=4),  # satisfied
        claim("code", INTERACTIVE + 1, held=3, wanted=2),  # higher, shrinking
    ]
    assert quota_share("chat", INTERACTIVE, False, 2, claims) == quota_share(
        "chat", INTERACTIVE, False, 2, []
    )
    assert quota_share("chat", INTERACTIVE, False, 2, claims).left == 2


def test_within_a_priority_a_missed_slo_is_served_first() -> None:
    missing = claim("chat", BATCH, held=2, wanted=5, missed=True)
    # The other service meets its SLO: it does not grow into the 3 GPUs the first waits for.
    assert quota_share("code", BATCH, False, 4, [missing]).left == 1
    assert quota_share("code", BATCH, False, 1, [missing]).left == 0
    # Both miss: first come, first served.
    assert quota_share("code", BATCH, True, 4, [missing]).left == 4


def test_a_services_own_claim_never_holds_gpus_back_from_it() -> None:
    own = claim("chat", INTERACTIVE, held=1, wanted=4, missed=True)
    assert quota_share("chat", INTERACTIVE, False, 3, [own]).left == 3
    assert quota_share("chat", BATCH, False, 3, [own]).left == 3


def test_priorities_are_the_classes_values_and_the_global_default() -> None:
    classes: list[dict[str, Any]] = [
        {"metadata": {"name": "interactive"}, "value": 100000},
        {"metadata": {"name": "standard"}, "value": 1000, "globalDefault": True},
        {"metadata": {"name": "broken"}, "value": "high"},
    ]
    priorities = Priorities.of(classes)
    assert priorities.priority("interactive") == 100000
    # No class named: the global default's value, as the API server gives such pods.
    assert priorities.priority(None) == 1000
    # A class not read (or none at all): 0, as for pods without one.
    assert priorities.priority("broken") == 0
    assert Priorities.of([]).priority(None) == 0
