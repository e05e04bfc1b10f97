"""The kopf layer's one piece of state: every object's handlers reach the same controller."""

from __future__ import annotations

import asyncio
import copy

import kopf

from inferfleet.reconcile import handlers


def test_every_object_reaches_the_one_controller_and_cleanup_stops_it() -> None:
    async def scenario() -> None:
        memo = kopf.Memo(install=None, autoscaler=None)
        handlers.configure(settings=kopf.OperatorSettings(), memo=memo)
        # kopf gives each object a shallow copy of the operator's memo.
        first, second = copy.copy(memo), copy.copy(memo)
        controller = handlers._controller(first, {})
        assert handlers._controller(second, {}) is controller
        await handlers.stop(memo=memo)
        assert all(task.done() for task in controller._tasks)

    asyncio.run(scenario())
