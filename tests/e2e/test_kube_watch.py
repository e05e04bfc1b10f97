"""`Kube.list_and_watch` on the real API server: listed once, then watched across watch
requests that end and resume from the last version seen: nothing listed again, nothing missed,
nothing that the selector leaves out."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

import inferfleet.kube as kube_module
from inferfleet.kube import Kube

SELECTOR = "test.inferfleet.io/watched=yes"
WATCH_S = 12.0


def _config_map(name: str, namespace: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"test.inferfleet.io/watched": "yes"},
        },
        "data": {"value": value},
    }


def test_a_watch_resumes_across_requests_without_listing_again(
    kube: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each watch request lasts a second: the changes below span several of them.
    monkeypatch.setattr(kube_module, "WATCH_REQUEST_S", 1)
    kube.apply(_config_map("before", namespace, "0"))
    unlabelled = _config_map("unwatched", namespace, "0")
    del unlabelled["metadata"]["labels"]
    kube.apply(unlabelled)
    events: queue.Queue[tuple[str, str, str]] = queue.Queue()

    def watch() -> None:
        for kind, obj in kube.list_and_watch("v1", "ConfigMap", namespace, SELECTOR, for_s=WATCH_S):
            data = obj.get("data") or {}
            events.put((kind, (obj.get("metadata") or {}).get("name", ""), data.get("value", "")))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        assert events.get(timeout=10) == ("LISTED", "before", "0")
        assert events.get(timeout=10) == ("SYNCED", "", "")
        for step in range(1, 4):
            time.sleep(1.5)  # past the end of the request that was open
            kube.apply(_config_map("before", namespace, str(step)))
            assert events.get(timeout=10) == ("MODIFIED", "before", str(step))
        kube.apply({**unlabelled, "data": {"value": "1"}})
        kube.apply(_config_map("after", namespace, "a"))
        assert events.get(timeout=10) == ("ADDED", "after", "a")
        kube.delete("v1", "ConfigMap", "after", namespace)
        assert events.get(timeout=10)[:2] == ("DELETED", "after")
        time.sleep(2.5)
        assert events.empty()  # no second list, no bookmark passed on
    finally:
        thread.join(WATCH_S + 5)
    assert not thread.is_alive()
    assert events.empty()
