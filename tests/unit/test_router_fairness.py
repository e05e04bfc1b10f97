"""The router's admission gate: capacity, priorities, fair share by virtual token counters,
shedding and waiting limits (pure, on an event loop)."""

from __future__ import annotations

import asyncio

import pytest

from inferfleet.router.fairness import FairGate, Priority, ShedError, Ticket

INTERACTIVE, BATCH = Priority.INTERACTIVE, Priority.BATCH


async def settle() -> None:
    """Let woken waiters run (a future's result reaches its awaiting task over a few turns of
    the loop)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def _queue(
    gate: FairGate, *requests: tuple[str, Priority, int]
) -> list[asyncio.Task[Ticket]]:
    """Start waiting requests in order, each queued before the next arrives."""
    tasks = []
    for tenant, priority, tokens in requests:
        tasks.append(asyncio.create_task(gate.enter(tenant, priority, tokens)))
        await settle()
    return tasks


async def _served_order(
    gate: FairGate, tasks: list[asyncio.Task[Ticket]], output: int
) -> list[str]:
    """Let the queued requests through one at a time (capacity 1); who went, in order."""
    served = []
    for _ in tasks:
        done = next(t for t in tasks if t.done() and t.result().tenant and t not in served)
        served.append(done)
        gate.leave(done.result(), output)
        await settle()
    return [t.result().tenant for t in served]


async def test_without_capacity_every_request_goes_at_once() -> None:
    gate = FairGate()
    tickets = [await gate.enter("a", INTERACTIVE, 10) for _ in range(100)]
    assert gate.in_flight == 100
    assert gate.queued == 0
    for ticket in tickets:
        gate.leave(ticket, 5)
    assert gate.in_flight == 0


async def test_past_capacity_requests_wait_and_go_as_places_free() -> None:
    gate = FairGate(capacity=2)
    first = await gate.enter("a", INTERACTIVE, 10)
    await gate.enter("a", INTERACTIVE, 10)
    (waiting,) = await _queue(gate, ("a", INTERACTIVE, 10))
    assert not waiting.done()
    assert gate.queued == 1
    gate.leave(first, 3)
    await settle()
    assert waiting.done()
    assert gate.in_flight == 2


async def test_the_least_served_tenant_goes_first_not_the_first_come() -> None:
    gate = FairGate(capacity=1)
    holder = await gate.enter("noisy", INTERACTIVE, 1000)  # noisy has been served 1000 already
    # Noisy queues five requests before quiet sends one: quiet's goes right after the holder.
    tasks = await _queue(
        gate, *[("noisy", INTERACTIVE, 100)] * 5, ("quiet", INTERACTIVE, 100)
    )  # fmt: skip
    gate.leave(holder, 500)
    await settle()
    assert tasks[-1].done()
    assert not any(t.done() for t in tasks[:-1])


async def test_two_busy_tenants_share_by_tokens_served() -> None:
    gate = FairGate(capacity=1)
    holder = await gate.enter("x", INTERACTIVE, 0)
    # a asks for big requests, b for small ones: both always waiting, they alternate so that
    # their served tokens stay level, not their request counts.
    tasks = await _queue(gate, *[("a", INTERACTIVE, 300)] * 3, *[("b", INTERACTIVE, 100)] * 9)
    gate.leave(holder, 0)
    await settle()
    order = await _served_order(gate, tasks, output=0)
    assert order[:4] == ["a", "b", "b", "b"]
    assert order.count("a") == 3
    assert abs(gate.counters["a"] - gate.counters["b"]) <= 300


async def test_idling_earns_no_credit() -> None:
    gate = FairGate(capacity=1)
    holder = await gate.enter("busy", INTERACTIVE, 0)
    gate.counters["busy"] = 10_000.0
    gate.counters["back"] = 0.0  # served long ago, then idle
    tasks = await _queue(gate, ("busy", INTERACTIVE, 100), ("back", INTERACTIVE, 100))
    # Lifted to the least counter waiting: level with busy, not 10,000 tokens ahead.
    assert gate.counters["back"] == 10_000.0
    gate.leave(holder, 0)
    await settle()
    assert tasks[0].done()  # level: the first come goes first


async def test_interactive_goes_before_batch_whoever_has_been_served_less() -> None:
    gate = FairGate(capacity=1)
    holder = await gate.enter("x", INTERACTIVE, 0)
    gate.counters["chat"] = 1e6
    batch, chat = await _queue(gate, ("etl", BATCH, 10), ("chat", INTERACTIVE, 10))
    gate.leave(holder, 0)
    await settle()
    assert chat.done()
    assert not batch.done()


async def test_a_full_queue_sheds_the_newest_batch_request_for_an_interactive_one() -> None:
    gate = FairGate(capacity=1, max_queue=2)
    await gate.enter("x", INTERACTIVE, 0)
    old_batch, new_batch = await _queue(gate, ("etl", BATCH, 10), ("etl", BATCH, 10))
    (chat,) = await _queue(gate, ("chat", INTERACTIVE, 10))
    with pytest.raises(ShedError) as shed:
        await new_batch
    assert shed.value.reason == "shed"
    assert not old_batch.done()
    assert not chat.done()
    assert gate.queued == 2
    # Full of interactive and batch: another batch request is refused outright.
    with pytest.raises(ShedError) as full:
        await gate.enter("etl", BATCH, 10)
    assert full.value.reason == "queue_full"
    assert full.value.retry_after_s > 0


async def test_a_wait_past_the_limit_is_refused_and_leaves_the_queue() -> None:
    gate = FairGate(capacity=1, max_wait_s=0.05)
    await gate.enter("x", INTERACTIVE, 0)
    with pytest.raises(ShedError) as late:
        await gate.enter("a", INTERACTIVE, 10)
    assert late.value.reason == "queue_timeout"
    assert gate.queued == 0


async def test_a_client_gone_while_waiting_leaves_no_trace() -> None:
    gate = FairGate(capacity=1)
    holder = await gate.enter("x", INTERACTIVE, 0)
    (waiting,) = await _queue(gate, ("a", INTERACTIVE, 10))
    waiting.cancel()
    await settle()
    assert gate.queued == 0
    gate.leave(holder, 0)
    assert gate.in_flight == 0


async def test_more_capacity_lets_the_waiting_in() -> None:
    gate = FairGate(capacity=1)
    await gate.enter("x", INTERACTIVE, 0)
    tasks = await _queue(gate, *[("a", INTERACTIVE, 10)] * 3)
    gate.set_capacity(3)
    await settle()
    assert sum(t.done() for t in tasks) == 2
    gate.set_capacity(None)
    await settle()
    assert all(t.done() for t in tasks)
