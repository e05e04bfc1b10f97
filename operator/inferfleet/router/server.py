"""The router listening: the users' port (`create_app`) and the admin port
(`create_admin_app`: metrics and debug pages, for Prometheus and operators only), one
process and one `Router` (`proxy`), with a graceful drain."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from inferfleet.router.config import ADMIN_PORT, RouterConfig
from inferfleet.router.proxy import ROUTER, Discovery, Router
from inferfleet.serving import serve_until_signalled

log = logging.getLogger(__name__)


def create_app(config: RouterConfig, discovery: Discovery | None = None) -> web.Application:
    """The router as an aiohttp application (what users call); `discovery` runs while the app
    does. Its metrics and debug pages are `create_admin_app`'s, on another port."""
    router = Router(config)
    app = web.Application(client_max_size=config.request_bytes_limit)
    app[ROUTER] = router
    app.router.add_post("/v1/completions", router.completions)
    app.router.add_post("/v1/chat/completions", router.chat_completions)
    app.router.add_get("/v1/models", router.models)
    app.router.add_get("/health", router.health)

    async def start(app: web.Application) -> None:
        await router.start()
        if discovery is not None:
            router._spawn(discovery(router))

    async def stop(app: web.Application) -> None:
        await router.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def create_admin_app(router: Router) -> web.Application:
    """What operators and Prometheus read of `router`, kept off the users' port: `/metrics`,
    and `/debug/replicas` (replica addresses and load)."""
    app = web.Application()
    app.router.add_get("/metrics", router.metrics_endpoint)
    app.router.add_get("/debug/replicas", router.replicas)
    app.router.add_get("/health", router.health)
    return app


class RouterServer:
    """The router on its two ports. `admin_port` 0 picks a free one; None serves no admin
    listener (tests of the proxy alone)."""

    def __init__(
        self,
        app: web.Application,
        host: str = "0.0.0.0",
        port: int = 8000,
        admin_port: int | None = ADMIN_PORT,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.admin_port = admin_port
        config = app[ROUTER].config
        self._runner = web.AppRunner(
            app,
            handler_cancellation=True,
            shutdown_timeout=config.drain_timeout_s,
            keepalive_timeout=config.idle_timeout_s,
            access_log=None,
        )
        self._admin = (
            None
            if admin_port is None
            else web.AppRunner(create_admin_app(app[ROUTER]), access_log=None)
        )
        self._stopped = False

    @property
    def router(self) -> Router:
        return self.app[ROUTER]

    async def start(self) -> int:
        """Listen on both ports; the users' port (the one asked for, or the one picked)."""
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, backlog=4096).start()
        self.port = int(self._runner.addresses[0][1])
        if self._admin is not None:
            await self._admin.setup()
            await web.TCPSite(self._admin, self.host, self.admin_port).start()
            self.admin_port = int(self._admin.addresses[0][1])
        return self.port

    async def stop(self, *, drain: bool = True) -> None:
        """Say 503 on /health for `drain_delay_s` while still serving, then stop listening and
        let in-flight streams finish within `drain_timeout_s`; the admin port closes last, so
        the drain can be watched. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.router.draining = True
        if drain and self.router.config.drain_delay_s > 0:
            await asyncio.sleep(self.router.config.drain_delay_s)
        await self._runner.cleanup()
        if self._admin is not None:
            await self._admin.cleanup()


async def serve(
    config: RouterConfig,
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    admin_port: int = ADMIN_PORT,
    discovery: Discovery | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or `stop`), then drain."""
    server = RouterServer(create_app(config, discovery), host, port, admin_port)

    def draining() -> None:
        log.info(
            "draining: /health says 503 for %.0f s, then the listener closes", config.drain_delay_s
        )

    await serve_until_signalled(
        server.start, server.stop, stop=stop, on_ready=on_ready, on_stop=draining
    )


def run(config: RouterConfig, **options: Any) -> None:
    asyncio.run(serve(config, **options))


__all__ = ["ADMIN_PORT", "RouterServer", "run", "serve"]
