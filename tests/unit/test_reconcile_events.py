"""Events named by the occurrence they report: computed twice, posted once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from inferfleet.reconcile.events import MESSAGE_LIMIT, Event, event_name, event_object

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _about(resource_version: str = "41", uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {
            "name": "qwen",
            "namespace": "team-a",
            "uid": uid,
            "resourceVersion": resource_version,
        },
    }


def test_one_occurrence_has_one_name_and_another_occurrence_another() -> None:
    event = Event("RolloutStalled", "pods are not ready", warning=True)
    assert event_name(_about(), event) == event_name(_about(), event)
    # The same words about a later state, or about another object of the same name, are new.
    assert event_name(_about("42"), event) != event_name(_about(), event)
    assert event_name(_about(uid="u-2"), event) != event_name(_about(), event)
    assert event_name(_about(), Event("RolloutStalled", "other")) != event_name(_about(), event)


def test_an_occurrence_named_by_the_caller_does_not_follow_the_resource_version() -> None:
    event = Event("Applied", "generation 2: Deployment/qwen", occurrence="generation 2")
    assert event_name(_about("41"), event) == event_name(_about("57"), event)
    assert event_name(_about(), event) != event_name(
        _about(), Event("Applied", "generation 3: Deployment/qwen", occurrence="generation 3")
    )


def test_the_event_object_is_a_valid_core_event_about_the_object() -> None:
    long_name = "m" * 253
    about = _about()
    about["metadata"]["name"] = long_name
    obj = event_object(
        about, Event("SpecNotApplied", "x" * 5000, warning=True), now=NOW, instance="op-0"
    )
    assert len(obj["metadata"]["name"]) <= 253
    assert obj["metadata"]["name"].startswith("m" * 200 + ".")
    assert obj["type"] == "Warning"
    assert len(obj["message"]) == MESSAGE_LIMIT
    assert obj["involvedObject"] == {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "name": long_name,
        "namespace": "team-a",
        "uid": "u-1",
    }
    assert obj["firstTimestamp"] == obj["lastTimestamp"] == "2026-11-23T12:00:00Z"
    assert obj["count"] == 1
    assert (
        event_object(_about(), Event("Pinned", "m"), now=NOW, instance="op-0")["type"] == "Normal"
    )
