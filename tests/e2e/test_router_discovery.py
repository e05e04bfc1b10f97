"""The router finds replicas in EndpointSlices, watched on the real API server: ready
endpoints in, not-ready and deleted ones out, as they change."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from inferfleet.kube import Kube
from inferfleet.router.config import RouterConfig, parse_backend
from inferfleet.router.discovery import discovery_for
from inferfleet.router.server import RouterServer, create_app


def endpoint_slice(
    name: str, namespace: str, service: str, endpoints: list[tuple[str, bool]]
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        # TEST-NET-1 addresses: valid in a slice (loopback is refused), reachable by no one.
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": ready}} for address, ready in endpoints
        ],
    }


async def eventually(check: Callable[[], Any], want: Any, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    seen = None
    while asyncio.get_running_loop().time() < deadline:
        seen = await check()
        if seen == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"wanted {want}, last saw {seen}")


async def test_replicas_follow_the_endpointslices(kube: Kube, namespace: str) -> None:
    config = RouterConfig(
        "chat",
        (
            parse_backend("deployment=d,role=prefill,engine=sim,model=m,service=d-prefill,port=9"),
            parse_backend("deployment=d,role=decode,engine=sim,model=m,service=d-decode,port=9"),
        ),
        namespace=namespace,
        health_interval_s=0.5,
    )
    discovery = discovery_for(config, kube)
    assert discovery is not None
    server = RouterServer(create_app(config, discovery), "127.0.0.1", 0, admin_port=0)
    port = await server.start()
    admin = server.admin_port

    async def replicas() -> dict[str, list[str]]:
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"http://127.0.0.1:{admin}/debug/replicas")).json()
        found: dict[str, list[str]] = {}
        for replica in listed:
            found.setdefault(replica["role"], []).append(replica["url"])
        return {role: sorted(urls) for role, urls in found.items()}

    try:
        await asyncio.to_thread(
            kube.apply,
            endpoint_slice("d-prefill-a", namespace, "d-prefill", [("192.0.2.1", True)]),
        )
        await asyncio.to_thread(
            kube.apply,
            endpoint_slice(
                "d-decode-a", namespace, "d-decode", [("192.0.2.2", True), ("192.0.2.3", False)]
            ),
        )
        # A slice of another Service in the namespace is not ours.
        await asyncio.to_thread(
            kube.apply, endpoint_slice("other", namespace, "other", [("192.0.2.9", True)])
        )
        await eventually(
            replicas,
            {"prefill": ["http://192.0.2.1:8000"], "decode": ["http://192.0.2.2:8000"]},
        )
        # A second slice of the same Service adds to it; readiness flips move replicas.
        await asyncio.to_thread(
            kube.apply,
            endpoint_slice("d-decode-b", namespace, "d-decode", [("192.0.2.4", True)]),
        )
        await asyncio.to_thread(
            kube.apply,
            endpoint_slice(
                "d-decode-a", namespace, "d-decode", [("192.0.2.2", False), ("192.0.2.3", True)]
            ),
        )
        await eventually(
            replicas,
            {
                "prefill": ["http://192.0.2.1:8000"],
                "decode": ["http://192.0.2.3:8000", "http://192.0.2.4:8000"],
            },
        )
        await asyncio.to_thread(
            kube.delete, "discovery.k8s.io/v1", "EndpointSlice", "d-prefill-a", namespace
        )
        await eventually(replicas, {"decode": ["http://192.0.2.3:8000", "http://192.0.2.4:8000"]})
        # Unreachable replicas never pass a health check: the router says so and refuses.
        async with httpx.AsyncClient() as client:
            base = f"http://127.0.0.1:{port}"
            assert (await client.get(f"{base}/health")).status_code == 503
            refused = await client.post(f"{base}/v1/completions", json={"prompt": "w"})
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "1"
    finally:
        await server.stop(drain=False)
