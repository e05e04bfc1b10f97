"""Which pods a scale-in removes first (`autoscale.scalein`), and how the operator says so."""

from __future__ import annotations

from typing import Any

import pytest

from inferfleet.autoscale.scalein import DELETION_COST_ANNOTATION, cost_patch, deletion_costs
from inferfleet.reconcile.controller import Controller
from inferfleet.render import InstallSettings


def test_a_pods_cost_is_the_requests_it_holds_within_an_int32() -> None:
    series = [
        ({"pod": "a"}, 2.6),
        ({"pod": "b"}, -1.0),
        ({"pod": "c"}, 1e12),
        ({"namespace": "llm"}, 4.0),
    ]
    assert deletion_costs(series) == {"a": 3, "b": 0, "c": 2**31 - 1}
    assert cost_patch(3) == {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "3"}}}


class _Pods:
    def __init__(self) -> None:
        self.patched: list[tuple[str, str, dict[str, Any]]] = []

    def merge_patch(
        self, api_version: str, kind: str, name: str, namespace: str, body: dict[str, Any]
    ) -> None:
        assert (api_version, kind) == ("v1", "Pod")
        if name == "gone":
            raise LookupError("pods gone not found")
        self.patched.append((namespace, name, body))


def test_the_operator_sets_each_cost_and_a_pod_gone_stops_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = _Pods()
    monkeypatch.setattr("inferfleet.reconcile.controller.kube", lambda: pods)
    controller = Controller({}, install=InstallSettings(), autoscaler=None)
    controller._set_deletion_costs("llm", {"gone": 1, "busy": 5, "idle": 0})
    assert pods.patched == [("llm", "busy", cost_patch(5)), ("llm", "idle", cost_patch(0))]
