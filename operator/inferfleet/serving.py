"""Running an HTTP server process until SIGTERM or SIGINT, then stopping it gracefully: what
the engine emulator and the router share."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable


async def serve_until_signalled(
    start: Callable[[], Awaitable[int]],
    stop_server: Callable[[], Awaitable[None]],
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """`start()` (it returns the bound port, given to `on_ready`), wait for SIGTERM/SIGINT or
    `stop`, then `on_stop()` and `stop_server()`, which runs however the wait ends."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Not possible off the main thread or on some platforms: then only `stop` stops.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        bound = await start()
        if on_ready is not None:
            on_ready(bound)
        await stop.wait()
        if on_stop is not None:
            on_stop()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await stop_server()
