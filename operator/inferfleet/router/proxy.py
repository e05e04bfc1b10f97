"""The router's HTTP face: an OpenAI-compatible streaming proxy in front of engine replicas.

Endpoints: `POST /v1/completions` and `/v1/chat/completions` (JSON or server-sent events,
passed through as the engine writes them), `GET /v1/models` (the served models of the
backends), `GET /health` (200 while some deployment can take requests, or the router holds
them for one to wake, and it is not draining; else 503). On the admin port only
(`server.create_admin_app`), never the users': `GET /metrics` (see `router.metrics`), `GET
/debug/replicas` (what the router knows of each replica, as JSON), and `/health` again.

Per request: choose a deployment and replicas (`router.balancer`); for a disaggregated
deployment, call a prefill replica, then hand its answer over to a decode replica
(`router.requests`); stream the answer back, timing the first token and the tokens after it
as they pass (`inferfleet.streaming`), and count the SLO outcome.

Failures:
* no replica healthy for a role the request needs: 503 with `Retry-After`; where the service
  may be at zero on purpose (`RouterConfig.wake_timeout_s`), held until one serves
  (`router.wake`), and 503 with `Retry-After` only past that timeout or with the hold full;
* a replica that refuses the connection, breaks it or answers 502/503/504 before anything
  reached the client: the call goes to another replica (up to `max_attempts` replicas in
  all), and a refused or broken connection marks the replica unhealthy until its health check
  passes again. Once a byte has been sent back, nothing is retried. When every replica tried
  failed: 502, its message saying why each did (the router's engine keys refused, the status
  it answered, the call broken), without their addresses;
* a stream cut after it started: the client gets an error event (vLLM's shape) and `[DONE]`,
  and the request counts as failed;
* with tenants (`router.tenants`): no API key or one not theirs, 401; a model the tenant may
  not use, 403; over the tenant's requests a second, tokens a minute or requests at once, 429
  with `Retry-After`;
* more requests or request bytes held than the router's limits (`max_in_flight_requests`,
  `max_in_flight_bytes`): 503 with `Retry-After`, before the body is read;
* a body over the limit (`RouterConfig.request_bytes_limit`, from the model's context): 413,
  before it is read; one that has not arrived within `body_read_timeout_s`: 408; one that is
  not JSON, or nests deeper than the parser goes: 400;
* a connection without a whole request header, or idle, for `idle_timeout_s`: closed;
* a `model` that no backend serves: 404 (as the engines and OpenAI's API answer it), naming
  the models served; requests naming a model go only to the deployments that serve it.
Answers the engine refuses (4xx) pass through unchanged and are not judged against the SLO.
A client that hangs up cancels its handler, which closes the upstream call (the engine then
aborts the request); such requests are counted as cancelled, not judged, and never count
against the replica, also when the hang-up shows first as a write that fails.

Non-streamed requests have no observable first token: their TTFT is taken as the whole
answer's time (an upper bound) and TPOT is not judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from inferfleet.api.model_deployment import EngineName, Role
from inferfleet.router.answers import error_body, error_response, message_of
from inferfleet.router.balancer import Balancer, Replica
from inferfleet.router.config import Backend, RouterConfig
from inferfleet.router.failures import (
    ClientGoneError,
    NoReplicaError,
    UpstreamFailedError,
    broke,
    refused_keys,
)
from inferfleet.router.fairness import FairGate, ShedError
from inferfleet.router.keyfiles import EngineKeys, load_keys, reload_engine_keys, reload_keys
from inferfleet.router.metrics import Finished, RouterMetrics
from inferfleet.router.requests import (
    BadRequestError,
    CharsPerToken,
    HandoffError,
    RoutedRequest,
    decode_body,
    prefill_body,
    read_request,
    upstream_body,
)
from inferfleet.router.tenants import Refusal, Tenants
from inferfleet.router.wake import WakeHold, WakeRefusedError
from inferfleet.slo import Outcome
from inferfleet.streaming import DONE_EVENT, TokenStream

log = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({502, 503, 504})
_CALL_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
HEALTH_TIMEOUT_S = 2.0
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}

ROUTER: web.AppKey[Router] = web.AppKey("router")


@dataclass(slots=True)
class _Charge:
    """Tokens a request adds to a replica's load, given back as the work gets done."""

    replica: Replica
    remaining: int

    def release(self, tokens: int) -> None:
        tokens = min(tokens, self.remaining)
        if tokens > 0:
            self.remaining -= tokens
            self.replica.outstanding_tokens -= tokens

    def close(self) -> None:
        self.release(self.remaining)
        self.replica.in_flight -= 1


@dataclass(slots=True)
class _Timing:
    arrived: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    prompt_tokens_estimate: int | None = None
    prompt_chars: int | None = None
    streamed: bool = False


class Router:
    """One service's router: replicas, choice, calls, metrics."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or RouterMetrics(config.service)
        self.chars_per_token = CharsPerToken()
        self.balancer = Balancer(
            {name: config.roles_of(name)[0].weight for name in config.deployments()},
            slack_tokens=config.affinity_slack_tokens,
        )
        self.backends: dict[tuple[str, Role], Backend] = {b.key: b for b in config.backends}
        for backend in config.backends:
            self.balancer.declare(backend.deployment, backend.role)
            self.metrics.declare(backend.deployment)
        self.tenants = Tenants(config.tenants)
        self._engine_keys = EngineKeys(config.backends)
        self.gate = FairGate(
            max_queue=config.max_queued_requests, max_wait_s=config.max_queue_wait_s
        )
        for tenant in config.tenants:
            self.metrics.declare_tenant(tenant.name)
        self.on_waiting: Callable[[int], None] | None = None
        """Told each change of the requests held for want of a replica (the wake's push)."""
        self.wake = (
            None
            if config.wake_timeout_s is None
            else WakeHold(config.wake_timeout_s, config.max_queued_requests, self._waiting)
        )
        self.draining = False
        self._held_requests = 0
        self._held_bytes = 0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # Lifecycle.

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=self.config.request_timeout_s,
                sock_connect=self.config.upstream_connect_timeout_s,
            ),
            auto_decompress=False,
        )
        for backend in self.config.backends:
            if backend.urls:
                self.set_replicas(backend.deployment, backend.role, backend.urls)
        self._spawn(self._health_loop())
        if self.tenants.enforced:
            await asyncio.to_thread(load_keys, self.tenants)
            self._spawn(reload_keys(self.tenants, self.config.key_reload_s))
        if self._engine_keys.any:
            self._spawn(reload_engine_keys(self._engine_keys, self.config.key_reload_s))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the router is not started"
        return self._session

    # Replicas and their health.

    def set_replicas(self, deployment: str, role: Role, urls: Sequence[str]) -> None:
        """What discovery found; new replicas are checked at once."""
        added = self.balancer.set_replicas(deployment, role, urls)
        if added:
            self._spawn(self._check_all(added))
        self._publish_replicas()

    async def _check(self, replica: Replica) -> None:
        try:
            async with self.session.get(
                f"{replica.url}/health", timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            ) as response:
                healthy = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            healthy = False
        if healthy != replica.healthy:
            log.info(
                "replica %s (%s) is %s", replica.url, replica.role, "up" if healthy else "down"
            )
        replica.healthy = healthy

    async def _check_all(self, replicas: Sequence[Replica]) -> None:
        await asyncio.gather(*(self._check(replica) for replica in replicas))
        self._publish_replicas()

    async def _health_loop(self) -> None:
        while True:
            await self._check_all(self.balancer.all_replicas())
            await asyncio.sleep(self.config.health_interval_s)

    def _publish_replicas(self) -> None:
        # No healthy replica: nothing to wait for (requests get their 503 at once).
        self.gate.set_capacity(self._engine_capacity() or None)
        if self.wake is not None:
            self.wake.replicas_changed()
        for (deployment, role), pool in self.balancer.replicas.items():
            healthy = sum(1 for replica in pool.values() if replica.healthy)
            series = self.metrics.replicas
            series.labels(self.config.service, deployment, role.value, "healthy").set(healthy)
            series.labels(self.config.service, deployment, role.value, "unhealthy").set(
                len(pool) - healthy
            )

    @contextlib.asynccontextmanager
    async def _post(
        self, replica: Replica, url: str, payload: bytes, labels: tuple[str, str, str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST a request to an engine: JSON, with its deployment's engine key where it has
        one (the client's own Authorization, a tenant's key, never goes upstream); refused as
        unauthorised, again with the key before a rotation (`EngineKeys`). Each refusal counts
        as an upstream error of kind `key`."""
        keys = self._engine_keys.keys(replica.deployment) or (None,)
        for attempt, key in enumerate(keys, start=1):
            headers = {"Content-Type": "application/json"}
            if key is not None:
                headers["Authorization"] = f"Bearer {key}"
            async with self.session.post(url, data=payload, headers=headers) as response:
                if response.status == HTTPStatus.UNAUTHORIZED:
                    self.metrics.upstream_errors.labels(*labels, "key").inc()
                    if attempt < len(keys):
                        await response.read()
                        continue
                yield response
                return

    def _engine_capacity(self) -> int | None:
        """Requests the healthy replicas batch at once, or None where a pool does not say."""
        sequences = self.config.engine_sequences()
        if sequences is None:
            return None
        return sum(
            n * sum(1 for r in self.balancer.replicas.get(key, {}).values() if r.healthy)
            for key, n in sequences.items()
        )

    def _mark_down(self, replica: Replica, error: BaseException) -> None:
        if replica.healthy:
            log.warning(
                "replica %s (%s) failed a call (%s: %s); out until it checks healthy",
                replica.url,
                replica.role,
                type(error).__name__,
                error,
            )
        replica.healthy = False
        self._publish_replicas()

    def routable(self, among: Sequence[str] | None = None) -> bool:
        """Whether some deployment (of `among`, when given) has a healthy replica per role."""
        names = self.config.deployments() if among is None else among
        return any(self.balancer.routable(name) for name in names)

    def _waiting(self, count: int) -> None:
        self.metrics.waiting_for_replicas.labels(self.config.service).set(count)
        if self.on_waiting is not None:
            self.on_waiting(count)

    # Requests.

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=True)

    async def generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        """Who sends it and whether they may now (with tenants); then within the router's own
        limits (its body counted at its declared size before a byte of it is read); then
        serve it."""
        tenant: str | None = None
        if self.tenants.enforced:
            who = self.tenants.authenticate(request.headers)
            if isinstance(who, Refusal):
                return self._refuse(who, "unauthenticated")
            refused = self.tenants.admit(who, asyncio.get_running_loop().time())
            if refused is not None:
                return self._refuse(refused, "rate_limited", who)
            tenant = who
        try:
            return await self._held(request, chat=chat, tenant=tenant)
        finally:
            if tenant is not None:
                self.tenants.end(tenant)

    def _refuse(self, refusal: Refusal, reason: str, tenant: str | None = None) -> web.Response:
        self.metrics.rejected.labels(self.config.service, reason).inc()
        if tenant is not None:
            self.metrics.tenant_rejected.labels(self.config.service, tenant, reason).inc()
        headers = None
        if refusal.retry_after_s is not None:
            headers = {"Retry-After": str(max(1, math.ceil(refusal.retry_after_s)))}
        return error_response(refusal.message, refusal.status, refusal.kind, headers=headers)

    async def _held(
        self, request: web.Request, *, chat: bool, tenant: str | None
    ) -> web.StreamResponse:
        config = self.config
        limit = config.request_bytes_limit
        size = request.content_length
        held = limit if size is None else min(size, limit)
        if (
            self._held_requests >= config.max_in_flight_requests
            or self._held_bytes + held > config.max_in_flight_bytes
        ):
            self.metrics.rejected.labels(config.service, "overloaded").inc()
            return error_response(
                f"the router holds as many requests as it may ({config.max_in_flight_requests}"
                f" requests, {config.max_in_flight_bytes} bytes of them)",
                503,
                "ServiceUnavailableError",
                headers={"Retry-After": str(config.retry_after_s)},
            )
        self._held_requests += 1
        self._held_bytes += held
        try:
            return await self._admitted(request, chat=chat, tenant=tenant)
        finally:
            self._held_requests -= 1
            self._held_bytes -= held

    async def _admitted(
        self, request: web.Request, *, chat: bool, tenant: str | None
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        service = self.config.service
        timing = _Timing(arrived=loop.time())
        try:
            async with asyncio.timeout(self.config.body_read_timeout_s):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.rejected.labels(service, "too_large").inc()
            return error_response(
                f"the request body exceeds {self.config.request_bytes_limit} bytes",
                413,
                "RequestEntityTooLargeError",
            )
        except TimeoutError:
            self.metrics.rejected.labels(service, "body_timeout").inc()
            return error_response(
                f"the request body did not arrive within {self.config.body_read_timeout_s:g} s",
                408,
                "RequestTimeoutError",
            )
        try:
            routed = read_request(
                json.loads(raw),
                chat=chat,
                chars_per_token=self.chars_per_token.value,
                longest_context=self.config.longest_context,
            )
        except (ValueError, BadRequestError) as error:
            self.metrics.rejected.labels(service, "bad_request").inc()
            return error_response(str(error), 400, "BadRequestError")
        except RecursionError:
            self.metrics.rejected.labels(service, "bad_request").inc()
            return error_response(
                "the request body nests deeper than the JSON parser goes", 400, "BadRequestError"
            )
        timing.prompt_chars = routed.prompt_chars
        timing.prompt_tokens_estimate = routed.prompt_tokens_estimate
        among = None if routed.model is None else self.config.serving(routed.model)
        if among == []:
            self.metrics.rejected.labels(service, "unknown_model").inc()
            served = ", ".join(self.config.models())
            return error_response(
                f"the model {routed.model!r} is not served here (served: {served})",
                404,
                "NotFoundError",
            )
        charged = 0
        if tenant is not None:
            charged = routed.prompt_tokens_estimate + routed.max_tokens_estimate
            refused = self.tenants.may_use(tenant, routed.model)
            if refused is not None:
                return self._refuse(refused, "forbidden", tenant)
            refused = self.tenants.charge(tenant, charged, loop.time())
            if refused is not None:
                return self._refuse(refused, "rate_limited", tenant)
        try:  # wait for a replica, and while the engines are full: part of the TTFT
            if self.wake is not None:
                await self.wake.until(lambda: self.routable(among))
            ticket = await self.gate.enter(
                tenant or "", self.tenants.priority(tenant), routed.prompt_tokens_estimate
            )
        except (ShedError, WakeRefusedError) as refused:
            if tenant is not None:
                self.tenants.refund(tenant, charged, loop.time())
            if isinstance(refused, WakeRefusedError):
                return self._unavailable(str(refused), refused.reason)
            return self._shed(refused, tenant)
        deployment = self.balancer.choose_deployment(among)
        if deployment is None:
            self.gate.leave(ticket, 0)
            if tenant is not None:
                self.tenants.refund(tenant, charged, loop.time())
            serving = "any deployment" if routed.model is None else repr(routed.model)
            return self._unavailable(f"no replica of {serving} is healthy")

        self.metrics.in_flight.labels(service).inc()
        self.metrics.arrivals.labels(service, deployment).inc()
        self.metrics.arrival_prompt_tokens.labels(service, deployment).inc(
            routed.prompt_tokens_estimate
        )
        judged: Outcome | None = None
        try:
            response, judged = await self._serve(request, routed, deployment, timing)
            return response
        except asyncio.CancelledError:
            self.metrics.cancelled.labels(service, deployment).inc()
            raise
        except ClientGoneError as gone:
            self.metrics.cancelled.labels(service, deployment).inc()
            return gone.response
        except NoReplicaError as error:
            if not error.failures:
                return self._unavailable(
                    f"no {error.role.value} replica of {deployment} is healthy"
                )
            judged = Outcome.FAILED
            return error_response(error.message(), 502, "BadGatewayError")
        except UpstreamFailedError as error:
            judged = Outcome.FAILED
            return error_response(error.message, error.status, "BadGatewayError")
        finally:
            self.gate.leave(ticket, timing.tokens)
            self.metrics.in_flight.labels(service).dec()
            if judged is not None:
                self._record(deployment, tenant, judged, timing, loop.time())
            if tenant is not None:
                used = (timing.prompt_tokens or routed.prompt_tokens_estimate) + timing.tokens
                self.tenants.refund(tenant, charged - used, loop.time())

    def _shed(self, shed: ShedError, tenant: str | None) -> web.Response:
        self.metrics.rejected.labels(self.config.service, shed.reason).inc()
        if tenant is not None:
            self.metrics.tenant_rejected.labels(self.config.service, tenant, shed.reason).inc()
        retry = str(max(1, math.ceil(shed.retry_after_s)))
        message = f"the engines are full: {shed}"
        return error_response(
            message, 503, "ServiceUnavailableError", headers={"Retry-After": retry}
        )

    def _unavailable(self, message: str, reason: str = "no_replica") -> web.Response:
        self.metrics.rejected.labels(self.config.service, reason).inc()
        return error_response(
            message,
            503,
            "ServiceUnavailableError",
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    def _record(
        self, deployment: str, tenant: str | None, outcome: Outcome, timing: _Timing, now: float
    ) -> None:
        first = timing.first_token
        self.metrics.finished(
            Finished(
                deployment,
                outcome,
                e2e_s=now - timing.arrived,
                ttft_s=None if first is None else first - timing.arrived,
                tpot_s=self._tpot(timing),
                prompt_tokens=timing.prompt_tokens,
                output_tokens=timing.tokens,
                tenant=tenant,
                prompt_tokens_estimate=timing.prompt_tokens_estimate,
            )
        )
        if timing.prompt_tokens is not None and timing.prompt_chars is not None:
            self.chars_per_token.observe(timing.prompt_chars, timing.prompt_tokens)

    @staticmethod
    def _tpot(timing: _Timing) -> float | None:
        if not timing.streamed or timing.first_token is None or timing.last_token is None:
            return None
        if timing.tokens < 2:
            return None
        return (timing.last_token - timing.first_token) / (timing.tokens - 1)

    def _judge(self, timing: _Timing, ok: bool) -> Outcome:
        ttft = None if timing.first_token is None else timing.first_token - timing.arrived
        return self.config.slo.outcome(ok=ok, ttft_s=ttft, tpot_s=self._tpot(timing))

    async def _serve(
        self, request: web.Request, routed: RoutedRequest, deployment: str, timing: _Timing
    ) -> tuple[web.StreamResponse, Outcome | None]:
        roles = self.balancer.roles_of(deployment)
        body = upstream_body(routed)
        serving_role = Role.AGGREGATED
        if roles == [Role.PREFILL, Role.DECODE]:
            serving_role = Role.DECODE
            body = await self._prefill(request.path, routed, deployment, body)
        return await self._call_serving(
            request,
            routed=routed,
            deployment=deployment,
            role=serving_role,
            body=body,
            timing=timing,
        )

    async def _prefill(
        self, path: str, routed: RoutedRequest, deployment: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        engine = self.backends[(deployment, Role.PREFILL)].engine
        payload = json.dumps(prefill_body(engine, body)).encode()
        labels = (self.config.service, deployment, Role.PREFILL.value)
        tried: list[str] = []
        failures: list[str] = []
        loop = asyncio.get_running_loop()
        while len(tried) < self.config.max_attempts:
            replica = self.balancer.choose(deployment, Role.PREFILL, routed.prefix_blocks, tried)
            if replica is None:
                break
            if tried:
                self.metrics.retries.labels(*labels).inc()
            tried.append(replica.url)
            charge = self._charge(replica, routed.prompt_tokens_estimate)
            started = loop.time()
            try:
                async with self._post(replica, replica.url + path, payload, labels) as response:
                    answer = await response.read()
                    if response.status == HTTPStatus.UNAUTHORIZED:
                        # Never the client's fault: another replica may take the key.
                        failures.append(refused_keys(len(self._engine_keys.keys(deployment))))
                        continue
                    if response.status in RETRYABLE_STATUSES:
                        self.metrics.upstream_errors.labels(*labels, "status").inc()
                        failures.append(f"answered {response.status}")
                        continue
                    if response.status != 200:
                        raise UpstreamFailedError(
                            message_of(answer, f"prefill answered {response.status}"),
                            response.status,
                        )
                self._record_prefix(replica, routed.prefix_blocks)
                self.metrics.upstream.labels(*labels).observe(loop.time() - started)
                try:
                    return decode_body(engine, body, json.loads(answer))
                except (ValueError, HandoffError) as error:
                    self.metrics.upstream_errors.labels(*labels, "handoff").inc()
                    raise UpstreamFailedError(f"prefill -> decode hand-off: {error}") from error
            except _CALL_ERRORS as error:
                self.metrics.upstream_errors.labels(*labels, "connect").inc()
                self._mark_down(replica, error)
                failures.append(broke(error))
            finally:
                charge.close()
        raise NoReplicaError(Role.PREFILL, failures)

    def _record_prefix(self, replica: Replica, blocks: tuple[int, ...]) -> None:
        looked, seen = self.balancer.record_prefix(replica, blocks)
        if looked and replica.role is not Role.DECODE:  # counted where the prompt is prefilled
            labels = (self.config.service, replica.deployment, replica.role.value)
            self.metrics.prefix_blocks.labels(*labels).inc(looked)
            self.metrics.prefix_blocks_seen.labels(*labels).inc(seen)

    def _charge(self, replica: Replica, tokens: int) -> _Charge:
        replica.outstanding_tokens += tokens
        replica.in_flight += 1
        replica.served += 1
        return _Charge(replica, tokens)

    async def _call_serving(
        self,
        request: web.Request,
        *,
        routed: RoutedRequest,
        deployment: str,
        role: Role,
        body: dict[str, Any],
        timing: _Timing,
    ) -> tuple[web.StreamResponse, Outcome | None]:
        payload = json.dumps(body).encode()
        labels = (self.config.service, deployment, role.value)
        prompt_load = routed.prompt_tokens_estimate if role is Role.AGGREGATED else 0
        tried: list[str] = []
        failures: list[str] = []
        loop = asyncio.get_running_loop()
        while len(tried) < self.config.max_attempts:
            replica = self.balancer.choose(deployment, role, routed.prefix_blocks, tried)
            if replica is None:
                break
            if tried:
                self.metrics.retries.labels(*labels).inc()
            tried.append(replica.url)
            charge = self._charge(replica, prompt_load + routed.max_tokens_estimate)
            started = loop.time()
            client: web.StreamResponse | None = None
            try:
                async with self._post(
                    replica, replica.url + request.path, payload, labels
                ) as upstream:
                    if upstream.status == HTTPStatus.UNAUTHORIZED:
                        # Never the client's fault: another replica may take the key.
                        failures.append(refused_keys(len(self._engine_keys.keys(deployment))))
                        continue
                    if upstream.status in RETRYABLE_STATUSES:
                        self.metrics.upstream_errors.labels(*labels, "status").inc()
                        failures.append(f"answered {upstream.status}")
                        continue
                    self._record_prefix(replica, routed.prefix_blocks)
                    if upstream.status != 200:
                        # The engine refused the request: its answer, unchanged and unjudged.
                        return web.Response(
                            body=await upstream.read(),
                            status=upstream.status,
                            content_type=upstream.content_type,
                        ), None
                    if not routed.stream:
                        answer = await upstream.read()
                        now = loop.time()
                        timing.first_token = timing.last_token = now
                        _usage_into(timing, answer)
                        self.metrics.upstream.labels(*labels).observe(now - started)
                        response = web.Response(body=answer, content_type="application/json")
                        return response, self._judge(timing, ok=True)
                    stream = TokenStream(drop_usage=not routed.client_wants_usage)
                    async for data in upstream.content.iter_any():
                        now = loop.time()
                        before = stream.tokens
                        out = stream.feed(data, now)
                        if stream.first_token_at is not None and before == 0:
                            charge.release(prompt_load)
                            self.metrics.upstream.labels(*labels).observe(now - started)
                        charge.release(stream.tokens - before)
                        if out:
                            if client is None:
                                client = web.StreamResponse(headers=_SSE_HEADERS)
                                await _to_client(client, client.prepare(request))
                            await _to_client(client, client.write(out))
                        if stream.error is not None:
                            break
                    timing.streamed = True
                    timing.first_token = stream.first_token_at
                    timing.last_token = stream.last_token_at
                    timing.tokens = stream.tokens
                    timing.prompt_tokens = stream.usage_prompt_tokens
                    if client is None:
                        # Nothing came: the replica ended the stream at once; try another.
                        self.metrics.upstream_errors.labels(*labels, "stream").inc()
                        failures.append("ended its stream before any token")
                        continue
                    ok = stream.done and stream.error is None
                    if not stream.done:
                        self.metrics.upstream_errors.labels(*labels, "stream").inc()
                        await self._write_stream_error(client, "the replica's stream ended early")
                    # A client that hangs up after the last event fails this write, not the
                    # replica.
                    await _to_client(client, client.write_eof())
                    return client, self._judge(timing, ok=ok)
            except _CALL_ERRORS as error:
                self.metrics.upstream_errors.labels(
                    *labels, "connect" if client is None else "stream"
                ).inc()
                self._mark_down(replica, error)
                if client is None:
                    failures.append(broke(error))
                    continue
                timing.streamed = True
                await self._write_stream_error(client, f"the replica's stream broke: {error}")
                with contextlib.suppress(ConnectionError):
                    await client.write_eof()
                return client, Outcome.FAILED
            finally:
                charge.close()
        raise NoReplicaError(role, failures)

    @staticmethod
    async def _write_stream_error(client: web.StreamResponse, message: str) -> None:
        event = json.dumps(error_body(message, 502, "BadGatewayError"))
        with contextlib.suppress(ConnectionError):
            await client.write(b"data: " + event.encode() + b"\n\n" + DONE_EVENT)

    # Informational endpoints.

    async def models(self, request: web.Request) -> web.Response:
        del request
        data = [
            {"id": name, "object": "model", "owned_by": "inferfleet"}
            for name in self.config.models()
        ]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        del request
        if self.draining:
            return web.Response(status=503, text="draining\n")
        if not self.routable():
            if self.wake is not None:  # at zero on purpose: it holds requests while they wake
                return web.Response(text="ok: no replica serves; requests wait for one\n")
            return web.Response(status=503, text="no healthy replica\n")
        return web.Response(text="ok\n")

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        del request
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def replicas(self, request: web.Request) -> web.Response:
        del request
        return web.json_response(
            [
                {
                    "url": replica.url,
                    "deployment": replica.deployment,
                    "role": replica.role.value,
                    "healthy": replica.healthy,
                    "outstandingTokens": replica.outstanding_tokens,
                    "inFlight": replica.in_flight,
                    "served": replica.served,
                }
                for replica in self.balancer.all_replicas()
            ]
        )


async def _to_client(client: web.StreamResponse, sending: Awaitable[object]) -> None:
    """Send to the client; a failure here is the client's hang-up (`ClientGoneError`), which
    must not be taken for the replica's (aiohttp raises the same connection errors for both
    sides)."""
    try:
        await sending
    except (ConnectionError, aiohttp.ClientConnectionError) as error:
        raise ClientGoneError(client) from error


def _usage_into(timing: _Timing, answer: bytes) -> None:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        usage = json.loads(answer).get("usage") or {}
        if isinstance(usage.get("completion_tokens"), int):
            timing.tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            timing.prompt_tokens = usage["prompt_tokens"]


Discovery = Callable[[Router], Awaitable[None]]
"""A task that keeps the router's replica lists current (`Router.set_replicas`)."""


__all__ = ["ROUTER", "Discovery", "EngineName", "Router"]
