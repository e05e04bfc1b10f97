"""The router's memory under hostile bodies, measured on the router as a process of its own
(`inferfleet router` in front of `inferfleet sim-engine`, both on loopback)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferfleet.router.config import RouterConfig
from inferfleet.router.config import parse_backend as backend

MIB = 1024**2
CLIENTS = 20
BODY_BYTES = 15 * MIB


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def peak_rss(pid: int) -> int:
    """VmHWM, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def router_port() -> Iterator[tuple[int, int]]:
    """A router (its port and pid) whose body limit takes the 15 MiB bodies whole, so that
    only its cap on the bytes it holds stands between them and its memory."""
    engine_port, port, admin_port = free_port(), free_port(), free_port()
    cli = [sys.executable, "-m", "inferfleet.cli"]
    engine = subprocess.Popen(
        [*cli, "sim-engine", "--model", "llama-3.1-8b", "--gpu", "H100-80GB",
         "--host", "127.0.0.1", "--port", str(engine_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    router = subprocess.Popen(
        [*cli, "router", "--service", "chat", "--host", "127.0.0.1", "--port", str(port),
         "--admin-port", str(admin_port), "--max-request-bytes", str(16 * MIB), "--backend",
         "deployment=d,role=aggregated,engine=sim,model=llama-3.1-8b,context=131072,"
         f"urls=http://127.0.0.1:{engine_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield port, router.pid
    finally:
        for process in (router, engine):
            process.terminate()
            process.wait(timeout=30)


async def test_twenty_15_mib_bodies_at_once_stay_within_the_routers_memory_bound(
    router_port: tuple[int, int],
) -> None:
    port, pid = router_port
    cap = RouterConfig(
        "chat", (backend("deployment=d,role=aggregated,engine=sim,model=m,urls=http://a:1"),)
    ).max_in_flight_bytes
    body = b'{"prompt": "' + b"w " * (BODY_BYTES // 2) + b'", "max_tokens": 1}'
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
        for _ in range(400):
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
        idle = peak_rss(pid)
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/completions", content=body, headers={"Content-Type": "application/json"}
                )
                for _ in range(CLIENTS)
            )
        )
        statuses = sorted(answer.status_code for answer in answers)
        assert (await client.get("/health")).status_code == 200  # it lives on
    # At least as many as the cap holds at once were read (and refused by the engine: far
    # past its context); the rest got 503 before a byte of their bodies was read.
    assert set(statuses) <= {400, 503}
    assert statuses.count(400) >= cap // BODY_BYTES
    assert statuses.count(503) > 0
    grew = peak_rss(pid) - idle
    assert grew < 4 * cap, f"grew {grew / MIB:.0f} MiB over {idle / MIB:.0f} MiB idle"
