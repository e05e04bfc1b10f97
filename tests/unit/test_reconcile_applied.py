"""Read your own writes for created objects: what an apply stored stands in for the index's
older view until the index shows that version, the object goes, or the hold ends."""

from __future__ import annotations

from inferfleet.reconcile.applied import HOLD_S, AppliedChildren
from inferfleet.reconcile.desired import Child, ObjectKey

DEPLOYMENT = ObjectKey("apps/v1", "Deployment", "llama-aggregated")
SERVICE = ObjectKey("v1", "Service", "llama-aggregated")


def child(key: ObjectKey, applied_hash: str, owner: str = "uid-1") -> Child:
    return Child(key=key, owner_uid=owner, applied_hash=applied_hash)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_applied_child_the_index_lacks_or_holds_older_is_seen_as_applied() -> None:
    written = AppliedChildren()
    written.record("ns", child(DEPLOYMENT, "new"), "12")
    written.record("ns", child(SERVICE, "s"), "13")
    indexed = [child(DEPLOYMENT, "old")]
    assert written.children("ns", "uid-1", indexed) == [
        child(DEPLOYMENT, "new"),
        child(SERVICE, "s"),
    ]
    # Another owner's view is its own.
    assert written.children("ns", "uid-2", []) == []


def test_the_index_is_read_again_once_it_shows_the_applied_version_or_the_object_goes() -> None:
    written = AppliedChildren()
    written.record("ns", child(DEPLOYMENT, "new"), "12")
    written.record("ns", child(SERVICE, "s"), "13")
    written.seen("ns", child(DEPLOYMENT, "old"), "11", gone=False)  # an older event: held
    assert child(DEPLOYMENT, "new") in written.children("ns", "uid-1", [])
    written.seen("ns", child(DEPLOYMENT, "new"), "12", gone=False)
    written.seen("ns", child(SERVICE, "s"), "13", gone=True)
    assert written.children("ns", "uid-1", []) == []


def test_where_the_index_holds_the_applied_hash_its_view_is_taken() -> None:
    written = AppliedChildren()
    written.record(
        "ns", Child(key=DEPLOYMENT, owner_uid="uid-1", applied_hash="h", replicas=2), "12"
    )
    scaled_by_hand = Child(key=DEPLOYMENT, owner_uid="uid-1", applied_hash="h", replicas=5)
    assert written.children("ns", "uid-1", [scaled_by_hand]) == [scaled_by_hand]


def test_a_version_the_watch_never_shows_is_held_for_a_while_only() -> None:
    clock = Clock()
    written = AppliedChildren(clock)
    written.record("ns", child(DEPLOYMENT, "new"), "12")
    clock.now += HOLD_S / 2
    assert written.children("ns", "uid-1", []) == [child(DEPLOYMENT, "new")]
    clock.now += HOLD_S
    assert written.children("ns", "uid-1", []) == []
