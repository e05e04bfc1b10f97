"""An httpx transport that runs httpcore on plain asyncio protocols, for the load generator.

httpx's own transport runs httpcore through anyio, which opens a cancel scope on every read;
at a few hundred streams of tokens a second that is most of the client's CPU. This one keeps
httpcore's HTTP/1.1 connection pool and replaces only the network layer: a connection is an
`asyncio.Protocol` that buffers what it receives (up to `_READ_HIGH_WATER` bytes, then stops
reading from the socket) and wakes the one reader waiting for it. httpcore's exceptions are
mapped to httpx's, as httpx's own transport maps them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Iterable
from typing import Any, cast

import httpcore
import httpx
from httpcore import SOCKET_OPTION

_READ_HIGH_WATER = 1 << 20
"""Bytes a connection buffers before it stops reading from the socket."""


class _StreamProtocol(asyncio.Protocol):
    """Buffers what a connection receives and wakes the one reader waiting for it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.eof = False
        self.error: Exception | None = None
        self.reading_paused = False
        self._reader: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not asyncio's classes.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > _READ_HIGH_WATER and not self.reading_paused and self.transport:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _wake(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def wait_readable(self) -> None:
        self._reader = asyncio.get_running_loop().create_future()
        await self._reader

    async def wait_drained(self) -> None:
        self._drain = asyncio.get_running_loop().create_future()
        await self._drain


class _AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _StreamProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.chunks and not protocol.eof:
            try:
                async with asyncio.timeout(timeout):
                    while not protocol.chunks and not protocol.eof:
                        await protocol.wait_readable()
            except TimeoutError:
                raise httpcore.ReadTimeout("read timed out") from None
        if not protocol.chunks:
            if protocol.error is not None:
                raise httpcore.ReadError(str(protocol.error)) from protocol.error
            return b""
        data = protocol.chunks.popleft()
        if len(data) > max_bytes:
            protocol.chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        protocol.size -= len(data)
        if protocol.reading_paused and protocol.size < _READ_HIGH_WATER // 4:
            protocol.reading_paused = False
            self._transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        if self._protocol.writing_paused:
            try:
                async with asyncio.timeout(timeout):
                    await self._protocol.wait_drained()
            except TimeoutError:
                raise httpcore.WriteTimeout("write timed out") from None

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.close()
            raise httpcore.ConnectTimeout("TLS handshake timed out") from None
        except (OSError, ssl.SSLError) as error:
            self._transport.close()
            raise httpcore.ConnectError(str(error)) from error
        if transport is None:
            raise httpcore.ConnectError("the TLS handshake did not complete")
        self._protocol.transport = transport
        return _AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # An idle pooled connection that shows data or EOF was closed by the server.
            return bool(self._protocol.chunks) or self._protocol.eof
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


async def _opened(
    opening: Awaitable[tuple[asyncio.Transport, asyncio.BaseProtocol]],
    timeout: float | None,
    where: str,
) -> asyncio.Transport:
    """The transport of a connection being opened, or httpcore's error for why it was not."""
    try:
        async with asyncio.timeout(timeout):
            transport, _ = await opening
    except TimeoutError:
        raise httpcore.ConnectTimeout(f"connecting to {where} timed out") from None
    except OSError as error:
        raise httpcore.ConnectError(str(error)) from error
    return transport


class _AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network layer straight on asyncio transports: its default goes through
    anyio, which opens a cancel scope for every read, a large part of a streamed token's
    cost."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        protocol = _StreamProtocol()
        transport = await _opened(
            loop.create_connection(
                lambda: protocol,
                host,
                port,
                local_addr=(local_address, 0) if local_address else None,
            ),
            timeout,
            f"{host}:{port}",
        )
        for option in socket_options or ():
            transport.get_extra_info("socket").setsockopt(*option)
        return _AsyncioStream(transport, protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        protocol = _StreamProtocol()
        transport = await _opened(
            loop.create_unix_connection(lambda: protocol, path), timeout, path
        )
        return _AsyncioStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# httpcore's exceptions as httpx's, as httpx's own transport maps them.
_EXCEPTIONS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)


_CORE_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
)


def _as_httpx(error: Exception) -> Exception:
    for source, target in _EXCEPTIONS:
        if isinstance(error, source):
            return target(str(error))
    return error


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except _CORE_ERRORS as error:
            raise _as_httpx(error) from error

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


class AsyncioTransport(httpx.AsyncBaseTransport):
    """An httpx transport: HTTP/1.1 with keep-alive over an unbounded httpcore pool on plain
    asyncio (see `_AsyncioBackend`). No proxies: a benchmark measures the direct path."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=None,
            max_keepalive_connections=None,
            http1=True,
            http2=False,
            network_backend=_AsyncioBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core_request)
        except _CORE_ERRORS as error:
            raise _as_httpx(error) from error
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
