"""A work queue of object keys, as Kubernetes controllers keep one (client-go's workqueue).

Any change that may affect an object (its own, a child's, a service that routes to it) adds
its key; a worker takes keys one at a time and reconciles the object from what the indices
hold then. The queue guarantees what makes level-based reconciling cheap and safe:

* a key is queued at most once, however many changes arrive before a worker takes it (a burst
  of child events costs one reconcile);
* a key is never reconciled by two workers at once: added while in progress, it is queued
  again when that reconcile ends;
* a failed reconcile is retried after a delay that doubles per consecutive failure of that
  key, up to a ceiling (an API server that refuses keeps being asked, slowly); a success
  resets it;
* `add_after` reconciles a key later (a pin that expires, a status write that lost a race);
* `superseded` tells a worker that its key was added again since it took it: what it read has
  changed, and a status it is about to write would be overwritten by the next reconcile at
  once (one write instead of two);
* how long each key waited for a worker, from the moment it was ready to be taken, is told to
  `on_wait` (the operator's metrics: a queue that falls behind shows there first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)

FIRST_RETRY_S = 0.5
LONGEST_RETRY_S = 60.0


def retry_delay_s(failures: int) -> float:
    """The wait before the next try of a key that failed `failures` times in a row."""
    return float(min(FIRST_RETRY_S * 2 ** max(failures - 1, 0), LONGEST_RETRY_S))


class WorkQueue(Generic[Key]):
    """Keys waiting for a worker. Used from one event loop; not thread-safe by design."""

    def __init__(
        self,
        *,
        on_wait: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._ready_at: dict[Key, float] = {}
        self._on_wait = on_wait
        self._clock = clock
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._later: dict[Key, asyncio.TimerHandle] = {}
        self._passed_over: set[Key] = set()

    def add(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._put(key)

    def _put(self, key: Key) -> None:
        self._ready_at[key] = self._clock()
        self._ready.put_nowait(key)

    def add_after(self, key: Key, delay_s: float) -> None:
        """Add `key` in `delay_s` seconds (sooner if something adds it before); the earlier
        of two pending delays wins."""
        loop = asyncio.get_running_loop()
        pending = self._later.get(key)
        when = loop.time() + max(delay_s, 0.0)
        if pending is not None and pending.when() <= when:
            return
        if pending is not None:
            pending.cancel()
        self._later[key] = loop.call_at(when, self._due, key)

    def _due(self, key: Key) -> None:
        self._later.pop(key, None)
        self.add(key)

    async def get(self) -> Key:
        key = await self._ready.get()
        ready_at = self._ready_at.pop(key, None)
        if self._on_wait is not None and ready_at is not None:
            self._on_wait(max(0.0, self._clock() - ready_at))
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key, *, failed: bool = False) -> None:
        """The worker finished `key`; `failed`: retry it after the key's backoff."""
        self._processing.discard(key)
        if failed:
            self._failures[key] = self._failures.get(key, 0) + 1
            self.add_after(key, retry_delay_s(self._failures[key]))
        else:
            self._failures.pop(key, None)
        if key in self._dirty:
            self._put(key)

    def forget(self, key: Key) -> None:
        """The object is gone: drop its pending retry and its failure count."""
        self._failures.pop(key, None)
        self._passed_over.discard(key)
        pending = self._later.pop(key, None)
        if pending is not None:
            pending.cancel()

    def superseded(self, key: Key) -> bool:
        """Whether `key` was added again since its worker took it, so that the worker may
        leave a write to the reconcile that follows; at most once in a row per key, so that a
        key that changes all the time still gets its writes out. Asked from the worker's
        thread: membership reads of sets, each whole under the GIL; an answer a moment old
        only lets one write through."""
        if key in self._dirty and key in self._processing and key not in self._passed_over:
            self._passed_over.add(key)  # only the worker holding `key` touches its entry
            return True
        self._passed_over.discard(key)
        return False

    def processing(self, key: Key) -> bool:
        """Whether a worker holds `key` now."""
        return key in self._processing

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)

    def __len__(self) -> int:
        return self._ready.qsize()
