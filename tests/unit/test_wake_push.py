"""The wake signal (`render.wake`): what a router pushes of the requests it holds at zero
replicas, how often, and what the operator reads back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from inferfleet.render.wake import PUSH_FRESH_S, push_body, pushed_wait
from inferfleet.router import wake_push
from inferfleet.router.wake_push import WakePush

NOW = datetime(2026, 11, 28, 18, 0, 0, 123000, tzinfo=UTC)


def test_what_a_router_pushes_the_operator_reads_back() -> None:
    body = push_body(12, "chat-router-5d8f-x2k", NOW)
    pushed = pushed_wait({"metadata": {"name": "chat-router-wake"}, **body})
    assert pushed is not None
    assert (pushed.waiting, pushed.at, pushed.router) == (12, NOW, "chat-router-5d8f-x2k")
    assert pushed.fresh(NOW + timedelta(seconds=PUSH_FRESH_S))
    assert not pushed.fresh(NOW + timedelta(seconds=PUSH_FRESH_S + 1))


@pytest.mark.parametrize(
    "data",
    [
        None,
        {},
        {"waitingForReplicas": "3"},
        {"waitingForReplicas": "-3", "pushedAt": NOW.isoformat()},
        {"waitingForReplicas": "many", "pushedAt": NOW.isoformat()},
        {"waitingForReplicas": "3", "pushedAt": "yesterday"},
    ],
    ids=["no-data", "empty", "no-time", "negative", "not-a-count", "bad-time"],
)
def test_a_config_map_without_a_readable_push_wakes_nothing(data: dict[str, Any] | None) -> None:
    assert pushed_wait({"data": data} if data is not None else {}) is None


async def test_a_router_pushes_at_the_first_held_request_renews_and_says_when_none_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wake_push, "WAKE_RENEW_S", 0.3)
    monkeypatch.setattr(wake_push, "MIN_GAP_S", 0.05)
    pushed: list[tuple[int, float]] = []
    loop = asyncio.get_running_loop()

    def patch(body: dict[str, Any]) -> None:
        pushed.append((int(body["data"]["waitingForReplicas"]), loop.time()))

    push = WakePush(patch, router="r1")
    task = asyncio.ensure_future(push.run())
    try:
        await asyncio.sleep(0.1)
        assert pushed == [], "nothing held, nothing pushed"
        started = loop.time()
        push.heard(1)
        for count in (2, 3, 4):  # a burst: coalesced into the pushes that follow
            push.heard(count)
        await asyncio.sleep(0.1)
        assert pushed[0][0] in (1, 4)
        assert pushed[0][1] - started < 0.1
        await asyncio.sleep(0.7)  # renewed while requests are held
        assert [n for n, _ in pushed][-1] == 4
        assert len(pushed) >= 3
        push.heard(0)
        await asyncio.sleep(0.2)
        assert pushed[-1][0] == 0
        settled = len(pushed)
        await asyncio.sleep(0.7)
        assert len(pushed) == settled, "nothing held: no renewal"
    finally:
        task.cancel()


async def test_a_push_that_fails_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wake_push, "WAKE_RENEW_S", 0.2)
    monkeypatch.setattr(wake_push, "MIN_GAP_S", 0.01)
    tries: list[int] = []

    def patch(body: dict[str, Any]) -> None:
        tries.append(int(body["data"]["waitingForReplicas"]))
        if len(tries) == 1:
            raise PermissionError("configmaps is forbidden")

    push = WakePush(patch, router="r1")
    task = asyncio.ensure_future(push.run())
    try:
        push.heard(2)
        await asyncio.sleep(0.5)
        assert tries[:2] == [2, 2]
    finally:
        task.cancel()
