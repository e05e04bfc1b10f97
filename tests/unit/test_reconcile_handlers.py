"""The kopf layer's one piece of state, and what its events queue."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf

from inferfleet.reconcile import handlers
from inferfleet.reconcile.controller import Controller
from inferfleet.render import InstallSettings


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


def _engine_deployment(ready: int, *, observed: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "llama-aggregated",
            "namespace": "llm",
            "uid": "uid-deployment",
            "generation": 1,
            "labels": {"inferfleet.io/role": "aggregated"},
            "annotations": {"inferfleet.io/applied-hash": "h1"},
            "ownerReferences": [
                {"kind": "ModelDeployment", "name": "llama", "uid": "uid-md", "controller": True}
            ],
        },
        "spec": {"replicas": 2},
        "status": {"observedGeneration": observed, "replicas": 2, "readyReplicas": ready},
    }


def test_a_child_queues_its_owner_only_when_what_the_owner_reads_of_it_changes() -> None:
    async def scenario() -> None:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)
        owner = ("ModelDeployment", "llm", "llama")

        async def queued() -> bool:
            if not len(controller.reconciles):
                return False
            key = await controller.reconciles.get()
            controller.reconciles.done(key)
            return key == owner

        controller.child_changed("llm", _engine_deployment(ready=1), gone=False)
        assert await queued()
        # A status write that changes nothing its owner reads (the Deployment controller's
        # resync, a condition's heartbeat) queues nothing.
        unchanged = _engine_deployment(ready=1)
        unchanged["status"]["conditions"] = [{"type": "Available", "status": "True"}]
        controller.child_changed("llm", unchanged, gone=False)
        assert not await queued()
        controller.child_changed("llm", _engine_deployment(ready=2), gone=False)
        assert await queued()
        controller.child_changed("llm", _engine_deployment(ready=2), gone=True)
        assert await queued()
        await controller.stop()

    asyncio.run(scenario())
