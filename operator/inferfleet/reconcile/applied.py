"""Read your own writes, for the objects the operator creates: a reconcile that follows the
operator's own applies closely (the next one of a key that changed while it ran) sees what
those applies stored where the index has not caught up with their watch events yet. Without
it, a child the index lacks is applied again (a create the API server refuses as already
there), and one whose new version the index lacks is written twice.

What an apply stored is held until the watch event of that version reaches the index, the
object is deleted, or `HOLD_S` has passed (a watch that restarted and never showed that
version: the index is trusted again)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from inferfleet.reconcile.desired import Child, ObjectKey

HOLD_S: Final = 60.0


@dataclass(frozen=True)
class _Stored:
    child: Child
    version: str
    at: float


class AppliedChildren:
    """Children as the operator's applies stored them, by namespace and owner. Recorded and
    read by reconciles (worker threads), released by watch events (the event loop)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_owner: dict[tuple[str, str], dict[ObjectKey, _Stored]] = {}

    def record(self, namespace: str, child: Child, version: str) -> None:
        """What an apply of `child` stored, at resourceVersion `version`."""
        with self._lock:
            held = self._by_owner.setdefault((namespace, child.owner_uid), {})
            held[child.key] = _Stored(child, version, self._clock())

    def seen(self, namespace: str, child: Child, version: str | None, *, gone: bool) -> None:
        """A watch event of `child`, the index updated with it: it holds the applied version
        when the event shows that version; a deletion ends what was applied either way."""
        owner = (namespace, child.owner_uid)
        with self._lock:
            held = self._by_owner.get(owner)
            stored = held.get(child.key) if held else None
            if held is None or stored is None or not (gone or stored.version == version):
                return
            del held[child.key]
            if not held:
                del self._by_owner[owner]

    def children(self, namespace: str, owner_uid: str, indexed: Sequence[Child]) -> list[Child]:
        """The owner's children: the index's, except where an apply stored a version the
        index does not hold yet (missing, or with another applied hash)."""
        owner = (namespace, owner_uid)
        now = self._clock()
        with self._lock:
            held = self._by_owner.get(owner)
            if not held:
                return list(indexed)
            for key in [key for key, stored in held.items() if now - stored.at > HOLD_S]:
                del held[key]
            applied = {key: stored.child for key, stored in held.items()}
            if not held:
                del self._by_owner[owner]
        children = [
            applied.pop(child.key)
            if child.key in applied and applied[child.key].applied_hash != child.applied_hash
            else child
            for child in indexed
        ]
        known = {child.key for child in indexed}
        return children + [child for key, child in applied.items() if key not in known]
