"""kopf handlers: read the resource, plan, render, apply, write status. Thin on purpose: the
decisions live in `planning`, `render` and `reconcile.status`.

Level-based: every trigger (create, update, resume after a restart, a child Deployment's
change) recomputes the desired objects and status from the current spec. Objects are applied
with server-side apply under the operator's own field manager; status is written only when it
differs, so an idle fleet costs no writes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random

from inferfleet.api.common import API_GROUP, API_VERSION
from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import ModelDeployment, Role, TopologyMode
from inferfleet.autoscale.controller import (
    METRICS_AVAILABLE,
    AutoscalerSettings,
    PrometheusSource,
    autoscaled_by,
    tick,
)
from inferfleet.engines import roles_of
from inferfleet.kube import Kube, StaleObjectError
from inferfleet.planning.capacity import CapacityPlan, plan
from inferfleet.reconcile.pins import PIN_ANNOTATION, Pin, read_pin
from inferfleet.reconcile.status import (
    RoleProgress,
    condition,
    model_deployment_status,
    with_condition,
)
from inferfleet.render import (
    InstallSettings,
    MissingReferenceError,
    UnsupportedSpecError,
    render_inference_service,
    render_model_deployment,
    selector_labels,
)
from inferfleet.render.common import (
    LABEL_MANAGED_BY,
    LABEL_MODEL_DEPLOYMENT,
    LABEL_ROLE,
    MANAGED_BY,
    label_value,
)

FIELD_MANAGER = "inferfleet-operator"
# kopf's own bookkeeping, under a prefix of its own: kopf leaves annotations with its storage
# prefix out of the change detection, and inferfleet.io/pin must stay in it.
KOPF_ANNOTATION_PREFIX = "kopf.inferfleet.io"
MANAGED_BY_SELECTOR = {LABEL_MANAGED_BY: MANAGED_BY}
# What render_model_deployment creates, for pruning roles that went away.
OWNED_KINDS = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
    ("v1", "ConfigMap"),
)


@functools.cache
def kube() -> Kube:
    return Kube.from_environment()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # A structural status schema would prune kopf's bookkeeping: keep it in annotations.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=KOPF_ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.peering.standalone = True
    settings.watching.server_timeout = 270


def _namespaced(namespace: str | None) -> str:
    if namespace is None:  # the CRDs are namespaced: a cluster-scoped event is not ours
        raise kopf.PermanentError("inferfleet resources are namespaced")
    return namespace


def _now() -> datetime:
    return datetime.now(UTC)


def _serving_role(md: ModelDeployment) -> Role:
    disaggregated = md.spec.topology.mode == TopologyMode.DISAGGREGATED
    return Role.DECODE if disaggregated else Role.AGGREGATED


def _children(md: ModelDeployment, name: str, namespace: str) -> dict[Role, RoleProgress]:
    deployments = kube().list(
        "apps/v1",
        "Deployment",
        namespace=namespace,
        label_selector=f"{LABEL_MODEL_DEPLOYMENT}={label_value(name)}",
    )
    progress = {}
    for deployment in deployments:
        role = deployment["metadata"].get("labels", {}).get(LABEL_ROLE)
        if role in Role._value2member_map_:
            progress[Role(role)] = RoleProgress.from_deployment(deployment)
    return progress


@dataclass(frozen=True)
class _Desired:
    capacity: CapacityPlan
    objects: list[dict[str, Any]]
    blocked: str | None
    """Why the spec was not applied (existing workloads are then left as they are)."""
    pin: Pin | None
    pin_problem: str | None


def _autoscaled(md: ModelDeployment) -> dict[Role, int] | None:
    """The replicas an InferenceService's autoscaler chose, while it still autoscales `md`
    (a service deleted, switched to `policy: none` or no longer routing to it: the spec)."""
    recorded = md.status.autoscaling if md.status else None
    if recorded is None:
        return None
    namespace = md.metadata.get("namespace")
    found = kube().get(
        f"{API_GROUP}/{API_VERSION}",
        "InferenceService",
        recorded.service,
        str(namespace) if namespace else None,
    )
    if found is None:
        return None
    try:
        service = InferenceService.model_validate(found)
    except ValidationError:
        return None
    if not autoscaled_by(service, str(md.metadata.get("name"))):
        return None
    return {entry.role: entry.replicas for entry in recorded.replicas}


def _desired(md: ModelDeployment, install: InstallSettings) -> _Desired:
    """The objects to apply, or why none may be: a spec that does not fit asks for no GPU."""
    annotations = md.metadata.get("annotations") or {}
    roles = set(roles_of(md.spec))
    now = _now()
    pin, pin_problem = read_pin(
        annotations if isinstance(annotations, dict) else {}, roles=roles, now=now
    )
    if pin is not None and not pin.active(now):
        pin = None
    capacity = plan(md.spec)
    if not capacity.memory.fits:
        verdict = f"not applied: {capacity.memory.verdict()}"
        return _Desired(capacity, [], verdict, pin, pin_problem)
    overrides = {r: n for r, n in (_autoscaled(md) or {}).items() if r in roles}
    overrides |= pin.replicas if pin else {}  # read_pin took only `roles`
    try:
        objects = render_model_deployment(md, replicas=overrides or None, options=install.engines)
    except UnsupportedSpecError as error:
        return _Desired(capacity, [], f"not applied: {error}", pin, pin_problem)
    return _Desired(capacity, objects, None, pin, pin_problem)


def _status_of(
    md: ModelDeployment, name: str, namespace: str, desired: _Desired, pinned: set[Role]
) -> dict[str, Any]:
    previous = md.status.to_wire() if md.status else {}
    serving = _serving_role(md)
    return model_deployment_status(
        generation=int(str(md.metadata.get("generation", 0))),
        plan=desired.capacity,
        roles=_children(md, name, namespace),
        serving_role=serving,
        selector=",".join(f"{k}={v}" for k, v in selector_labels(name, serving).items()),
        previous=previous,
        now=_now(),
        blocked=desired.blocked,
        pinned=pinned,
    )


def _prune(md: ModelDeployment, name: str, namespace: str, keep: list[dict[str, Any]]) -> None:
    """Delete what this ModelDeployment created and no longer wants (a role that went away).
    Only objects whose controller is this very resource: never what someone else made."""
    uid = md.metadata.get("uid")
    wanted = {(o["kind"], o["metadata"]["name"]) for o in keep}
    for api_version, kind in OWNED_KINDS:
        for found in kube().list(
            api_version,
            kind,
            namespace=namespace,
            label_selector=f"{LABEL_MODEL_DEPLOYMENT}={label_value(name)}",
        ):
            owners = found["metadata"].get("ownerReferences") or []
            ours = any(o.get("uid") == uid and o.get("controller") for o in owners)
            if ours and (kind, found["metadata"]["name"]) not in wanted:
                kube().delete(api_version, kind, found["metadata"]["name"], namespace)


def _changed(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    current = current or {}
    return any(current.get(key) != value for key, value in desired.items())


@kopf.on.resume(API_GROUP, API_VERSION, "modeldeployments")
@kopf.on.create(API_GROUP, API_VERSION, "modeldeployments")
@kopf.on.update(API_GROUP, API_VERSION, "modeldeployments")
def reconcile_model_deployment(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    _reconcile_model_deployment(
        body, name, _namespaced(namespace), status, patch, install=_install(memo)
    )


def _apply_workloads(
    md: ModelDeployment, name: str, namespace: str, install: InstallSettings
) -> _Desired:
    """Apply what `md` wants now (spec, then the autoscaler's replicas, then pins) and prune
    what it no longer wants; idempotent, so any writer of its inputs may call it."""
    desired = _desired(md, install)
    for obj in desired.objects:
        kube().apply(obj, FIELD_MANAGER)
    if desired.objects:
        _prune(md, name, namespace, desired.objects)
    return desired


def _record_autoscaling(
    md: dict[str, Any], autoscaling: dict[str, Any] | None, install: InstallSettings
) -> None:
    """Write (or, with None, clear) the autoscaler's record in a ModelDeployment's status, and
    apply its workloads from the object as stored, whoever wrote it. Not left to the
    status-field handler alone: kopf's change detection on status missed such a change when
    it landed amid the handling of another (its last-handled state recorded it; the workloads
    kept the old count)."""
    stored = kube().patch_status(md, {"autoscaling": autoscaling})
    with contextlib.suppress(ValidationError):
        _apply_workloads(
            ModelDeployment.model_validate(stored),
            str(stored["metadata"]["name"]),
            str(stored["metadata"]["namespace"]),
            install,
        )


def _reconcile_model_deployment(
    body: kopf.Body,
    name: str,
    namespace: str,
    status: kopf.Status,
    patch: kopf.Patch,
    *,
    install: InstallSettings,
) -> None:
    try:
        md = ModelDeployment.model_validate(dict(body))
    except ValidationError as error:
        message = f"spec refused: {error}"
        kopf.warn(body, reason="InvalidSpec", message=message)
        patch.status["conditions"] = [
            condition(
                status.get("conditions") or [],
                "Ready",
                status=False,
                reason="InvalidSpec",
                message=message,
                generation=int(body.meta.get("generation", 0)),
                now=_now(),
            )
        ]
        return
    desired = _apply_workloads(md, name, namespace, install)
    if desired.blocked:
        kopf.warn(body, reason="SpecNotApplied", message=desired.blocked)
    if desired.pin_problem:
        kopf.warn(body, reason="PinIgnored", message=desired.pin_problem)
    if desired.objects and status.get("observedGeneration") != body.meta.get("generation"):
        kinds = ", ".join(sorted({f"{o['kind']}/{o['metadata']['name']}" for o in desired.objects}))
        kopf.info(
            body, reason="Applied", message=f"generation {body.meta.get('generation')}: {kinds}"
        )
    pinned = set(desired.pin.replicas) if desired.pin else set()
    desired_status = _status_of(md, name, namespace, desired, pinned)
    was_pinned = any(role.get("pinned") for role in status.get("roles") or [])
    if desired.pin and not was_pinned:
        kopf.info(body, reason="Pinned", message=desired.pin.describe())
    elif was_pinned and not desired.pin:
        kopf.info(body, reason="PinReleased", message="replicas follow the spec again")
    if _changed(status, desired_status):
        patch.status.update(desired_status)


@kopf.on.field(API_GROUP, API_VERSION, "modeldeployments", field="status.autoscaling")
def autoscaled_replicas_changed(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """The autoscaler chose new replicas (or let go): apply them to the workloads."""
    _reconcile_model_deployment(
        body, name, _namespaced(namespace), status, patch, install=_install(memo)
    )


@kopf.timer(
    API_GROUP,
    API_VERSION,
    "modeldeployments",
    interval=15,
    annotations={PIN_ANNOTATION: kopf.PRESENT},
)
def pin_in_force(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A pin that expires changes nothing in the object: notice it and reconcile once. Also a
    pin that is in force but not yet applied, however its annotation's change was missed: the
    SRE's override must not wait for the next change of the object."""
    try:
        md = ModelDeployment.model_validate(dict(body))
    except ValidationError:
        return  # the reconcile reports the spec; a pin on it has nothing to apply to
    now = _now()
    pin, _problem = read_pin(body.metadata.annotations, roles=roles_of(md.spec), now=now)
    roles = status.get("roles") or []
    applied = {role.get("role") for role in roles if role.get("pinned")}
    in_force = (
        {r.value for r in pin.replicas} & {role.get("role") for role in roles}
        if pin is not None and pin.active(now)
        else set()
    )
    if applied != in_force:
        _reconcile_model_deployment(
            body, name, _namespaced(namespace), status, patch, install=_install(memo)
        )


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY_SELECTOR)
def child_deployment_changed(
    *, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A workload's rollout moved: refresh its owner's status (Ready, replicas per role)."""
    # The controller reference names the owner exactly (labels may be truncated).
    owner = next(
        (
            ref.get("name")
            for ref in body.metadata.get("ownerReferences") or []
            if ref.get("kind") == "ModelDeployment" and ref.get("controller")
        ),
        None,
    )
    if not owner:
        return
    current = kube().get(f"{API_GROUP}/{API_VERSION}", "ModelDeployment", owner, namespace)
    if current is None:
        return
    md = ModelDeployment.model_validate(current)
    # Pins are the main reconcile's to judge (it applies them): keep what it recorded.
    pinned = {role.role for role in md.status.roles if role.pinned} if md.status else set()
    desired_status = _status_of(
        md, owner, _namespaced(namespace), _desired(md, _install(memo)), pinned
    )
    if _changed(current.get("status"), desired_status):
        kube().patch_status(current, desired_status)


def _install(memo: kopf.Memo) -> InstallSettings:
    """What this install renders with: the flags of `inferfleet run`."""
    install = memo.get("install")
    return install if isinstance(install, InstallSettings) else InstallSettings()


@dataclass(frozen=True)
class _ServiceVerdict:
    """What the reconciler says of an InferenceService: the parts of its status it owns."""

    generation: int
    ready: bool
    reason: str
    message: str
    url: str | None


def _service_state(
    service: InferenceService,
    namespace: str,
    install: InstallSettings,
) -> tuple[list[dict[str, Any]], _ServiceVerdict]:
    """The router objects to apply and the reconciler's verdict on the service."""
    name = str(service.metadata.get("name"))
    generation = int(str(service.metadata.get("generation", 0)))
    referenced = {}
    for ref in service.spec.deployments:
        found = kube().get(f"{API_GROUP}/{API_VERSION}", "ModelDeployment", ref.name, namespace)
        if found is not None:
            referenced[ref.name] = ModelDeployment.model_validate(found)
    try:
        objects = render_inference_service(
            service,
            referenced,
            router_image=install.router_image,
            router_discovery=install.router_discovery,
        )
    except MissingReferenceError as error:
        return [], _ServiceVerdict(generation, False, "MissingDeployment", str(error), None)
    not_ready = sorted(
        ref
        for ref, md in referenced.items()
        if not (
            md.status
            and any(c.type == "Ready" and c.status.value == "True" for c in md.status.conditions)
        )
    )
    url = f"http://{name}.{namespace}.svc.cluster.local"
    if not_ready:
        message = "not ready: " + ", ".join(not_ready)
        return objects, _ServiceVerdict(generation, False, "BackendsNotReady", message, url)
    message = "ready: " + ", ".join(sorted(referenced))
    return objects, _ServiceVerdict(generation, True, "BackendsReady", message, url)


def _service_status(verdict: _ServiceVerdict, current: Mapping[str, Any]) -> dict[str, Any]:
    """The reconciler's part of the status, over the status as it is now: Ready judged anew,
    the autoscaler's conditions kept."""
    conditions: list[Mapping[str, Any]] = list(current.get("conditions") or [])
    ready = condition(
        conditions, "Ready", status=verdict.ready, reason=verdict.reason,
        message=verdict.message, generation=verdict.generation, now=_now(),
    )  # fmt: skip
    status: dict[str, Any] = {
        "observedGeneration": verdict.generation,
        "conditions": with_condition(conditions, ready),
    }
    if verdict.url is not None:
        status["url"] = verdict.url
    return status


@retry(
    retry=retry_if_exception_type(StaleObjectError),
    stop=stop_after_attempt(5),
    wait=wait_random(0, 0.2),
    reraise=True,
)
def _update_service_status(
    name: str, namespace: str, update: Callable[[Mapping[str, Any]], dict[str, Any]]
) -> dict[str, Any] | None:
    """Read the InferenceService, compute its status with `update` from what it holds now and
    write it over the version read; on a conflict, again from a fresh read (client-go's
    RetryOnConflict). The reconciler and the autoscaler each own entries of one conditions
    list, and a merge patch from a stale read would drop the other's. Returns what was written:
    None when nothing changed or the service is gone."""
    current = kube().get(f"{API_GROUP}/{API_VERSION}", "InferenceService", name, namespace)
    if current is None:
        return None
    status = update(current.get("status") or {})
    if not _changed(current.get("status"), status):
        return None
    kube().patch_status(current, status, if_unchanged=True)
    return status


@kopf.on.resume(API_GROUP, API_VERSION, "inferenceservices")
@kopf.on.create(API_GROUP, API_VERSION, "inferenceservices")
@kopf.on.update(API_GROUP, API_VERSION, "inferenceservices")
def reconcile_inference_service(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    try:
        service = InferenceService.model_validate(dict(body))
    except ValidationError as error:
        kopf.warn(body, reason="InvalidSpec", message=f"spec refused: {error}")
        return
    space = _namespaced(namespace)
    objects, verdict = _service_state(service, space, _install(memo))
    for obj in objects:
        kube().apply(obj, FIELD_MANAGER)
    _release(service, space, _install(memo))
    try:
        written = _update_service_status(name, space, functools.partial(_service_status, verdict))
    except StaleObjectError as error:
        raise kopf.TemporaryError(f"status kept changing: {error}", delay=1) from error
    if written is not None and verdict.reason == "MissingDeployment":
        kopf.warn(body, reason="MissingDeployment", message=verdict.message)


@kopf.on.field(API_GROUP, API_VERSION, "modeldeployments", field="status.conditions")
def backend_changed(*, name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A ModelDeployment turned Ready or not: the services it backs follow."""
    for found in kube().list(f"{API_GROUP}/{API_VERSION}", "InferenceService", namespace=namespace):
        if not any(ref.get("name") == name for ref in found["spec"].get("deployments", [])):
            continue
        service = InferenceService.model_validate(found)
        verdict = _service_state(service, _namespaced(namespace), _install(memo))[1]
        _update_service_status(
            str(found["metadata"]["name"]),
            _namespaced(namespace),
            functools.partial(_service_status, verdict),
        )


AUTOSCALE_TIMER_S = 1.0
"""How often each autoscaled service's timer wakes; it ticks every `--autoscale-interval`."""


def _autoscaling_on(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("autoscaling", {}).get("policy") == "goodput")


def _autoscaler_settings(memo: kopf.Memo) -> AutoscalerSettings:
    settings = memo.get("autoscaler")
    return settings if isinstance(settings, AutoscalerSettings) else AutoscalerSettings()


@kopf.timer(
    API_GROUP,
    API_VERSION,
    "inferenceservices",
    interval=AUTOSCALE_TIMER_S,
    when=_autoscaling_on,
)
def autoscale(*, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """One autoscaling tick (`autoscale.controller.tick`) of a `policy: goodput` service, on a
    timer of its own so that a slow Prometheus answer delays no other service."""
    settings = _autoscaler_settings(memo)
    now = _now()
    last = memo.get("last_tick")
    if isinstance(last, datetime) and (now - last).total_seconds() < settings.interval_s:
        return
    memo["last_tick"] = now
    try:
        service = InferenceService.model_validate(dict(body))
    except ValidationError:
        return  # the reconciler reports it
    space = _namespaced(namespace)
    found: dict[str, dict[str, Any]] = {}
    for ref in service.spec.deployments:
        obj = kube().get(f"{API_GROUP}/{API_VERSION}", "ModelDeployment", ref.name, space)
        if obj is not None:
            found[ref.name] = obj
    deployments = {name: ModelDeployment.model_validate(obj) for name, obj in found.items()}
    source = (
        PrometheusSource(settings.prometheus_url, settings.query_budget_s)
        if settings.prometheus_url
        else None
    )
    result = tick(service, deployments, source, settings=settings, now=now)
    # The service's status first: it holds the policy's history, and a tick whose status could
    # not be written must not have scaled anything; it runs again on the next wake.
    metrics = next(c for c in result.status["conditions"] if c["type"] == METRICS_AVAILABLE)

    def status_over(current: Mapping[str, Any]) -> dict[str, Any]:
        conditions = with_condition(current.get("conditions") or [], metrics)
        return {**result.status, "conditions": conditions}

    try:
        _update_service_status(str(body.metadata["name"]), space, status_over)
    except StaleObjectError:
        memo["last_tick"] = None
        return
    for decided in result.deployments:
        if decided.autoscaling_status is not None:
            _record_autoscaling(found[decided.name], decided.autoscaling_status, _install(memo))
    for reason, message, warning in result.events:
        (kopf.warn if warning else kopf.info)(body, reason=reason, message=message)


def _release(
    service: InferenceService, namespace: str, install: InstallSettings, *, deleted: bool = False
) -> None:
    """Hand the replicas of deployments this service no longer autoscales back to their specs."""
    name = str(service.metadata.get("name"))
    for ref in service.spec.deployments:
        found = kube().get(f"{API_GROUP}/{API_VERSION}", "ModelDeployment", ref.name, namespace)
        recorded = (found or {}).get("status", {}).get("autoscaling") or {}
        if found is None or recorded.get("service") != name:
            continue
        if deleted or not autoscaled_by(service, ref.name):
            _record_autoscaling(found, None, install)


@kopf.on.event(API_GROUP, API_VERSION, "inferenceservices")
def inference_service_deleted(
    *, type: str, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted service autoscales nothing: its deployments follow their specs again. A watch
    event, not a deletion handler: no finalizer to hold the deletion, no progress to store on
    an object that is gone."""
    if type != "DELETED":
        return
    with contextlib.suppress(ValidationError):
        _release(
            InferenceService.model_validate(dict(body)),
            _namespaced(namespace),
            _install(memo),
            deleted=True,
        )
