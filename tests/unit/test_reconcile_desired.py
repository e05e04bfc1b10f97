"""The desired state of each kind, from the resource and what the indices hold: what the
operator applies, deletes, writes to status and posts as Events, without a cluster."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import Role
from inferfleet.api.pins import PIN_ANNOTATION
from inferfleet.autoscale.ownership import Claim, autoscaling_owner, claims_of
from inferfleet.reconcile.desired import (
    Child,
    Namespace,
    ObjectKey,
    Outcome,
    inference_service_outcome,
    may_span_nodes,
    model_deployment_outcome,
)
from inferfleet.reconcile.entries import child_of
from inferfleet.reconcile.events import event_name
from inferfleet.reconcile.status import RoleProgress
from inferfleet.render import GPU_PRODUCT_LABEL, InstallSettings

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
INSTALL = InstallSettings()
UID = "uid-md"


def _example(kind: str, file: str = "llama-3.1-8b-aggregated-sim.yaml") -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "examples" / file).read_text())
    found: dict[str, Any] = next(d for d in docs if d["kind"] == kind)
    uid = UID if kind == "ModelDeployment" else "uid-svc"
    found["metadata"] |= {
        "namespace": "llm",
        "uid": uid,
        "generation": 1,
        "resourceVersion": "1",
        "creationTimestamp": "2026-11-23T10:00:00Z",
    }
    return found


def _md_outcome(
    body: Mapping[str, Any],
    children: Sequence[Child] = (),
    *,
    claims: Sequence[Claim] = (),
    unschedulable: Mapping[Role, str] | None = None,
    holder: Any = None,
    now: datetime = NOW,
    unserved: frozenset[str] = frozenset(),
) -> Outcome:
    space = Namespace(children=children, holder=holder or (lambda _key: None))
    return model_deployment_outcome(
        body, space=space, claims=claims, unschedulable=unschedulable or {},
        install=INSTALL, now=now, unserved=unserved,
    )  # fmt: skip


def _stored(obj: Mapping[str, Any], *, ready: bool) -> list[Child]:
    """What the index holds once an applied object is stored (and, for a Deployment, rolled
    out when `ready`)."""
    stored = copy.deepcopy(dict(obj))
    stored["metadata"]["generation"] = 1
    if stored["kind"] == "Deployment" and ready:
        n = stored["spec"]["replicas"]
        stored["status"] = {
            "observedGeneration": 1, "replicas": n, "updatedReplicas": n,
            "readyReplicas": n, "availableReplicas": n,
        }  # fmt: skip
    if stored["kind"] == "LeaderWorkerSet" and ready:
        n = stored["spec"]["replicas"]
        stored["status"] = {
            "observedGeneration": 1, "replicas": n, "updatedReplicas": n, "readyReplicas": n,
            "conditions": [{"type": "Available", "status": "True", "reason": "AllGroupsReady"}],
        }  # fmt: skip
    child = child_of("llm", stored)
    return [] if child is None else [child]


def _stored_all(outcome: Outcome, *, ready: bool) -> list[Child]:
    return [c for obj in outcome.apply for c in _stored(obj, ready=ready)]


def _settled(body: dict[str, Any], outcome: Outcome, *, ready: bool = True) -> list[Child]:
    children = _stored_all(outcome, ready=ready)
    if outcome.status:
        body["status"] = {
            k: v for k, v in {**body.get("status", {}), **outcome.status}.items() if v is not None
        }
    return children


def _deployment(outcome: Outcome) -> dict[str, Any]:
    return next(o for o in outcome.apply if o["kind"] == "Deployment")


def _condition(status: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    return next(c for c in (status or {}).get("conditions", []) if c["type"] == type_)


def test_a_new_deployment_applies_its_workloads_and_says_it_is_rolling_out() -> None:
    outcome = _md_outcome(_example("ModelDeployment"))
    kinds = sorted(o["kind"] for o in outcome.apply)
    assert kinds == ["Deployment", "PodDisruptionBudget", "Service"]
    assert all("inferfleet.io/applied-hash" in o["metadata"]["annotations"] for o in outcome.apply)
    assert _condition(outcome.status, "Ready")["reason"] == "ReplicasNotReady"
    assert [e.reason for e in outcome.events] == ["Applied"]
    assert outcome.delete == ()


def test_once_applied_and_rolled_out_nothing_is_written_again() -> None:
    body = _example("ModelDeployment")
    children = _settled(body, _md_outcome(body))
    ready = _md_outcome(body, children=children)
    assert ready.apply == ()
    assert _condition(ready.status, "Ready")["status"] == "True"
    _settled(body, ready)
    again = _md_outcome(body, children=children, now=NOW + timedelta(minutes=5))
    assert again == Outcome(), "an idle deployment costs no write and no Event"


def test_a_child_edited_by_hand_is_applied_again() -> None:
    body = _example("ModelDeployment")
    children = _settled(body, _md_outcome(body))
    drifted = [
        Child(c.key, c.owner_uid, c.applied_hash, 7, c.role, c.progress)
        if c.key.kind == "Deployment"
        else c
        for c in children
    ]
    assert [o["kind"] for o in _md_outcome(body, children=drifted).apply] == ["Deployment"]


def test_the_owner_decision_replaces_the_spec_replicas() -> None:
    body = _example("ModelDeployment")
    claim = Claim("chat", "2026-11-23T10:00:00Z", True, {Role.AGGREGATED: 3}, "ScaleUpTtft")
    outcome = _md_outcome(body, claims=[claim])
    assert _deployment(outcome)["spec"]["replicas"] == 3
    assert outcome.status is not None
    assert outcome.status["autoscaling"]["service"] == "chat"
    assert outcome.status["autoscaling"]["replicas"] == [{"role": "aggregated", "replicas": 3}]
    # The service stops autoscaling: the spec again, and the record is removed.
    _settled(body, outcome)
    released = _md_outcome(body, claims=[Claim("chat", "2026-11-23T10:00:00Z", False)])
    assert _deployment(released)["spec"]["replicas"] == body["spec"]["replicas"]
    assert released.status is not None
    assert released.status["autoscaling"] is None


def test_the_owners_advice_is_in_the_deployments_status_as_its_service_wrote_it() -> None:
    body = _example("ModelDeployment")
    service = {
        "metadata": {"name": "chat", "creationTimestamp": "2026-11-23T10:00:00Z"},
        "spec": {"deployments": [{"name": body["metadata"]["name"]}],
                 "autoscaling": {"policy": "goodput"}},
        "status": {
            "replicas": [{"deployment": body["metadata"]["name"], "role": "aggregated",
                          "replicas": 3}],
            "advice": [
                {"deployment": body["metadata"]["name"], "reason": "EnablePrefixCaching",
                 "message": "75% of the prompts' leading blocks repeat",
                 "inputs": {"repeatedPrefixShare": 0.75, "bogus": "x"}},
                {"deployment": "another", "reason": "Fp8Weights"},
                {"reason": "NoDeployment"},
            ],
            "diagnosis": [
                {"deployment": body["metadata"]["name"], "role": "aggregated",
                 "bound": "bandwidth", "message": "aggregated: bandwidth-bound",
                 "inputs": {"mbu": 0.62}},
                {"deployment": body["metadata"]["name"], "role": "aggregated", "bound": "?"},
                {"deployment": "another", "role": "decode", "bound": "light"},
            ],
        },
    }  # fmt: skip
    [claim] = claims_of(service).values()
    outcome = _md_outcome(body, claims=[claim])
    assert outcome.status is not None
    assert outcome.status["autoscaling"]["advice"] == [
        {
            "reason": "EnablePrefixCaching",
            "message": "75% of the prompts' leading blocks repeat",
            "inputs": {"repeatedPrefixShare": 0.75},
        }
    ]
    assert outcome.status["autoscaling"]["diagnosis"] == [
        {"role": "aggregated", "bound": "bandwidth", "message": "aggregated: bandwidth-bound",
         "inputs": {"mbu": 0.62}}
    ]  # fmt: skip


def test_a_decision_of_zero_applies_only_where_the_owners_bounds_allow_zero() -> None:
    body = _example("ModelDeployment")
    zero = {Role.AGGREGATED: 0}
    allowed = Claim("chat", "2026-11-23T10:00:00Z", True, zero, zero_roles=frozenset(zero))
    outcome = _md_outcome(body, claims=[allowed])
    assert _deployment(outcome)["spec"]["replicas"] == 0
    children = _settled(body, outcome)
    idle = _md_outcome(body, claims=[allowed], children=children)
    ready = _condition(idle.status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")
    # A zero its bounds do not allow (a status an older schema wrote) is not applied.
    refused = Claim("chat", "2026-11-23T10:00:00Z", True, zero)
    kept = _md_outcome(_example("ModelDeployment"), claims=[refused])
    assert _deployment(kept)["spec"]["replicas"] == body["spec"]["replicas"]


def test_one_owner_among_claimants_and_it_keeps_ownership() -> None:
    older = Claim("a-older", "2026-11-23T09:00:00Z", True, {Role.AGGREGATED: 2})
    newer = Claim("b-newer", "2026-11-23T10:00:00Z", True, {Role.AGGREGATED: 5})
    assert autoscaling_owner(None, [newer, older]) == older
    assert autoscaling_owner("b-newer", [newer, older]) == newer
    assert autoscaling_owner("gone", [newer, older]) == older
    assert autoscaling_owner(None, [Claim("x", "t", False)]) is None
    body = _example("ModelDeployment")
    outcome = _md_outcome(body, claims=[newer, older])
    assert _deployment(outcome)["spec"]["replicas"] == 2


def test_claims_are_read_tolerantly_from_a_service_object() -> None:
    service = _example("InferenceService")
    service["spec"]["autoscaling"] = {"policy": "goodput"}
    service["status"] = {
        "replicas": [
            {"deployment": "llama-3-1-8b", "role": "aggregated", "replicas": 4},
            {"deployment": "x", "role": "nonsense", "replicas": 1},
            {"role": "decode"},
            {"deployment": "llama-3-1-8b", "role": "decode", "replicas": True},
        ],
        "lastDecision": "not an object",
    }
    [(_name, claim)] = claims_of(service).items()
    assert claim.autoscales
    assert dict(claim.replicas) == {Role.AGGREGATED: 4}
    assert claims_of({"spec": {"deployments": "oops"}}) == {}


def test_a_pin_wins_and_its_coming_and_going_are_events() -> None:
    body = _example("ModelDeployment")
    until = NOW + timedelta(hours=1)
    pin = {"replicas": {"aggregated": 4}, "reason": "INC-1", "until": until.isoformat()}
    body["metadata"]["annotations"] = {PIN_ANNOTATION: json.dumps(pin)}
    claim = Claim("chat", "2026-11-23T10:00:00Z", True, {Role.AGGREGATED: 2})
    pinned = _md_outcome(body, claims=[claim])
    assert _deployment(pinned)["spec"]["replicas"] == 4
    assert "Pinned" in [e.reason for e in pinned.events]
    assert pinned.requeue_after_s == 3600
    children = _settled(body, pinned)
    expired = _md_outcome(body, children=children, claims=[claim], now=until + timedelta(seconds=1))
    assert _deployment(expired)["spec"]["replicas"] == 2
    assert "PinReleased" in [e.reason for e in expired.events]


def test_a_pin_that_breaks_a_rule_is_ignored_once_with_a_warning() -> None:
    body = _example("ModelDeployment")
    pin = {"replicas": {"aggregated": 2147483648}, "reason": "x", "until": NOW.isoformat()}
    body["metadata"]["annotations"] = {PIN_ANNOTATION: json.dumps(pin)}
    first = _md_outcome(body)
    assert _deployment(first)["spec"]["replicas"] == body["spec"]["replicas"]
    warned = [e for e in first.events if e.reason == "PinIgnored"]
    assert len(warned) == 1
    assert warned[0].warning
    assert "replicas.aggregated" in warned[0].message
    children = _settled(body, first)
    assert [e.reason for e in _md_outcome(body, children=children).events] == []


def test_a_spec_a_newer_model_refuses_is_a_condition_not_a_crash() -> None:
    body = _example("ModelDeployment")
    body["spec"]["replicas"] = "two"
    outcome = _md_outcome(body)
    assert outcome.apply == ()
    assert _condition(outcome.status, "Ready")["reason"] == "InvalidSpec"
    assert [(e.reason, e.warning) for e in outcome.events] == [("InvalidSpec", True)]


def test_a_name_another_resource_holds_is_refused() -> None:
    body = _example("ModelDeployment")
    outcome = _md_outcome(body, holder=lambda key: "uid-other" if key.kind == "Service" else None)
    assert outcome.apply == ()
    ready = _condition(outcome.status, "Ready")
    assert ready["reason"] == "NameCollision"
    assert "Service/" in ready["message"]


def test_names_are_created_only_where_free_and_one_held_by_a_foreign_object_is_refused() -> None:
    body = _example("ModelDeployment")
    first = _md_outcome(body)
    # What the resource has not created yet is applied only if no object holds its name.
    assert first.new == {ObjectKey.of(obj) for obj in first.apply}
    children = _settled(body, first)
    assert _md_outcome(body, children=children).new == frozenset()
    # An object inferfleet did not create holds the Service's name: nothing is applied.
    service = next(ObjectKey.of(o) for o in first.apply if o["kind"] == "Service")
    fresh = _example("ModelDeployment")
    space = Namespace(foreign=frozenset({service}))
    outcome = model_deployment_outcome(
        fresh, space=space, claims=(), unschedulable={}, install=INSTALL, now=NOW
    )
    assert outcome.apply == ()
    ready = _condition(outcome.status, "Ready")
    assert ready["reason"] == "NameCollision"
    assert (
        f"{service.describe()} already exist and inferfleet did not create them" in ready["message"]
    )
    assert [(e.reason, e.warning) for e in outcome.events] == [("NameCollision", True)]


QUOTA_REFUSAL = (
    'deployments.apps "x" is forbidden: exceeded quota: objects, requested: '
    "count/deployments.apps=1, used: count/deployments.apps=0, limited: count/deployments.apps=0"
)


def test_an_object_the_api_server_refused_holds_the_apply_and_says_why() -> None:
    """A quota, a policy webhook or RBAC refused an object: the resource says so in its Ready
    condition and a Warning Event, in the server's words, and leaves what runs as it is."""
    body = _example("ModelDeployment")
    first = _md_outcome(body)
    deployment = next(ObjectKey.of(o) for o in first.apply if o["kind"] == "Deployment")
    children = _settled(body, first)
    space = Namespace(children=children, refused={deployment: QUOTA_REFUSAL})
    outcome = model_deployment_outcome(
        body, space=space, claims=(), unschedulable={}, install=INSTALL, now=NOW
    )
    assert outcome.apply == ()
    assert outcome.delete == ()  # what runs stays
    ready = _condition(outcome.status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyRefused")
    assert ready["message"] == (
        f"not applied: the API server refused {deployment.describe()}: {QUOTA_REFUSAL} "
        "(tried again every minute)"
    )
    assert [(e.reason, e.warning) for e in outcome.events] == [("ApplyRefused", True)]
    # The service that routes to it: the same for its router's objects.
    service = _example("InferenceService")
    router = next(
        ObjectKey.of(o)
        for o in _service_outcome(service, {"llama-3-1-8b": body}).apply
        if o["kind"] == "Role"
    )
    refused = inference_service_outcome(
        service, space=Namespace(refused={router: "forbidden: RBAC"}),
        backends={"llama-3-1-8b": body}, install=INSTALL, now=NOW,
    )  # fmt: skip
    assert refused.apply == ()
    assert _condition(refused.status, "Ready")["reason"] == "ApplyRefused"
    assert "forbidden: RBAC" in _condition(refused.status, "Ready")["message"]


def test_a_role_that_went_away_is_pruned_and_nothing_else() -> None:
    body = _example("ModelDeployment")
    children = _settled(body, _md_outcome(body))
    gone = Child(ObjectKey("apps/v1", "Deployment", "old-prefill"), UID, "h", 1, Role.PREFILL)
    outcome = _md_outcome(body, children=[*children, gone])
    assert outcome.delete == (gone.key,)


def test_pods_the_scheduler_cannot_place_degrade_the_deployment_with_its_reason() -> None:
    body = _example("ModelDeployment")
    why = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    outcome = _md_outcome(body, unschedulable={Role.AGGREGATED: f"1 pod(s) unschedulable: {why}"})
    degraded = _condition(outcome.status, "Degraded")
    assert degraded["status"] == "True"
    assert degraded["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    assert "Unschedulable" in [e.reason for e in outcome.events]


@pytest.mark.parametrize(
    ("why", "reason"),
    [
        (
            'pods "llm-aggregated-5d8f" is forbidden: exceeded quota: gpus, requested: '
            "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: "
            "requests.nvidia.com/gpu=4",
            "QuotaExhausted",
        ),
        (
            'pods "llm-aggregated-5d8f" is forbidden: maximum nvidia.com/gpu usage per '
            "Container is 1, but limit is 2",
            "PodsRefused",
        ),
    ],
)
def test_pods_the_api_server_refuses_degrade_the_deployment_and_say_why(
    why: str, reason: str
) -> None:
    body = _example("ModelDeployment")
    children = _settled(body, _md_outcome(body), ready=False)
    children = [
        replace(c, progress=replace(c.progress, ready=0, available=0, refused=why))
        if c.progress is not None
        else c
        for c in children
    ]
    outcome = _md_outcome(body, children=children)
    degraded = _condition(outcome.status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    assert degraded["message"] == f"aggregated: {why}"
    assert [(e.reason, e.warning) for e in outcome.events] == [(reason, True)]


def test_a_refusal_the_deployment_controller_reports_is_read_from_its_conditions() -> None:
    why = 'pods "x" is forbidden: exceeded quota: gpus'
    deployment: dict[str, Any] = {
        "metadata": {"generation": 2},
        "spec": {"replicas": 3},
        "status": {
            "observedGeneration": 2, "replicas": 2, "readyReplicas": 2,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                 "message": why},
            ],
        },
    }  # fmt: skip
    assert RoleProgress.from_deployment(deployment).refused == why
    deployment["status"]["conditions"][1]["status"] = "False"
    assert RoleProgress.from_deployment(deployment).refused is None


def _service_outcome(
    body: Mapping[str, Any],
    backends: Mapping[str, Mapping[str, Any]],
    holder: Any = None,
    children: Sequence[Child] = (),
) -> Outcome:
    space = Namespace(children=children, holder=holder or (lambda _key: None))
    return inference_service_outcome(body, space=space, backends=backends, install=INSTALL, now=NOW)


def test_a_service_without_its_deployment_applies_nothing_and_says_which() -> None:
    outcome = _service_outcome(_example("InferenceService"), {})
    assert outcome.apply == ()
    ready = _condition(outcome.status, "Ready")
    assert ready["reason"] == "MissingDeployment"
    assert "llama-3-1-8b" in ready["message"]
    assert [(e.reason, e.warning) for e in outcome.events] == [("MissingDeployment", True)]


def test_a_service_is_ready_when_its_backends_are_and_a_router_pod_is_available() -> None:
    md = _example("ModelDeployment")
    _settled(md, _md_outcome(md, children=_settled(md, _md_outcome(md))))
    service = _example("InferenceService")
    service["status"] = {
        "conditions": [
            {"type": "MetricsAvailable", "status": "False", "reason": "X", "message": "",
             "lastTransitionTime": "2026-11-23T10:00:00Z"},
        ]
    }  # fmt: skip
    first = _service_outcome(service, {"llama-3-1-8b": md})
    assert sorted(o["kind"] for o in first.apply) == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "Service", "PodDisruptionBudget", "Deployment"]
    )
    # The backends serve, but the endpoint refuses requests until a router pod is up.
    assert _condition(first.status, "Ready")["reason"] == "RouterNotReady"
    starting = _settled(service, first, ready=False)
    # Its pods starting: still not Ready, so nothing to write.
    assert _service_outcome(service, {"llama-3-1-8b": md}, children=starting).status is None
    outcome = _service_outcome(
        service, {"llama-3-1-8b": md}, children=_stored_all(first, ready=True)
    )
    assert outcome.status is not None
    assert _condition(outcome.status, "Ready")["status"] == "True"
    assert first.status is not None
    assert first.status["url"] == "http://chat.llm.svc.cluster.local"
    # policy: none: the autoscaler's conditions are not left behind.
    assert [c["type"] for c in outcome.status["conditions"]] == ["Ready"]


def test_a_spec_that_does_not_fit_asks_for_no_gpu_and_says_why() -> None:
    body = _example("ModelDeployment", "llama-3.1-405b-bf16-l40s-does-not-fit.yaml")
    outcome = _md_outcome(body)
    assert outcome.apply == ()
    assert outcome.status is not None
    assert _condition(outcome.status, "Fits")["reason"] == "DoesNotFit"
    assert _condition(outcome.status, "Ready")["reason"] == "SpecNotApplied"
    assert "predictedTtftMs" not in outcome.status["plan"]
    assert [(e.reason, e.warning) for e in outcome.events] == [("SpecNotApplied", True)]


def test_a_pin_past_the_autoscaling_service_bounds_or_budget_is_ignored() -> None:
    body = _example("ModelDeployment")
    until = (NOW + timedelta(hours=1)).isoformat()
    owner = Claim(
        "chat", "2026-11-23T10:00:00Z", True, {Role.AGGREGATED: 2},
        max_replicas={Role.AGGREGATED: 4}, gpu_budget=3,
    )  # fmt: skip
    for count, says in ((5, "maxReplicas 4 of InferenceService chat"), (4, "gpuBudget 3")):
        pin = {"replicas": {"aggregated": count}, "reason": "x", "until": until}
        body["metadata"]["annotations"] = {PIN_ANNOTATION: json.dumps(pin)}
        outcome = _md_outcome(body, claims=[owner])
        assert _deployment(outcome)["spec"]["replicas"] == 2, "the owner's decision stands"
        pinned = _condition(outcome.status, "Pinned")
        assert pinned["reason"] == "PinIgnored"
        assert says in pinned["message"]
    # Within them, the pin wins.
    pin = {"replicas": {"aggregated": 3}, "reason": "x", "until": until}
    body["metadata"]["annotations"] = {PIN_ANNOTATION: json.dumps(pin)}
    assert _deployment(_md_outcome(body, claims=[owner]))["spec"]["replicas"] == 3


def test_applied_is_posted_once_per_generation_even_across_a_crash() -> None:
    body = _example("ModelDeployment")
    first = _md_outcome(body)
    # Applied, then the operator died before writing status: its successor applies nothing
    # new, and still says the generation was applied.
    children = [c for obj in first.apply for c in _stored(obj, ready=False)]
    successor = _md_outcome(body, children=children)
    assert successor.apply == ()
    assert [e.reason for e in successor.events] == ["Applied"]
    # Under the same name, even from a later version of the object: its create is refused.
    later = {**body, "metadata": {**body["metadata"], "resourceVersion": "9"}}
    assert event_name(later, successor.events[0]) == event_name(body, first.events[0])
    _settled(body, successor)
    assert "Applied" not in [e.reason for e in _md_outcome(body, children=children).events]


def test_the_service_reconcile_writes_only_its_own_status_fields() -> None:
    md = _example("ModelDeployment")
    service = _example("InferenceService")
    decided = [{"deployment": "llama-3-1-8b", "role": "aggregated", "replicas": 3}]
    service["status"] = {"replicas": decided, "autoscalerState": {"x": {}}}
    outcome = _service_outcome(service, {"llama-3-1-8b": md})
    assert outcome.status is not None
    assert set(outcome.status) <= {"observedGeneration", "conditions", "url"}


def test_the_install_gpu_catalog_plans_and_places_the_engines() -> None:
    """A cluster whose H100 nodes are labelled with another product name, and whose GPUs
    report less memory: both come from the install's catalog, not the built-in one."""
    body = _example("ModelDeployment", "llama-3.1-8b-aggregated-vllm.yaml")
    product = "NVIDIA-H100-SXM5-80GB"
    relabelled = GpuCatalog.builtin().with_overrides({"H100-80GB": {"nodeProductLabel": product}})
    space = Namespace(children=(), holder=lambda _key: None)

    def outcome(gpus: GpuCatalog) -> Outcome:
        return model_deployment_outcome(
            body, space=space, claims=(), unschedulable={},
            install=InstallSettings(gpus=gpus), now=NOW,
        )  # fmt: skip

    selector = _deployment(outcome(relabelled))["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {GPU_PRODUCT_LABEL: product}
    small = relabelled.with_overrides({"H100-80GB": {"memoryBytes": 8 * 2**30}})
    refused = outcome(small)
    assert refused.apply == ()
    assert refused.status is not None
    assert _condition(refused.status, "Fits")["reason"] == "DoesNotFit"


MULTI_NODE = "llama-3.1-405b-bf16-two-nodes-vllm.yaml"


def test_a_replica_over_two_nodes_is_a_leader_worker_set_ready_from_its_groups() -> None:
    """Applied as a LeaderWorkerSet (no Deployment); Ready once LWS reports every group ready
    at the current generation, as its controller writes it; a hand edit of its replicas is
    drift, applied again."""
    body = _example("ModelDeployment", MULTI_NODE)
    outcome = _md_outcome(body)
    kinds = sorted(o["kind"] for o in outcome.apply)
    assert kinds == ["LeaderWorkerSet", "PodDisruptionBudget", "Service"]
    assert outcome.apply[-1]["kind"] == "LeaderWorkerSet", "the workload is applied last"
    assert _condition(outcome.status, "Ready")["reason"] == "ReplicasNotReady"
    not_ready = _settled(body, outcome, ready=False)
    _settled(body, _md_outcome(body, children=not_ready), ready=False)
    assert _condition(body["status"], "Ready")["status"] == "False"
    children = _settled(body, outcome)
    ready = _md_outcome(body, children=children)
    assert ready.apply == ()
    assert _condition(ready.status, "Ready")["status"] == "True"
    scaled_by_hand = [
        replace(c, replicas=5) if c.key.kind == "LeaderWorkerSet" else c for c in children
    ]
    assert [o["kind"] for o in _md_outcome(body, children=scaled_by_hand).apply] == [
        "LeaderWorkerSet"
    ]


def test_a_tensorrt_llm_group_s_keys_are_generated_once_never_applied_or_pruned() -> None:
    """The keys Secret is rendered without data: handed to the controller to create with keys
    (`generate`), never in `apply` (applied again it would lose them) and, never read back, it
    is not a child to prune (its owner's deletion takes it)."""
    body = _example("ModelDeployment", "llama-3.1-405b-bf16-two-nodes-trtllm.yaml")
    outcome = _md_outcome(body)
    (secret,) = outcome.generate
    assert secret["kind"] == "Secret"
    uid = body["metadata"]["uid"]
    assert secret["metadata"]["name"] == f"llama-3-1-405b-trtllm-mpi-ssh-{uid[:8]}"
    assert "Secret" not in {o["kind"] for o in outcome.apply}
    settled = _md_outcome(body, children=_settled(body, outcome))
    assert (settled.apply, settled.delete) == ((), ())
    assert settled.generate == outcome.generate
    vllm = _md_outcome(_example("ModelDeployment", MULTI_NODE))
    assert vllm.generate == ()
    # Deleted and created again under its name: new keys, not the Secret of the one before
    # (on its way out through the garbage collector, and never read by the operator).
    recreated = _example("ModelDeployment", "llama-3.1-405b-bf16-two-nodes-trtllm.yaml")
    recreated["metadata"]["uid"] = "ffffffff-0000-4000-8000-000000000000"
    (again,) = _md_outcome(recreated).generate
    assert again["metadata"]["name"] != secret["metadata"]["name"]


def test_keys_no_longer_rendered_are_retired_and_the_status_stops_recording_them() -> None:
    """The status records the generated Secrets (the operator never reads Secrets back). An
    engine change that drops the keys retires them, once; while the spec fits nowhere (nothing
    renders, nothing is deleted) the record stays."""
    body = _example("ModelDeployment", "llama-3.1-405b-bf16-two-nodes-trtllm.yaml")
    outcome = _md_outcome(body)
    (secret,) = outcome.generate
    name = secret["metadata"]["name"]
    assert outcome.status is not None
    assert outcome.status["generatedSecrets"] == [name]
    assert outcome.retire == ()
    children = _settled(body, outcome)
    assert _md_outcome(body, children=children).retire == ()

    does_not_fit = copy.deepcopy(body)
    does_not_fit["spec"]["gpu"]["type"] = "L4-24GB"
    blocked = _md_outcome(does_not_fit, children=children)
    assert (blocked.generate, blocked.retire, blocked.delete) == ((), (), ())
    assert "generatedSecrets" not in (blocked.status or {}), "kept as recorded"

    body["spec"]["engine"] = {"name": "vllm"}
    body["metadata"]["generation"] = 2
    changed = _md_outcome(body, children=children)
    assert changed.generate == ()
    assert changed.retire == (ObjectKey("v1", "Secret", name),)
    assert changed.status is not None
    assert changed.status["generatedSecrets"] is None, "removed from the status"
    _settled(body, changed)
    assert "generatedSecrets" not in body["status"]
    assert _md_outcome(body, children=children).retire == ()


def test_a_leader_worker_set_of_a_release_without_observed_generation_counts() -> None:
    """LWS reports `status.observedGeneration` since v0.9.0: an earlier release's counts are
    taken as they are."""
    lws: dict[str, Any] = {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": 4},
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2},
    }
    assert RoleProgress.from_workload(lws).rolled_out
    behind = lws | {"status": lws["status"] | {"observedGeneration": 3}}
    assert not RoleProgress.from_workload(behind).rolled_out


def test_without_leader_worker_set_installed_nothing_is_applied_and_status_says_why() -> None:
    body = _example("ModelDeployment", MULTI_NODE)
    outcome = _md_outcome(body, unserved=frozenset({"LeaderWorkerSet"}))
    assert outcome.apply == ()
    ready = _condition(outcome.status, "Ready")
    assert ready["reason"] == "SpecNotApplied"
    assert "runs as a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)" in ready["message"]
    assert "install LeaderWorkerSet (v0.6.0 or later" in ready["message"]
    assert outcome.requeue_after_s == 60.0, "looks again for a CRD installed since"
    # A deployment that fits one node does not need it.
    single = _md_outcome(_example("ModelDeployment"), unserved=frozenset({"LeaderWorkerSet"}))
    assert "Deployment" in {o["kind"] for o in single.apply}
    assert single.requeue_after_s is None


def test_a_role_that_changes_kind_is_read_from_the_workload_rendered() -> None:
    """Back on one node: the Deployment just applied is what status reads, not the
    LeaderWorkerSet on its way out (which the same outcome deletes)."""
    multi = _example("ModelDeployment", MULTI_NODE)
    groups = [c for c in _settled(multi, _md_outcome(multi)) if c.key.kind == "LeaderWorkerSet"]
    body = _example("ModelDeployment")
    body["metadata"]["uid"] = multi["metadata"]["uid"]
    deployment = [
        c for c in _stored_all(_md_outcome(body), ready=False) if c.key.kind == "Deployment"
    ]
    outcome = _md_outcome(body, children=[*deployment, *groups])
    assert [key.kind for key in outcome.delete] == ["LeaderWorkerSet"]
    assert _condition(outcome.status, "Ready")["status"] == "False"
    assert outcome.status is not None
    assert outcome.status["readyReplicas"] == 0, "the group ready on its way out is not counted"


def test_only_a_replica_over_nodes_asks_whether_the_cluster_serves_leader_worker_sets() -> None:
    gpus = GpuCatalog.builtin()
    assert may_span_nodes(_example("ModelDeployment", MULTI_NODE), gpus)
    assert not may_span_nodes(_example("ModelDeployment"), gpus)
    four = gpus.with_overrides({"H100-80GB": {"gpusPerNode": 1}})
    assert may_span_nodes(
        _example("ModelDeployment", "llama-3.3-70b-fp8-disaggregated-trtllm.yaml"), four
    )
    broken: Mapping[str, Any]
    for broken in (
        {},
        {"spec": []},
        {"spec": {"gpu": {"type": "TPU"}}},
        {"spec": {"parallelism": 3}},
    ):
        assert not may_span_nodes(broken, gpus)
