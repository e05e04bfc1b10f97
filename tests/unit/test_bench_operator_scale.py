"""The operator-scale benchmark's pure parts: what counts as rolled out and Ready, the audit
log read into requests, the operator-attributable latencies, the bare baseline's Deployments,
and issue 13's goals judged and reported."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from benchmarks.operator_scale.audit import (
    DEPLOYMENT_STATUS,
    INFERENCE_SERVICE_STATUS,
    LATENCY_STEPS,
    MODEL_DEPLOYMENT_STATUS,
    MODEL_DEPLOYMENTS,
    OPERATOR_USER,
    ApiRequest,
    audit_policy,
    audit_request,
    missing_latencies,
    operator_latencies,
)
from benchmarks.operator_scale.report import _goals_table
from benchmarks.operator_scale.stats import distribution, percentile, rolled_out
from benchmarks.operator_scale.summary import goals
from benchmarks.operator_scale.workloads import children, engine_deployments, rendered

from inferfleet.devcluster.cluster import AUDIT_POLICY

NS = "bench-fleet"
ADMIN = "inferfleet-admin"
DEPLOYMENT_CONTROLLER = "system:serviceaccount:kube-system:deployment-controller"


def deployment(*, generation: int = 1, observed: int = 1, ready: int = 1) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"generation": generation},
        "spec": {"replicas": 1},
        "status": {
            "observedGeneration": observed,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": ready,
            "availableReplicas": ready,
        },
    }


def test_percentiles_are_nearest_rank_never_interpolated() -> None:
    values = [float(v) for v in range(1, 201)]
    assert percentile(values, 99) == 198.0
    assert percentile(values, 50) == 100.0
    assert percentile([3.0], 99) == 3.0
    assert distribution([]) is None
    assert distribution([2.0, 1.0]) == {
        "n": 2, "min": 1.0, "p50": 1.0, "p90": 2.0, "p99": 2.0, "max": 2.0
    }  # fmt: skip


def test_a_deployment_is_rolled_out_only_when_its_current_spec_is_all_ready() -> None:
    assert rolled_out(deployment())
    assert not rolled_out(deployment(generation=2, observed=1))
    assert not rolled_out(deployment(ready=0))
    assert not rolled_out({"metadata": {"generation": 1}, "spec": {"replicas": 1}})


def test_an_audit_event_becomes_a_request_with_its_readiness() -> None:
    event = {
        "auditID": "a",
        "stage": "ResponseComplete",
        "verb": "update",
        "user": {"username": DEPLOYMENT_CONTROLLER},
        "objectRef": {
            "apiGroup": "apps",
            "resource": "deployments",
            "subresource": "status",
            "namespace": NS,
            "name": "svc-000-aggregated",
        },
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": "2026-01-01T00:00:01.000001Z",
        "stageTimestamp": "2026-01-01T00:00:01.250000Z",
        "responseObject": deployment(),
    }
    request = audit_request(event)
    assert request.target == DEPLOYMENT_STATUS
    assert request.ready is True
    assert request.done - request.at == pytest.approx(0.249999, abs=1e-6)
    assert audit_request({**event, "responseObject": deployment(ready=0)}).ready is False
    conflict = {**event, "responseStatus": {"code": 409}, "responseObject": {"kind": "Status"}}
    assert audit_request(conflict).ready is None
    assert not audit_request(conflict).succeeded
    core = {**event, "objectRef": {"resource": "services", "name": "x"}}
    assert audit_request(core).target == "core/services"
    assert audit_request(core).ready is None


def test_the_audit_policy_logs_readiness_bodies_first_and_keeps_the_dev_clusters_rules() -> None:
    policy = audit_policy()
    first = policy["rules"][0]
    assert first["level"] == "RequestResponse"
    assert set(first["verbs"]) == {"update", "patch"}
    resources = {r for group in first["resources"] for r in group["resources"]}
    assert resources == {
        "deployments/status", "modeldeployments/status", "inferenceservices/status"
    }  # fmt: skip
    assert policy["rules"][1]["users"] == [OPERATOR_USER]
    assert policy["rules"][2:] == AUDIT_POLICY["rules"]


def request(
    user: str, target: str, name: str, done: float, *, ready: bool | None = None, **extra: Any
) -> ApiRequest:
    fields: dict[str, Any] = {
        "at": done - 0.01, "user": user, "verb": "patch", "target": target, "namespace": NS,
        "name": name, "code": 200, "message": "", "done": done, "ready": ready,
    }  # fmt: skip
    return ApiRequest(**(fields | extra))


def test_operator_latencies_run_from_what_it_waits_for_to_its_answer() -> None:
    engine = "svc-000-aggregated"
    requests = [
        request(ADMIN, MODEL_DEPLOYMENTS, "svc-000", 10.0, code=201),
        request(OPERATOR_USER, MODEL_DEPLOYMENTS, "svc-000", 10.2),  # its own: not a child
        request(OPERATOR_USER, "core/services", engine, 10.4, code=409),  # failed: not applied
        request(OPERATOR_USER, "core/services", engine, 10.5),
        request(OPERATOR_USER, "apps/deployments", engine, 10.7),
        request(DEPLOYMENT_CONTROLLER, DEPLOYMENT_STATUS, engine, 15.0, ready=False),
        request(OPERATOR_USER, MODEL_DEPLOYMENT_STATUS, "svc-000", 16.0, ready=False),
        request(DEPLOYMENT_CONTROLLER, DEPLOYMENT_STATUS, engine, 20.0, ready=True),
        request(DEPLOYMENT_CONTROLLER, DEPLOYMENT_STATUS, engine, 20.1, ready=True),
        request(OPERATOR_USER, MODEL_DEPLOYMENT_STATUS, "svc-000", 20.3, ready=True),
        request(OPERATOR_USER, MODEL_DEPLOYMENT_STATUS, "svc-000", 22.0, ready=True),
        request(OPERATOR_USER, INFERENCE_SERVICE_STATUS, "svc-000", 21.0, ready=True),
        # Another namespace's namesake is another resource.
        request(ADMIN, MODEL_DEPLOYMENTS, "svc-001", 1.0, namespace="elsewhere"),
        request(ADMIN, MODEL_DEPLOYMENTS, "svc-001", 11.0),
    ]
    latencies = operator_latencies(
        requests,
        namespace=NS,
        children={name: children(name, NS) for name in ("svc-000", "svc-001")},
        backends={"svc-000": ["svc-000"], "svc-001": ["svc-001"]},
    )
    created, rolled, backends = LATENCY_STEPS
    assert latencies[created] == {"svc-000": pytest.approx(0.5)}
    assert latencies[rolled] == {"svc-000": pytest.approx(0.3)}
    assert latencies[backends] == {"svc-000": pytest.approx(0.7)}
    assert missing_latencies(latencies, 2, 2) == dict.fromkeys(LATENCY_STEPS, 1)


def test_the_bare_baseline_applies_exactly_the_operators_engine_deployments() -> None:
    documents = list(yaml.safe_load_all(engine_deployments(["svc-000", "svc-001"], "bench-bare")))
    assert [d["metadata"]["name"] for d in documents] == [
        "svc-000-aggregated", "svc-001-aggregated"
    ]  # fmt: skip
    assert documents[0] == next(
        d for d in rendered("svc-000", "bench-bare") if d["kind"] == "Deployment"
    )
    assert all("ownerReferences" not in d["metadata"] for d in documents)
    assert ("apps/deployments", "svc-000-aggregated") in children("svc-000", NS)
    assert ("policy/poddisruptionbudgets", "svc-000-aggregated") in children("svc-000", NS)


def headline(**overrides: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "operator_latency_s": {step: {"p50": 0.1, "p99": 1.9} for step in LATENCY_STEPS},
        "all_ready_s": 65.0,
        "bare_all_rolled_out_s": 50.0,
        "all_ready_x_bare": 1.3,
        "operator_writes_per_resource_rollout": 3.0,
        "operator_cpu_ms_per_reconcile": 20.0,
        "operator_peak_rss_mib": 120.0,
        "operator_writes_steady_minute": 0,
    }
    return figures | overrides


def test_goals_are_judged_at_their_bounds() -> None:
    judged = {g["figure"]: g for g in goals(headline())}
    assert len(judged) == len(LATENCY_STEPS) + 5
    assert all(judged[f"operator latency p99, {step}"]["met"] for step in LATENCY_STEPS)
    assert judged["time to all Ready / bare Deployments' time to all rolled out"]["met"]
    assert judged["operator writes per reconciled resource on create"]["met"]
    assert judged["operator CPU per reconcile"]["met"] is False  # under 20 ms, not at it
    assert judged["operator writes in the idle minute"]["met"]
    slow = headline(
        operator_latency_s={step: {"p50": 1.0, "p99": 2.0} for step in LATENCY_STEPS},
        all_ready_x_bare=None,
        operator_writes_steady_minute=1,
    )
    judged = {g["figure"]: g for g in goals(slow)}
    assert not any(judged[f"operator latency p99, {step}"]["met"] for step in LATENCY_STEPS)
    assert judged["time to all Ready / bare Deployments' time to all rolled out"]["met"] is None
    assert judged["operator writes in the idle minute"]["met"] is False


def test_the_goals_table_prints_each_goal_beside_its_figure() -> None:
    result = {"headline": headline(), "goals": goals(headline())}
    table = "\n".join(_goals_table(result))
    assert "7 of 8 met." in table
    assert "| 65 s / 50 s = 1.3x | <= 1.3 x | met |" in table
    assert "| operator CPU per reconcile | 20 ms | < 20 ms | **not met** |" in table
    assert "| operator writes in the idle minute | 0 | = 0 | met |" in table
    assert f"| operator latency p99, {LATENCY_STEPS[0]} | p50 0.1 s, p99 1.9 s | < 2 s | met |" in (
        table
    )
