"""Open-loop load against an OpenAI-compatible server: each request is sent at its scheduled
arrival whatever happened to the earlier ones, as real users do (a closed loop, waiting for
answers before sending more, hides overload by slowing the load down).

Each request is a streamed `POST /v1/completions` (`stream_options.include_usage`,
`ignore_eos` so a real vLLM generates exactly `max_tokens`) with a synthetic prompt of exactly
`input_tokens` whitespace-separated words, which is how the `sim` engine counts tokens (and
common English words are one token each in the usual BPE vocabularies, so a real engine sees
about as many). Prefix hashes travel in the `inferfleet` vendor extension, and blocks with the
same hash get the same words, so a real engine's prefix cache sees the trace's sharing too;
prompts without hashes start with a word unique to the request, so they share nothing.

Client cost, which must stay well below one core at a few hundred streams (each streamed
token is a socket read, an HTTP chunk and an SSE event):
* streams are spread over `httpx.AsyncClient`s of at most `DEFAULT_STREAMS_PER_CLIENT`
  streams each (HTTP/1.1, keep-alive, unbounded pool). httpcore's pool scans all its
  connections and queued requests several times per request, so one shared client costs
  O(concurrency^2); small pools bound that;
* their transport (`AsyncioTransport`) runs httpcore on plain asyncio protocols rather than
  through anyio, which opens a cancel scope on every read;
* the request timeout is one asyncio timeout around the whole request, not per read;
* SSE is split by hand from `aiter_raw`, and plain token chunks are recognised without
  decoding their JSON.
Measured on one 2-vCPU VM core, 300 streams of 50 tokens/s (13.6k chunks/s): one shared
stock client 90 us per chunk (saturated, falling behind), stock clients of 64 streams 73 us,
this client 60 us (about 80% of the core, keeping pace; aiohttp's C parser: 54 us). The report
gives the client's CPU use and warns when it nears a full core.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import ssl
import sys
import time
from array import array
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpcore
import httpx
from httpcore import SOCKET_OPTION

from inferfleet.bench.report import (
    ERROR_CLIENT,
    ERROR_CONNECT,
    ERROR_CONNECTION,
    ERROR_DROPPED,
    ERROR_INCOMPLETE,
    ERROR_STREAM,
    ERROR_TIMEOUT,
    ERROR_UNFINISHED,
    ClientStats,
    Report,
    RequestResult,
    summarize,
)
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Slo
from inferfleet.streaming import TokenStream

DEFAULT_MAX_IN_FLIGHT = 10_000
"""Safety cap on concurrent requests; past it requests are dropped at the client."""
DEFAULT_STREAMS_PER_CLIENT = 32
"""Concurrent streams per `httpx.AsyncClient` (and its connection pool) before another one is
opened."""
DEFAULT_DRAIN_S = 60.0
DEFAULT_REQUEST_TIMEOUT_S = 600.0
_ERROR_DETAIL_CHARS = 300
_READ_HIGH_WATER = 1 << 20
"""Bytes a connection buffers before it stops reading from the socket."""

# Words that are a single token in common BPE vocabularies (with their leading space).
_WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this "
    "be or has had not but first one their its new after who they have her she two been other "
    "when there all during into school time may years more most only over city some world "
    "would where later up such used many can state about national out known university united "
    "then made three high him part under well team between while both film year history since "
    "home through four season second like around group music area system including called "
    "former final day game these than early same each several played left public being work "
    "back best life war member before because river people county year play we five power law "
    "water line long house name field data light point show order family place side sea green "
    "road hand story body open land eye red book word small place north south east west good"
)
_VOCABULARY = tuple(dict.fromkeys(_WORDS.split()))


# --- HTTP transport: httpcore on plain asyncio.


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
        try:
            async with asyncio.timeout(timeout):
                transport, _ = await loop.create_connection(
                    lambda: protocol,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as error:
            raise httpcore.ConnectError(str(error)) from error
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
        try:
            async with asyncio.timeout(timeout):
                transport, _ = await loop.create_unix_connection(lambda: protocol, path)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {path} timed out") from None
        except OSError as error:
            raise httpcore.ConnectError(str(error)) from error
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


class PromptBuilder:
    """Prompts of an exact number of words, sliced out of one precomputed text."""

    def __init__(self, max_words: int, *, seed: int = 0) -> None:
        rng = random.Random(f"inferfleet-prompts-{seed}")
        self._size = max(max_words, 1) + 1
        words = [_VOCABULARY[int(rng.random() * len(_VOCABULARY))] for _ in range(self._size)]
        self._text = " ".join(words)
        # Word k spans _text[_starts[k] : _starts[k + 1] - 1].
        starts = array("q", [0])
        for word in words:
            starts.append(starts[-1] + len(word) + 1)
        self._starts = starts

    def words(self, start: int, count: int) -> str:
        """`count` consecutive words from word `start` (wrapping to fit)."""
        if count <= 0:
            return ""
        start %= self._size - count + 1
        return self._text[self._starts[start] : self._starts[start + count] - 1]

    def prompt(self, request: TraceRequest, key: int) -> str:
        """Exactly `request.input_tokens` words; `key` makes hash-less prompts unique."""
        total = request.input_tokens
        parts: list[str] = []
        left = total
        if request.prefix_hashes:
            block = request.hash_block_tokens
            for block_hash in request.prefix_hashes:
                if left <= 0:
                    break
                count = min(block, left)
                # Same hash, same words: a real engine's prefix cache sees the sharing too.
                parts.append(self.words(block_hash * 2_654_435_761, count))
                left -= count
        else:
            parts.append(f"r{key}")
            left -= 1
        if left > 0:
            parts.append(self.words(key * 40_503 + 7, left))
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands, for a progress line."""

    elapsed_s: float
    scheduled: int
    sent: int
    completed: int
    failed: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a load run measured."""

    results: list[RequestResult]
    duration_s: float
    client: ClientStats


def _api_base(base_url: str) -> str:
    """`http://host:port` or `http://host:port/v1` -> the URL that `/completions` follows."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class LoadGenerator:
    """Replays a schedule open-loop against one OpenAI-compatible endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        streams_per_client: int = DEFAULT_STREAMS_PER_CLIENT,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        send_prefix_hashes: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        seed: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`ssl_context`: for an https URL, how to verify the server (default: the system's
        certificate authorities)."""
        if max_in_flight < 1 or streams_per_client < 1:
            raise ValueError("max_in_flight and streams_per_client must be at least 1")
        self.url = _api_base(base_url) + "/completions"
        self.model = model
        self.max_in_flight = max_in_flight
        self.streams_per_client = streams_per_client
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.send_prefix_hashes = send_prefix_hashes
        self.extra_body = dict(extra_body or {})
        self.seed = seed
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._clients: list[httpx.AsyncClient] = []
        self._ssl_context = ssl_context
        self._client_load: list[int] = []
        self._prompts: PromptBuilder | None = None
        self._t0 = 0.0
        self._in_flight = 0
        self._peak_in_flight = 0

    # Bodies.

    def _body(self, request: TraceRequest, index: int) -> bytes:
        assert self._prompts is not None
        fields: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            **self.extra_body,
        }
        if self.send_prefix_hashes and request.prefix_hashes:
            fields["inferfleet"] = {
                "prefix_hashes": list(request.prefix_hashes),
                "hash_block_tokens": request.hash_block_tokens,
            }
        # The prompt's words need no JSON escaping: splice it in rather than encode it.
        head = json.dumps(fields, separators=(",", ":"))[:-1]
        prompt = self._prompts.prompt(request, index + self.seed * 1_000_003)
        return f'{head},"prompt":"{prompt}"}}'.encode()

    # Clients.

    def _new_client(self) -> httpx.AsyncClient:
        if self._ssl_context is None and self.url.startswith("https://"):
            self._ssl_context = httpx.create_ssl_context()
        return httpx.AsyncClient(
            transport=AsyncioTransport(self._ssl_context),
            # Timeouts are enforced per request (see _send); the transport pools are unbounded:
            # a pool limit would queue requests inside the client, a hidden closed loop.
            timeout=httpx.Timeout(None, connect=self.connect_timeout_s),
            headers=self.headers,
        )

    def _acquire_client(self) -> int:
        """The first client with room for another stream, opening one when all are full."""
        for slot, load in enumerate(self._client_load):
            if load < self.streams_per_client:
                self._client_load[slot] += 1
                return slot
        self._clients.append(self._new_client())
        self._client_load.append(1)
        return len(self._clients) - 1

    # Running.

    async def run(
        self,
        requests: Sequence[TraceRequest],
        *,
        duration_s: float | None = None,
        drain_s: float = DEFAULT_DRAIN_S,
        progress: Callable[[Progress], None] | None = None,
        progress_every_s: float = 1.0,
    ) -> RunResult:
        """Send the requests arriving before `duration_s` (default: all of them), each at its
        arrival, then wait up to `drain_s` for the last answers; requests still running are
        abandoned and count as `unfinished`."""
        schedule = sorted(
            (
                request
                for request in requests
                if duration_s is None or request.arrival_s < duration_s
            ),
            key=lambda request: request.arrival_s,
        )
        self._in_flight = self._peak_in_flight = 0
        # Connect and load httpx's lazily imported parts before the clock starts: otherwise
        # the first request's TTFT carries tens of ms of client start-up.
        with contextlib.suppress(httpx.HTTPError):
            await self.served_models()
        longest = max((request.input_tokens for request in schedule), default=1)
        self._prompts = PromptBuilder(max(longest, 1 << 16), seed=self.seed)
        results = [
            RequestResult(index, request.arrival_s, request.input_tokens, request.output_tokens)
            for index, request in enumerate(schedule)
        ]
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        ticker: asyncio.Task[None] | None = None
        # Park everything alive now (modules, the schedule, the results) out of the
        # collector's sight: a full collection walking it stalled the loop, and so the
        # sending, for hundreds of ms.
        frozen_before = gc.get_freeze_count()
        gc.collect()
        gc.freeze()
        cpu_start = time.process_time()
        self._t0 = loop.time()

        def snapshot() -> Progress:
            sent = sum(1 for result in results if result.sent_s is not None)
            done = [result for result in results if result.end_s is not None or result.error]
            failed = sum(1 for result in done if result.error)
            return Progress(
                loop.time() - self._t0,
                len(results),
                sent,
                len(done) - failed,
                failed,
                self._in_flight,
            )

        def finished(task: asyncio.Task[None]) -> None:
            # A callback, not the task's own `finally`: it runs even for a task cancelled
            # before it started.
            tasks.discard(task)
            self._in_flight -= 1

        async def tick() -> None:
            assert progress is not None
            while True:
                await asyncio.sleep(progress_every_s)
                progress(snapshot())

        try:
            if progress is not None:
                ticker = loop.create_task(tick())
            for request, result in zip(schedule, results, strict=True):
                delay = self._t0 + request.arrival_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._in_flight >= self.max_in_flight:
                    result.error = ERROR_DROPPED
                    result.error_detail = f"{self._in_flight} requests in flight (the cap)"
                    continue
                # Counted at dispatch: a burst of simultaneous arrivals must meet the cap too.
                self._in_flight += 1
                self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
                task = loop.create_task(self._send(request, result))
                tasks.add(task)
                task.add_done_callback(finished)
            last_arrival = schedule[-1].arrival_s if schedule else 0.0
            deadline = self._t0 + last_arrival + drain_s
            if tasks:
                await asyncio.wait(set(tasks), timeout=max(deadline - loop.time(), 0.0))
        finally:
            cut_off = bool(tasks)
            wall = loop.time() - self._t0
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.wait(set(tasks))
            for result in results:
                if result.end_s is None and result.error is None:
                    # Cancelled before it could record anything, or never reached.
                    result.error = ERROR_UNFINISHED
                    result.error_detail = "not finished when the benchmark ended"
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            cpu = time.process_time() - cpu_start
            if not frozen_before:  # leave a caller's own freeze alone
                gc.unfreeze()
            clients = len(self._clients)
            await self.aclose()
        if progress is not None:
            progress(snapshot())
        # The run lasts until its last answer, or until it was cut off.
        moments = [r.end_s or r.sent_s or 0.0 for r in results]
        duration = wall if cut_off else max(moments, default=0.0)
        return RunResult(
            results,
            duration,
            ClientStats(
                cpu_s=cpu,
                cpu_utilisation=cpu / wall if wall > 0 else 0.0,
                peak_in_flight=self._peak_in_flight,
                max_in_flight=self.max_in_flight,
                http_clients=clients,
            ),
        )

    async def served_models(self) -> list[str] | None:
        """The model ids the server lists at `/v1/models`, or None when it lists none (an
        error status or an unexpected body). Connection failures raise `httpx.HTTPError`."""
        slot = self._acquire_client()
        try:
            response = await self._clients[slot].get(
                self.url.removesuffix("/completions") + "/models",
                timeout=self.connect_timeout_s,
            )
        finally:
            self._client_load[slot] -= 1
        if response.status_code != 200:
            return None
        try:
            listed = response.json()["data"]
            return [str(entry["id"]) for entry in listed]
        except (ValueError, KeyError, TypeError):
            return None

    async def aclose(self) -> None:
        clients, self._clients, self._client_load = self._clients, [], []
        for client in clients:
            await client.aclose()

    async def _send(self, request: TraceRequest, result: RequestResult) -> None:
        loop = asyncio.get_running_loop()
        body = self._body(request, result.index)
        slot = self._acquire_client()
        client = self._clients[slot]
        result.sent_s = loop.time() - self._t0
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with client.stream("POST", self.url, content=body) as response:
                    result.http_status = response.status_code
                    if response.status_code != 200:
                        detail = (await response.aread()).decode(errors="replace")
                        result.error = f"http_{response.status_code}"
                        result.error_detail = _error_message(detail)
                        result.end_s = loop.time() - self._t0
                        return
                    await self._read_events(response, result, loop)
        except TimeoutError:
            result.error = ERROR_TIMEOUT
            result.error_detail = f"no complete answer within {self.request_timeout_s:g} s"
        except asyncio.CancelledError:
            result.error = ERROR_UNFINISHED
            result.error_detail = "still running when the benchmark ended"
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            result.error = ERROR_CONNECT
            result.error_detail = _describe(error)
        except (httpx.TransportError, httpx.StreamError) as error:
            result.error = ERROR_CONNECTION
            result.error_detail = _describe(error)
        except Exception as error:  # a benchmark records a client failure and carries on
            result.error = ERROR_CLIENT
            result.error_detail = _describe(error)
        finally:
            self._client_load[slot] -= 1

    async def _read_events(
        self, response: httpx.Response, result: RequestResult, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Time each content chunk as its bytes arrive; the usage chunk gives the token count."""
        t0 = self._t0
        stream = TokenStream(gaps=result.gaps)
        async for received in response.aiter_raw():
            now = loop.time() - t0
            stream.feed(received, now)
            if stream.error is not None:
                result.error = ERROR_STREAM
                result.error_detail = stream.error[:_ERROR_DETAIL_CHARS]
                result.end_s = now
                break
        result.first_token_s = stream.first_token_at
        result.last_token_s = stream.last_token_at
        result.chunks = stream.chunks
        result.tokens = stream.tokens
        if result.error is not None:
            return
        result.end_s = loop.time() - t0
        if not stream.done:
            result.error = ERROR_INCOMPLETE
            result.error_detail = "the stream ended without data: [DONE]"


def _error_message(text: str) -> str:
    """The `error.message` of an OpenAI error body, else the text, shortened."""
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
        body = json.loads(text)
        text = str(body["error"]["message"])
    return text[:_ERROR_DETAIL_CHARS]


def _describe(error: BaseException) -> str:
    return (f"{type(error).__name__}: {error}")[:_ERROR_DETAIL_CHARS]


# Entry points.


def _raise_open_files_limit(wanted: int) -> None:
    """Each stream holds a socket: lift the soft limit on open files towards the hard one."""
    if sys.platform == "win32":
        return
    import resource  # noqa: PLC0415 (Unix only)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class BenchmarkError(RuntimeError):
    """A benchmark that cannot start: the server unreachable, the model not served, no
    plotting library."""


def _check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError as error:
        raise BenchmarkError(
            "plots need matplotlib (pip install 'inferfleet[bench]'), or pass plots=False"
        ) from error


async def serve_benchmark(
    base_url: str,
    requests: Sequence[TraceRequest],
    *,
    model: str,
    slo: Slo | None = None,
    duration_s: float | None = None,
    out_dir: Path | str | None = None,
    drain_s: float = DEFAULT_DRAIN_S,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    streams_per_client: int = DEFAULT_STREAMS_PER_CLIENT,
    api_key: str | None = None,
    send_prefix_hashes: bool = True,
    plots: bool = True,
    metadata: Mapping[str, Any] | None = None,
    progress: Callable[[Progress], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Report:
    """Replay `requests` open-loop against `base_url` (an OpenAI-compatible server, with or
    without the `/v1` suffix) serving `model`, for at most `duration_s` of arrivals (default:
    the whole schedule) plus `drain_s` for the last answers, and judge it against `slo`.

    With `out_dir`, writes there `report.json`, `requests.jsonl` (one record per request) and,
    with `plots`, `bench_latency.png` and `bench_cdf.png`. Returns the report.

    Raises `BenchmarkError` before sending anything when the server cannot be reached, when
    its `/v1/models` does not list `model`, or when plots are asked for without matplotlib.
    Requests still running `drain_s` after the last arrival count as `unfinished`."""
    if plots and out_dir is not None:
        _check_plotting()  # before the run, not after an hour of it
    _raise_open_files_limit(min(max_in_flight, 65_536) + 256)
    generator = LoadGenerator(
        base_url,
        model=model,
        max_in_flight=max_in_flight,
        streams_per_client=streams_per_client,
        request_timeout_s=request_timeout_s,
        api_key=api_key,
        send_prefix_hashes=send_prefix_hashes,
        ssl_context=ssl_context,
    )
    # Fail before the run, not with every request an error after it.
    try:
        served = await generator.served_models()
    except httpx.HTTPError as error:
        await generator.aclose()
        raise BenchmarkError(f"cannot reach {base_url}: {_describe(error)}") from error
    if served is not None and model not in served:
        await generator.aclose()
        raise BenchmarkError(
            f"{base_url} does not serve model {model!r}; it serves: {', '.join(served) or 'none'}"
        )
    run = await generator.run(requests, duration_s=duration_s, drain_s=drain_s, progress=progress)
    details: dict[str, Any] = {
        "base_url": base_url,
        "model": model,
        "duration_limit_s": duration_s,
        "drain_s": drain_s,
    }
    details.update(metadata or {})
    report = summarize(
        run.results, slo=slo, duration_s=run.duration_s, client=run.client, metadata=details
    )
    if out_dir is not None:
        directory = Path(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "report.json").write_text(report.to_json(), encoding="utf-8")
        with (directory / "requests.jsonl").open("w", encoding="utf-8") as handle:
            for result in run.results:
                handle.write(json.dumps(result.to_dict(), allow_nan=False) + "\n")
        if plots:
            from inferfleet.bench.report import plot  # noqa: PLC0415

            plot(run.results, directory / "bench", slo=slo)
    return report


def run_benchmark(
    base_url: str,
    requests: Sequence[TraceRequest],
    *,
    model: str,
    slo: Slo | None = None,
    duration_s: float | None = None,
    out_dir: Path | str | None = None,
    drain_s: float = DEFAULT_DRAIN_S,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    streams_per_client: int = DEFAULT_STREAMS_PER_CLIENT,
    api_key: str | None = None,
    send_prefix_hashes: bool = True,
    plots: bool = True,
    metadata: Mapping[str, Any] | None = None,
    progress: Callable[[Progress], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Report:
    """`serve_benchmark` on a fresh event loop (for a command line)."""
    return asyncio.run(
        serve_benchmark(
            base_url,
            requests,
            model=model,
            slo=slo,
            duration_s=duration_s,
            out_dir=out_dir,
            drain_s=drain_s,
            max_in_flight=max_in_flight,
            request_timeout_s=request_timeout_s,
            streams_per_client=streams_per_client,
            api_key=api_key,
            send_prefix_hashes=send_prefix_hashes,
            plots=plots,
            metadata=metadata,
            progress=progress,
            ssl_context=ssl_context,
        )
    )
