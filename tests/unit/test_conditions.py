"""Conditions as a list keyed by type, written by more than one owner."""

from __future__ import annotations

from datetime import UTC, datetime

from inferfleet.api.conditions import condition, with_condition

EARLIER = datetime(2026, 1, 1, tzinfo=UTC)
LATER = datetime(2026, 1, 2, tzinfo=UTC)


def _ready(status: bool, now: datetime, previous: list[dict[str, object]]) -> dict[str, object]:
    return condition(
        previous, "Ready", status=status, reason="R", message="m", generation=1, now=now
    )


def test_writing_one_type_keeps_the_others_and_their_order() -> None:
    metrics: dict[str, object] = {
        "type": "MetricsAvailable",
        "status": "False",
        "reason": "PrometheusUnavailable",
    }
    ready = _ready(False, EARLIER, [])
    written = with_condition([ready, metrics], _ready(True, LATER, [ready, metrics]))
    assert [c["type"] for c in written] == ["Ready", "MetricsAvailable"]
    assert written[0]["status"] == "True"
    assert written[1] == metrics


def test_a_new_type_is_appended() -> None:
    ready = _ready(True, EARLIER, [])
    metrics = {"type": "MetricsAvailable", "status": "True", "reason": "MetricsFresh"}
    assert with_condition([ready], metrics) == [ready, metrics]
    assert with_condition([], metrics) == [metrics]


def test_the_transition_time_moves_only_when_the_status_flips() -> None:
    first = _ready(True, EARLIER, [])
    same = _ready(True, LATER, [first])
    flipped = _ready(False, LATER, [first])
    assert same["lastTransitionTime"] == first["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert flipped["lastTransitionTime"] == "2026-01-02T00:00:00Z"
