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
* their transport (`bench.transport.AsyncioTransport`) runs httpcore on plain asyncio
  protocols rather than through anyio, which opens a cancel scope on every read;
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

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
from inferfleet.bench.transport import AsyncioTransport
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
