"""The router of a service at zero replicas on purpose: requests held until a replica serves,
timed from arrival, bounded in number and in wait, and counted for the autoscaler."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.exposition import generate_latest

from inferfleet.api.model_deployment import Role
from inferfleet.router.proxy import Router
from inferfleet.router.server import RouterServer, create_app
from tests.unit.test_router_proxy import aggregated, config, series, servers, start_engine

__all__ = ["servers"]  # the fixture, used by name

NOWHERE = "http://127.0.0.1:9"
"""No replica: nothing listens there, so it never checks healthy."""


async def start_waking_router(
    servers: dict[str, Any], **options: Any
) -> tuple[Router, httpx.AsyncClient, list[int]]:
    """A router whose one replica is down, as a service at zero; and what it pushes."""
    settings = {"wake_timeout_s": 10.0} | options
    app = create_app(config(aggregated(NOWHERE), **settings))
    server = RouterServer(app, "127.0.0.1", 0, admin_port=None)
    port = await server.start()
    servers["routers"].append(server)
    pushed: list[int] = []
    server.router.on_waiting = pushed.append
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20.0)
    servers["clients"].append(client)
    return server.router, client, pushed


async def wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_request_at_zero_waits_for_a_replica_and_its_wait_is_its_ttft(
    servers: dict[str, Any],
) -> None:
    router, client, pushed = await start_waking_router(servers)
    assert (await client.get("/health")).status_code == 200
    body = {"prompt": "w", "max_tokens": 4, "stream": True}
    sending = asyncio.ensure_future(client.post("/v1/completions", json=body))
    await wait_for(lambda: router.wake is not None and router.wake.waiting == 1)
    assert pushed == [1]
    assert series(router_text(router), "inferfleet_router_waiting_for_replicas") == 1

    await asyncio.sleep(0.5)
    engine = await start_engine(servers)
    router.set_replicas("d", Role.AGGREGATED, [engine])
    response = await sending
    assert response.status_code == 200, response.text
    assert pushed == [1, 0]
    text = router_text(router)
    assert series(text, "inferfleet_router_waiting_for_replicas") == 0
    assert series(text, "inferfleet_router_ttft_seconds_sum") >= 0.5
    assert series(text, "inferfleet_router_requests_total") == 1


async def test_a_request_held_past_the_wake_timeout_gets_503_with_retry_after(
    servers: dict[str, Any],
) -> None:
    router, client, pushed = await start_waking_router(servers, wake_timeout_s=0.3, retry_after_s=5)
    response = await client.post("/v1/completions", json={"prompt": "w", "max_tokens": 2})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert "waking from zero replicas" in response.json()["error"]["message"]
    assert pushed == [1, 0]
    text = router_text(router)
    assert series(text, "inferfleet_router_rejected_requests_total", reason="wake_timeout") == 1


async def test_the_hold_is_bounded_and_a_request_past_it_is_refused_at_once(
    servers: dict[str, Any],
) -> None:
    router, client, _ = await start_waking_router(servers, max_queued_requests=1)
    first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "a"}))
    await wait_for(lambda: router.wake is not None and router.wake.waiting == 1)
    second = await client.post("/v1/completions", json={"prompt": "b"})
    assert second.status_code == 503
    assert "already wait" in second.json()["error"]["message"]
    text = router_text(router)
    assert series(text, "inferfleet_router_rejected_requests_total", reason="wake_queue_full") == 1
    first.cancel()


async def test_without_a_wake_timeout_a_router_at_zero_says_so_at_once(
    servers: dict[str, Any],
) -> None:
    server = RouterServer(create_app(config(aggregated(NOWHERE))), "127.0.0.1", 0, admin_port=None)
    port = await server.start()
    servers["routers"].append(server)
    assert server.router.wake is None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert (await client.get("/health")).status_code == 503
        response = await client.post("/v1/completions", json={"prompt": "w"})
        assert response.status_code == 503


def router_text(router: Router) -> str:
    return generate_latest(router.metrics.registry).decode()
