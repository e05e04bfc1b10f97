"""Audit-log analysis: the API server's own record of every request, to the microsecond.

The benchmark's audit policy (`audit_policy`) is the dev cluster's (every write, at Metadata
level) plus the operator's own reads, plus the response bodies of the status writes that
say when a thing became ready: the Deployment controller's `deployments/status` and the
operator's `modeldeployments/status` and `inferenceservices/status`. Those bodies are read
once, as each line is parsed, into one flag per request (`ApiRequest.ready`), so the log of a
1,000-service run is never held in memory.

From it: the operator's requests per window (`api_summary`), every client's writes
(`writers`), where each service's time went (`stages`), how often the operator wrote each of
a service's objects (`writes_per_service`), and the operator-attributable latencies
(`operator_latencies`) that the operator's scale goals name.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from benchmarks.operator_scale.stats import distribution, is_ready, parse_time, rolled_out
from inferfleet.devcluster import cluster as cluster_module

OPERATOR_NAMESPACE = "inferfleet-system"
OPERATOR_ACCOUNT = "inferfleet-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
READ_VERBS = ("get", "list", "watch")
WRITE_VERBS = ("create", "update", "patch")
DEPLOYMENT_STATUS = "apps/deployments/status"
MODEL_DEPLOYMENTS = "inferfleet.io/modeldeployments"
MODEL_DEPLOYMENT_STATUS = "inferfleet.io/modeldeployments/status"
INFERENCE_SERVICE_STATUS = "inferfleet.io/inferenceservices/status"

LATENCY_STEPS = (
    "ModelDeployment created -> first child applied",
    "engine Deployment rolled out -> ModelDeployment Ready",
    "backends and router Ready -> InferenceService Ready",
)


def audit_policy() -> dict[str, Any]:
    """The dev cluster's policy (writes only, at Metadata level) with, first (the first rule
    that matches decides): the response bodies of the status writes that mark readiness, and
    the operator's own reads. Other components' reads stay unlogged, so the API server's
    extra work stays small."""
    policy: dict[str, Any] = copy.deepcopy(cluster_module.AUDIT_POLICY)
    readiness = {
        "level": "RequestResponse",
        "verbs": ["update", "patch"],
        "resources": [
            {"group": "apps", "resources": ["deployments/status"]},
            {
                "group": "inferfleet.io",
                "resources": ["modeldeployments/status", "inferenceservices/status"],
            },
        ],
    }
    operator_reads = {"level": "Metadata", "users": [OPERATOR_USER], "verbs": list(READ_VERBS)}
    return {**policy, "rules": [readiness, operator_reads, *policy["rules"]]}


@dataclass(frozen=True)
class ApiRequest:
    at: float
    """When the API server received it."""
    user: str
    verb: str
    target: str
    """`group/resource[/subresource]` (`core` for the core group), or the path."""
    namespace: str
    name: str
    code: int
    message: str
    done: float = 0.0
    """When its response completed (the write is stored: watchers can see it)."""
    ready: bool | None = None
    """For a status write whose body was logged: whether the object it left was rolled out
    (a Deployment) or Ready=True (a ModelDeployment or InferenceService)."""
    available: bool | None = None
    """For a Deployment's status write whose body was logged: whether a pod of it was
    available."""

    @property
    def succeeded(self) -> bool:
        return 0 < self.code < 300

    @property
    def write(self) -> bool:
        return self.verb not in READ_VERBS


@dataclass
class Phase:
    """A window of wall-clock time whose API requests and CPU are reported together."""

    name: str
    start: float
    end: float
    resources: int
    """ModelDeployments plus InferenceServices created in the window (0: none)."""


@dataclass(frozen=True)
class FleetObjects:
    """What the fleet namespace holds once everything is Ready."""

    model_deployment_ready: dict[str, float]
    """ModelDeployment name -> its Ready condition's lastTransitionTime (operator's clock)."""
    pods_by_phase: dict[str, int]
    unscheduled_pods: int
    unscheduled_example: str | None


def _readiness(target: str, body: Any) -> bool | None:
    if not isinstance(body, dict) or body.get("kind") == "Status":
        return None
    if target == DEPLOYMENT_STATUS:
        return rolled_out(body)
    if target in (MODEL_DEPLOYMENT_STATUS, INFERENCE_SERVICE_STATUS):
        return is_ready(body)
    return None


def _available(target: str, body: Any) -> bool | None:
    if target != DEPLOYMENT_STATUS or not isinstance(body, dict) or body.get("kind") == "Status":
        return None
    return int((body.get("status") or {}).get("availableReplicas") or 0) > 0


def audit_request(event: Mapping[str, Any]) -> ApiRequest:
    """One audit event -> the request it records (pure)."""
    ref = event.get("objectRef") or {}
    if ref.get("resource"):
        target = f"{ref.get('apiGroup') or 'core'}/{ref['resource']}"
        if ref.get("subresource"):
            target += f"/{ref['subresource']}"
    else:
        target = urlsplit(event.get("requestURI", "")).path
    status = event.get("responseStatus") or {}
    at = parse_time(event.get("requestReceivedTimestamp")) or 0.0
    return ApiRequest(
        at=at,
        user=str((event.get("user") or {}).get("username", "")),
        verb=str(event.get("verb", "")),
        target=target,
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int(status.get("code", 0) or 0),
        message=str(status.get("message", ""))[:300],
        done=parse_time(event.get("stageTimestamp")) or at,
        ready=_readiness(target, event.get("responseObject")),
        available=_available(target, event.get("responseObject")),
    )


def read_audit(log_dir: Path) -> tuple[list[ApiRequest], int]:
    """Every request in the audit log(s), once each (a watch logs two stages); and how many
    files there were (more than one means the log rotated: still all read)."""
    requests: dict[str, ApiRequest] = {}
    files = sorted(log_dir.glob("audit*.log"))
    for path in files:
        with path.open() as lines:
            for line in lines:
                event = json.loads(line)
                audit_id = event.get("auditID", "")
                if audit_id in requests and event.get("stage") != "ResponseComplete":
                    continue
                requests[audit_id] = audit_request(event)
    return sorted(requests.values(), key=lambda r: r.at), len(files)


def api_summary(requests: Sequence[ApiRequest], phase: Phase) -> dict[str, Any]:
    """The operator's requests in a phase: writes and reads, per verb and resource, failures."""
    mine = [r for r in requests if r.user == OPERATOR_USER and phase.start <= r.at < phase.end]
    writes = [r for r in mine if r.write]
    reads = [r for r in mine if not r.write]
    failed = Counter(f"{r.code} {r.verb} {r.target}" for r in mine if r.code >= 300)
    failure_messages = {}
    for r in mine:
        key = f"{r.code} {r.verb} {r.target}"
        if r.code >= 300 and key not in failure_messages:
            failure_messages[key] = r.message
    summary: dict[str, Any] = {
        "window_s": round(phase.end - phase.start, 2),
        "writes": len(writes),
        "reads": len(reads),
        "writes_by_request": dict(Counter(f"{r.verb} {r.target}" for r in writes).most_common()),
        "reads_by_request": dict(Counter(f"{r.verb} {r.target}" for r in reads).most_common()),
        "failed": dict(failed.most_common()),
        "failure_examples": failure_messages,
    }
    if phase.resources:
        summary["resources_reconciled"] = phase.resources
        summary["writes_per_resource"] = round(len(writes) / phase.resources, 2)
        summary["reads_per_resource"] = round(len(reads) / phase.resources, 2)
        summary["requests_per_resource"] = round(len(mine) / phase.resources, 2)
    return summary


def writers(requests: Sequence[ApiRequest], phase: Phase) -> dict[str, dict[str, float | int]]:
    """Writes per user in a phase (who keeps the API server busy), with their mean rate and
    their busiest 10 s: a client held at a steady ceiling (20/s is kube-controller-manager's
    default --kube-api-qps) is rate-limited on its own side."""
    buckets: dict[str, Counter[int]] = {}
    for r in requests:
        if phase.start <= r.at < phase.end and r.write:
            buckets.setdefault(r.user, Counter())[int((r.at - phase.start) // 10)] += 1
    seconds = max(phase.end - phase.start, 1e-9)
    summary = {
        user: {
            "writes": sum(counted.values()),
            "mean_per_s": round(sum(counted.values()) / seconds, 1),
            "busiest_10s_per_s": round(max(counted.values()) / min(10.0, seconds), 1),
        }
        for user, counted in buckets.items()
    }
    ranked = sorted(summary.items(), key=lambda kv: -kv[1]["writes"])
    return dict(ranked[:12])


Key = TypeVar("Key", str, tuple[str, str])


def _keep_first(times: dict[Key, float], key: Key, at: float) -> None:
    if at < times.get(key, math.inf):
        times[key] = at


def operator_latencies(
    requests: Iterable[ApiRequest],
    *,
    namespace: str,
    children: Mapping[str, frozenset[tuple[str, str]]],
    backends: Mapping[str, Sequence[str]],
    routers: Mapping[str, str],
) -> dict[str, dict[str, float]]:
    """Per step of `LATENCY_STEPS`, per resource: the seconds the operator took, from the
    moment the thing it waits for was stored to the moment its answer was (both the
    completion of a request in the audit log):

    - a ModelDeployment's creation (the first write to it by anyone but the operator) -> the
      operator's first write to any of its children (`children`: what it renders for it);
    - its engine Deployments rolled out (the Deployment controller's status write that left
      the last of them so) -> the operator's status write that left it Ready=True;
    - an InferenceService's backends Ready (`backends`: ModelDeployments it routes to) and a
      pod of its router Deployment available (`routers`: its name), the later of them -> the
      operator's status write that left it Ready=True.

    A resource missing either end is left out (counted by `missing_latencies`)."""
    created: dict[str, float] = {}
    applied: dict[tuple[str, str], float] = {}
    rolled: dict[str, float] = {}
    serving: dict[str, float] = {}
    md_ready: dict[str, float] = {}
    isvc_ready: dict[str, float] = {}
    for r in requests:
        if r.namespace != namespace or not r.succeeded or r.verb not in WRITE_VERBS:
            continue
        if r.user == OPERATOR_USER:
            _keep_first(applied, (r.target, r.name), r.done)
            if r.ready and r.target == MODEL_DEPLOYMENT_STATUS:
                _keep_first(md_ready, r.name, r.done)
            elif r.ready and r.target == INFERENCE_SERVICE_STATUS:
                _keep_first(isvc_ready, r.name, r.done)
        elif r.target == MODEL_DEPLOYMENTS:
            _keep_first(created, r.name, r.done)
        elif r.target == DEPLOYMENT_STATUS:
            if r.ready:
                _keep_first(rolled, r.name, r.done)
            if r.available:
                _keep_first(serving, r.name, r.done)
    first_child: dict[str, float] = {}
    children_rolled: dict[str, float] = {}
    for md, objects in children.items():
        writes = [applied[obj] for obj in objects if obj in applied]
        if writes:
            first_child[md] = min(writes)
        engines = [name for target, name in objects if target == "apps/deployments"]
        if engines and all(name in rolled for name in engines):
            children_rolled[md] = max(rolled[name] for name in engines)
    backends_ready = {
        service: max(serving[routers[service]], *(md_ready[md] for md in mds))
        for service, mds in backends.items()
        if mds and all(md in md_ready for md in mds) and routers.get(service) in serving
    }
    return {
        step: {
            key: round(after[key] - before[key], 6) for key in sorted(before.keys() & after.keys())
        }
        for step, before, after in zip(
            LATENCY_STEPS,
            (created, children_rolled, backends_ready),
            (first_child, md_ready, isvc_ready),
            strict=True,
        )
    }


def missing_latencies(
    latencies: Mapping[str, Mapping[str, float]], model_deployments: int, services: int
) -> dict[str, int]:
    """Per step, how many resources had no measurement (an end never seen in the log)."""
    expected = (model_deployments, model_deployments, services)
    return {
        step: max(0, wanted - len(latencies.get(step, {})))
        for step, wanted in zip(LATENCY_STEPS, expected, strict=True)
    }


_SERVICE = re.compile(r"^(svc-\d+)([-.]|$)")


STEPS = (
    "apply creates the ModelDeployment",
    "operator: first request for it",
    "operator applies the engine Deployment",
    "controller manager creates the ReplicaSet",
    "scheduler binds the engine pod",
    "kwok marks the pod Running",
    "controller manager reports the Deployment rolled out",
    "operator: ModelDeployment Ready",
    "operator: InferenceService Ready",
    "watch sees the InferenceService Ready",
)


def _by_service(requests: Iterable[ApiRequest], namespace: str) -> dict[str, list[ApiRequest]]:
    per_service: dict[str, list[ApiRequest]] = {}
    for r in requests:
        match = _SERVICE.match(r.name) if r.namespace == namespace else None
        if match:
            per_service.setdefault(match.group(1), []).append(r)
    return per_service


def _first(found: Iterable[ApiRequest], after: float = 0.0) -> float | None:
    return next((r.at for r in found if r.at >= after), None)


def _last(found: Iterable[ApiRequest], before: float) -> float | None:
    return max((r.at for r in found if r.at <= before), default=None)


def _readiness_times(
    found: Sequence[ApiRequest], service: str, objects: FleetObjects, isvc_ready: float | None
) -> tuple[float | None, float | None, float | None]:
    """(engine Deployment rolled out, ModelDeployment Ready, InferenceService Ready) of one
    service. Where the log holds the bodies of status writes: the writes that left each so.
    Otherwise the last Deployment status write before the operator saw the rollout complete
    (the one that said so), and the Ready conditions' lastTransitionTime (the operator's
    clock, which moves if a condition is rewritten later)."""
    engine = f"{service}-aggregated"
    statuses = [
        r for r in found if r.target == DEPLOYMENT_STATUS and r.name == engine and r.succeeded
    ]
    if not any(r.ready is not None for r in statuses):
        md_ready = objects.model_deployment_ready.get(service)
        return _last(statuses, before=md_ready or math.inf), md_ready, isvc_ready
    mine = [r for r in found if r.user == OPERATOR_USER and r.name == service and r.ready]
    return (
        _first(r for r in statuses if r.ready),
        _first(r for r in mine if r.target == MODEL_DEPLOYMENT_STATUS),
        _first(r for r in mine if r.target == INFERENCE_SERVICE_STATUS),
    )


def _service_times(
    found: Sequence[ApiRequest],
    service: str,
    objects: FleetObjects,
    isvc_ready: float | None,
    isvc_seen: float | None,
) -> list[float | None]:
    """When each of `STEPS` happened for one service (None: not seen)."""
    engine = f"{service}-aggregated"
    bound = _first(
        r for r in found if r.target == "core/pods/binding" and r.name.startswith(f"{engine}-")
    )
    running = _first(
        (r for r in found if r.target == "core/pods/status" and r.verb == "patch"
         and r.name.startswith(f"{engine}-") and r.user.startswith("kwok")),
        after=bound or 0.0,
    )  # fmt: skip
    return [
        _first(r for r in found if r.name == service and r.target == MODEL_DEPLOYMENTS
               and r.verb == "patch" and r.user != OPERATOR_USER),
        _first(r for r in found if r.user == OPERATOR_USER),
        _first(r for r in found if r.user == OPERATOR_USER and r.name == engine
               and r.target == "apps/deployments" and r.verb == "patch"),
        _first(r for r in found if r.target == "apps/replicasets" and r.verb == "create"
               and r.name.startswith(f"{engine}-")),
        bound,
        running,
        *_readiness_times(found, service, objects, isvc_ready),
        isvc_seen,
    ]  # fmt: skip


def stages(
    requests: Sequence[ApiRequest],
    *,
    namespace: str,
    objects: FleetObjects,
    isvc_ready: Mapping[str, float],
    isvc_seen: Mapping[str, float],
    start: float,
) -> dict[str, dict[str, dict[str, float | int] | None]]:
    """Where each service's time went. `offsets`: per step, its time after the start of the
    apply; `gaps`: per step, its time after the step before, for the same service; both as
    distributions over the services. Steps are requests in the audit log (when the API server
    received them, to the microsecond), found by the object names the operator derives from
    the service's (`svc-N-aggregated-...`); the last, the watch seeing the service Ready."""
    per_service = _by_service(requests, namespace)
    offsets: dict[str, list[float]] = {step: [] for step in STEPS}
    gaps: dict[str, list[float]] = {step: [] for step in STEPS[1:]}
    for service in sorted(set(per_service) | set(isvc_seen)):
        times = _service_times(
            per_service.get(service, []),
            service,
            objects,
            isvc_ready.get(service),
            isvc_seen.get(service),
        )
        for i, (step, at) in enumerate(zip(STEPS, times, strict=True)):
            if at is None:
                continue
            offsets[step].append(at - start)
            before = times[i - 1] if i else None
            if before is not None:
                gaps[step].append(at - before)
    return {
        "offsets": {step: distribution(values) for step, values in offsets.items()},
        "gaps": {step: distribution(values) for step, values in gaps.items()},
    }


def writes_per_service(
    requests: Sequence[ApiRequest], namespace: str, window: Phase
) -> dict[str, dict[str, float | int] | None]:
    """How many times the operator wrote each kind of thing per service in a window, as a
    distribution over the services (names derived from `svc-N`, as in `stages`)."""
    counts: dict[str, Counter[str]] = {}
    for r in requests:
        match = _SERVICE.match(r.name) if r.namespace == namespace else None
        if not match or r.user != OPERATOR_USER or not r.write:
            continue
        if not window.start <= r.at < window.end:
            continue
        service = match.group(1)
        counted = counts.setdefault(service, Counter())
        counted["all operator writes"] += 1
        # `svc-N-aggregated` -> `-aggregated`; the service's own name and its Events -> nothing.
        suffix = r.name[len(service) :]
        counted[
            f"{r.verb} {r.target} {suffix}".strip() if suffix[:1] == "-" else f"{r.verb} {r.target}"
        ] += 1
    kinds = sorted({kind for counted in counts.values() for kind in counted})
    return {
        kind: distribution([float(counted[kind]) for counted in counts.values()]) for kind in kinds
    }
