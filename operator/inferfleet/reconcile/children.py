"""The index of what the operator created (the kinds of `CHILD_KINDS`), by owner and by name,
kept by the operator's own watches (`reconcile.watches`) on the event loop, which alone writes
it; reconciles on worker threads read it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inferfleet.reconcile.desired import Child, ObjectKey
from inferfleet.reconcile.entries import IndexedChild
from inferfleet.reconcile.watches import Watched
from inferfleet.render.common import LABEL_MANAGED_BY, MANAGED_BY
from inferfleet.render.multinode import LWS_API_VERSION, LWS_KIND

MANAGED = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
"""The label selector of what the operator made."""

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
WATCHED_CHILDREN = tuple(
    Watched(api_version, kind, MANAGED, optional=(api_version, kind) in OPTIONAL_KINDS)
    for api_version, kind in CHILD_KINDS
)


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
