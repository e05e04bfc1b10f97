"""The operator's kopf layer: indices of what the cluster holds, and the events that say which
object to reconcile. Thin on purpose: what each object should be is decided in
`reconcile.desired` (pure); `reconcile.controller` carries it out.

Level-triggered, as Kubernetes controllers are: kopf's watches keep indices (the informer
caches) of ModelDeployments, InferenceServices and GPU quotas, and the operator's own
(`reconcile.watches`) keep the objects it created and the engine pods it must explain; every
event only adds keys to a work queue (`reconcile.workqueue`), the object's own and those of the
objects it affects (a child's owner, a service's backends, a deployment's services). Workers
reconcile each key from the indices, so a burst of events costs one reconcile, a change is
never lost to a missed diff, and a restart simply reconciles everything once. No create/update
handler: kopf stores no diff base or progress in the objects, and an object's deletion needs no
finalizer (its children carry owner references; the deployments a deleted service autoscaled
are reconciled back to their specs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kopf

from inferfleet.api.common import API_GROUP, API_VERSION
from inferfleet.autoscale.controller import AutoscalerSettings
from inferfleet.autoscale.ownership import claims_of
from inferfleet.reconcile.children import WATCHED_CHILDREN
from inferfleet.reconcile.controller import Controller
from inferfleet.reconcile.desired import UNSERVED_RECHECK_S
from inferfleet.reconcile.entries import gpu_quota_entry
from inferfleet.reconcile.pods import ENGINE_PODS
from inferfleet.reconcile.watches import Watches
from inferfleet.render import InstallSettings
from inferfleet.render.common import label_value

logger = logging.getLogger(__name__)


@dataclass
class _Slot:
    """Where the one controller of the operator lives. kopf hands each object a shallow copy
    of the operator's memo: a key set from an object's handler stays in that object's copy,
    while this slot, put in the operator's memo at startup, is shared by every copy."""

    controller: Controller | None = None


class _NoDiffBase(kopf.DiffBaseStorage):
    """No handler here reacts to a diff (no create/update handlers): kopf need not copy every
    object on every watch event to compute one, nor store a last-handled state in it."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    memo["slot"] = _Slot()
    settings.posting.level = logging.INFO
    settings.peering.standalone = True
    settings.watching.server_timeout = 270
    settings.persistence.diffbase_storage = _NoDiffBase()
    # Every event's handler succeeds by design: a line per event would be the whole log.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)


# Indices: kopf fills them from its watches before any handler runs, and keeps them current.
# Coroutines, as every handler here is: kopf runs a plain function in a thread pool, a hop per
# watch event that costs more than the function.


@kopf.index(API_GROUP, API_VERSION, "modeldeployments")
async def model_deployments(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    if namespace is None:
        return {}
    return {(namespace, name): dict(body), ("label", namespace, label_value(name)): name}


@kopf.index(API_GROUP, API_VERSION, "inferenceservices")
async def inference_services(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    if namespace is None:
        return {}
    claims = claims_of(body)
    return {(namespace, name): dict(body)} | {
        ("backend", namespace, backend): claim for backend, claim in claims.items()
    }


@kopf.index("", "v1", "resourcequotas")
async def gpu_quotas(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return gpu_quota_entry(namespace, dict(body)) if namespace else {}


def _controller(memo: kopf.Memo, indices: dict[str, Any]) -> Controller:
    """The operator's controller, started by the first event (on the event loop kopf runs, with
    the indices it fills)."""
    slot = memo.get("slot")
    if not isinstance(slot, _Slot):
        raise kopf.PermanentError("the operator's startup did not run")
    if slot.controller is not None:
        return slot.controller
    install = memo.get("install")
    autoscaler = memo.get("autoscaler")
    namespaces = memo.get("namespaces")
    controller = Controller(
        indices,
        install=install if isinstance(install, InstallSettings) else InstallSettings(),
        autoscaler=autoscaler if isinstance(autoscaler, AutoscalerSettings) else None,
        watches=Watches(
            (*WATCHED_CHILDREN, ENGINE_PODS), namespaces, recheck_unserved_s=UNSERVED_RECHECK_S
        )
        if isinstance(namespaces, tuple)
        else None,
    )
    slot.controller = controller
    controller.start()
    return controller


# Events: each adds the keys of what it may affect; nothing else happens here.


@kopf.on.event(API_GROUP, API_VERSION, "modeldeployments")
async def model_deployment_event(
    *,
    type: str | None,
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    **indices: Any,
) -> None:
    if namespace is not None:
        current = None if type == "DELETED" else body
        _controller(memo, indices).model_deployment_changed(namespace, name, current)


@kopf.on.event(API_GROUP, API_VERSION, "inferenceservices")
async def inference_service_event(
    *,
    type: str | None,
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    **indices: Any,
) -> None:
    if namespace is not None:
        current = None if type == "DELETED" else body
        _controller(memo, indices).inference_service_changed(namespace, name, current)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    slot = memo.get("slot")
    if isinstance(slot, _Slot) and slot.controller is not None:
        await slot.controller.stop()
