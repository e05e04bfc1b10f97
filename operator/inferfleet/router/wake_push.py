"""The router's push of the requests it holds for want of a replica to the service's wake
ConfigMap (`render.wake`), where the operator reads it at once and wakes the service.

Pushed when the first request is held, every `WAKE_RENEW_S` while any is (the latest count),
and once more when none is left; never more often than `MIN_GAP_S`. A push that fails (the
API server away, the grant missing) is logged and tried again at the next change or renewal:
the count also reaches the autoscaler through Prometheus (`inferfleet_router_waiting_for_
replicas`), a scrape and a tick later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from inferfleet.kube import Kube
from inferfleet.render.wake import WAKE_RENEW_S, push_body
from inferfleet.router.config import RouterConfig
from inferfleet.router.discovery import own_namespace
from inferfleet.router.proxy import Discovery, Router

log = logging.getLogger(__name__)

MIN_GAP_S = 0.5
"""The least time between two pushes: a burst of arrivals costs one write, not one each."""

Patch = Callable[[dict[str, Any]], None]
"""Merges a body into the ConfigMap (blocking: run on a thread)."""


class WakePush:
    def __init__(self, patch: Patch, router: str | None = None) -> None:
        self._patch = patch
        self._router = router or os.environ.get("POD_NAME") or socket.gethostname()
        self._waiting = 0
        self._pushed: int | None = None
        self._changed = asyncio.Event()

    def heard(self, waiting: int) -> None:
        """The router's count changed (`Router.on_waiting`, on its event loop)."""
        self._waiting = waiting
        self._changed.set()

    async def run(self) -> None:
        while True:
            if self._waiting > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), WAKE_RENEW_S)
            else:
                await self._changed.wait()
            self._changed.clear()
            waiting = self._waiting
            if waiting == 0 and self._pushed == 0:
                continue
            body = push_body(waiting, self._router, datetime.now(UTC))
            try:
                await asyncio.to_thread(self._patch, body)
                self._pushed = waiting
            except Exception as error:  # tried again at the next change or renewal
                log.warning("cannot push %d held requests (%s)", waiting, error)
            await asyncio.sleep(MIN_GAP_S)


def with_wake_push(
    config: RouterConfig, discovery: Discovery | None, kube: Kube | None = None
) -> Discovery | None:
    """`discovery`, and where the config names a wake ConfigMap, the push to it beside."""
    name = config.wake_config_map
    if name is None:
        return discovery

    async def run(router: Router) -> None:
        client = kube if kube is not None else await asyncio.to_thread(Kube.from_environment)
        namespace = own_namespace(config)

        def patch(body: dict[str, Any]) -> None:
            client.merge_patch("v1", "ConfigMap", name, namespace, body)

        push = WakePush(patch)
        router.on_waiting = push.heard
        if discovery is None:
            await push.run()
            return
        await asyncio.gather(push.run(), discovery(router))

    return run
