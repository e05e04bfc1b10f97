"""The router in front of real HTTP servers on loopback: emulated engines and scripted
upstreams that fail in the ways replicas do."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import Role
from inferfleet.router.config import RouterConfig, RouterConfigError, parse_backend
from inferfleet.router.keyfiles import EngineKeys, engine_keys
from inferfleet.router.proxy import ROUTER
from inferfleet.router.server import RouterServer, create_admin_app, create_app
from inferfleet.sim.openai_api import SimServer
from inferfleet.sim.openai_api import create_app as create_engine
from inferfleet.slo import Slo
from tests.unit.planning_fixtures import replica

MODEL = "llama-3.1-8b"
CONFIG = replica(MODEL, GpuType.H200_141GB)
Start = Callable[..., Awaitable[str]]


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, Any]]:
    """Engines, scripted upstreams and routers started by a test; all stopped after it."""
    started: dict[str, Any] = {"engines": [], "runners": [], "routers": [], "clients": []}
    yield started
    for client in started["clients"]:
        await client.aclose()
    for router in started["routers"]:
        await router.stop(drain=False)
    for engine in started["engines"]:
        await engine.stop()
    for runner in started["runners"]:
        await runner.cleanup()


async def start_engine(
    servers: dict[str, Any],
    role: Role = Role.AGGREGATED,
    model: str = MODEL,
    adapters: tuple[str, ...] = (),
) -> str:
    app = create_engine(CONFIG, model, role, adapters=adapters)
    server = SimServer(app, "127.0.0.1", 0, drain_timeout_s=1.0)
    port = await server.start()
    servers["engines"].append(server)
    return f"http://127.0.0.1:{port}"


async def scripted(request: web.Request, mode: str) -> web.StreamResponse:
    """An upstream replica that behaves as `mode` says."""
    await request.read()
    if mode == "busy":
        return web.json_response({"error": {"message": "draining"}}, status=503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"index":0,"text":" tok1"}]}\n\n')
    if mode == "die":
        assert request.transport is not None
        request.transport.abort()  # the replica's process dies mid-stream
    if mode == "linger":
        # The whole answer, and the end of the stream a moment later.
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(0.3)
    return response  # "cut": the stream ends without [DONE]


async def start_scripted(servers: dict[str, Any], mode: str) -> str:
    async def completions(request: web.Request) -> web.StreamResponse:
        return await scripted(request, mode)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    servers["runners"].append(runner)
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


def config(*backends: str, **options: Any) -> RouterConfig:
    settings = {"health_interval_s": 0.05, "drain_delay_s": 0.0, "drain_timeout_s": 5.0}
    return RouterConfig("chat", tuple(parse_backend(b) for b in backends), **(settings | options))


ADMIN: dict[int, httpx.AsyncClient] = {}
"""The admin port's client of each router's users' client (by id)."""


def admin(client: httpx.AsyncClient) -> httpx.AsyncClient:
    return ADMIN[id(client)]


async def start_router(servers: dict[str, Any], router_config: RouterConfig) -> httpx.AsyncClient:
    server = RouterServer(create_app(router_config), "127.0.0.1", 0, admin_port=0)
    port = await server.start()
    servers["routers"].append(server)
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0, verify=False)
    ADMIN[id(client)] = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{server.admin_port}", timeout=10.0
    )
    servers["clients"] += [client, ADMIN[id(client)]]
    for _ in range(200):  # until the first health checks pass
        if (await client.get("/health")).status_code == 200:
            break
        await asyncio.sleep(0.01)
    return client


def aggregated(*urls: str) -> str:
    return f"deployment=d,role=aggregated,engine=sim,model={MODEL},urls={';'.join(urls)}"


async def stream_lines(client: httpx.AsyncClient, body: dict[str, Any]) -> list[str]:
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        return [line async for line in response.aiter_lines() if line]


def series(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for item in family.samples:
            if item.name == name and all(item.labels.get(k) == v for k, v in labels.items()):
                total += item.value
    return total


async def metrics(client: httpx.AsyncClient) -> str:
    return (await admin(client).get("/metrics")).text


async def test_metrics_and_debug_pages_are_served_on_the_admin_port_only(
    servers: dict[str, Any],
) -> None:
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated(engine)))
    for path in ("/metrics", "/debug/replicas"):
        assert (await client.get(path)).status_code == 404, path
        assert (await admin(client).get(path)).status_code == 200, path
    assert (await admin(client).get("/health")).status_code == 200
    assert (await admin(client).post("/v1/completions", json={})).status_code in {404, 405}


async def test_a_stream_passes_through_timed_and_judged(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    client = await start_router(
        servers, config(aggregated(engine), slo=Slo(ttft_p95_ms=5_000.0, tpot_p95_ms=1_000.0))
    )
    lines = await stream_lines(
        client, {"model": MODEL, "prompt": "w " * 100, "max_tokens": 8, "stream": True}
    )
    assert lines[-1] == "data: [DONE]"
    tokens = [json.loads(line[6:]) for line in lines[:-1]]
    assert [t["choices"][0]["text"] for t in tokens] == [f" tok{i}" for i in range(1, 9)]
    assert all("usage" not in t for t in tokens)  # asked for upstream, not passed on
    text = await metrics(client)
    assert series(text, "inferfleet_router_requests_total", outcome="met") == 1
    assert series(text, "inferfleet_router_requests_total") == 1
    assert series(text, "inferfleet_router_output_tokens_total") == 8
    assert series(text, "inferfleet_router_prompt_tokens_total") == 100
    assert series(text, "inferfleet_router_prompt_tokens_squared_total") == 100**2
    assert series(text, "inferfleet_router_tpot_seconds_count") == 1
    assert series(text, "inferfleet_router_in_flight_requests") == 0

    asked = await stream_lines(
        client,
        {"prompt": "w", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert json.loads(asked[-2][6:])["usage"]["completion_tokens"] == 2
    whole = await client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert whole.status_code == 200
    assert whole.json()["usage"]["completion_tokens"] == 3
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


async def test_a_tight_slo_counts_misses_by_their_cause(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    client = await start_router(
        servers, config(aggregated(engine), slo=Slo(ttft_p95_ms=5_000.0, tpot_p95_ms=0.001))
    )
    await stream_lines(client, {"prompt": "w", "max_tokens": 4, "stream": True})
    assert (
        series(await metrics(client), "inferfleet_router_requests_total", outcome="missed_tpot")
        == 1
    )


async def test_prefill_hands_over_to_decode(servers: dict[str, Any]) -> None:
    prefill = await start_engine(servers, Role.PREFILL)
    decode = await start_engine(servers, Role.DECODE)
    client = await start_router(
        servers,
        config(
            f"deployment=d,role=prefill,engine=sim,model={MODEL},urls={prefill}",
            f"deployment=d,role=decode,engine=sim,model={MODEL},urls={decode}",
        ),
    )
    lines = await stream_lines(client, {"prompt": "w " * 300, "max_tokens": 5, "stream": True})
    assert len(lines) == 6
    text = await metrics(client)
    assert series(text, "inferfleet_router_upstream_seconds_count", role="prefill") == 1
    assert series(text, "inferfleet_router_upstream_seconds_count", role="decode") == 1
    async with httpx.AsyncClient() as direct:
        for url, role in ((prefill, "prefill"), (decode, "decode")):
            engine_metrics = (await direct.get(f"{url}/metrics")).text
            assert series(engine_metrics, "vllm:request_success_total") == 1, role


async def test_prompts_that_repeat_a_recent_prefix_are_counted_where_they_are_prefilled(
    servers: dict[str, Any],
) -> None:
    """A shared system prompt, then a new question each time: the router counts the leading
    blocks it saw before, once per request, in the pool that prefills (aggregated here, prefill
    in a disaggregated pair), whether or not the engines cache prefixes."""
    # 1,900 characters of system prompt and 200 of question: four blocks of 512 characters
    # are hashed, three of system prompt alone and one that holds the question.
    system = "You answer questions about the fleet. " * 50
    questions = [f"{topic}? " * 40 for topic in ("GPUs", "model", "SLO")]
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated(engine)))
    for question in questions:
        body = {"prompt": system + question[:200], "max_tokens": 2}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    text = await metrics(client)
    looked = series(text, "inferfleet_router_prefix_blocks_total", role="aggregated")
    seen = series(text, "inferfleet_router_prefix_blocks_seen_total", deployment="d")
    assert looked == 3 * 4
    assert seen == 2 * 3  # the first request saw nothing before it

    prefill = await start_engine(servers, Role.PREFILL)
    decode = await start_engine(servers, Role.DECODE)
    pair = await start_router(
        servers,
        config(
            f"deployment=d,role=prefill,engine=sim,model={MODEL},urls={prefill}",
            f"deployment=d,role=decode,engine=sim,model={MODEL},urls={decode}",
        ),
    )
    for question in questions[:2]:
        body = {"prompt": system + question[:200], "max_tokens": 2}
        assert (await pair.post("/v1/completions", json=body)).status_code == 200
    text = await metrics(pair)
    # Counted at the prefill call only, not again at the decode call.
    assert series(text, "inferfleet_router_prefix_blocks_total", role="prefill") == 2 * 4
    assert series(text, "inferfleet_router_prefix_blocks_seen_total", role="prefill") == 3
    assert series(text, "inferfleet_router_prefix_blocks_total", role="decode") == 0


async def test_no_healthy_replica_is_503_with_retry_after(servers: dict[str, Any]) -> None:
    client = await start_router(servers, config(aggregated("http://127.0.0.1:9"), retry_after_s=7))
    assert (await client.get("/health")).status_code == 503
    response = await client.post("/v1/completions", json={"prompt": "w"})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "7"
    assert response.json()["error"]["type"] == "ServiceUnavailableError"
    text = await metrics(client)
    assert series(text, "inferfleet_router_rejected_requests_total", reason="no_replica") == 1
    assert series(text, "inferfleet_router_requests_total") == 0


async def test_a_refused_call_goes_to_another_replica(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    busy = await start_scripted(servers, "busy")
    client = await start_router(servers, config(aggregated(busy, engine)))
    for _ in range(4):
        lines = await stream_lines(client, {"prompt": "w", "max_tokens": 2, "stream": True})
        assert lines[-1] == "data: [DONE]"
    text = await metrics(client)
    assert series(text, "inferfleet_router_requests_total", outcome="met") == 4
    assert series(text, "inferfleet_router_retries_total") >= 1
    assert series(text, "inferfleet_router_upstream_errors_total", kind="status") >= 1


async def test_when_every_replica_tried_fails_the_502_says_why_each_did(
    servers: dict[str, Any],
) -> None:
    """One replica answers 503, one is not listening: the client reads what went wrong with
    each, without their addresses."""
    busy = await start_scripted(servers, "busy")
    client = await start_router(servers, config(aggregated(busy, "http://127.0.0.1:9")))
    app_router = servers["routers"][-1].router
    for pooled in app_router.balancer.replicas[("d", Role.AGGREGATED)].values():
        pooled.healthy = True  # as if both had passed their last health check
    answer = await client.post("/v1/completions", json={"prompt": "w", "max_tokens": 2})
    assert answer.status_code == 502, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("every aggregated replica tried failed (2): "), message
    assert sorted(message.split(": ", 1)[1].split("; ")) == [
        "answered 503",
        "the call broke (ClientConnectorError)",
    ]
    assert "127.0.0.1" not in message


async def test_a_dead_replica_is_skipped_and_marked_down(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated("http://127.0.0.1:9", engine)))
    app_router = servers["routers"][-1].router
    dead = app_router.balancer.replicas[("d", Role.AGGREGATED)]["http://127.0.0.1:9"]
    dead.healthy = True  # as if it died after its last health check
    dead.outstanding_tokens = -(10**9)  # and looked like the best choice
    lines = await stream_lines(client, {"prompt": "w", "max_tokens": 2, "stream": True})
    assert lines[-1] == "data: [DONE]"
    assert not dead.healthy
    assert (
        series(await metrics(client), "inferfleet_router_upstream_errors_total", kind="connect")
        == 1
    )


@pytest.mark.parametrize("mode", ["cut", "die"])
async def test_a_stream_broken_after_it_started_ends_in_an_error_event(
    servers: dict[str, Any], mode: str
) -> None:
    upstream = await start_scripted(servers, mode)
    client = await start_router(servers, config(aggregated(upstream)))
    prompt = "w " * 400
    lines = await stream_lines(client, {"prompt": prompt, "max_tokens": 5, "stream": True})
    assert json.loads(lines[0][6:])["choices"][0]["text"] == " tok1"
    assert json.loads(lines[1][6:])["error"]["type"] == "BadGatewayError"
    assert lines[2:] == ["data: [DONE]"]
    text = await metrics(client)
    assert series(text, "inferfleet_router_requests_total", outcome="failed") == 1
    # The engine reported no usage: the mean prompt of the load counts the router's estimate
    # (characters / 4, rounded up, before any usage was seen), not a prompt of no tokens.
    estimate = len(prompt) // 4 + 1
    assert series(text, "inferfleet_router_prompt_tokens_total") == estimate
    assert series(text, "inferfleet_router_prompt_tokens_squared_total") == estimate**2
    assert series(text, "inferfleet_router_retries_total") == 0  # a token was sent: no retry


async def test_limits_and_refusals(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated(engine), max_request_bytes=1000))
    too_large = await client.post("/v1/completions", json={"prompt": "w " * 1000})
    assert too_large.status_code == 413
    bad = await client.post("/v1/completions", content=b"{not json")
    assert bad.status_code == 400
    other_model = await client.post("/v1/completions", json={"model": "gpt-9", "prompt": "w"})
    assert other_model.status_code == 404  # as the engines (and OpenAI's API) answer it
    assert f"served: {MODEL}" in other_model.json()["error"]["message"]
    text = await metrics(client)
    assert series(text, "inferfleet_router_requests_total") == 0  # refusals are not judged
    assert series(text, "inferfleet_router_rejected_requests_total", reason="too_large") == 1
    assert series(text, "inferfleet_router_rejected_requests_total", reason="bad_request") == 1
    assert series(text, "inferfleet_router_rejected_requests_total", reason="unknown_model") == 1
    async with httpx.AsyncClient() as direct:
        engine_metrics = (await direct.get(f"{engine}/metrics")).text
    assert series(engine_metrics, "vllm:request_success_total") == 0  # none reached it


async def test_past_its_limits_on_requests_or_bytes_held_the_router_says_503(
    servers: dict[str, Any],
) -> None:
    engine = await start_engine(servers)
    client = await start_router(
        servers, config(aggregated(engine), max_in_flight_requests=1, retry_after_s=3)
    )
    long = {"prompt": "w", "max_tokens": 5000, "stream": True}
    async with client.stream("POST", "/v1/completions", json=long) as streaming:
        async for _ in streaming.aiter_lines():
            break
        refused = await client.post("/v1/completions", json={"prompt": "w", "max_tokens": 1})
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "3"
    assert "1 requests" in refused.json()["error"]["message"]
    # What was held is given back once the router sees the stream's client gone.
    for _ in range(200):
        after = await client.post("/v1/completions", json={"prompt": "w", "max_tokens": 1})
        if after.status_code != 503:
            break
        await asyncio.sleep(0.01)
    assert after.status_code == 200
    small = await start_router(servers, config(aggregated(engine), max_in_flight_bytes=1000))
    assert (await small.post("/v1/completions", json={"prompt": "w " * 1000})).status_code == 503
    assert (await small.post("/v1/completions", json={"prompt": "w"})).status_code == 200
    text = await metrics(small)
    assert series(text, "inferfleet_router_rejected_requests_total", reason="overloaded") == 1


async def test_slow_clients_are_cut_off(servers: dict[str, Any]) -> None:
    """A body that does not arrive in time gets 408; a connection that never completes its
    request header is closed after the idle timeout."""
    engine = await start_engine(servers)
    await start_router(
        servers, config(aggregated(engine), body_read_timeout_s=0.2, idle_timeout_s=0.3)
    )
    port = servers["routers"][-1].port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt": '
    )
    answer = await asyncio.wait_for(reader.read(4096), 5.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n")  # and nothing more
    started = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(reader.read(4096), 5.0) == b""  # closed by the router
    assert asyncio.get_running_loop().time() - started < 2.0
    writer.close()


async def test_a_body_nested_past_the_parser_is_a_bad_request(servers: dict[str, Any]) -> None:
    client = await start_router(servers, config(aggregated(await start_engine(servers))))
    nested = await client.post("/v1/completions", content=b"[" * 100_000)
    assert nested.status_code == 400
    assert "nests deeper" in nested.json()["error"]["message"]


async def test_a_request_goes_to_a_deployment_that_serves_its_model(
    servers: dict[str, Any],
) -> None:
    """Two variants serving different names behind one service: each name reaches only its
    own; a request naming no model goes to either."""
    base = await start_engine(servers)
    tuned = await start_engine(servers, model="llama-tuned")
    client = await start_router(
        servers,
        config(
            f"deployment=base,role=aggregated,engine=sim,model={MODEL},urls={base}",
            f"deployment=tuned,role=aggregated,engine=sim,model=llama-tuned,urls={tuned}",
        ),
    )
    for model in [MODEL] * 3 + ["llama-tuned"] * 2 + [None] * 4:
        body = {"prompt": "w", "max_tokens": 2} | ({} if model is None else {"model": model})
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    text = await metrics(client)
    assert series(text, "inferfleet_router_requests_total", deployment="base") == 5
    assert series(text, "inferfleet_router_requests_total", deployment="tuned") == 4
    models = (await client.get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == sorted([MODEL, "llama-tuned"])


async def test_a_lora_adapters_name_reaches_the_deployment_that_serves_it(
    servers: dict[str, Any],
) -> None:
    """A deployment with adapters serves their names too; a name no deployment serves is a
    404 that lists what is served."""
    base = await start_engine(servers)
    tuned = await start_engine(servers, model="llama-tuned", adapters=("sql", "support"))
    client = await start_router(
        servers,
        config(
            f"deployment=base,role=aggregated,engine=sim,model={MODEL},urls={base}",
            f"deployment=tuned,role=aggregated,engine=sim,model=llama-tuned,urls={tuned},"
            "adapters=sql;support",
        ),
    )
    for _ in range(3):
        answer = await client.post(
            "/v1/completions", json={"model": "sql", "prompt": "w", "max_tokens": 2}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "sql"
    text = await metrics(client)
    assert series(text, "inferfleet_router_requests_total", deployment="tuned") == 3
    assert series(text, "inferfleet_router_requests_total", deployment="base") == 0
    unknown = await client.post("/v1/completions", json={"model": "other", "prompt": "w"})
    assert unknown.status_code == 404
    assert "sql" in unknown.text
    assert "support" in unknown.text
    models = (await client.get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == sorted([MODEL, "llama-tuned", "sql", "support"])


@pytest.mark.parametrize("asked", [10**300, 10**400])
async def test_a_huge_max_tokens_leaves_no_load_behind(servers: dict[str, Any], asked: int) -> None:
    """The engine refuses it; the router answers with that refusal (no 500), and the load it
    charged the replica is given back to the token."""
    engine = await start_engine(servers)
    backend = aggregated(engine) + ",context=8192"
    client = await start_router(servers, config(backend))
    for stream in (False, True):
        answer = await client.post(
            "/v1/completions", json={"prompt": "w", "max_tokens": asked, "stream": stream}
        )
        assert answer.status_code < 500, answer.text
    replicas = (await admin(client).get("/debug/replicas")).json()
    assert [(r["outstandingTokens"], r["inFlight"], r["healthy"]) for r in replicas] == [
        (0, 0, True)
    ]


@pytest.mark.parametrize("when", ["mid-stream", "after the last event"])
async def test_a_client_hanging_up_as_a_write_fails_is_not_the_replicas_failure(
    servers: dict[str, Any], when: str
) -> None:
    """Without handler cancellation the hang-up shows as a write to the client that fails,
    mid-stream or as the stream's end is written; the request is counted cancelled, the
    replica stays healthy and nothing counts failed."""
    if when == "mid-stream":
        engine, seen = await start_engine(servers), b"data: "
    else:
        engine, seen = await start_scripted(servers, "linger"), b"[DONE]"
    app = create_app(config(aggregated(engine)))
    runner = web.AppRunner(app, handler_cancellation=False, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    servers["runners"].append(runner)
    port = runner.addresses[0][1]
    router = app[ROUTER]
    for _ in range(200):
        if router.routable():
            break
        await asyncio.sleep(0.01)
    body = json.dumps({"prompt": "w", "max_tokens": 5000, "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await reader.readuntil(seen)
    writer.transport.abort()
    for _ in range(500):
        if router.metrics.registry.get_sample_value(
            "inferfleet_router_cancelled_requests_total", {"service": "chat", "deployment": "d"}
        ):
            break
        await asyncio.sleep(0.01)
    pages = web.AppRunner(create_admin_app(router))
    await pages.setup()
    await web.TCPSite(pages, "127.0.0.1", 0).start()
    servers["runners"].append(pages)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{pages.addresses[0][1]}") as client:
        text = (await client.get("/metrics")).text
        assert series(text, "inferfleet_router_cancelled_requests_total") == 1
        assert series(text, "inferfleet_router_requests_total") == 0
        assert series(text, "inferfleet_router_upstream_errors_total") == 0
        replicas = (await client.get("/debug/replicas")).json()
    assert [(r["healthy"], r["inFlight"], r["outstandingTokens"]) for r in replicas] == [
        (True, 0, 0)
    ]


async def test_a_client_that_hangs_up_is_counted_cancelled(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated(engine)))
    async with client.stream(
        "POST", "/v1/completions", json={"prompt": "w", "max_tokens": 2000, "stream": True}
    ) as response:
        async for _ in response.aiter_lines():
            break
    for _ in range(200):
        if series(await metrics(client), "inferfleet_router_cancelled_requests_total") == 1:
            break
        await asyncio.sleep(0.01)
    text = await metrics(client)
    assert series(text, "inferfleet_router_cancelled_requests_total") == 1
    assert series(text, "inferfleet_router_in_flight_requests") == 0


async def test_drain_says_503_and_lets_streams_finish(servers: dict[str, Any]) -> None:
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated(engine), drain_delay_s=0.3))
    server: RouterServer = servers["routers"][-1]
    body = {"prompt": "w", "max_tokens": 40, "stream": True}
    in_flight = asyncio.ensure_future(stream_lines(client, body))
    await asyncio.sleep(0.05)
    stopping = asyncio.ensure_future(server.stop())
    await asyncio.sleep(0.05)
    assert (await client.get("/health")).status_code == 503
    lines = await in_flight
    assert len(lines) == 41
    await stopping
    with pytest.raises(httpx.ConnectError):
        await client.get("/health")


async def test_arrivals_are_counted_as_they_arrive_not_when_they_end(
    servers: dict[str, Any],
) -> None:
    """The autoscaler's fast path: a request is an arrival (with its estimated prompt) while
    its answer is still streaming; only then is it a finished request."""
    engine = await start_engine(servers)
    client = await start_router(servers, config(aggregated(engine)))
    prompt = "w" * 399  # 400 characters or so: 100 tokens at 4 characters a token
    async with client.stream(
        "POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 400, "stream": True}
    ) as response:
        async for _ in response.aiter_lines():
            break
        text = await metrics(client)
        assert series(text, "inferfleet_router_arrivals_total", deployment="d") == 1
        assert series(text, "inferfleet_router_arrival_prompt_tokens_total") == 100
        assert series(text, "inferfleet_router_requests_total") == 0
        assert series(text, "inferfleet_router_in_flight_requests") == 1


async def test_engines_with_an_api_key_take_only_the_router_that_presents_it(
    servers: dict[str, Any], tmp_path: Any
) -> None:
    server = SimServer(
        create_engine(CONFIG, MODEL, api_key="engine-secret"), "127.0.0.1", 0, drain_timeout_s=1.0
    )
    servers["engines"].append(server)
    engine = f"http://127.0.0.1:{await server.start()}"
    body = {"model": MODEL, "prompt": "w", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=engine) as direct:
        # As vLLM with --api-key: /v1 needs the key, health and metrics do not.
        assert (await direct.post("/v1/completions", json=body)).status_code == 401
        wrong = {"Authorization": "Bearer guess"}
        assert (await direct.post("/v1/completions", json=body, headers=wrong)).status_code == 401
        assert (await direct.get("/health")).status_code == 200
        assert (await direct.get("/metrics")).status_code == 200
    key_file = tmp_path / "api-key"
    key_file.write_text("engine-secret\n")
    client = await start_router(servers, config(aggregated(engine) + f",keyfile={key_file}"))
    # The client's own Authorization (a tenant's key, say) never goes upstream: the router's
    # engine key does.
    answer = await client.post(
        "/v1/completions", json=body, headers={"Authorization": "Bearer tenant-key"}
    )
    assert answer.status_code == 200, answer.text
    # A router without the key is refused by the engine: never the client's fault, so the
    # client is told the replicas failed, not that its own key is wrong.
    keyless = await start_router(servers, config(aggregated(engine)))
    refused = await keyless.post("/v1/completions", json=body)
    assert refused.status_code == 502, refused.text
    assert refused.json()["error"]["message"] == (
        "every aggregated replica tried failed (1): refused the call (401)"
    )
    wrong_key = tmp_path / "wrong-key"
    wrong_key.write_text("guess\n")
    misconfigured = await start_router(
        servers, config(aggregated(engine) + f",keyfile={wrong_key}")
    )
    refused = await misconfigured.post("/v1/completions", json=body)
    assert refused.json()["error"]["message"] == (
        "every aggregated replica tried failed (1): refused the router's engine key (401)"
    )
    assert series(await metrics(keyless), "inferfleet_router_upstream_errors_total", kind="key")


async def _keyed_engine(servers: dict[str, Any], key: str) -> str:
    app = create_engine(CONFIG, MODEL, api_key=key)
    server = SimServer(app, "127.0.0.1", 0, drain_timeout_s=1.0)
    servers["engines"].append(server)
    return f"http://127.0.0.1:{await server.start()}"


async def _served(engine: str) -> float:
    async with httpx.AsyncClient(base_url=engine) as direct:
        return series((await direct.get("/metrics")).text, "vllm:request_success_total")


async def test_an_engine_key_rotates_without_a_router_restart_or_a_refused_request(
    servers: dict[str, Any], tmp_path: Any
) -> None:
    """A rotation mid-rollout: an engine started before it still takes the old key, one
    started after takes the new one; the router, not restarted, serves both."""
    before = await _keyed_engine(servers, "key-1")
    after = await _keyed_engine(servers, "key-2")
    key_file = tmp_path / "api-key"
    key_file.write_text("key-1\n")
    backend = aggregated(before, after) + f",keyfile={key_file}"
    client = await start_router(servers, config(backend, key_reload_s=0.05))
    body = {"model": MODEL, "prompt": "w", "max_tokens": 2}

    async def refused_keys() -> float:
        return series(await metrics(client), "inferfleet_router_upstream_errors_total", kind="key")

    # Until the Secret changes, the engine started with the new key refuses the router's, and
    # the call goes to the other replica: the client never sees the engine's 401.
    answers = [(await client.post("/v1/completions", json=body)).status_code for _ in range(8)]
    assert answers == [200] * 8, answers
    assert await refused_keys() > 0
    assert await _served(after) == 0
    # The kubelet updates the mounted Secret in place; the router reads it again.
    key_file.write_text("key-2\n")
    await asyncio.sleep(0.3)
    served_before, refused = await _served(before), await refused_keys()
    answers = [(await client.post("/v1/completions", json=body)).status_code for _ in range(12)]
    assert answers == [200] * 12, answers
    # Both served: the old engine took the key before the rotation, once the new was refused.
    assert await _served(before) > served_before
    assert await _served(after) > 0
    assert await refused_keys() > refused
    # A second rotation forgets the first key: the engine still on it serves no more.
    key_file.write_text("key-3\n")
    await asyncio.sleep(0.3)
    served_before = await _served(before)
    answers = [(await client.post("/v1/completions", json=body)).status_code for _ in range(8)]
    assert answers == [200] * 8, answers
    assert await _served(before) == served_before


def test_an_engine_key_file_that_cannot_be_read_later_keeps_the_keys_read_before(
    tmp_path: Any,
) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("key-1\n")
    keys = EngineKeys([parse_backend(aggregated("http://127.0.0.1:1") + f",keyfile={key_file}")])
    assert keys.keys("d") == ("key-1",)
    key_file.write_text("key-1\n")
    keys.load()
    assert keys.keys("d") == ("key-1",)  # unchanged: no second key
    key_file.write_text("")
    keys.load()
    assert keys.keys("d") == ("key-1",)
    key_file.unlink()
    keys.load()
    assert keys.keys("d") == ("key-1",)
    key_file.write_bytes(b"\xff\xfe")  # not UTF-8
    keys.load()
    key_file.write_text("two\nlines")  # no header can carry it
    keys.load()
    assert keys.keys("d") == ("key-1",)
    key_file.write_text("key-2")
    keys.load()
    assert keys.keys("d") == ("key-2", "key-1")
    assert keys.keys("other") == ()


def test_an_engine_key_file_that_cannot_be_read_is_a_configuration_error(tmp_path: Any) -> None:
    missing = parse_backend(aggregated("http://127.0.0.1:1") + f",keyfile={tmp_path}/none")
    with pytest.raises(RouterConfigError, match="cannot read its engine key"):
        engine_keys([missing])
    (tmp_path / "empty").write_text("\n")
    empty = parse_backend(aggregated("http://127.0.0.1:1") + f",keyfile={tmp_path}/empty")
    with pytest.raises(RouterConfigError, match="engine key is empty"):
        engine_keys([empty])
