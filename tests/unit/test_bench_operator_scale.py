"""The operator-scale benchmark's pure parts: what counts as rolled out and Ready, the audit
log read into requests, the operator-attributable latencies, the bare baseline's Deployments,
and the operator's scale goals judged and reported."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
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
    FleetObjects,
    Phase,
    audit_policy,
    audit_request,
    missing_latencies,
    operator_latencies,
)
from benchmarks.operator_scale.harness import BareRun, Config, Run
from benchmarks.operator_scale.procfs import MACHINE, CpuSnapshot, timeline
from benchmarks.operator_scale.report import _goals_table, markdown
from benchmarks.operator_scale.stats import distribution, percentile, rolled_out
from benchmarks.operator_scale.summary import goals, summarise
from benchmarks.operator_scale.workloads import (
    all_rendered,
    audit_target,
    children,
    engine_deployments,
    rendered,
)

from inferfleet.devcluster.cluster import AUDIT_POLICY
from inferfleet.devcluster.components import ClientRateLimit

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
    assert request.available is True
    assert request.done - request.at == pytest.approx(0.249999, abs=1e-6)
    starting = audit_request({**event, "responseObject": deployment(ready=0)})
    assert (starting.ready, starting.available) == (False, False)
    conflict = {**event, "responseStatus": {"code": 409}, "responseObject": {"kind": "Status"}}
    assert audit_request(conflict).ready is None
    assert audit_request(conflict).available is None
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
        # Its router: a pod available after the deployment was Ready, so that is the later.
        request(DEPLOYMENT_CONTROLLER, DEPLOYMENT_STATUS, "svc-000-router", 20.4, available=False),
        request(DEPLOYMENT_CONTROLLER, DEPLOYMENT_STATUS, "svc-000-router", 20.5, available=True),
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
        routers={"svc-000": "svc-000-router", "svc-001": "svc-001-router"},
    )
    created, rolled, backends = LATENCY_STEPS
    assert latencies[created] == {"svc-000": pytest.approx(0.5)}
    assert latencies[rolled] == {"svc-000": pytest.approx(0.3)}
    assert latencies[backends] == {"svc-000": pytest.approx(0.5)}
    assert missing_latencies(latencies, 2, 2) == dict.fromkeys(LATENCY_STEPS, 1)


def test_the_rendered_baseline_applies_everything_the_operator_renders() -> None:
    documents = list(yaml.safe_load_all(all_rendered(["svc-000"], "bench-bare-rendered")))
    kinds = sorted(f"{d['kind']} {d['metadata']['name']}" for d in documents)
    assert kinds == sorted(
        [
            "Deployment svc-000-aggregated", "Service svc-000-aggregated",
            "PodDisruptionBudget svc-000-aggregated", "Deployment svc-000-router",
            "Service svc-000", "PodDisruptionBudget svc-000-router",
            "ServiceAccount svc-000-router", "Role svc-000-router", "RoleBinding svc-000-router",
        ]
    )  # fmt: skip
    assert {(audit_target(d), d["metadata"]["name"]) for d in documents} >= children(
        "svc-000", "bench-bare-rendered"
    )
    assert all("ownerReferences" not in d["metadata"] for d in documents)


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


def test_cores_used_are_averaged_per_window_and_the_rest_is_other_processes() -> None:
    samples = [(100.0 + t, {"operator": 0.5 * t, MACHINE: 1.5 * t}) for t in range(21)]
    line = timeline(samples, start=100.0, end=120.0)
    assert line == {
        "from_s": [0.0, 10.0],
        "operator": [0.5, 0.5],
        MACHINE: [1.5, 1.5],
        "other processes": [1.0, 1.0],
    }
    assert timeline(samples, start=200.0, end=210.0) == {}


def snapshot_at(at: float, operator_cpu: float) -> CpuSnapshot:
    return CpuSnapshot(
        at=at,
        processes={"kube-apiserver": at / 10, "operator": operator_cpu},
        system_busy=at,
        benchmark=0.0,
        benchmark_children=0.0,
    )


def audit_line(at: float, user: str, verb: str, ref: dict[str, str], **extra: Any) -> str:
    stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    event = {
        "auditID": f"{at}-{verb}-{ref.get('name')}", "stage": "ResponseComplete", "verb": verb,
        "user": {"username": user}, "objectRef": {"namespace": NS, **ref},
        "responseStatus": {"code": 200}, "requestReceivedTimestamp": stamp,
        "stageTimestamp": stamp,
    }  # fmt: skip
    return json.dumps(event | extra)


def test_a_run_is_summarised_and_reported_with_its_goals(tmp_path: Path) -> None:
    """One service end to end, from a hand-written audit log: the figures, the goals and the
    report's sections."""
    engine = {"apiGroup": "apps", "resource": "deployments", "name": "svc-000-aggregated"}
    router = {"apiGroup": "apps", "resource": "deployments", "name": "svc-000-router"}
    md = {"apiGroup": "inferfleet.io", "resource": "modeldeployments", "name": "svc-000"}
    isvc = {"apiGroup": "inferfleet.io", "resource": "inferenceservices", "name": "svc-000"}
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    logs = tmp_path / "cluster" / "logs"
    logs.mkdir(parents=True)
    (logs / "audit.log").write_text(
        "\n".join([
            audit_line(100.0, ADMIN, "patch", md),
            audit_line(100.5, OPERATOR_USER, "patch", engine),
            audit_line(101.0, DEPLOYMENT_CONTROLLER, "update", engine | {"subresource": "status"},
                       responseObject=deployment()),
            audit_line(101.1, DEPLOYMENT_CONTROLLER, "update", router | {"subresource": "status"},
                       responseObject=deployment()),
            audit_line(101.2, OPERATOR_USER, "patch", md | {"subresource": "status"},
                       responseObject=ready),
            audit_line(101.5, OPERATOR_USER, "patch", isvc | {"subresource": "status"},
                       responseObject=ready),
            audit_line(101.6, OPERATOR_USER, "list", {"resource": "services"}),
        ]) + "\n"
    )  # fmt: skip
    config = Config(
        services=1, baseline_samples=1, settle_s=5, quiet_timeout_s=300, steady_s=60,
        timeout_s=600, nodes="L4-24GB=2", cpu_nodes=1, keep_state=False,
        client_rate=ClientRateLimit(qps=100, burst=100),
    )  # fmt: skip
    run = Run(
        config=config,
        bin_dir=Path("/cache/kube-v1/bin"),
        state_dir=tmp_path,
        hardware={"cpu_model": "x", "cores": 2, "memory_gib": 1, "kernel": "k", "python": "3"},
        bare=BareRun(
            deployments=1,
            objects=1,
            apply_start=10.0,
            apply_end=10.5,
            rolled_out={"svc-000-aggregated": 12.0},
            complete=True,
            deleted_s=3.0,
        ),
        bare_rendered=BareRun(
            deployments=2,
            objects=9,
            apply_start=20.0,
            apply_end=20.5,
            rolled_out={"svc-000-aggregated": 22.0, "svc-000-router": 22.5},
            complete=True,
            deleted_s=3.0,
        ),
        operator_start=50.0,
        baseline=[(60.0, 61.0, 61.0)],
        apply_start=99.0,
        apply_end=100.1,
        rollout_ready={"svc-000": 102.0},
        complete=True,
        quiet_after_s=5.0,
        phases=[
            Phase("bare Deployments", 10.0, 12.0, 0),
            Phase("bare rendered objects", 20.0, 22.5, 0),
            Phase("baseline single-0", 60.0, 66.0, 2),
            Phase("rollout", 99.0, 107.0, 2),
            Phase("steady", 107.0, 167.0, 0),
            Phase("operator start-up and warm-up", 50.0, 60.0, 2),
        ],
        cpu={
            name: snapshot_at(at, cpu)
            for name, at, cpu in [
                ("bare Deployments start", 10.0, 0.0),
                ("bare Deployments rolled out", 12.0, 0.0),
                ("bare rendered objects start", 20.0, 0.0),
                ("bare rendered objects rolled out", 22.5, 0.0),
                ("baseline start", 60.0, 1.0),
                ("rollout start", 99.0, 1.1),
                ("all ready", 102.0, 1.12),
                ("steady start", 107.0, 1.13),
                ("steady end", 167.0, 1.13),
            ]
        },
        reconciles={"rollout start": 2, "steady start": 7},
        fleet=FleetObjects({"svc-000": 101.2}, {"Running": 3}, 0, None),
        source={
            "at_start": {"operator_sources_sha256": "a"},
            "at_end": {"operator_sources_sha256": "a"},
        },
        watch={"events": 3, "polls": 0},
        operator_peak_rss_kib=100 * 1024,
    )
    result = summarise(run)
    head = result["headline"]
    assert head["all_ready_s"] == 3.0
    assert head["bare_all_rolled_out_s"] == 2.0
    assert head["all_ready_x_bare"] == 1.5
    # Everything rendered, applied bare: the engine's and the router's Deployments, 2.5 s.
    assert head["bare_rendered_all_rolled_out_s"] == 2.5
    assert head["all_ready_x_bare_rendered"] == 1.2
    assert head["operator_cpu_ms_per_reconcile"] == 15.0  # 0.03 s until quiet / 2 resources
    # The operator's own metrics: 5 reconciles ran for the 2 resources.
    assert head["operator_reconciles_per_resource"] == 2.5
    assert head["operator_cpu_ms_per_reconcile_run"] == 6.0
    assert head["operator_writes_per_resource_rollout"] == 1.5  # 3 writes, 2 resources
    assert head["operator_latency_s"] == {
        LATENCY_STEPS[0]: {"p50": 0.5, "p99": 0.5},
        LATENCY_STEPS[1]: {"p50": 0.2, "p99": 0.2},
        LATENCY_STEPS[2]: {"p50": 0.3, "p99": 0.3},
    }
    assert [g["met"] for g in result["goals"]] == [True, True, True, False, True, True, True, True]
    report = markdown(result)
    for section in (
        "## Goals", "## Baseline: the same engine Deployments, no operator",
        "## Baseline: everything the operator renders, no operator",
        "## Operator-attributable latency", "## All figures", "## Where the rollout's time went",
        "## CPU seconds during the rollout", "## The operator's API requests",
        "## Operator log", "## How it was measured",
    ):  # fmt: skip
        assert section in report
    assert "7 of 8 met." in report
    assert "CPU per reconcile run | 2.5; 6 ms |" in report
    assert "| operator quiet (CPU under 2 % of a core for 5 s) after all Ready | 5 s |" in report
