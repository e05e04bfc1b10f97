"""The operator's own watches of what it does not define: one `kube.reflector.Reflector` per
kind (and per namespace served), on threads, whose events reach the event loop in order, where
alone the indices they feed are written (`reconcile.children`, `reconcile.pods`).

Not kopf's, on purpose: most of the watch events the operator receives are of objects it made
(the Deployment and disruption controllers' status writes, the scheduler's binds), and kopf's
processing of each (causes, memories, index bookkeeping, a handler's invocation) cost several
times the decode and the dictionary update these watches make (`make bench-operator`). kopf
keeps what the operator defines (ModelDeployments, InferenceServices) and the GPU quotas.

The threads queue events and wake the loop only when no drain of the queue is scheduled: while
the loop is busy (a rollout's burst of status writes), one wake-up hands it every event queued
meanwhile, where a wake-up per event cost the loop more than its handling.

Reconciles wait for `synced`: until each kind has been listed once, an object missing from an
index may only be one not listed yet."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferfleet.kube import Kube
from inferfleet.kube.reflector import Reflector

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watched:
    """A kind the operator watches, and which of its objects."""

    api_version: str
    kind: str
    label_selector: str
    field_selector: str | None = None
    optional: bool = False
    """Served only with an add-on installed (a CRD): while it is not, listed as empty and asked
    about again every `recheck_unserved_s`."""


class OnEvent(Protocol):
    """An object's event: its kind, namespace, the object, whether it is gone (deleted, or no
    longer matching the selectors)."""

    def __call__(
        self, watched: Watched, namespace: str, obj: Mapping[str, Any], *, gone: bool
    ) -> None: ...


OnRelisted = Callable[[Watched, str | None, list[tuple[str, str]]], None]
"""A new list of a kind ended in a scope (a namespace; None: all): the (namespace, name) of each
object it showed. What the receiver holds of that kind and scope beyond those was deleted
while no watch ran."""


@dataclass
class _Watch:
    watched: Watched
    namespace: str | None
    on_event: OnEvent
    on_relisted: OnRelisted
    listed: list[tuple[str, str]] = field(default_factory=list)
    """What the list under way has shown so far."""
    synced: bool = False


_Pending = tuple[_Watch, str, dict[str, Any]]


class Watches:
    """The watches of `watched` in `namespaces` (none: in all), from threads; their events
    handed to `on_event` on the event loop that `start` runs on. `synced` is set once every
    watch has listed what exists."""

    def __init__(
        self,
        watched: Sequence[Watched],
        namespaces: Sequence[str],
        *,
        recheck_unserved_s: float,
    ) -> None:
        self.watched = tuple(watched)
        self.namespaces = tuple(namespaces)
        self.recheck_unserved_s = recheck_unserved_s
        self.synced = asyncio.Event()
        self._watches: list[_Watch] = []
        self._reflectors: list[Reflector] = []
        self._pending: deque[_Pending] = deque()
        self._drain_lock = threading.Lock()
        self._drain_scheduled = False
        self._first_listed = 0

    def start(self, on_event: OnEvent, on_relisted: OnRelisted) -> None:
        loop = asyncio.get_running_loop()
        scopes: Sequence[str | None] = self.namespaces or (None,)
        # One connection per watch, on a client of their own: the workers' pool stays theirs.
        kube = Kube.from_environment(connections=len(self.watched) * len(scopes))
        for watched in self.watched:
            for namespace in scopes:
                watch = _Watch(watched, namespace, on_event, on_relisted)
                self._watches.append(watch)
                self._reflectors.append(
                    Reflector(
                        kube,
                        watched.api_version,
                        watched.kind,
                        namespace=namespace,
                        label_selector=watched.label_selector,
                        field_selector=watched.field_selector,
                        deliver=functools.partial(self._deliver, loop, watch),
                        recheck_unserved_s=self.recheck_unserved_s if watched.optional else None,
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
        self, loop: asyncio.AbstractEventLoop, watch: _Watch, event: str, obj: dict[str, Any]
    ) -> bool:
        """From a watch's thread: the event, queued to be handled on the loop, in order."""
        self._pending.append((watch, event, obj))
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
            watch, event, obj = self._pending.popleft()
            try:
                self._handle(watch, event, obj)
            except Exception:
                logger.exception("cannot handle a %s event of a %s", event, watch.watched.kind)

    def _handle(self, watch: _Watch, event: str, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace")
        if event == "LISTED":
            # Indexed as listed, keeping only its name for the end of the list.
            if namespace:
                watch.on_event(watch.watched, str(namespace), obj, gone=False)
                watch.listed.append((str(namespace), str(metadata.get("name"))))
            return
        if event != "SYNCED":
            if namespace:
                watch.on_event(watch.watched, str(namespace), obj, gone=event == "DELETED")
            return
        listed, watch.listed = watch.listed, []
        watch.on_relisted(watch.watched, watch.namespace, listed)
        if not watch.synced:
            watch.synced = True
            self._first_listed += len(listed)
        if not self.synced.is_set() and all(each.synced for each in self._watches):
            logger.info(
                "the operator's watches have listed what exists: %d objects of %d kinds",
                self._first_listed,
                len(self.watched),
            )
            self.synced.set()
