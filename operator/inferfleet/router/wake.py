"""Requests held while a service wakes from zero replicas.

Where the service may be at zero on purpose (`RouterConfig.wake_timeout_s` set), a request
that finds no replica of a deployment it may go to waits here, in arrival order, until one
serves; at most `max_waiting` wait, each at most `timeout_s`, then a 503 with Retry-After
(`WakeRefusedError`). Every change of the count is told to `on_waiting` (the router's gauge,
and the push that wakes the autoscaler without waiting for a scrape). The wait is part of
the request's TTFT: the router's timing starts at arrival.

No I/O: the router calls `replicas_changed` whenever discovery or a health check changes its
replicas, and held requests look again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


class WakeRefusedError(Exception):
    """The request may not wait (the hold is full) or waited `timeout_s` in vain."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class WakeHold:
    timeout_s: float
    max_waiting: int
    on_waiting: Callable[[int], None] | None = None
    waiting: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def replicas_changed(self) -> None:
        """The replicas changed: every held request checks whether it may go now."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def until(self, serving: Callable[[], bool]) -> None:
        """Return once `serving()` holds (at once when it does already)."""
        if serving():
            return
        if self.waiting >= self.max_waiting:
            raise WakeRefusedError(
                "wake_queue_full",
                f"no replica serves yet, and {self.waiting} requests already wait for one",
            )
        self._count(1)
        try:
            async with asyncio.timeout(self.timeout_s):
                while not serving():
                    await self._changed.wait()
        except TimeoutError:
            raise WakeRefusedError(
                "wake_timeout",
                f"no replica served within {self.timeout_s:g} s (the service is waking from "
                "zero replicas)",
            ) from None
        finally:
            self._count(-1)

    def _count(self, change: int) -> None:
        self.waiting += change
        if self.on_waiting is not None:
            self.on_waiting(self.waiting)
