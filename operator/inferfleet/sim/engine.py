"""The engine emulator in real time: the scheduler core stepped on an asyncio loop.

One task owns the `EngineCore`. While there is work it calls `core.step(start)`, sleeps until
`start + duration` and then hands the step's tokens to the requests' streams, so clients see
each token when a GPU running the modelled step would have produced it. Back-to-back steps
are chained on absolute deadlines (the next step starts at the previous deadline, not when the
sleep happened to return), so timer overshoot does not accumulate. When the process cannot
keep up (handing out a step's tokens takes longer than the next step lasts) the lag shows in
`inferfleet_sim_late_seconds_total`, and a debt of more than `MAX_CATCH_UP_S` is dropped
(`inferfleet_sim_schedule_resets_total`) rather than repaid with a burst of instant steps.

Per-token work is kept small so that one core can drive hundreds of streams: a step only bumps
each request's token count and wakes its handler, which writes everything new in one go.
Token text is synthetic (" tok1", " tok2", ...): only lengths matter to the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from inferfleet.api.model_deployment import Role
from inferfleet.planning.memory import KV_BLOCK_TOKENS
from inferfleet.planning.performance import DEFAULT_EFFICIENCY, EfficiencyTerms
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.metrics import EngineMetrics
from inferfleet.sim.scheduler import EngineCore, EngineRequest, EngineStats, StepResult

_log = logging.getLogger(__name__)

MAX_CATCH_UP_S = 0.05
"""How far behind its deadlines the loop may run before it resets its schedule to now."""


class EngineClosedError(RuntimeError):
    """The engine is shutting down and takes no new requests."""


class RequestStream:
    """One request's progress as its HTTP handler sees it: a token count and an end."""

    __slots__ = (
        "_waiter",
        "arrival_s",
        "emitted",
        "finish_reason",
        "first_token_s",
        "kv_bytes",
        "last_token_s",
        "max_tokens",
        "prompt_tokens",
        "request_id",
        "scheduled_s",
    )

    def __init__(self, request: EngineRequest, max_tokens: int, arrival_s: float) -> None:
        self.request_id = request.request_id
        self.prompt_tokens = request.prompt_tokens
        self.max_tokens = max_tokens
        """Tokens the request will emit (1 on a prefill replica)."""
        self.arrival_s = arrival_s
        self.scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.emitted = 0
        self.finish_reason: str | None = None
        """None while running; "length" when done, "abort" when aborted or shut down, "error"
        if the engine loop failed."""
        self.kv_bytes = 0
        """Prefill role: KV bytes handed off to the decode replica."""
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    async def wait(self, seen: int) -> int:
        """Wait until more than `seen` tokens are out or the request ended; the token count."""
        while self.emitted <= seen and self.finish_reason is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            await waiter
        return self.emitted

    def _notify(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


@dataclass(frozen=True, slots=True)
class LoopTiming:
    """How faithfully the loop kept the modelled time."""

    steps: int
    modelled_s: float
    """Sum of the modelled step durations."""
    late_s: float
    """Sum over steps of how long after its modelled end each step's tokens were handed out
    (timer overshoot, or the process falling behind); `late_s / steps` is the mean."""
    resets: int
    """Times the loop fell more than `MAX_CATCH_UP_S` behind and dropped the debt, stretching
    the emulated timeline: 0 while the emulator keeps up."""


class SimEngine:
    """An emulated vLLM engine: the scheduler core, its clock, its streams and metrics."""

    def __init__(
        self,
        config: ReplicaConfig,
        model_name: str,
        role: Role = Role.AGGREGATED,
        *,
        efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
        prefix_caching: bool = True,
        kv_transfer_bytes_per_s: float | None = None,
        kv_capacity_blocks: int | None = None,
    ) -> None:
        self.config = config
        self.model_name = model_name
        self.role = role
        self.core = EngineCore(
            config,
            role,
            efficiency=efficiency,
            prefix_caching=prefix_caching,
            kv_transfer_bytes_per_s=kv_transfer_bytes_per_s,
            kv_capacity_blocks=kv_capacity_blocks,
        )
        self.metrics = EngineMetrics(
            model_name,
            self.core.stats,
            max_model_len=config.context_limit,
            block_size=KV_BLOCK_TOKENS,
            num_gpu_blocks=self.core.kv_capacity_blocks,
            prefix_caching=prefix_caching,
        )
        self._streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = True
        self._steps = 0

    # Lifecycle.

    def start(self) -> None:
        """Start the engine loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"sim-engine-{self.model_name}"
            )

    @property
    def healthy(self) -> bool:
        """The loop runs and the engine takes requests."""
        return self._accepting and self._task is not None and not self._task.done()

    def stop_accepting(self) -> None:
        """Refuse new requests (graceful shutdown); in-flight ones carry on."""
        self._accepting = False

    async def close(self) -> None:
        """Abort whatever is still in flight and stop the loop."""
        self._accepting = False
        for request_id in list(self._streams):
            self.abort(request_id)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # Requests.

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def add_request(self, request: EngineRequest) -> RequestStream:
        """Queue `request`; `RequestRejectedError` if it can never run, `EngineClosedError`
        during shutdown."""
        if not self._accepting:
            raise EngineClosedError("the engine is shutting down")
        self.core.add_request(request)
        max_tokens = 1 if self.role is Role.PREFILL else request.max_output_tokens
        stream = RequestStream(request, max_tokens, asyncio.get_running_loop().time())
        self._streams[request.request_id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Drop a request (client gone, shutdown); its blocks are freed at once."""
        stream = self._streams.get(request_id)
        if stream is None:
            return
        self.core.abort(request_id)
        self._finish(stream, "abort", asyncio.get_running_loop().time())
        self._wake.set()  # freed blocks may let a waiting request in

    def timing(self) -> LoopTiming:
        return LoopTiming(
            steps=self._steps,
            modelled_s=self.metrics.step_seconds,
            late_s=self.metrics.late_seconds,
            resets=self.metrics.schedule_resets,
        )

    def stats(self) -> EngineStats:
        return self.core.stats()

    # The loop.

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            # A bug, not a condition to serve through: fail the requests and turn unhealthy
            # so that the liveness probe restarts the engine.
            _log.exception("the engine loop failed")
            self._accepting = False
            now = asyncio.get_running_loop().time()
            for stream in list(self._streams.values()):
                self._finish(stream, "error", now)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        metrics = self.metrics
        next_start: float | None = None
        while True:
            if not core.has_work:
                self._wake.clear()
                await self._wake.wait()
                next_start = None
                continue
            now = loop.time()
            start = now
            if next_start is not None:
                if now - next_start <= MAX_CATCH_UP_S:
                    start = next_start
                else:
                    metrics.schedule_resets += 1
            result = core.step(start)
            if result.idle:
                # Waiting for KV to land or for blocks: sleep until a transfer lands or a
                # request arrives or leaves.
                self._wake.clear()
                wake_at = core.next_wake_s
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(wake_at):
                        await self._wake.wait()
                next_start = None
                continue
            self._steps += 1
            metrics.step_seconds += result.duration_s
            metrics.iteration_tokens.observe(result.load.tokens)
            for request_id in result.started:
                stream = self._streams.get(request_id)
                if stream is not None and stream.scheduled_s is None:
                    stream.scheduled_s = max(start, stream.arrival_s)
            deadline = start + result.duration_s
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            delivered = loop.time()
            metrics.late_seconds += max(delivered - deadline, 0.0)
            self._deliver(result, delivered)
            next_start = deadline

    def _deliver(self, result: StepResult, now: float) -> None:
        """Hand the step's outcome to the streams; ids of aborted requests are skipped."""
        streams = self._streams
        metrics = self.metrics
        ttft = metrics.ttft
        inter_token = metrics.inter_token
        for request_id in result.tokens:
            stream = streams.get(request_id)
            if stream is None:
                continue
            if stream.emitted:
                inter_token.observe(now - (stream.last_token_s or now))
            else:
                stream.first_token_s = now
                ttft.observe(now - stream.arrival_s)
            stream.emitted += 1
            stream.last_token_s = now
            stream._notify()
        for request_id in result.finished:
            stream = streams.get(request_id)
            if stream is not None:
                self._finish(stream, "length", now)
        for handoff in result.handoffs:
            stream = streams.get(handoff.request_id)
            if stream is None:
                continue
            # The prefill replica samples the first token, returns it and finishes.
            stream.emitted = 1
            stream.first_token_s = stream.last_token_s = now
            stream.kv_bytes = handoff.kv_bytes
            ttft.observe(now - stream.arrival_s)
            metrics.extra_generation_tokens += 1
            self._finish(stream, "length", now)

    def _finish(self, stream: RequestStream, reason: str, now: float) -> None:
        del self._streams[stream.request_id]
        stream.finish_reason = reason
        self.metrics.request_finished(
            reason,
            arrival_s=stream.arrival_s,
            scheduled_s=stream.scheduled_s,
            first_token_s=stream.first_token_s,
            last_token_s=stream.last_token_s,
            end_s=now,
            prompt_tokens=stream.prompt_tokens,
            generation_tokens=stream.emitted,
            max_tokens=stream.max_tokens,
        )
        stream._notify()
