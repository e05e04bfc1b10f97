"""The kopf layer's one piece of state, and what its events queue."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Hashable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import kopf

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.ownership import Claim, claims_of
from inferfleet.reconcile import handlers
from inferfleet.reconcile.controller import Controller, Done
from inferfleet.reconcile.pods import ENGINE_PODS
from inferfleet.reconcile.workqueue import WorkQueue
from inferfleet.render import InstallSettings
from inferfleet.render.common import LABEL_MANAGED_BY, MANAGED_BY
from inferfleet.render.wake import push_body
from tests.unit.test_reconcile_pods import WHY, pending_pod


def test_every_object_reaches_the_one_controller_and_cleanup_stops_it() -> None:
    async def scenario() -> None:
        memo = kopf.Memo(install=None, autoscaler=None)
        # kopf's decorators retype a handler as the protocol of every argument kopf passes it,
        # sync or async; the function they return is the one written, which takes these.
        handlers.configure(settings=kopf.OperatorSettings(), memo=memo)  # type: ignore[call-arg]
        # kopf gives each object a shallow copy of the operator's memo.
        first, second = copy.copy(memo), copy.copy(memo)
        controller = handlers._controller(first, {})
        assert handlers._controller(second, {}) is controller
        await handlers.stop(memo=memo)  # type: ignore[call-arg,misc]
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

        controller.child_changed("llm", _engine_deployment(ready=1), gone=False)
        assert await _drained(controller) == {owner}
        # A status write that changes nothing its owner reads (the Deployment controller's
        # resync, a condition's heartbeat) queues nothing.
        unchanged = _engine_deployment(ready=1)
        unchanged["status"]["conditions"] = [{"type": "Available", "status": "True"}]
        controller.child_changed("llm", unchanged, gone=False)
        assert await _drained(controller) == set()
        controller.child_changed("llm", _engine_deployment(ready=2), gone=False)
        assert await _drained(controller) == {owner}
        controller.child_changed("llm", _engine_deployment(ready=2), gone=True)
        assert await _drained(controller) == {owner}
        await controller.stop()

    asyncio.run(scenario())


def test_the_index_follows_child_events_and_a_child_released_by_hand_is_news_to_its_owner() -> None:
    async def scenario() -> None:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)
        owner = ("ModelDeployment", "llm", "llama")
        controller.child_changed("llm", _engine_deployment(ready=1), gone=False)
        assert await _drained(controller) == {owner}
        held = controller.indices.children("llm", "uid-md")
        assert [(c.key.name, c.progress.ready if c.progress else None) for c in held] == [
            ("llama-aggregated", 1)
        ]
        # Someone removed its owner reference: no longer the deployment's, which learns so.
        released = _engine_deployment(ready=1)
        released["metadata"]["ownerReferences"] = []
        controller.child_changed("llm", released, gone=False)
        assert await _drained(controller) == {owner}
        assert controller.indices.children("llm", "uid-md") == []
        controller.child_changed("llm", released, gone=True)
        assert await _drained(controller) == set()
        await controller.stop()

    asyncio.run(scenario())


def test_the_watch_event_of_its_own_apply_does_not_queue_the_owner_again() -> None:
    async def scenario() -> None:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)

        def queued() -> int:
            return len(controller.reconciles)

        # The owner's reconcile applied it and was answered with the object as stored: the
        # watch event of that write, which shows the same, is no news to the owner.
        controller._applied("llm", _engine_deployment(ready=0, observed=0))
        controller.child_changed("llm", _engine_deployment(ready=0, observed=0), gone=False)
        assert queued() == 0
        # The Deployment controller has seen the spec and made the pods, none ready yet:
        # nothing its owner's status says changed.
        controller.child_changed("llm", _engine_deployment(ready=0), gone=False)
        assert queued() == 0
        # Replicas ready: news.
        controller.child_changed("llm", _engine_deployment(ready=1), gone=False)
        assert queued() == 1
        key = await controller.reconciles.get()
        assert key == ("ModelDeployment", "llm", "llama")
        controller.reconciles.done(key)
        # And so is its deletion, whoever applied it last.
        controller._applied("llm", _engine_deployment(ready=2))
        controller.child_changed("llm", _engine_deployment(ready=2), gone=True)
        assert queued() == 1
        await controller.stop()

    asyncio.run(scenario())


def test_the_echo_of_a_write_seen_while_its_reconcile_still_runs_does_not_queue_it_again() -> None:
    """The watch can deliver a write's event before the reconcile that made it has recorded
    the answer; what arrives while the reconcile runs is judged once it ends."""

    async def scenario(event: dict[str, Any]) -> list[tuple[str, str, str]]:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)
        owner = ("ModelDeployment", "llm", "llama")
        applied = _engine_deployment(ready=0, observed=0)
        arrived = threading.Event()
        taken: list[tuple[str, str, str]] = []

        def reconcile(key: tuple[str, str, str]) -> Done:
            taken.append(key)
            if len(taken) == 1:
                arrived.wait(5)  # the event reaches the loop before the apply's answer here
                controller._applied("llm", applied)
            return Done()

        worker = asyncio.create_task(
            controller._work(
                "reconcile", controller.reconciles, reconcile, lambda k: k[0], lambda k: k
            )
        )
        controller.reconciles.add(owner)
        while not controller.reconciles.processing(owner):
            await asyncio.sleep(0.001)
        controller.child_changed("llm", event, gone=False)
        arrived.set()
        for _ in range(50):
            await asyncio.sleep(0.01)
        worker.cancel()
        await controller.stop()
        return taken

    owner = ("ModelDeployment", "llm", "llama")
    # Its own apply's echo: one reconcile.
    assert asyncio.run(scenario(_engine_deployment(ready=0, observed=0))) == [owner]
    # The Deployment controller's write, arrived meanwhile: reconciled again.
    assert asyncio.run(scenario(_engine_deployment(ready=1))) == [owner, owner]


def test_the_echo_of_a_ticks_status_write_does_not_queue_the_service() -> None:
    async def scenario() -> None:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)
        service = ("InferenceService", "llm", "chat")
        controller.inference_service_changed("llm", "chat", _inference_service("5"))
        while len(controller.reconciles):  # it and the deployment it autoscales, once
            controller.reconciles.done(await controller.reconciles.get())
        controller.ticks.add(("llm", "chat"))
        assert await controller.ticks.get() == ("llm", "chat")  # a tick runs
        # Its status write's event, before the tick has recorded what the write answered.
        controller.inference_service_changed("llm", "chat", _inference_service("7"))
        controller._stored[service] = ("6", _inference_service("7"))
        controller._judge_news(service)  # the tick ended
        controller.ticks.done(("llm", "chat"))
        assert len(controller.reconciles) == 0
        # Someone else's write meanwhile is news.
        controller.ticks.add(("llm", "chat"))
        await controller.ticks.get()
        controller.inference_service_changed("llm", "chat", _inference_service("9"))
        controller._judge_news(service)
        assert len(controller.reconciles) == 1
        await controller.stop()

    asyncio.run(scenario())


def _model_deployment(version: str, *, generation: int = 1, ready: str = "False") -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {
            "name": "llama", "namespace": "llm", "uid": "uid-md", "generation": generation,
            "resourceVersion": version,
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }  # fmt: skip


def _inference_service(version: str, *, decided: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if decided is not None:
        status["replicas"] = [{"deployment": "llama", "role": "aggregated", "replicas": decided}]
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "llm", "uid": "uid-isvc",
                     "resourceVersion": version},
        "spec": {"deployments": [{"name": "llama"}], "autoscaling": {"policy": "goodput"}},
        "status": status,
    }  # fmt: skip


Key = TypeVar("Key", bound=Hashable)


async def _taken(queue: WorkQueue[Key]) -> set[Key]:
    """The keys a queue holds, each taken and done."""
    keys = set()
    while len(queue):
        key = await queue.get()
        queue.done(key)
        keys.add(key)
    return keys


async def _drained(controller: Controller) -> set[tuple[str, str, str]]:
    """The keys queued for a reconcile, each taken and done."""
    return await _taken(controller.reconciles)


def test_events_queue_an_object_and_its_dependents_only_for_what_they_read() -> None:
    async def scenario() -> None:
        service = _inference_service("1")
        indices: dict[str, dict[tuple[str, ...], list[dict[str, Any] | Claim]]] = {
            "inference_services": {("llm", "chat"): [service]}
        }
        indices["inference_services"][("backend", "llm", "llama")] = [claims_of(service)["llama"]]
        controller = Controller(indices, install=InstallSettings(), autoscaler=None)
        md_key = ("ModelDeployment", "llm", "llama")
        isvc_key = ("InferenceService", "llm", "chat")

        # New objects: each is queued, and what routes to or from it.
        controller.model_deployment_changed("llm", "llama", _model_deployment("10"))
        assert await _drained(controller) == {md_key, isvc_key}
        controller.inference_service_changed("llm", "chat", service)
        assert await _drained(controller) == {isvc_key, md_key}
        # The deployment's own status write, seen by the watch: nothing its reconcile or the
        # service's reads changed.
        controller._stored[md_key] = ("10", _model_deployment("11"))
        controller.model_deployment_changed("llm", "llama", _model_deployment("11"))
        assert await _drained(controller) == set()
        # Ready, written by someone else: both.
        controller.model_deployment_changed("llm", "llama", _model_deployment("12", ready="True"))
        assert await _drained(controller) == {md_key, isvc_key}
        # The service's own status write leaves its claims as they were: nothing.
        controller._stored[isvc_key] = ("1", _inference_service("2"))
        controller.inference_service_changed("llm", "chat", _inference_service("2"))
        assert await _drained(controller) == set()
        # A decision the autoscaler wrote changes the claim: the deployment follows it.
        controller._stored[isvc_key] = ("2", _inference_service("3", decided=3))
        controller.inference_service_changed("llm", "chat", _inference_service("3", decided=3))
        assert await _drained(controller) == {md_key}
        # Gone: both are queued (the deployment's replicas return to its spec).
        controller.inference_service_changed("llm", "chat", None)
        assert await _drained(controller) == {isvc_key, md_key}
        # A service that routes to the deployment without autoscaling it changes nothing the
        # deployment reads, whether it comes or goes.
        plain = _inference_service("4")
        plain["metadata"]["name"] = "batch"
        plain["spec"]["autoscaling"] = {"policy": "none"}
        batch_key = ("InferenceService", "llm", "batch")
        controller.inference_service_changed("llm", "batch", plain)
        assert await _drained(controller) == {batch_key}
        controller.inference_service_changed("llm", "batch", None)
        assert await _drained(controller) == {batch_key}
        await controller.stop()

    asyncio.run(scenario())


def test_a_deployment_that_says_it_is_not_ready_yet_does_not_queue_its_services() -> None:
    async def scenario() -> None:
        service = _inference_service("1")
        claim = claims_of(service)["llama"]
        indices = {"inference_services": {("backend", "llm", "llama"): [claim]}}
        controller = Controller(indices, install=InstallSettings(), autoscaler=None)
        md_key = ("ModelDeployment", "llm", "llama")
        isvc_key = ("InferenceService", "llm", "chat")

        created = _model_deployment("1")
        del created["status"]
        controller.model_deployment_changed("llm", "llama", created)
        assert await _drained(controller) == {md_key, isvc_key}
        # Its first status says it is not Ready: the service read as much before.
        controller.model_deployment_changed("llm", "llama", _model_deployment("2"))
        assert await _drained(controller) == {md_key}
        controller.model_deployment_changed("llm", "llama", _model_deployment("3", ready="True"))
        assert await _drained(controller) == {md_key, isvc_key}
        await controller.stop()

    asyncio.run(scenario())


def _router_deployment(ready: int, *, observed: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat-router",
            "namespace": "llm",
            "uid": "router-uid",
            "generation": 1,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {"kind": "InferenceService", "name": "chat", "uid": "chat-uid", "controller": True}
            ],
        },
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": observed,
            "replicas": 2,
            "readyReplicas": ready,
            "availableReplicas": ready,
        },
    }


def test_a_router_deployment_queues_its_service_when_its_endpoint_starts_or_stops_serving() -> None:
    async def scenario() -> None:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)
        service_key = ("InferenceService", "llm", "chat")

        async def queued() -> bool:
            keys = set()
            while len(controller.reconciles):
                key = await controller.reconciles.get()
                controller.reconciles.done(key)
                keys.add(key)
            return service_key in keys

        controller.child_changed("llm", _router_deployment(0), gone=False)
        assert await _drained(controller)
        # The Deployment controller's progress writes that leave no pod available: nothing.
        controller.child_changed("llm", _router_deployment(0, observed=2), gone=False)
        assert not await _drained(controller)
        # A first router pod available: the service can say Ready.
        controller.child_changed("llm", _router_deployment(1), gone=False)
        assert await _drained(controller)
        controller.child_changed("llm", _router_deployment(2), gone=False)
        assert not await _drained(controller)
        controller.child_changed("llm", _router_deployment(0), gone=False)
        assert await _drained(controller)
        await controller.stop()

    asyncio.run(scenario())


def _wake_config_map(waiting: int | None, pushed_at: datetime) -> dict[str, Any]:
    data = {} if waiting is None else push_body(waiting, "chat-router-x", pushed_at)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "chat-router-wake",
            "namespace": "llm",
            "uid": "wake-uid",
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {"kind": "InferenceService", "name": "chat", "uid": "chat-uid", "controller": True}
            ],
        },
    } | data


def test_a_router_that_holds_requests_queues_its_services_tick_at_once() -> None:
    async def scenario() -> None:
        controller = Controller({}, install=InstallSettings(), autoscaler=None)
        now = datetime.now(UTC)

        async def ticked() -> set[tuple[str, str]]:
            return await _taken(controller.ticks)

        controller.child_changed("llm", _wake_config_map(None, now), gone=False)
        assert await ticked() == set(), "rendered, nothing pushed yet"
        controller.child_changed("llm", _wake_config_map(3, now), gone=False)
        assert await ticked() == {("llm", "chat")}
        controller.child_changed("llm", _wake_config_map(0, now), gone=False)
        assert await ticked() == set(), "none held: no tick before the next interval"
        stale = now - timedelta(minutes=5)
        controller.child_changed("llm", _wake_config_map(3, stale), gone=False)
        assert await ticked() == set(), "a router that stopped pushing is not believed"
        await controller.stop()

    asyncio.run(scenario())


def test_an_unschedulable_engine_pod_queues_its_deployment_which_reads_the_schedulers_reason() -> (
    None
):
    async def scenario() -> None:
        indices = {"model_deployments": {("label", "llm", "llama"): ["llama"]}}
        controller = Controller(indices, install=InstallSettings(), autoscaler=None)
        owner = ("ModelDeployment", "llm", "llama")
        controller._watched(ENGINE_PODS, "llm", pending_pod("a", why=None), gone=False)
        assert await _drained(controller) == set()  # pending, not yet tried
        controller._watched(ENGINE_PODS, "llm", pending_pod("a"), gone=False)
        assert await _drained(controller) == {owner}
        assert controller.indices.unschedulable("llm", "llama") == {
            Role.PREFILL: f"1 pod(s) unschedulable (a): {WHY}"
        }
        controller._watched(ENGINE_PODS, "llm", pending_pod("a"), gone=False)
        assert await _drained(controller) == set()
        controller._watched(ENGINE_PODS, "llm", pending_pod("a", why="taints"), gone=False)
        assert await _drained(controller) == {owner}
        # Bound while no watch ran: the new list lacks it.
        controller._relisted(ENGINE_PODS, None, [])
        assert await _drained(controller) == {owner}
        assert controller.indices.unschedulable("llm", "llama") == {}
        # A pod of a deployment the operator does not hold queues nothing.
        controller._watched(ENGINE_PODS, "llm", pending_pod("x", deployment="unknown"), gone=False)
        assert await _drained(controller) == set()
        await controller.stop()

    asyncio.run(scenario())
