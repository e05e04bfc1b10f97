"""Who goes first when the engines are full: priorities and fair share between tenants.

The router admits at most `capacity` requests to the engines at once (the sequences their
replicas batch: beyond that an engine only queues, first come first served, and one tenant's
flood delays everyone). Past it, requests wait here:
* interactive before batch: a batch request is served only when no interactive one waits, and
  a full queue makes room for an interactive request by shedding the newest batch one;
* within a priority, the tenant that has been served least goes first, by a virtual token
  counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024): each tenant's
  counter grows by the tokens it is served, prompt tokens at 1 and output tokens at 2 (a
  decoded token costs the engines more than a prefilled one); a tenant that starts sending
  again is lifted to the least counter of those waiting, so idling earns no credit to burst
  with later.
A wait past `max_wait_s` ends in a 503 with Retry-After, as does a full queue.

No I/O: the router drives it from its event loop (`enter` awaits a future that `leave` or a
capacity change resolves)."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field

from inferfleet.api.inference_service import TenantPriority as Priority

PROMPT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0

PRIORITY_ORDER = (Priority.INTERACTIVE, Priority.BATCH)


class ShedError(Exception):
    """The request was not admitted: the queue is full, it was shed for a higher priority, or
    it waited too long. `retry_after_s`: when to try again."""

    def __init__(self, reason: str, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Ticket:
    tenant: str
    priority: Priority
    prompt_tokens: int
    order: int
    admitted: asyncio.Future[None] | None = None


@dataclass
class FairGate:
    """`capacity`: requests at once (None: no limit, every request goes at once)."""

    capacity: int | None = None
    max_queue: int = 4096
    max_wait_s: float = 30.0
    in_flight: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    _waiting: dict[Priority, dict[str, deque[Ticket]]] = field(
        default_factory=lambda: {p: {} for p in PRIORITY_ORDER}
    )
    _order: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def queued(self) -> int:
        return sum(len(q) for tier in self._waiting.values() for q in tier.values())

    def queued_by(self, priority: Priority) -> int:
        return sum(len(q) for q in self._waiting[priority].values())

    def _free(self) -> bool:
        return self.capacity is None or self.in_flight < self.capacity

    async def enter(self, tenant: str, priority: Priority, prompt_tokens: int) -> Ticket:
        """Wait for a place among the requests at the engines (at once while there is one and
        nobody waits); `ShedError` when the request may not wait."""
        ticket = Ticket(tenant, priority, prompt_tokens, next(self._order))
        if self._free() and self.queued == 0:
            self._admit(ticket)
            return ticket
        if self.queued >= self.max_queue:
            self._make_room(priority)
        self._lift(tenant)
        loop = asyncio.get_running_loop()
        ticket.admitted = loop.create_future()
        self._waiting[priority].setdefault(tenant, deque()).append(ticket)
        try:
            await asyncio.wait_for(asyncio.shield(ticket.admitted), self.max_wait_s)
        except TimeoutError:
            if not ticket.admitted.done():
                self._remove(ticket)
                raise ShedError(
                    "queue_timeout",
                    f"the engines stayed full for {self.max_wait_s:g} s",
                    self.max_wait_s,
                ) from None
        except asyncio.CancelledError:  # the client hung up while waiting
            if not ticket.admitted.done():
                self._remove(ticket)
            else:
                self.leave(ticket, 0)
            raise
        ticket.admitted.result()  # raises the ShedError of a shed ticket
        return ticket

    def leave(self, ticket: Ticket, output_tokens: int) -> None:
        """The request is done (answered, failed or cut): its output charged to its tenant,
        its place given to the next in line."""
        self.in_flight -= 1
        self.counters[ticket.tenant] = (
            self.counters.get(ticket.tenant, 0.0) + OUTPUT_WEIGHT * output_tokens
        )
        self._dispatch()

    def set_capacity(self, capacity: int | None) -> None:
        """The engines' sequences changed (replicas came or went)."""
        self.capacity = capacity
        self._dispatch()

    def _admit(self, ticket: Ticket) -> None:
        self.in_flight += 1
        self.counters[ticket.tenant] = (
            self.counters.get(ticket.tenant, 0.0) + PROMPT_WEIGHT * ticket.prompt_tokens
        )

    def _dispatch(self) -> None:
        while self._free():
            ticket = self._next()
            if ticket is None:
                return
            self._admit(ticket)
            assert ticket.admitted is not None
            ticket.admitted.set_result(None)

    def _next(self) -> Ticket | None:
        """The head of the least-served tenant's queue, in the highest priority that waits."""
        for priority in PRIORITY_ORDER:
            tier = self._waiting[priority]
            if not tier:
                continue
            tenant = min(tier, key=lambda t: (self.counters.get(t, 0.0), tier[t][0].order))
            ticket = tier[tenant].popleft()
            if not tier[tenant]:
                del tier[tenant]
            return ticket
        return None

    def _lift(self, tenant: str) -> None:
        """A tenant with nothing waiting starts at no less than the least counter of those
        waiting: credit is not saved up while idle."""
        if any(tenant in tier for tier in self._waiting.values()):
            return
        waiting = [self.counters.get(t, 0.0) for tier in self._waiting.values() for t in tier]
        if waiting:
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(waiting))

    def _make_room(self, priority: Priority) -> None:
        """A full queue: shed the newest request of a lower priority, else refuse this one."""
        for lower in reversed(PRIORITY_ORDER[PRIORITY_ORDER.index(priority) + 1 :]):
            tickets = [t for q in self._waiting[lower].values() for t in q]
            if tickets:
                newest = max(tickets, key=lambda t: t.order)
                self._remove(newest)
                assert newest.admitted is not None
                newest.admitted.set_exception(
                    ShedError("shed", "shed for a request of a higher priority", 1.0)
                )
                return
        raise ShedError("queue_full", f"{self.max_queue} requests wait already", 1.0)

    def _remove(self, ticket: Ticket) -> None:
        tier = self._waiting[ticket.priority]
        queue = tier.get(ticket.tenant)
        if queue is not None and ticket in queue:
            queue.remove(ticket)
            if not queue:
                del tier[ticket.tenant]


__all__ = ["FairGate", "Priority", "ShedError", "Ticket"]
