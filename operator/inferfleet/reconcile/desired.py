"""What each kind should be, from the resource and what the operator's indices hold (pure).

One function per kind: (the resource as stored, what the indices hold about its children, the
services that route to it, the names its namespace holds) -> an `Outcome`: the objects to
apply, the objects to delete, the status to write and the Events to post. `reconcile.handlers`
reads the indices, calls these and carries the outcome out; everything that decides is here,
tested without a cluster.

Level-based: an outcome depends only on the state passed in, never on which change triggered
it, so a reconcile run twice, late, or after a restart does the same thing. What is already as
desired costs no write: each applied object carries a digest of what was applied
(`APPLIED_HASH_ANNOTATION`), compared with what the index holds; status is written only when it
differs; Events are posted only when a condition they report changes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from inferfleet.api.catalog import GpuCatalog, GpuType
from inferfleet.api.common import StatusModel
from inferfleet.api.conditions import condition, find, with_condition, without_conditions
from inferfleet.api.inference_service import (
    AutoscalingPolicy,
    InferenceService,
    InferenceServiceStatus,
)
from inferfleet.api.model_deployment import (
    AutoscalingStatus,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    Role,
    TopologyMode,
)
from inferfleet.api.pins import read_pin
from inferfleet.autoscale.ownership import Claim, autoscaling_owner, recorded_autoscaler
from inferfleet.engines import roles_of
from inferfleet.planning.capacity import CapacityPlan, plan
from inferfleet.reconcile.events import Event
from inferfleet.reconcile.fill import FillState, weight_cache_status
from inferfleet.reconcile.status import (
    Blocked,
    PinState,
    RoleProgress,
    model_deployment_status,
)
from inferfleet.render import (
    InstallSettings,
    MissingReferenceError,
    UnsupportedSpecError,
    render_inference_service,
    render_model_deployment,
    selector_labels,
    spec_hash,
)
from inferfleet.render.common import WORKLOAD_KINDS
from inferfleet.render.multinode import (
    GENERATED_DATA_ANNOTATION,
    LWS_API_VERSION,
    LWS_KIND,
    LWS_SUPPORTED,
)

APPLIED_HASH_ANNOTATION = "inferfleet.io/applied-hash"
UNSERVED_RECHECK_S = 60.0
"""How soon a deployment blocked on a kind the cluster does not serve looks again."""


@dataclass(frozen=True, order=True)
class ObjectKey:
    """One object of a namespace."""

    api_version: str
    kind: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectKey:
        return cls(str(obj["apiVersion"]), str(obj["kind"]), str(obj["metadata"]["name"]))

    def describe(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Child:
    """An object the operator created, as its index holds it."""

    key: ObjectKey
    owner_uid: str
    applied_hash: str | None
    replicas: int | None = None
    """A workload's spec.replicas (an edit of it by hand is drift to undo)."""
    role: Role | None = None
    progress: RoleProgress | None = None
    """A ModelDeployment's workload (Deployment or LeaderWorkerSet): its rollout."""
    serving: bool | None = None
    """An InferenceService's router Deployment: whether a router pod is available (the
    service's endpoint answers)."""
    fill: FillState | None = None
    """Of a weight cache: its fill Job's end, its volume's phase, the fill's last push."""

    @property
    def read_by_owner(self) -> tuple[object, ...]:
        """What its owner's reconcile reads of it. Of a workload's rollout, what the owner's
        status says (the replicas asked for and ready, rolled out or not, stalled, refused):
        the steps of a rollout in between (the Deployment controller has seen the spec, made
        the pods, not readied them yet) change nothing the owner writes. The pods made count
        against a GPU quota in the autoscaler's ticks, which read them from the index."""
        progress = self.progress
        rollout = (
            None
            if progress is None
            else (
                progress.desired,
                progress.ready,
                progress.rolled_out,
                progress.stalled,
                progress.refused,
            )
        )
        return (
            self.key, self.owner_uid, self.applied_hash, self.replicas, self.role, self.serving,
            rollout, self.fill,
        )  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    apply: tuple[dict[str, Any], ...] = ()
    delete: tuple[ObjectKey, ...] = ()
    status: dict[str, Any] | None = None
    """The status patch (a merge patch: null removes a field); None: status is as desired."""
    events: tuple[Event, ...] = ()
    new: frozenset[ObjectKey] = frozenset()
    """Those of `apply` the resource has not created yet: applied only where no object of
    the name exists (one inferfleet did not create is never taken over)."""
    requeue_after_s: float | None = None
    """Reconcile again after this long even if nothing changes (a pin that expires)."""
    generate: tuple[dict[str, Any], ...] = ()
    """Secrets rendered without their data (`GENERATED_DATA_ANNOTATION`): created once with
    what the operator generates into them, never applied again and never read back (their
    names carry their owner's uid, so one that exists is the one created before). The
    ModelDeployment owns them, so they go with it."""
    retire: tuple[ObjectKey, ...] = ()
    """Secrets of `generate` that an earlier reconcile created (the status records them) and
    that the resource no longer renders: deleted by name (it carries this resource's uid),
    before the status that stops recording them is written."""


@dataclass(frozen=True)
class Namespace:
    """What the indices hold of the resource's namespace."""

    children: Sequence[Child] = ()
    """The objects this resource created (its uid is their controller)."""
    holder: Callable[[ObjectKey], str | None] = field(default=lambda _key: None)
    """The uid of the inferfleet resource that created the object of that name, if one did."""
    foreign: frozenset[ObjectKey] = frozenset()
    """Names held by objects inferfleet did not create (found when creating one was refused)."""
    refused: Mapping[ObjectKey, str] = field(default_factory=dict)
    """Objects the API server refused when last applied, with its message (a quota, a policy
    webhook, RBAC)."""


def _stamped(obj: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """`obj` with its digest (`spec_hash` of itself) in an annotation, to be applied."""
    metadata = dict(obj["metadata"])
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        APPLIED_HASH_ANNOTATION: digest,
    }
    return {**obj, "metadata": metadata}


def _digests(objects: Sequence[Mapping[str, Any]]) -> dict[ObjectKey, str]:
    """Each rendered object's `spec_hash`, computed once per reconcile: hashing is the
    costliest step of a reconcile that changes nothing."""
    return {ObjectKey.of(obj): spec_hash(obj) for obj in objects}


def _to_apply(
    objects: Sequence[Mapping[str, Any]],
    children: Sequence[Child],
    digests: Mapping[ObjectKey, str],
) -> tuple[dict[str, Any], ...]:
    held = {child.key: child for child in children}
    changed = []
    for obj in objects:
        key = ObjectKey.of(obj)
        child = held.get(key)
        replicas = (
            (obj.get("spec") or {}).get("replicas") if obj["kind"] in WORKLOAD_KINDS else None
        )
        digest = digests[key]
        if (
            child is None
            or child.applied_hash != digest
            or (replicas is not None and child.replicas != replicas)
        ):
            changed.append(_stamped(obj, digest))
    # Workloads last: what their pods use (a service account, a config map) exists before the
    # pods are created, and a name found taken stops the apply before any pod runs.
    return tuple(sorted(changed, key=lambda obj: obj["kind"] in WORKLOAD_KINDS))


def _to_delete(
    objects: Sequence[Mapping[str, Any]], children: Sequence[Child]
) -> tuple[ObjectKey, ...]:
    wanted = {ObjectKey.of(obj) for obj in objects}
    return tuple(sorted(child.key for child in children if child.key not in wanted))


def _new(objects: Sequence[Mapping[str, Any]], children: Sequence[Child]) -> frozenset[ObjectKey]:
    held = {child.key for child in children}
    return frozenset(key for obj in objects if (key := ObjectKey.of(obj)) not in held)


def _collisions(objects: Sequence[Mapping[str, Any]], uid: str, space: Namespace) -> str | None:
    """What holds names this resource would render (another inferfleet resource, or objects
    inferfleet did not create), as a condition's message; None when nothing does."""
    keys = [ObjectKey.of(obj) for obj in objects]
    foreign = [key.describe() for key in keys if key in space.foreign]
    taken = [
        key.describe()
        for key in keys
        if (holder := space.holder(key)) is not None and holder != uid
    ]
    problems = []
    if taken:
        problems.append(
            f"{', '.join(taken)} already belong to another inferfleet resource of this "
            "namespace; rename one of the two"
        )
    if foreign:
        problems.append(
            f"{', '.join(foreign)} already exist and inferfleet did not create them; rename "
            "this resource or remove them (checked again every minute)"
        )
    return f"not applied: {'; '.join(problems)}" if problems else None


def _refusals(objects: Sequence[Mapping[str, Any]], space: Namespace) -> str | None:
    """What the API server said when it refused objects this resource renders, as a
    condition's message; None when it refused none."""
    refused = [
        f"{key.describe()}: {space.refused[key]}"
        for obj in objects
        if (key := ObjectKey.of(obj)) in space.refused
    ]
    if not refused:
        return None
    return f"not applied: the API server refused {'; '.join(refused)} (tried again every minute)"


def status_patch(
    previous: Mapping[str, Any], desired: Mapping[str, Any], owned: Sequence[str] | None = None
) -> dict[str, Any] | None:
    """The merge patch from `previous` to `desired` over the fields this writer owns (all of
    `desired`'s, and those of `owned` that `desired` leaves out, which it removes), or None
    when nothing differs."""
    patch: dict[str, Any] = {k: v for k, v in desired.items() if previous.get(k) != v}
    for key in owned or ():
        if key not in desired and key in previous:
            patch[key] = None
    return patch or None


@functools.lru_cache(maxsize=4096)
def _plan_of(spec_json: str, gpus: GpuCatalog) -> CapacityPlan:
    """The planner's verdict for a spec on the install's GPU catalog; cached by the spec's
    JSON, since every reconcile of an unchanged spec asks again and the answer is a pure
    function of the two."""
    return plan(ModelDeploymentSpec.model_validate_json(spec_json), gpus)


def stored_status(body: Mapping[str, Any], model: type[StatusModel]) -> dict[str, Any]:
    """The object's status as this version writes it, so that a difference in form alone (a
    timestamp's precision) is no change. What this version cannot read of it (a newer
    operator's, or a hand edit) is dropped from the comparison and so written anew; only
    well-formed conditions are kept."""
    status = body.get("status")
    if not isinstance(status, dict):
        return {}
    try:
        return model.model_validate(status).to_wire()
    except ValidationError:
        pass
    readable: dict[str, Any] = {}
    for key, value in status.items():
        with contextlib.suppress(ValidationError):
            readable |= model.model_validate({key: value}).to_wire()
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        readable["conditions"] = [
            c
            for c in conditions
            if isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("type", "status"))
        ]
    return readable


def without_status(body: Mapping[str, Any]) -> dict[str, Any]:
    """The object to validate its spec: a status it cannot read must not make the spec
    invalid (the status is the operator's to rewrite)."""
    return {key: value for key, value in body.items() if key != "status"}


def _generation(body: Mapping[str, Any]) -> int:
    generation = (body.get("metadata") or {}).get("generation", 0)
    return generation if isinstance(generation, int) else 0


def _condition_events(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Event]:
    """The Events a change of conditions calls for: a problem when it appears or its message
    changes, and the pin's coming and going."""
    events = []
    for new in after:
        old = find(before, str(new["type"])) or {}
        if (old.get("reason"), old.get("message")) == (new["reason"], new["message"]):
            continue
        reason = str(new["reason"])
        if reason in PROBLEMS:
            events.append(Event(reason, str(new["message"]), warning=True))
        elif new["type"] == "Pinned" and reason == "PinInForce":
            events.append(Event("Pinned", str(new["message"])))
        elif new["type"] == "Pinned" and old.get("reason") == "PinInForce":
            events.append(Event("PinReleased", "replicas follow the spec again"))
    return list(dict.fromkeys(events))  # one Event for a problem that several conditions show


PROBLEMS = frozenset(
    {
        "InvalidSpec",
        "ArchitectureUnavailable",
        "SpecNotApplied",
        "NameCollision",
        "ApplyRefused",
        "PinIgnored",
        "RolloutStalled",
        "Unschedulable",
        "QuotaExhausted",
        "PodsRefused",
        "MissingDeployment",
    }
)
"""Condition reasons that are problems: each is posted as a Warning Event when it appears."""

MODEL_DEPLOYMENT_STATUS_FIELDS = tuple(
    info.alias or name for name, info in ModelDeploymentStatus.model_fields.items()
)


def _invalid(
    body: Mapping[str, Any], error: ValidationError, now: datetime, model: type[StatusModel]
) -> Outcome:
    message = f"spec refused: {_first_lines(error)}"
    return _not_ready(body, model, "InvalidSpec", message, now)


def _not_ready(
    body: Mapping[str, Any],
    model: type[StatusModel],
    reason: str,
    message: str,
    now: datetime,
    *,
    recheck_after_s: float | None = None,
) -> Outcome:
    """Ready False with `reason`, nothing applied or deleted: what runs keeps running."""
    previous = stored_status(body, model)
    conditions = previous.get("conditions") or []
    ready = condition(
        conditions, "Ready", status=False, reason=reason, message=message,
        generation=_generation(body), now=now,
    )  # fmt: skip
    after = with_condition(conditions, ready)
    return Outcome(
        status=status_patch(previous, {"conditions": after}),
        events=tuple(_condition_events(conditions, after)),
        requeue_after_s=recheck_after_s,
    )


def _first_lines(error: ValidationError) -> str:
    problems = [
        f"{'.'.join(str(p) for p in e['loc']) or 'object'}: {e['msg']}" for e in error.errors()
    ]
    return "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")


def _validated_deployment(
    body: Mapping[str, Any], architecture_problem: str | None, now: datetime
) -> ModelDeployment | Outcome:
    """The deployment, or the outcome that says why it is not reconciled (nothing applied or
    deleted): a spec refused, or an architecture its ConfigMap did not give."""
    try:
        md = ModelDeployment.model_validate(without_status(body))
    except ValidationError as error:
        return _invalid(body, error, now, ModelDeploymentStatus)
    if architecture_problem is None and md.spec.architecture_known:
        return md
    message = architecture_problem or "model.architectureFrom has not been read"
    return _not_ready(
        body, ModelDeploymentStatus, "ArchitectureUnavailable", message, now,
        recheck_after_s=UNSERVED_RECHECK_S,
    )  # fmt: skip


def model_deployment_outcome(
    body: Mapping[str, Any],
    *,
    space: Namespace,
    claims: Sequence[Claim],
    unschedulable: Mapping[Role, str],
    install: InstallSettings,
    now: datetime,
    unserved: frozenset[str] = frozenset(),
    architecture_problem: str | None = None,
) -> Outcome:
    """A ModelDeployment's outcome. `claims`: the services that route to it (the owner's
    decision replaces the spec's replicas, a pin wins over both); `unschedulable`: per role,
    the scheduler's reason for pods it cannot place; `unserved`: the kinds it may render that
    the cluster does not serve (LeaderWorkerSet, where LWS is not installed);
    `architecture_problem`: why the architecture its spec reads from a ConfigMap was not read."""
    md = _validated_deployment(body, architecture_problem, now)
    if isinstance(md, Outcome):
        return md
    metadata = body.get("metadata") or {}
    name, uid = str(metadata.get("name")), str(metadata.get("uid", ""))
    generation = _generation(body)
    previous = stored_status(body, ModelDeploymentStatus)
    roles = set(roles_of(md.spec))
    capacity = _plan_of(md.spec.model_dump_json(by_alias=True, exclude_none=True), install.gpus)
    owner = autoscaling_owner(recorded_autoscaler(body), claims)
    decided = owner.decided(roles) if owner else {}
    annotations = metadata.get("annotations")
    pin, pin_problem = read_pin(
        annotations if isinstance(annotations, dict) else {}, roles=roles, now=now,
        limits=owner.pin_limits(capacity.config.gpus) if owner else None,
    )  # fmt: skip
    pinned = dict(pin.replicas) if pin is not None and pin.active(now) else {}
    objects, blocked = _rendered(
        md, capacity, overrides=decided | pinned, uid=uid, space=space, install=install,
        unserved=unserved,
    )  # fmt: skip
    objects, generate = _split_generated(objects)
    generated, retire = _generated_secrets(objects, generate, previous.get("generatedSecrets"))
    digests = _digests(objects)
    disaggregated = md.spec.topology.mode == TopologyMode.DISAGGREGATED
    serving = Role.DECODE if disaggregated else Role.AGGREGATED
    status = model_deployment_status(
        generation=generation,
        plan=capacity,
        roles=_progress(objects, space.children, digests),
        serving_role=serving,
        selector=",".join(f"{k}={v}" for k, v in selector_labels(name, serving).items()),
        previous=previous,
        now=now,
        blocked=blocked,
        pinned=set(pinned),
        pin=PinState(in_force=pin.describe() if pin and pinned else None, ignored=pin_problem),
        unschedulable={r: why for r, why in unschedulable.items() if r in roles},
        autoscaling=_autoscaling_record(owner, decided),
        generated_secrets=generated,
        weight_cache=weight_cache_status(objects, _fills(space.children), md.spec.model.source),
    ).to_wire()
    events = _condition_events(previous.get("conditions") or [], status["conditions"])
    # Once per generation: until the status records it, every reconcile computes it again, and
    # it is named by its generation, so one that dies between posting and recording, or that
    # raced a change, posts it once.
    if objects and previous.get("observedGeneration") != generation:
        kinds = ", ".join(sorted(ObjectKey.of(o).describe() for o in objects))
        once = f"generation {generation}"
        events.insert(0, Event("Applied", f"{once}: {kinds}", occurrence=once))
    pin_ends_s = (pin.until - now).total_seconds() if pin and pinned else None
    rechecks = [
        s for s in (pin_ends_s, blocked.recheck_after_s if blocked else None) if s is not None
    ]
    return Outcome(
        apply=_to_apply(objects, space.children, digests),
        delete=_to_delete(objects, space.children) if objects else (),
        new=_new(objects, space.children),
        status=status_patch(previous, status, owned=MODEL_DEPLOYMENT_STATUS_FIELDS),
        events=tuple(events),
        requeue_after_s=min(rechecks, default=None),
        generate=generate,
        retire=retire,
    )


def _fills(children: Sequence[Child]) -> dict[str, FillState]:
    return {child.key.name: child.fill for child in children if child.fill is not None}


def _generated_secrets(
    objects: Sequence[Mapping[str, Any]],
    generate: Sequence[Mapping[str, Any]],
    recorded: Sequence[str] | None,
) -> tuple[list[str], tuple[ObjectKey, ...]]:
    """The Secrets with generated data the status records, and those to retire: recorded and
    no longer rendered. While nothing renders (the spec does not fit), nothing is deleted and
    the record stays."""
    if not objects:
        return list(recorded or []), ()
    names = [str(o["metadata"]["name"]) for o in generate]
    return names, tuple(ObjectKey("v1", "Secret", n) for n in recorded or [] if n not in names)


def _split_generated(
    objects: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], tuple[dict[str, Any], ...]]:
    """The objects to apply, and those created once with generated data (`Outcome.generate`)."""

    def generated(obj: Mapping[str, Any]) -> bool:
        return GENERATED_DATA_ANNOTATION in (obj["metadata"].get("annotations") or {})

    return [o for o in objects if not generated(o)], tuple(o for o in objects if generated(o))


def may_span_nodes(body: Mapping[str, Any], gpus: GpuCatalog) -> bool:
    """Whether a ModelDeployment as stored asks for more GPUs per replica than a node of its
    type has (read without validating it: its reconcile judges the spec)."""
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        return False
    parallelism = spec.get("parallelism") or {}
    gpu = spec.get("gpu") or {}
    try:
        per_replica = int(parallelism.get("tensor", 1)) * int(parallelism.get("pipeline", 1))
        per_node = gpus[GpuType(str(gpu.get("type")))].gpus_per_node
    except (AttributeError, KeyError, TypeError, ValueError):
        return False
    return per_replica > per_node


def _rendered(
    md: ModelDeployment,
    capacity: CapacityPlan,
    *,
    overrides: Mapping[Role, int],
    uid: str,
    space: Namespace,
    install: InstallSettings,
    unserved: frozenset[str],
) -> tuple[list[dict[str, Any]], Blocked | None]:
    """The objects to apply, or why none may be: a spec that does not fit asks for no GPU,
    and names another resource holds are not taken."""
    if not capacity.memory.fits:
        return [], Blocked("SpecNotApplied", f"not applied: {capacity.memory.verdict()}")
    try:
        objects = render_model_deployment(
            md,
            replicas=dict(overrides) or None,
            options=install.engines,
            isolation=install.network,
            placement=install.placement,
            gpus=install.gpus,
        )
    except UnsupportedSpecError as error:
        return [], Blocked("SpecNotApplied", f"not applied: {error}")
    if LWS_KIND in unserved and any(o["kind"] == LWS_KIND for o in objects):
        gpus = md.spec.parallelism.gpus_per_replica
        message = (
            f"not applied: a replica of {gpus} GPUs spans more than one node and runs as a "
            f"LeaderWorkerSet ({LWS_API_VERSION}), which this cluster does not serve: install "
            f"LeaderWorkerSet ({LWS_SUPPORTED}, https://github.com/kubernetes-sigs/lws)"
        )
        return [], Blocked("SpecNotApplied", message, recheck_after_s=UNSERVED_RECHECK_S)
    collision = _collisions(objects, uid, space)
    if collision is not None:
        return [], Blocked("NameCollision", collision)
    refusal = _refusals(objects, space)
    if refusal is not None:
        return [], Blocked("ApplyRefused", refusal)
    return objects, None


def _autoscaling_record(
    owner: Claim | None, decided: Mapping[Role, int]
) -> AutoscalingStatus | None:
    if owner is None or not decided:
        return None
    record: dict[str, Any] = {
        "service": owner.service,
        "replicas": [{"role": r, "replicas": n} for r, n in sorted(decided.items())],
        "reason": owner.reason or "Autoscaled",
        "time": owner.time or owner.created,
    }
    if owner.advice:
        record["advice"] = [advice.to_wire() for advice in owner.advice]
    if owner.diagnosis:
        record["diagnosis"] = [found.to_wire() for found in owner.diagnosis]
    return AutoscalingStatus.model_validate(record)


def _progress(
    objects: Sequence[Mapping[str, Any]],
    children: Sequence[Child],
    digests: Mapping[ObjectKey, str],
) -> dict[Role, RoleProgress]:
    """Each role's rollout: what its workload reports, against the replicas it is asked for
    now (a workload not yet applied, or applied with another count, is rolling out). A role
    that changes kind (a replica now over several nodes, or back on one) is read from the
    workload rendered, not the one on its way out."""
    workloads = [child for child in children if child.progress is not None]
    held = {child.role: child for child in workloads}
    if not objects:  # nothing applied (blocked): the workloads as they are
        return {role: c.progress for role, c in held.items() if role and c.progress}
    by_key = {child.key: child for child in workloads}
    progress: dict[Role, RoleProgress] = {}
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        role = Role(obj["metadata"]["labels"]["inferfleet.io/role"])
        desired = int(obj["spec"]["replicas"])
        key = ObjectKey.of(obj)
        child = by_key.get(key)
        seen = child.progress if child is not None else None
        current = (
            child is not None
            and seen is not None
            and child.applied_hash == digests[key]
            and seen.desired == desired
        )
        if seen is not None and current:
            progress[role] = seen
        else:
            before = seen or (held[role].progress if role in held else None)
            ready = before.ready if before is not None else 0
            progress[role] = RoleProgress(desired=desired, ready=ready, observed_current=False)
    return progress


SERVICE_STATUS_FIELDS = ("observedGeneration", "conditions", "url")
"""What the reconciler writes of an InferenceService's status; the autoscaler writes the rest."""
TICK_CONDITIONS = ("MetricsAvailable", "Autoscaling")
"""Conditions of an InferenceService that its autoscaler writes (only under `policy: goodput`)."""


def inference_service_outcome(
    body: Mapping[str, Any],
    *,
    space: Namespace,
    backends: Mapping[str, Mapping[str, Any]],
    install: InstallSettings,
    now: datetime,
) -> Outcome:
    """An InferenceService's outcome: its router objects, and the parts of its status the
    reconciler owns (`Ready`, `url`, `observedGeneration`); the autoscaler owns the rest.
    `backends`: the ModelDeployments of its namespace it references that exist."""
    try:
        service = InferenceService.model_validate(without_status(body))
    except ValidationError as error:
        return _invalid(body, error, now, InferenceServiceStatus)
    metadata = body.get("metadata") or {}
    name, namespace = str(metadata.get("name")), str(metadata.get("namespace"))
    uid = str(metadata.get("uid", ""))
    referenced, ready_backends, unread = _read_backends(service, backends)
    url: str | None = None
    if unread:
        # Its router is rendered from every backend's architecture: what runs keeps running.
        message = f"architecture not read: {', '.join(unread)} (see its Ready condition)"
        return _not_ready(body, InferenceServiceStatus, "BackendsNotReady", message, now)
    try:
        objects = render_inference_service(
            service,
            referenced,
            router_image=install.router_image,
            router_discovery=install.router_discovery,
            isolation=install.network,
        )
    except MissingReferenceError as error:
        objects, verdict = [], (False, "MissingDeployment", str(error))
    else:
        collision = _collisions(objects, uid, space)
        refusal = _refusals(objects, space)
        url = f"http://{name}.{namespace}.svc.cluster.local"
        if collision is not None:
            objects, url = [], None
            verdict = (False, "NameCollision", collision)
        elif refusal is not None:
            objects, url = [], None
            verdict = (False, "ApplyRefused", refusal)
        else:
            verdict = _backends_verdict(sorted(referenced), ready_backends)
            if verdict[0] and not _router_serving(space.children):
                routers = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
                message = f"no pod of its router {', '.join(routers)} is available"
                verdict = (False, "RouterNotReady", message)
    previous = stored_status(body, InferenceServiceStatus)
    conditions: list[dict[str, Any]] = list(previous.get("conditions") or [])
    ready = condition(
        conditions, "Ready", status=verdict[0], reason=verdict[1], message=verdict[2],
        generation=_generation(body), now=now,
    )  # fmt: skip
    after = with_condition(conditions, ready)
    if service.spec.autoscaling.policy is not AutoscalingPolicy.GOODPUT:
        after = without_conditions(after, TICK_CONDITIONS)
    typed = InferenceServiceStatus.model_validate(
        {"observedGeneration": _generation(body), "conditions": after}
        | ({"url": url} if url is not None else {})
    ).to_wire()
    # Only the fields the reconciler owns: the model's defaults for the others (an empty
    # `replicas`) would overwrite what the autoscaler wrote.
    desired = {key: typed[key] for key in SERVICE_STATUS_FIELDS if key in typed}
    return Outcome(
        apply=_to_apply(objects, space.children, _digests(objects)),
        delete=_to_delete(objects, space.children) if objects else (),
        new=_new(objects, space.children),
        status=status_patch(previous, desired),
        events=tuple(_condition_events(conditions, after)),
    )


def _read_backends(
    service: InferenceService, backends: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, ModelDeployment], set[str], list[str]]:
    """The service's backends that can be read, those of them Ready, and those whose
    architecture (from a ConfigMap) is not read yet. One that does not validate is left out:
    its own status says why."""
    referenced: dict[str, ModelDeployment] = {}
    ready: set[str] = set()
    unread: list[str] = []
    for ref in service.spec.deployments:
        found = backends.get(ref.name)
        if found is None:
            continue
        with contextlib.suppress(ValidationError):
            backend = ModelDeployment.model_validate(without_status(found))
            if not backend.spec.architecture_known:
                unread.append(ref.name)
                continue
            referenced[ref.name] = backend
            conditions = stored_status(found, ModelDeploymentStatus).get("conditions", [])
            if (find(conditions, "Ready") or {}).get("status") == "True":
                ready.add(ref.name)
    return referenced, ready, unread


def _router_serving(children: Sequence[Child]) -> bool:
    """Whether the service's router Deployment (the one Deployment it creates) has a pod
    available: until then its endpoint refuses every request, whatever its backends."""
    return any(child.serving for child in children if child.key.kind == "Deployment")


def _backends_verdict(referenced: Sequence[str], ready: set[str]) -> tuple[bool, str, str]:
    not_ready = [name for name in referenced if name not in ready]
    if not_ready:
        return False, "BackendsNotReady", "not ready: " + ", ".join(not_ready)
    return True, "BackendsReady", "ready: " + ", ".join(referenced)
