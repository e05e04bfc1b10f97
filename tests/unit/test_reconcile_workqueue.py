"""The work queue's promises: one entry per key however many changes, never two workers on one
key, failures retried later and later, a success forgets them."""

from __future__ import annotations

import asyncio

import pytest

from inferfleet.reconcile.workqueue import LONGEST_RETRY_S, WorkQueue, retry_delay_s


def test_a_burst_of_changes_is_one_reconcile() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        return [await queue.get(), await queue.get()]

    assert asyncio.run(scenario()) == ["a", "b"]


def test_a_key_added_while_in_progress_waits_for_its_reconcile_to_end() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        assert await queue.get() == "a"
        queue.add("a")  # changed again while a worker holds it
        assert len(queue) == 0, "a second worker must not take it now"
        queue.done("a")
        assert len(queue) == 1
        assert await queue.get() == "a"

    asyncio.run(scenario())


def test_failures_back_off_and_a_success_forgets_them() -> None:
    assert [retry_delay_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert retry_delay_s(30) == LONGEST_RETRY_S

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        await queue.get()
        queue.done("a", failed=True)
        assert queue.failures("a") == 1
        assert len(queue) == 0, "retried after its delay, not at once"
        again = await asyncio.wait_for(queue.get(), timeout=2)
        assert again == "a"
        queue.done("a")
        assert queue.failures("a") == 0

    asyncio.run(scenario())


def test_the_earlier_of_two_delays_wins_and_forget_cancels() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add_after("a", 60)
        queue.add_after("a", 0.01)
        assert await asyncio.wait_for(queue.get(), timeout=2) == "a"
        queue.done("a")
        queue.add_after("b", 0.01)
        queue.forget("b")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(queue.get(), timeout=0.1)

    asyncio.run(scenario())


def test_each_key_taken_reports_how_long_it_waited_since_it_was_ready() -> None:
    now = [100.0]
    waits: list[float] = []

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(on_wait=waits.append, clock=lambda: now[0])
        queue.add("a")
        now[0] += 3.0
        queue.add("a")  # a burst: still one key, ready since its first change
        now[0] += 2.0
        assert await queue.get() == "a"
        queue.add("a")  # changed while in progress: ready again only when its worker ends
        now[0] += 7.0
        queue.done("a")
        now[0] += 1.5
        assert await queue.get() == "a"

    asyncio.run(scenario())
    assert waits == [5.0, 1.5]


def test_a_key_added_again_while_held_is_superseded_once_in_a_row() -> None:
    async def scenario() -> list[bool]:
        queue: WorkQueue[str] = WorkQueue()
        seen = []
        queue.add("a")
        await queue.get()
        seen.append(queue.superseded("a"))  # nothing changed since it was taken
        queue.add("a")  # what its worker read changed
        seen += [queue.superseded("a"), queue.superseded("a")]
        queue.done("a")
        await queue.get()
        queue.add("a")  # in a later reconcile, after a write was let through: passed over again
        seen.append(queue.superseded("a"))
        queue.done("a")
        await queue.get()
        seen.append(queue.superseded("a"))
        return seen

    assert asyncio.run(scenario()) == [False, True, False, True, False]
