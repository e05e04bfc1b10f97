"""The index of what the operator created (the kinds of `CHILD_KINDS`), by owner and by name,
and the watches that keep it: one `kube.reflector.Reflector` per kind (and per namespace
served), whose events reach the event loop, which alone writes the index.

Not kopf's indices, on purpose: of the watch events the operator receives, most are of its
children (the Deployment and disruption controllers' status writes), and kopf's processing of
each (causes, memories, its index's bookkeeping, the handler's invocation) cost far more than
the decode and the dictionary update these watches make: the operator's CPU per reconciled
resource fell by a third when they replaced kopf's (`make bench-operator`, 150 services). The
operator's own resources, pods and quotas stay in kopf's indices.

Reconciles wait for `synced`: until each kind has been listed once, a child missing from the
index may only be one not listed yet."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferfleet.kube import Kube
from inferfleet.kube.reflector import Reflector
from inferfleet.reconcile.desired import Child, ObjectKey
from inferfleet.reconcile.entries import IndexedChild
from inferfleet.render.multinode import LWS_API_VERSION, LWS_KIND

logger = logging.getLogger(__name__)

CHILD_KINDS = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("policy/v1", "PodDisruptionBudget"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("v1", "PersistentVolumeClaim"),
    ("batch/v1", "Job"),
    (LWS_API_VERSION, LWS_KIND),
)
"""What the operator renders for its resources: it watches them, to reconcile their owner when
they change and to know what exists without asking the API server. (A kind the cluster does
not serve, LeaderWorkerSet without LWS installed, is watched once its CRD appears.)"""
OPTIONAL_KINDS = ((LWS_API_VERSION, LWS_KIND),)
"""Of those, the ones a cluster serves only with an add-on installed."""


class ChildrenIndex:
    """What the watches last showed of each child. Written on the event loop only; read by
    reconciles on worker threads, which each get a mapping no write changes after it is
    published (a write replaces an owner's mapping, never edits it)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, ObjectKey], IndexedChild] = {}
        self._by_owner: dict[tuple[str, str], Mapping[ObjectKey, Child]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def put(self, namespace: str, indexed: IndexedChild) -> None:
        key = indexed.child.key
        before = self._held.get((namespace, key))
        if before is not None and before.child.owner_uid != indexed.child.owner_uid:
            self.remove(namespace, key)
        self._held[(namespace, key)] = indexed
        owner = (namespace, indexed.child.owner_uid)
        self._by_owner[owner] = {**self._by_owner.get(owner, {}), key: indexed.child}

    def remove(self, namespace: str, key: ObjectKey) -> IndexedChild | None:
        gone = self._held.pop((namespace, key), None)
        if gone is None:
            return None
        owner = (namespace, gone.child.owner_uid)
        left = {k: child for k, child in self._by_owner.get(owner, {}).items() if k != key}
        if left:
            self._by_owner[owner] = left
        else:
            self._by_owner.pop(owner, None)
        return gone

    def children(self, namespace: str, owner_uid: str) -> list[Child]:
        return list(self._by_owner.get((namespace, owner_uid), {}).values())

    def holder(self, namespace: str, key: ObjectKey) -> str | None:
        """The uid of the resource whose child holds the name."""
        held = self._held.get((namespace, key))
        return held.child.owner_uid if held is not None else None

    def unlisted(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        listed: Iterable[tuple[str, ObjectKey]],
    ) -> list[tuple[str, IndexedChild]]:
        """Those of a kind (in `namespace`, or in all where None) that a list of it lacks:
        deleted while no watch ran. Removed from the index and returned."""
        kept = set(listed)
        stale = [
            (ns, key)
            for ns, key in list(self._held)
            if key.api_version == api_version
            and key.kind == kind
            and (namespace is None or ns == namespace)
            and (ns, key) not in kept
        ]
        return [(ns, gone) for ns, key in stale if (gone := self.remove(ns, key)) is not None]


class OnChild(Protocol):
    """An event of a child: its namespace, the object, whether it is gone."""

    def __call__(self, namespace: str, obj: Mapping[str, Any], *, gone: bool) -> None: ...


OnUnlisted = Callable[[str, IndexedChild], None]
"""A child a new list of its kind lacks (deleted while no watch ran)."""


@dataclass
class _Watch:
    api_version: str
    kind: str
    namespace: str | None
    listed: list[tuple[str, ObjectKey]] = field(default_factory=list)
    """What the list under way has shown so far."""
    synced: bool = False


@dataclass(frozen=True)
class _Receiver:
    """Who takes the events: `on_child` keeps `index` current (the controller's, which also
    learns of its own applies)."""

    index: ChildrenIndex
    on_child: OnChild
    on_unlisted: OnUnlisted


_Pending = tuple[_Receiver, _Watch, str, dict[str, Any]]


class ChildWatches:
    """The watches of `kinds` in `namespaces` (none: in all), from threads; their events
    handed to `on_child` on the event loop that `start` runs on. `synced` is set once every
    watch has listed what exists.

    The threads queue events and wake the loop only when no drain of the queue is scheduled:
    while the loop is busy (a rollout's burst of status writes), one wake-up hands it every
    event queued meanwhile, where a wake-up per event cost the loop more than its handling."""

    def __init__(
        self,
        kinds: Sequence[tuple[str, str]],
        namespaces: Sequence[str],
        label_selector: str,
        *,
        optional: Iterable[tuple[str, str]] = (),
        recheck_unserved_s: float,
    ) -> None:
        self.kinds = tuple(kinds)
        self.namespaces = tuple(namespaces)
        self.label_selector = label_selector
        self.optional = frozenset(optional)
        self.recheck_unserved_s = recheck_unserved_s
        self.synced = asyncio.Event()
        self._watches: list[_Watch] = []
        self._reflectors: list[Reflector] = []
        self._pending: deque[_Pending] = deque()
        self._drain_lock = threading.Lock()
        self._drain_scheduled = False

    def start(self, index: ChildrenIndex, on_child: OnChild, on_unlisted: OnUnlisted) -> None:
        loop = asyncio.get_running_loop()
        receiver = _Receiver(index, on_child, on_unlisted)
        scopes: Sequence[str | None] = self.namespaces or (None,)
        # One connection per watch, on a client of their own: the workers' pool stays theirs.
        kube = Kube.from_environment(connections=len(self.kinds) * len(scopes))
        for api_version, kind in self.kinds:
            for namespace in scopes:
                watch = _Watch(api_version, kind, namespace)
                self._watches.append(watch)
                recheck_s = (
                    self.recheck_unserved_s if (api_version, kind) in self.optional else None
                )
                self._reflectors.append(
                    Reflector(
                        kube,
                        api_version,
                        kind,
                        namespace=namespace,
                        label_selector=self.label_selector,
                        deliver=functools.partial(self._deliver, loop, receiver, watch),
                        recheck_unserved_s=recheck_s,
                    )
                )
        for reflector in self._reflectors:
            reflector.start()
        if not self._reflectors:
            self.synced.set()

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()

    def _deliver(
        self,
        loop: asyncio.AbstractEventLoop,
        receiver: _Receiver,
        watch: _Watch,
        event: str,
        obj: dict[str, Any],
    ) -> bool:
        """From a watch's thread: the event, queued to be handled on the loop, in order."""
        self._pending.append((receiver, watch, event, obj))
        with self._drain_lock:
            if self._drain_scheduled:
                return True
            self._drain_scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop has closed: the operator is stopping
            return False
        return True

    def _drain(self) -> None:
        """On the loop: the events queued so far. One queued after the flag is cleared
        schedules the next drain. An event whose handling fails is logged and passed over,
        as the loop does with a callback's error, and those after it are still handled."""
        with self._drain_lock:
            self._drain_scheduled = False
        for _ in range(len(self._pending)):
            receiver, watch, event, obj = self._pending.popleft()
            try:
                self._handle(receiver, watch, event, obj)
            except Exception:
                logger.exception("cannot handle a %s event of a %s", event, watch.kind)

    def _handle(
        self, receiver: _Receiver, watch: _Watch, event: str, obj: Mapping[str, Any]
    ) -> None:
        namespace = (obj.get("metadata") or {}).get("namespace")
        if event == "LISTED":
            # Indexed as listed, keeping only its name for the end of the list.
            if namespace:
                receiver.on_child(str(namespace), obj, gone=False)
                name = str(obj["metadata"].get("name"))
                watch.listed.append(
                    (str(namespace), ObjectKey(watch.api_version, watch.kind, name))
                )
            return
        if event != "SYNCED":
            if namespace:
                receiver.on_child(str(namespace), obj, gone=event == "DELETED")
            return
        listed, watch.listed = watch.listed, []
        unlisted = receiver.index.unlisted(watch.api_version, watch.kind, watch.namespace, listed)
        for where, gone in unlisted:
            receiver.on_unlisted(where, gone)
        watch.synced = True
        if not self.synced.is_set() and all(each.synced for each in self._watches):
            logger.info("the operator's children are listed: %d objects", len(receiver.index))
            self.synced.set()
