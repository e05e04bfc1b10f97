"""The index of what the operator created, and the watches that keep it: listed once, watched,
listed again after the API server lost the version to resume from (what that list lacks is
gone), reconciles held back until every kind is listed, and events handed to the loop in
bursts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from inferfleet.kube import Kube
from inferfleet.kube.reflector import until_stopped
from inferfleet.reconcile.children import MANAGED, ChildrenIndex
from inferfleet.reconcile.desired import ObjectKey
from inferfleet.reconcile.entries import IndexedChild, indexed_child
from inferfleet.reconcile.watches import Watched, Watches

DEPLOYMENT = Watched("apps/v1", "Deployment", MANAGED)
LWS = Watched("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", MANAGED, optional=True)


def _deployment(name: str, owner_uid: str = "uid-md", *, ready: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"inferfleet.io/role": "aggregated"},
            "ownerReferences": [
                {"kind": "ModelDeployment", "name": "llama", "uid": owner_uid, "controller": True}
            ],
        },
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "readyReplicas": ready},
    }


def _indexed(obj: Mapping[str, Any]) -> IndexedChild:
    found = indexed_child("llm", obj)
    assert found is not None
    return found


def test_the_index_holds_each_child_under_its_owner_and_its_name() -> None:
    index = ChildrenIndex()
    a, b = _indexed(_deployment("a")), _indexed(_deployment("b"))
    index.put("llm", a)
    index.put("llm", b)
    assert {child.key.name for child in index.children("llm", "uid-md")} == {"a", "b"}
    assert index.holder("llm", a.child.key) == "uid-md"
    assert index.children("other", "uid-md") == []
    # A reader holds what it was given while the index moves on.
    before = index.children("llm", "uid-md")
    index.put("llm", _indexed(_deployment("a", ready=2)))
    assert [c.progress.ready for c in before if c.key.name == "a" and c.progress] == [0]
    # The same name, now another resource's (deleted and made again): one owner only.
    index.put("llm", _indexed(_deployment("a", owner_uid="uid-other")))
    assert [c.key.name for c in index.children("llm", "uid-md")] == ["b"]
    assert index.holder("llm", a.child.key) == "uid-other"
    assert index.remove("llm", a.child.key) is not None
    assert index.remove("llm", a.child.key) is None
    assert index.holder("llm", a.child.key) is None
    assert len(index) == 1


def test_a_list_drops_what_it_lacks_of_its_kind_and_scope_only() -> None:
    index = ChildrenIndex()
    for name in ("a", "b"):
        index.put("llm", _indexed(_deployment(name)))
    service = _deployment("a")
    service.update(apiVersion="v1", kind="Service")
    index.put("llm", _indexed(service))
    kept = [("llm", ObjectKey("apps/v1", "Deployment", "a"))]
    assert index.unlisted("apps/v1", "Deployment", "other", []) == []
    gone = index.unlisted("apps/v1", "Deployment", None, kept)
    assert [(ns, held.child.key.name) for ns, held in gone] == [("llm", "b")]
    assert sorted((c.key.kind, c.key.name) for c in index.children("llm", "uid-md")) == [
        ("Deployment", "a"),
        ("Service", "a"),
    ]


class _ScriptedKube:
    """Answers each list-and-watch of a kind with the next of its scripts (an exception in a
    script is raised there); past the last, waits until the test ends."""

    def __init__(self, scripts: dict[str, list[list[Any]]], unserved: set[str]) -> None:
        self.scripts = scripts
        self.unserved = unserved
        self.done = threading.Event()
        self.calls: dict[str, int] = {}

    def serves(self, api_version: str, kind: str) -> bool:
        return kind not in self.unserved

    def list_and_watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str,
        *,
        field_selector: str | None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        assert label_selector == "app.kubernetes.io/managed-by=inferfleet"
        assert field_selector is None
        scripts = self.scripts.get(kind, [])
        call = self.calls.get(kind, 0)
        self.calls[kind] = call + 1
        for step in scripts[call] if call < len(scripts) else []:
            if isinstance(step, Exception):
                raise step
            yield step
        self.done.wait(5)


def test_watches_list_watch_list_again_after_410_and_report_when_all_kinds_are_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = _ScriptedKube(
        {
            "Deployment": [
                [
                    ("LISTED", _deployment("a")),
                    ("LISTED", _deployment("b")),
                    ("SYNCED", {}),
                    ("MODIFIED", _deployment("a", ready=1)),
                    ApiException(status=410, reason="Gone"),
                ],
                [("LISTED", _deployment("a", ready=2)), ("SYNCED", {})],
            ]
        },
        unserved={"LeaderWorkerSet"},
    )
    monkeypatch.setattr(Kube, "from_environment", lambda **_: kube)
    index = ChildrenIndex()
    seen: list[tuple[str, int, bool]] = []
    unlisted: list[str] = []

    def on_event(watched: Watched, namespace: str, obj: Mapping[str, Any], *, gone: bool) -> None:
        assert watched == DEPLOYMENT
        held = _indexed(obj)
        if gone:
            index.remove(namespace, held.child.key)
        else:
            index.put(namespace, held)
        ready = held.child.progress.ready if held.child.progress else -1
        seen.append((held.child.key.name, ready, gone))

    def on_relisted(watched: Watched, scope: str | None, listed: list[tuple[str, str]]) -> None:
        keys = [(ns, ObjectKey(watched.api_version, watched.kind, name)) for ns, name in listed]
        for _, gone in index.unlisted(watched.api_version, watched.kind, scope, keys):
            unlisted.append(gone.child.key.name)

    async def scenario() -> None:
        watches = Watches([DEPLOYMENT, LWS], (), recheck_unserved_s=60)
        watches.start(on_event, on_relisted)
        await asyncio.wait_for(watches.synced.wait(), 5)
        assert {name for name, _, _ in seen} == {"a", "b"}
        for _ in range(100):
            if unlisted:
                break
            await asyncio.sleep(0.02)
        watches.stop()
        kube.done.set()

    asyncio.run(scenario())
    assert seen == [("a", 0, False), ("b", 0, False), ("a", 1, False), ("a", 2, False)]
    # b was deleted while no watch ran: the second list lacks it.
    assert unlisted == ["b"]
    assert [child.key.name for child in index.children("llm", "uid-md")] == ["a"]
    assert kube.calls == {"Deployment": 2}


def test_a_watch_that_fails_is_backed_off_and_run_again_until_stopped() -> None:
    stopped = threading.Event()
    calls: list[float] = []

    def work() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise ConnectionError("the API server is unreachable")
        stopped.set()

    until_stopped(work, stopped, "a watch")
    assert len(calls) == 2
    assert calls[1] - calls[0] >= 0.4  # backed off, not spun

    # Stopped while backing off: ends at once, without a last run.
    stopped.clear()
    failing: list[int] = []

    def fails() -> None:
        failing.append(1)
        threading.Timer(0.1, stopped.set).start()
        raise ConnectionError("refused")

    started = time.monotonic()
    until_stopped(fails, stopped, "a watch")
    assert failing == [1]
    assert time.monotonic() - started < 0.45


def test_events_queued_while_the_loop_is_busy_reach_it_in_order_in_one_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = [("MODIFIED", _deployment("a", ready=ready)) for ready in range(1, 201)]
    kube = _ScriptedKube({"Deployment": [[("SYNCED", {}), *events]]}, unserved=set())
    monkeypatch.setattr(Kube, "from_environment", lambda **_: kube)
    seen: list[int] = []
    first_seen = threading.Event()

    def on_event(watched: Watched, namespace: str, obj: Mapping[str, Any], *, gone: bool) -> None:
        ready = int(obj["status"]["readyReplicas"])
        seen.append(ready)
        if ready == 1:
            first_seen.set()
            time.sleep(0.3)  # the loop is busy: the watch's other events queue meanwhile
        if ready == 2:
            raise ValueError("a handler's error")  # logged; the events after it still count

    async def scenario() -> int:
        watches = Watches([DEPLOYMENT], (), recheck_unserved_s=60)
        drains = 0
        drain = watches._drain

        def counted() -> None:
            nonlocal drains
            drains += 1
            drain()

        monkeypatch.setattr(watches, "_drain", counted)
        watches.start(on_event, lambda watched, scope, listed: None)
        for _ in range(250):
            if len(seen) == len(events):
                break
            await asyncio.sleep(0.02)
        watches.stop()
        kube.done.set()
        return drains

    drains = asyncio.run(scenario())
    assert seen == list(range(1, 201))
    # The SYNCED and the first event may each wake the loop; what came during the busy 0.3 s
    # came in one wake-up, not 199.
    assert drains <= 4
