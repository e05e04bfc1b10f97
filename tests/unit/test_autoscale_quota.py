"""A namespace's GPU quota shared by priority between the services that autoscale in it
(`autoscale.quota`): what each service's tick may take of the GPUs no pod holds."""

from __future__ import annotations

from inferfleet.autoscale.quota import GpuClaim, quota_share

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
    assert share.left == 1
    assert share.yields_to == (waiting,)


def test_a_lower_priority_service_gives_back_what_a_higher_one_waits_for() -> None:
    # Nothing is left: the batch service holds what the interactive one needs.
    waiting = claim("chat", INTERACTIVE, held=1, wanted=3, missed=True)
    share = quota_share("etl", BATCH, True, 0, [waiting])
    assert share.left == -2
    assert "chat (priority 100000, SLO missed, waits for 2)" in waiting.describe()


def test_a_lower_or_satisfied_claim_holds_nothing_back() -> None:
    claims = [
        claim("etl", BATCH, held=1, wanted=6, missed=True),
        claim("chat", INTERACTIVE, held=4, wanted=4),
        claim("search", INTERACTIVE, held=3, wanted=2),  # shrinking
    ]
    assert quota_share("chat", INTERACTIVE, False, 2, claims).left == 2
    assert quota_share("search", INTERACTIVE, False, 2, claims).left == 2


def test_within_a_priority_a_missed_slo_is_served_first_from_free_gpus_only() -> None:
    missing = claim("chat", BATCH, held=2, wanted=5, missed=True)
    # The other service meets its SLO: it does not grow into the 3 GPUs the first waits for.
    assert quota_share("code", BATCH, False, 4, [missing]).left == 1
    # Nor does it give back what it holds: one tier never trades GPUs back and forth.
    assert quota_share("code", BATCH, False, 1, [missing]).left == 0
    # Both miss: first come, first served.
    assert quota_share("code", BATCH, True, 4, [missing]).left == 4


def test_a_services_own_claim_never_holds_gpus_back_from_it() -> None:
    own = claim("chat", INTERACTIVE, held=1, wanted=4, missed=True)
    assert quota_share("chat", INTERACTIVE, True, 3, [own]).left == 3
