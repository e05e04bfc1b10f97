"""What keeps the operator from applying an object, remembered until it is time to try again:
names held by objects inferfleet did not create (a create-only apply found one), and objects
the API server refused (a quota, a policy webhook, RBAC). Reconciles read them as data
(`desired.Namespace`); nothing here is watched, so each is tried again after `RECHECK_S`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from inferfleet.reconcile.desired import ObjectKey

RECHECK_S: Final = 60.0
"""How long a name held, or an object refused, is taken as still so."""


class HeldBack:
    """Thread-safe: reconcile workers are threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._foreign: dict[tuple[str, ObjectKey], float] = {}
        self._refused: dict[tuple[str, ObjectKey], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def foreign(self, namespace: str, key: ObjectKey) -> None:
        """An object inferfleet did not create holds the name."""
        with self._lock:
            self._foreign[namespace, key] = self._clock() + RECHECK_S

    def refused(self, namespace: str, key: ObjectKey, message: str) -> None:
        """The API server refused the object, saying `message`."""
        with self._lock:
            self._refused[namespace, key] = (self._clock() + RECHECK_S, message)

    def in_namespace(self, namespace: str) -> tuple[frozenset[ObjectKey], dict[ObjectKey, str]]:
        """The names held and the objects refused in `namespace`, until it is time to look
        again."""
        now = self._clock()
        with self._lock:
            self._foreign = {k: until for k, until in self._foreign.items() if until > now}
            self._refused = {k: held for k, held in self._refused.items() if held[0] > now}
            foreign = frozenset(key for ns, key in self._foreign if ns == namespace)
            refused = {
                key: said for (ns, key), (_, said) in self._refused.items() if ns == namespace
            }
        return foreign, refused
