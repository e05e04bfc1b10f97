"""The controller behind the kopf layer: work queues, workers, and carrying out outcomes.

`reconcile.handlers` feeds it keys from kopf's events and hands it kopf's indices; workers
take each key, compute its outcome with `reconcile.desired` from the indices, and carry it out
through `kube` (server-side apply under one field manager, deletion of what the object created
and no longer wants, a status patch made against the version it was computed from). Two
queues, so that a slow Prometheus delays autoscaling ticks only, never a reconcile:

* reconciles, keyed (kind, namespace, name), by `RECONCILE_WORKERS` workers;
* autoscaling ticks of `policy: goodput` services, keyed (namespace, name), added by a ticker
  every `--autoscale-interval` per service, by `TICK_WORKERS` workers.

The Kubernetes client is blocking: workers run each reconcile in a thread pool, one key at a
time per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from inferfleet.api.architecture_source import (
    ConfigMapKey,
    ReadArchitecture,
    architecture_source,
    read_architecture,
)
from inferfleet.api.conditions import find
from inferfleet.api.inference_service import KIND as INFERENCE_SERVICE
from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import KIND as MODEL_DEPLOYMENT
from inferfleet.api.model_deployment import ModelDeployment
from inferfleet.autoscale.controller import AutoscalerSettings, PrometheusSource, tick
from inferfleet.autoscale.ownership import Claim, claims_of
from inferfleet.autoscale.quota import Priorities
from inferfleet.autoscale.scalein import cost_patch
from inferfleet.kube import AlreadyExistsError, Kube, RefusedError, StaleObjectError
from inferfleet.reconcile.applied import AppliedChildren
from inferfleet.reconcile.children import OPTIONAL_KINDS, ChildrenIndex
from inferfleet.reconcile.desired import (
    UNSERVED_RECHECK_S,
    Child,
    ObjectKey,
    Outcome,
    inference_service_outcome,
    may_span_nodes,
    model_deployment_outcome,
    without_status,
)
from inferfleet.reconcile.entries import IndexedChild, child_of, indexed_child
from inferfleet.reconcile.events import Event, event_object
from inferfleet.reconcile.generated import GeneratedSecrets
from inferfleet.reconcile.held import RECHECK_S, HeldBack
from inferfleet.reconcile.indices import Indices
from inferfleet.reconcile.pods import ENGINE_PODS, UnschedulablePods
from inferfleet.reconcile.quotas import QuotaBook
from inferfleet.reconcile.watches import Watched, Watches
from inferfleet.reconcile.workqueue import WorkQueue
from inferfleet.render import InstallSettings
from inferfleet.render.wake import PushedWait, pushed_wait

# A reconcile makes its writes one after another and waits on each (0.1-0.3 s from an API
# server busy with a large apply): 8 workers kept up with fewer objects a second than one
# `kubectl apply` of 200 services creates, and the queue's wait was most of the time to the
# first child applied (`make bench-operator`).
RECONCILE_WORKERS = 32
TICK_WORKERS = 4
RECONCILE_QUEUE = "reconcile"
TICK_QUEUE = "autoscale"
"""The queues' names in the operator's metrics (`autoscale.metrics`)."""
TICKER_PERIOD_S = 1.0
MODEL_CONFIG_RECHECK_S = 30.0
"""How often a ModelDeployment that reads its architecture from a ConfigMap reads it again."""

Key = tuple[str, str, str]
"""(kind, namespace, name)"""

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _now() -> datetime:
    return datetime.now(UTC)


@functools.cache
def kube() -> Kube:
    return Kube.from_environment(connections=RECONCILE_WORKERS + TICK_WORKERS)


def _as_served(body: Mapping[str, Any]) -> tuple[str, Any, bool]:
    """What an InferenceService's reconcile reads of a ModelDeployment it routes to: which
    object, its spec (by generation), and whether it is Ready (a status that says it is not,
    where there was none, changes nothing the service reads)."""
    metadata = body.get("metadata") or {}
    status = body.get("status")
    ready = find(status.get("conditions") or [], "Ready") if isinstance(status, Mapping) else None
    return (
        str(metadata.get("uid", "")),
        metadata.get("generation"),
        ready is not None and ready.get("status") == "True",
    )


@dataclass(frozen=True)
class Done:
    """What a finished reconcile leaves for the event loop."""

    requeue_after_s: float | None = None
    gone: bool = False
    """The object no longer exists: its retries and failure count are dropped."""
    then: tuple[Key, ...] = ()
    """Others to reconcile now (queued by the loop: the queue is the loop's alone)."""


class Controller:
    def __init__(
        self,
        indices: Mapping[str, Any],
        *,
        install: InstallSettings,
        autoscaler: AutoscalerSettings | None,
        watches: Watches | None = None,
    ) -> None:
        """`watches`: of the objects the operator creates and of the engine pods it explains,
        from `start` on (None: only what `child_changed` and `pod_changed` are told, as in
        tests)."""
        self.children = ChildrenIndex()
        self.pods = UnschedulablePods()
        self.indices = Indices(indices, self.children, self.pods)
        self._watches = watches
        self.install = install
        self.autoscaler = autoscaler or AutoscalerSettings()
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()
        """Who reports the Events this operator posts (its pod)."""
        metrics = self.autoscaler.metrics
        self.reconciles: WorkQueue[Key] = WorkQueue(
            on_wait=functools.partial(metrics.waited, RECONCILE_QUEUE) if metrics else None
        )
        self.ticks: WorkQueue[tuple[str, str]] = WorkQueue(
            on_wait=functools.partial(metrics.waited, TICK_QUEUE) if metrics else None
        )
        if metrics is not None:
            metrics.watch_queue(RECONCILE_QUEUE, self.reconciles.__len__)
            metrics.watch_queue(TICK_QUEUE, self.ticks.__len__)
        self._pool = ThreadPoolExecutor(
            RECONCILE_WORKERS + TICK_WORKERS, thread_name_prefix="inferfleet-reconcile"
        )
        self._stored: dict[Key, tuple[str, dict[str, Any]]] = {}
        self._ticked: dict[tuple[str, str], float] = {}
        self._claims: dict[tuple[str, str], dict[str, Claim]] = {}
        """Each service's claims to autoscale its deployments, as its last event showed them."""
        self._served: dict[tuple[str, str], tuple[str, Any, bool]] = {}
        """What services read of each deployment (`_as_served`) when they were last queued."""
        self._held = HeldBack()
        self._written = AppliedChildren()
        self._children: dict[tuple[str, str], Child] = {}
        """What the indices held of each created object when its owner was last queued."""
        self._after_reconcile: dict[Key, list[Callable[[], bool]]] = {}
        """Per object, events that arrived while its reconcile ran (`_add_unless_echo`)."""
        self._pushed: dict[tuple[str, str], PushedWait] = {}
        """Per service, what its router last pushed of the requests it holds (`render.wake`)."""
        self._quotas = QuotaBook(
            lambda: Priorities.of(kube().list("scheduling.k8s.io/v1", "PriorityClass"))
        )
        # Per ModelDeployment, the ConfigMap key it reads its architecture from and that
        # ConfigMap's data as its reconcile last fetched it (None: not found).
        self._model_configs: dict[tuple[str, str], tuple[ConfigMapKey, dict[str, Any] | None]] = {}
        self._model_configs_lock = threading.Lock()
        self._unserved: tuple[float, frozenset[str]] | None = None
        """When it was last asked, the optional kinds the cluster does not serve."""
        self._unserved_lock = threading.Lock()
        self._generated = GeneratedSecrets()
        self._tasks: list[asyncio.Task[None]] = []

    # The event loop's side: keys in, workers out.

    def start(self) -> None:
        """Workers and the ticker start once the watches have listed every kind: before that,
        an object missing from an index may only be one not listed yet."""
        if self._watches is not None:
            self._watches.start(self._watched, self._relisted)
        for _ in range(RECONCILE_WORKERS):
            work = self._work(
                RECONCILE_QUEUE,
                self.reconciles,
                self._reconcile,
                lambda key: key[0],
                lambda key: key,
            )
            self._tasks.append(asyncio.create_task(work))
        for _ in range(TICK_WORKERS):
            ticks = self._work(
                TICK_QUEUE, self.ticks, self._tick, lambda _key: "AutoscalingTick",
                lambda key: (INFERENCE_SERVICE, *key),
            )  # fmt: skip
            self._tasks.append(asyncio.create_task(ticks))
        self._tasks.append(asyncio.create_task(self._ticker()))

    async def stop(self) -> None:
        if self._watches is not None:
            self._watches.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _synced(self) -> None:
        if self._watches is not None:
            await self._watches.synced.wait()

    def add(self, kind: str, namespace: str, name: str) -> None:
        self.reconciles.add((kind, namespace, name))

    def model_deployment_changed(
        self, namespace: str, name: str, body: Mapping[str, Any] | None
    ) -> None:
        """The deployment (`body` None: it is gone), unless the event only shows the status its
        own reconcile wrote; and the services that route to it, when what they read of it
        changed."""
        key = (MODEL_DEPLOYMENT, namespace, name)
        if body is None:
            self.add(*key)
        else:
            self._add_unless_echo(key, lambda: not self._wrote(key, body))
        served = None if body is None else _as_served(body)
        if served is not None and self._served.get((namespace, name)) == served:
            return
        if served is None:
            self._served.pop((namespace, name), None)
        else:
            self._served[(namespace, name)] = served
        for claim in self.indices.claims(namespace, name):
            self.add(INFERENCE_SERVICE, namespace, claim.service)

    def inference_service_changed(
        self, namespace: str, name: str, body: Mapping[str, Any] | None
    ) -> None:
        """The service (`body` None: it is gone), unless the event only shows a status this
        operator wrote; and each deployment whose claim to autoscale it this service made,
        changed or dropped (its replicas follow the decision of the service that autoscales
        it). A claim of a service that does not autoscale changes nothing a deployment's
        reconcile reads (`autoscaling_owner` passes over it)."""
        key = (INFERENCE_SERVICE, namespace, name)
        if body is None:
            self.add(*key)
        else:
            self._add_unless_echo(key, lambda: not self._wrote(key, body))
        claims = {} if body is None else claims_of(body)
        claims = {backend: claim for backend, claim in claims.items() if claim.autoscales}
        before = self._claims.get((namespace, name)) or {}
        for backend in set(claims) | set(before):
            if claims.get(backend) != before.get(backend):
                self.add(MODEL_DEPLOYMENT, namespace, backend)
        if body is None:
            self._claims.pop((namespace, name), None)
        else:
            self._claims[(namespace, name)] = claims

    def _wrote(self, key: Key, body: Mapping[str, Any]) -> bool:
        """`body` is the object as this operator's last status write left it: that write's own
        watch event, which tells its reconcile nothing new."""
        written = self._stored.get(key)
        version = (body.get("metadata") or {}).get("resourceVersion")
        return (
            written is not None
            and version is not None
            and (written[1].get("metadata") or {}).get("resourceVersion") == version
        )

    def child_changed(self, namespace: str, obj: Mapping[str, Any], *, gone: bool) -> None:
        """An event of an object the operator created: the index holds it as it is now (or no
        longer), and its owner is reconciled when what it reads of it changed
        (`Child.read_by_owner`: a status write that changes nothing the owner reads costs
        nothing)."""
        indexed = indexed_child(namespace, obj)
        if indexed is None:  # not, or no longer, controlled by a resource of the operator's
            metadata = obj.get("metadata") or {}
            key = ObjectKey(
                str(obj.get("apiVersion")), str(obj.get("kind")), str(metadata.get("name"))
            )
            released = self.children.remove(namespace, key)
            if released is not None:  # its owner reference removed: no longer its owner's
                self._child_news(namespace, released, None, gone=True)
            return
        if gone:
            self.children.remove(namespace, indexed.child.key)
        else:
            self.children.put(namespace, indexed)
        if indexed.child.key.kind == "ConfigMap" and not gone:
            self._heard_wake(namespace, obj)
        version = (obj.get("metadata") or {}).get("resourceVersion")
        self._child_news(namespace, indexed, version, gone=gone)

    def _watched(
        self, watched: Watched, namespace: str, obj: Mapping[str, Any], *, gone: bool
    ) -> None:
        if watched == ENGINE_PODS:
            self.pod_changed(namespace, obj, gone=gone)
        else:
            self.child_changed(namespace, obj, gone=gone)

    def _relisted(self, watched: Watched, scope: str | None, listed: list[tuple[str, str]]) -> None:
        """What a new list of a kind lacks was deleted (or, of pods, bound) while no watch
        ran: news to its owner."""
        if watched == ENGINE_PODS:
            for namespace, label in self.pods.unlisted(scope, listed):
                self._pods_changed(namespace, label)
            return
        keys = [
            (namespace, ObjectKey(watched.api_version, watched.kind, name))
            for namespace, name in listed
        ]
        for namespace, gone in self.children.unlisted(
            watched.api_version, watched.kind, scope, keys
        ):
            self._child_news(namespace, gone, None, gone=True)

    def _child_news(
        self, namespace: str, indexed: IndexedChild, version: str | None, *, gone: bool
    ) -> None:
        child = indexed.child
        self._written.seen(namespace, child, version, gone=gone)
        seen = (namespace, indexed.uid)

        def news() -> bool:
            if gone:
                self._children.pop(seen, None)
                return True
            before = self._children.get(seen)
            self._children[seen] = child
            return before is None or before.read_by_owner != child.read_by_owner

        owner_kind, owner_name = indexed.owner
        self._add_unless_echo((owner_kind, namespace, owner_name), news)

    def _set_deletion_costs(self, namespace: str, costs: Mapping[str, int]) -> None:
        """Before a scale-in is written: the pods that hold the fewest requests go first
        (`autoscale.scalein`). A pod gone or a write refused only leaves the ReplicaSet's own
        choice."""
        for pod, cost in costs.items():
            try:
                kube().merge_patch("v1", "Pod", pod, namespace, cost_patch(cost))
            except Exception as error:  # the scale-in goes on without it
                logger.warning("cannot set the deletion cost of %s/%s (%s)", namespace, pod, error)

    def _heard_wake(self, namespace: str, obj: Mapping[str, Any]) -> None:
        """A router pushed the requests it holds for want of a replica (`render.wake`): kept
        for the next tick of its service, which is queued at once when any wait."""
        pushed = pushed_wait(obj)
        owner = next(
            (
                str(ref.get("name"))
                for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
                if ref.get("kind") == INFERENCE_SERVICE and ref.get("controller")
            ),
            None,
        )
        if pushed is None or owner is None:
            return
        self._pushed[(namespace, owner)] = pushed
        if pushed.waiting > 0 and pushed.fresh(_now()):
            self.ticks.add((namespace, owner))

    def _add_unless_echo(self, key: Key, news: Callable[[], bool]) -> None:
        """Queue `key` when `news()` says its event shows what the operator did not write.
        While a reconcile of `key` (or a tick of that service) runs, `news` waits for it to
        end: its writes are recorded (`_applied`, `_write_status`) once their requests return,
        and the watch may deliver their events before that, when they would queue it again for
        nothing."""
        kind, namespace, name = key
        if self.reconciles.processing(key) or (
            kind == INFERENCE_SERVICE and self.ticks.processing((namespace, name))
        ):
            self._after_reconcile.setdefault(key, []).append(news)
        elif news():
            self.add(*key)

    def _judge_news(self, key: Key) -> None:
        """After a reconcile of `key` (or a tick of that service): the events that arrived
        while it ran, judged now that its writes are recorded; each in turn, as each records
        what it saw."""
        if key in self._after_reconcile:
            changed = [news() for news in self._after_reconcile.pop(key)]
            if any(changed):
                self.reconciles.add(key)

    def _applied(self, namespace: str, stored: Mapping[str, Any]) -> None:
        """An object as its apply stored it. The watch event of that write shows the same, and
        tells its owner, whose reconcile made the write, nothing new: `child_changed` passes
        over it. (A write by anyone else since shows as a change, and is reconciled.)"""
        child = child_of(namespace, stored)
        metadata = stored.get("metadata") or {}
        if child is not None and metadata.get("uid"):
            self._children[(namespace, str(metadata["uid"]))] = child
            self._written.record(namespace, child, str(metadata.get("resourceVersion")))

    def pod_changed(self, namespace: str, pod: Mapping[str, Any], *, gone: bool) -> None:
        """An engine pod pending on no node (`gone`: bound, or deleted): its deployment is
        reconciled where the pods it cannot place, or the scheduler's reasons, changed."""
        for label in self.pods.update(namespace, pod, gone=gone):
            self._pods_changed(namespace, label)

    def _pods_changed(self, namespace: str, label: str) -> None:
        owner = self.indices.model_deployment_named(namespace, label)
        if owner is not None:
            self.add(MODEL_DEPLOYMENT, namespace, owner)

    async def _ticker(self) -> None:
        """Adds each `policy: goodput` service to the tick queue once per interval."""
        await self._synced()
        while True:
            await asyncio.sleep(TICKER_PERIOD_S)
            now = time.monotonic()
            for namespace, name in self.indices.inference_services():
                body = self.indices.inference_service(namespace, name) or {}
                autoscaling = (body.get("spec") or {}).get("autoscaling") or {}
                if autoscaling.get("policy") != "goodput":
                    self._ticked.pop((namespace, name), None)
                    continue
                last = self._ticked.get((namespace, name))
                if last is None or now - last >= self.autoscaler.interval_s:
                    self.ticks.add((namespace, name))

    async def _work(
        self,
        name: str,
        queue: WorkQueue[T],
        work: Callable[[T], Done],
        kind: Callable[[T], str],
        reconciled: Callable[[T], Key],
    ) -> None:
        """`reconciled`: the object whose writes a run of `work` makes (`_judge_news`)."""
        loop = asyncio.get_running_loop()
        metrics = self.autoscaler.metrics
        await self._synced()
        while True:
            key = await queue.get()
            context = contextvars.copy_context()
            started = time.monotonic()
            try:
                done = await loop.run_in_executor(self._pool, context.run, work, key)
            except StaleObjectError:
                queue.done(key, failed=True)  # raced a newer version: again, from it
                continue
            except Exception:
                logger.exception("reconciling %s failed; it will be retried", key)
                if metrics is not None:
                    metrics.reconcile_failed(kind(key))
                queue.done(key, failed=True)
                continue
            finally:
                if metrics is not None:
                    metrics.reconciled(name, kind(key), time.monotonic() - started)
                self._judge_news(reconciled(key))
            queue.done(key)
            if done.gone:
                queue.forget(key)  # here, on the loop that owns the queue
            for other in done.then:  # only reconciles return others, keys of this queue
                queue.add(other)  # type: ignore[arg-type]
            if done.requeue_after_s is not None:
                queue.add_after(key, done.requeue_after_s)

    # The workers' side (threads): read the indices, decide, carry out.

    def _body(self, key: Key) -> dict[str, Any] | None:
        """The object as the index holds it, or as this operator last wrote it when the index
        has not caught up with that write yet (read your own writes)."""
        kind, namespace, name = key
        found = (
            self.indices.model_deployment(namespace, name)
            if kind == MODEL_DEPLOYMENT
            else self.indices.inference_service(namespace, name)
        )
        written = self._stored.get(key)
        if found is None or written is None:
            return found
        if found["metadata"].get("resourceVersion") == written[0]:
            return written[1]
        self._stored.pop(key, None)
        return found

    def _reconcile(self, key: Key) -> Done:
        kind, namespace, name = key
        body = self._body(key)
        if body is None:  # gone: owner references take its children with it
            self._stored.pop(key, None)
            if kind == MODEL_DEPLOYMENT:
                with self._model_configs_lock:
                    self._model_configs.pop((namespace, name), None)
            return Done(gone=True)
        uid = str(body["metadata"].get("uid", ""))
        foreign, refused = self._held.in_namespace(namespace)
        indexed = self.indices.namespace(namespace, uid)
        children = self._written.children(namespace, uid, indexed.children)
        space = dataclasses.replace(indexed, children=children, foreign=foreign, refused=refused)
        then: tuple[Key, ...] = ()
        if kind == MODEL_DEPLOYMENT:
            read, changed = self._fetch_architecture(namespace, name, body)
            if changed:  # the services that route to it render from its architecture too
                then = tuple(
                    (INFERENCE_SERVICE, namespace, claim.service)
                    for claim in self.indices.claims(namespace, name)
                )
            outcome = model_deployment_outcome(
                read.body,
                architecture_problem=read.problem,
                space=space,
                claims=self.indices.claims(namespace, name),
                unschedulable=self.indices.unschedulable(namespace, name),
                install=self.install,
                now=_now(),
                unserved=self._unserved_kinds(body),
            )
        else:
            backends = {
                backend: self._read_architecture(namespace, backend, found).body
                for backend in claims_of(body)
                if (found := self.indices.model_deployment(namespace, backend)) is not None
            }
            outcome = inference_service_outcome(
                body, space=space, backends=backends, install=self.install, now=_now()
            )
        done = self._carry_out(key, body, outcome)
        if done is None:  # an object in the way, now known: what to do instead
            again = self._reconcile(key)
            return dataclasses.replace(again, then=then + again.then)
        if (foreign or refused) and done.requeue_after_s is None:
            done = Done(RECHECK_S)
        if kind == MODEL_DEPLOYMENT and architecture_source(body) is not None:
            # The ConfigMap is not watched (the operator streams only what it made): read again.
            done = Done(min(done.requeue_after_s or MODEL_CONFIG_RECHECK_S, MODEL_CONFIG_RECHECK_S))
        return dataclasses.replace(done, then=then)

    def _fetch_architecture(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> tuple[ReadArchitecture, bool]:
        """A ModelDeployment body with its architecture read from the ConfigMap it names, if it
        names one, fetched from the API server for its own reconcile; and whether what was read
        differs from the last read (the services and the autoscaler use that last read)."""
        source = architecture_source(body)
        if source is None:
            return read_architecture(body, None), False
        found = kube().get("v1", "ConfigMap", source.name, namespace)
        data: dict[str, Any] | None = None  # not found
        if found is not None:
            held = found.get("data")
            data = dict(held) if isinstance(held, Mapping) else {}
        fetched = (source, data)
        with self._model_configs_lock:
            changed = self._model_configs.get((namespace, name)) != fetched
            self._model_configs[namespace, name] = fetched
        return read_architecture(body, fetched[1]), changed

    def _read_architecture(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> ReadArchitecture:
        """As the deployment's reconcile last read it (fetched now when it has not yet, as
        after a restart before that reconcile ran)."""
        source = architecture_source(body)
        if source is None:
            return read_architecture(body, None)
        with self._model_configs_lock:
            last = self._model_configs.get((namespace, name))
        if last is None or last[0] != source:
            return self._fetch_architecture(namespace, name, body)[0]
        return read_architecture(body, last[1])

    def _carry_out(self, key: Key, body: dict[str, Any], outcome: Outcome) -> Done | None:
        """Apply, delete, post, write status; None when an object inferfleet did not create
        holds a name to be created, or the API server refused an object (nothing else done:
        reconcile again, knowing it)."""
        namespace = key[1]
        for obj in outcome.generate:
            try:
                self._generated.ensure(obj, kube().create)
            except RefusedError as error:
                self._refused(namespace, obj, error)
                return None
        for obj in outcome.apply:
            new = ObjectKey.of(obj)
            try:
                stored = kube().apply(obj, create_only=new in outcome.new)
            except AlreadyExistsError:
                if self._ours(namespace, new):
                    continue  # created a moment ago: its watch event follows
                self._held.foreign(namespace, new)
                return None
            except RefusedError as error:
                self._refused(namespace, obj, error)
                return None
            self._applied(namespace, stored)
        for gone in outcome.delete:
            kube().delete(gone.api_version, gone.kind, gone.name, namespace)
        for gone in outcome.retire:
            self._generated.retire(gone, namespace, str(body["metadata"]["uid"]), kube().delete)
        self._post(body, outcome.events)
        if outcome.status is not None and not self.reconciles.superseded(key):
            self._write_status(key, body, outcome.status)
        return Done(outcome.requeue_after_s)

    def _unserved_kinds(self, body: Mapping[str, Any]) -> frozenset[str]:
        """The kinds the ModelDeployment may render that this cluster does not serve: asked
        only of one whose replica may span nodes, and again once `UNSERVED_RECHECK_S` has
        passed (a CRD installed since). Where discovery cannot be read, the last answer holds
        (none at first: the apply says what is missing)."""
        if not may_span_nodes(body, self.install.gpus):
            return frozenset()
        with self._unserved_lock:  # one discovery read for the workers that ask at once
            now = time.monotonic()
            known = self._unserved
            if known is not None and now - known[0] < UNSERVED_RECHECK_S:
                return known[1]
            answers = {
                kind: kube().serves(api_version, kind) for api_version, kind in OPTIONAL_KINDS
            }
            before = known[1] if known is not None else frozenset()
            unserved = frozenset(
                kind
                for kind, served in answers.items()
                if served is False or (served is None and kind in before)
            )
            self._unserved = (now, unserved)
            return unserved

    def _ours(self, namespace: str, key: ObjectKey) -> bool:
        """Whether inferfleet created the object (its index may not hold it yet)."""
        found = kube().get(key.api_version, key.kind, key.name, namespace)
        if found is None:
            raise StaleObjectError(f"{key.describe()} went away while created")
        return child_of(namespace, found) is not None

    def _refused(self, namespace: str, obj: Mapping[str, Any], error: RefusedError) -> None:
        """Remember what the API server said of `obj`, for the reconcile that says it in
        status."""
        key = ObjectKey.of(obj)
        logger.warning("the API server refused %s: %s", key.describe(), error)
        self._held.refused(namespace, key, str(error))

    def _post(self, body: Mapping[str, Any], events: Iterable[Event]) -> None:
        """Post Events before the status that records their cause (see `reconcile.events`).
        Events are the API's best effort: one that cannot be posted is logged, and never holds
        the status back."""
        for event in events:
            obj = event_object(body, event, now=_now(), instance=self.instance)
            try:
                kube().create(obj)
            except Exception as error:
                logger.warning(
                    "could not post Event %s %s: %s", event.reason, obj["metadata"], error
                )

    def _write_status(self, key: Key, body: dict[str, Any], status: dict[str, Any]) -> None:
        """Patch the status over the version it was computed from (`StaleObjectError` when
        the object moved on: it is reconciled again from the newer one)."""
        based_on = str(body["metadata"].get("resourceVersion"))
        stored = kube().patch_status(body, status, if_unchanged=True)
        self._stored[key] = (based_on, stored)

    def _tick(self, key: tuple[str, str]) -> Done:
        namespace, name = key
        service_key = (INFERENCE_SERVICE, namespace, name)
        body = self._body(service_key)
        if body is None:
            return Done(gone=True)
        service = _readable(InferenceService, body)
        if service is None:
            return Done()  # its reconcile reports the spec
        deployments: dict[str, ModelDeployment] = {}
        for ref in service.spec.deployments:
            found = self.indices.model_deployment(namespace, ref.name)
            if found is not None:
                read = self._read_architecture(namespace, ref.name, found)
                if read.problem is not None:
                    return Done()  # every decision holds until it is read: its status says why
                found = dict(read.body)
            md = _readable(ModelDeployment, found) if found is not None else None
            if md is not None and md.spec.architecture_known:  # else its status says why
                deployments[ref.name] = md
        settings = self.autoscaler
        source = (
            PrometheusSource(settings.prometheus_url, settings.query_budget_s)
            if settings.prometheus_url
            else None
        )
        claims = {d: self.indices.claims(namespace, d) for d in deployments}
        now = _now()
        quota = self._quotas.quota(
            namespace, name, deployments, left=self.indices.gpu_quota_left(namespace),
            pods={
                d: self.indices.pods_created(namespace, str(md.metadata.get("uid")))
                for d, md in deployments.items()
            },
            now_s=now.timestamp(), interval_s=self.autoscaler.interval_s,
        )  # fmt: skip
        pushed = self._pushed.get(key)
        result = tick(
            service, deployments, source,
            settings=settings, now=now, claims=claims, catalog=self.install.gpus,
            gpu_quota=quota, waiting=pushed.waiting if pushed and pushed.fresh(now) else 0,
        )  # fmt: skip
        if result.gpu_claim is not None:
            self._quotas.record(namespace, name, result.gpu_claim)
        self._post(body, (Event(*event) for event in result.events))
        self._set_deletion_costs(namespace, result.deletion_costs)
        self._write_status(service_key, body, result.status)
        self._ticked[key] = time.monotonic()
        return Done()


Model = TypeVar("Model", InferenceService, ModelDeployment)


def _readable(model: type[Model], body: Mapping[str, Any]) -> Model | None:
    """The object, or without its status when only that cannot be read (a newer operator's,
    a hand edit: the autoscaler's history starts afresh rather than never ticking again)."""
    for candidate in (body, without_status(body)):
        with contextlib.suppress(ValidationError):
            return model.model_validate(candidate)
    return None
