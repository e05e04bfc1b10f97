"""The engine emulator over real HTTP: OpenAI bodies and streams, timing, metrics, errors,
disconnects, the prefill/decode hand-off, shutdown and hundreds of concurrent streams."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import Role
from inferfleet.planning.memory import KV_BLOCK_TOKENS, kv_bytes_per_token_replica
from inferfleet.planning.performance import decode_step_seconds, prefill_seconds
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.kv_cache import blocks_for
from inferfleet.sim.openai_api import CHAT_TOKENS_PER_MESSAGE, SimServer, create_app
from inferfleet.sim.scheduler import EngineCore, EngineRequest
from tests.unit.planning_fixtures import replica

MODEL = "llama-3.1-8b"
CONFIG = replica(MODEL, GpuType.H200_141GB)


@dataclass
class Running:
    server: SimServer
    url: str
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    def client(self, timeout: float = 10.0) -> httpx.AsyncClient:
        # Plain HTTP: verify=False spares each client loading the CA bundle.
        client = httpx.AsyncClient(base_url=self.url, timeout=timeout, verify=False)
        self.clients.append(client)
        return client


StartEngine = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_engine() -> AsyncIterator[StartEngine]:
    running: list[Running] = []

    async def start(
        role: Role = Role.AGGREGATED,
        config: ReplicaConfig = CONFIG,
        drain_timeout_s: float = 2.0,
        **options: Any,
    ) -> Running:
        server = SimServer(
            create_app(config, MODEL, role, **options),
            "127.0.0.1",
            0,
            drain_timeout_s=drain_timeout_s,
        )
        port = await server.start()
        running.append(Running(server, f"http://127.0.0.1:{port}"))
        return running[-1]

    yield start
    for item in running:
        for client in item.clients:
            await client.aclose()
        await item.server.stop()


def words(count: int) -> str:
    return " ".join(["w"] * count)


@dataclass
class Streamed:
    chunks: list[dict[str, Any]]
    times: list[float]
    """When each chunk arrived, from the request's start."""
    done: bool
    """`data: [DONE]` came last."""
    headers: httpx.Headers


async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Streamed:
    chunks: list[dict[str, Any]] = []
    times: list[float] = []
    done = False
    started = time.perf_counter()
    async with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            assert not done, "nothing may follow [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            chunks.append(json.loads(line.removeprefix("data: ")))
            times.append(time.perf_counter() - started)
        return Streamed(chunks, times, done, response.headers)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus exposition."""
    for family in text_string_to_metric_families(text):
        for item in family.samples:
            if item.name == name and all(item.labels.get(k) == v for k, v in labels.items()):
                return float(item.value)
    raise AssertionError(f"no sample {name}{labels}")


async def scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


# Bodies and streams.


async def test_completion_stream_emits_exactly_max_tokens_then_done(
    start_engine: StartEngine,
) -> None:
    client = (await start_engine()).client()
    result = await stream(
        client,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": words(50),
            "max_tokens": 12,
            "stream_options": {"include_usage": True},
        },
    )
    assert result.headers["content-type"].startswith("text/event-stream")
    assert result.done
    *tokens, usage = result.chunks
    assert [chunk["choices"][0]["text"] for chunk in tokens] == [f" tok{i}" for i in range(1, 13)]
    assert [chunk["choices"][0]["finish_reason"] for chunk in tokens] == [None] * 11 + ["length"]
    assert {chunk["id"] for chunk in result.chunks} == {tokens[0]["id"]}
    assert tokens[0]["id"].startswith("cmpl-")
    assert all(chunk["object"] == "text_completion" for chunk in result.chunks)
    assert all(chunk["model"] == MODEL for chunk in result.chunks)
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62}


async def test_chat_stream_opens_with_the_role_and_streams_content(
    start_engine: StartEngine,
) -> None:
    client = (await start_engine()).client()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "three words here"}]},
    ]
    result = await stream(
        client,
        "/v1/chat/completions",
        {"messages": messages, "max_completion_tokens": 4, "stream_options": {}},
    )
    assert result.done
    role, *tokens = result.chunks
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [chunk["choices"][0]["delta"]["content"] for chunk in tokens] == [
        " tok1",
        " tok2",
        " tok3",
        " tok4",
    ]
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in chunk for chunk in result.chunks)  # include_usage not asked


async def test_non_streaming_bodies_carry_text_and_usage(start_engine: StartEngine) -> None:
    client = (await start_engine()).client()
    completion = (
        await client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(40))})
    ).json()
    assert completion["object"] == "text_completion"
    assert completion["id"].startswith("cmpl-")
    assert isinstance(completion["created"], int)
    assert completion["model"] == MODEL
    [choice] = completion["choices"]
    # vLLM's default max_tokens for completions is 16; a token-id prompt counts its ids.
    assert choice["text"] == "".join(f" tok{i}" for i in range(1, 17))
    assert choice["finish_reason"] == "length"
    assert completion["usage"] == {"prompt_tokens": 40, "completion_tokens": 16, "total_tokens": 56}
    assert completion["kv_transfer_params"] is None

    messages = [{"role": "user", "content": words(7)}]
    chat = (
        await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3})
    ).json()
    assert chat["object"] == "chat.completion"
    assert chat["id"].startswith("chatcmpl-")
    [choice] = chat["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == " tok1 tok2 tok3"
    assert choice["finish_reason"] == "length"
    prompt = 7 + CHAT_TOKENS_PER_MESSAGE
    assert chat["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 3,
        "total_tokens": prompt + 3,
    }


async def test_models_and_health(start_engine: StartEngine) -> None:
    client = (await start_engine()).client()
    health = await client.get("/health")
    assert health.status_code == 200
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    [model] = models["data"]
    assert model["id"] == MODEL
    assert model["object"] == "model"
    assert model["max_model_len"] == CONFIG.context_limit


# Timing.


async def test_idle_request_timing_follows_the_roofline_model(start_engine: StartEngine) -> None:
    running = await start_engine()
    client = running.client()
    await client.get("/health")  # connect first: only the request's own latency counts
    prompt, output = 2000, 20
    result = await stream(
        client, "/v1/completions", {"prompt": words(prompt), "max_tokens": output}
    )
    assert len(result.chunks) == output

    expected_ttft = prefill_seconds(CONFIG, prompt)
    metrics = running.server.engine.metrics
    assert metrics.ttft.count == 1
    # The engine's TTFT: its wake-up (queue time), then the modelled prefill step, handed out
    # as late as the timer overshoots (about a millisecond on a quiet machine; the lateness
    # of all steps bounds the first one's). Never before the model.
    assert metrics.ttft.total == pytest.approx(metrics.queue.total + metrics.prefill.total)
    assert expected_ttft <= metrics.prefill.total <= expected_ttft + metrics.late_seconds + 1e-6
    assert metrics.ttft.total - expected_ttft < 0.03  # generous for a busy shared CI machine
    # The client's TTFT adds the HTTP round trip through httpx.
    assert metrics.ttft.total <= result.times[0] <= metrics.ttft.total + 0.05

    # Token k (k >= 2) comes from a decode step over a context of prompt + k - 1 tokens.
    expected_gap = sum(
        decode_step_seconds(CONFIG, 1, prompt + k - 1) for k in range(2, output + 1)
    ) / (output - 1)
    mean_gap = (result.times[-1] - result.times[0]) / (output - 1)
    assert mean_gap == pytest.approx(expected_gap, abs=0.002)


# Metrics.


VLLM_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_decode_time_seconds_count",
    "vllm:request_inference_time_seconds_count",
    "vllm:request_prompt_tokens_count",
    "vllm:request_generation_tokens_count",
    "vllm:iteration_tokens_total_count",
)


async def test_metrics_use_vllm_names_labels_and_buckets_and_count_right(
    start_engine: StartEngine,
) -> None:
    client = (await start_engine()).client()
    before = await scrape(client)
    for name in VLLM_SERIES:
        assert sample(before, name, model_name=MODEL, engine="0") == 0
    # vLLM's TTFT buckets, in its order.
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name=' in before
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="2560.0",model_name=' in before
    assert 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="7680.0",model_name=' in before

    requests = [(30, 5), (60, 8), (90, 3)]
    await asyncio.gather(
        *(
            client.post("/v1/completions", json={"prompt": words(prompt), "max_tokens": output})
            for prompt, output in requests
        )
    )
    after = await scrape(client)
    labels = {"model_name": MODEL, "engine": "0"}
    assert sample(after, "vllm:prompt_tokens_total", **labels) == sum(p for p, _ in requests)
    assert sample(after, "vllm:generation_tokens_total", **labels) == sum(o for _, o in requests)
    assert sample(after, "vllm:time_to_first_token_seconds_count", **labels) == len(requests)
    assert sample(after, "vllm:e2e_request_latency_seconds_count", **labels) == len(requests)
    assert sample(after, "vllm:inter_token_latency_seconds_count", **labels) == sum(
        o - 1 for _, o in requests
    )
    assert sample(after, "vllm:request_generation_tokens_sum", **labels) == 16
    assert sample(after, "vllm:request_success_total", finished_reason="length", **labels) == 3
    assert sample(after, "vllm:request_success_total", finished_reason="abort", **labels) == 0
    assert sample(after, "vllm:num_requests_running", **labels) == 0
    assert sample(after, "vllm:kv_cache_usage_perc", **labels) == 0
    assert sample(after, "vllm:cache_config_info", block_size=str(KV_BLOCK_TOKENS)) == 1


async def test_prefix_hashes_drive_prefix_cache_hits(start_engine: StartEngine) -> None:
    client = (await start_engine()).client()
    body = {
        "prompt": words(1024),
        "max_tokens": 2,
        "inferfleet": {"prefix_hashes": [7, 8], "hash_block_tokens": 512},
    }
    for _ in range(2):
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    metrics = await scrape(client)
    assert sample(metrics, "vllm:prefix_cache_queries_total") == 2 * 1024
    # The second request finds every block but the last (vLLM recomputes the last token).
    assert sample(metrics, "vllm:prefix_cache_hits_total") == (1024 - 1) // KV_BLOCK_TOKENS * 16


# Errors.


BAD_REQUESTS: list[tuple[str, str, object, int, str]] = [
    ("not JSON", "/v1/completions", b"{nope", 400, "invalid JSON"),
    ("not an object", "/v1/completions", [1, 2], 400, "JSON object"),
    ("another model", "/v1/completions", {"model": "gpt-9", "prompt": "hi"}, 404, "gpt-9"),
    ("zero max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "at least 1"),
    (
        "max_tokens not an int",
        "/v1/completions",
        {"prompt": "hi", "max_tokens": "3"},
        400,
        "integer",
    ),
    ("no prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("empty prompt", "/v1/completions", {"prompt": "  ", "max_tokens": 3}, 400, "empty"),
    ("batch of prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "batched"),
    ("n > 1", "/v1/completions", {"prompt": "hi", "n": 2}, 400, "n=1"),
    (
        "stream_options without stream",
        "/v1/completions",
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        400,
        "stream=True",
    ),
    (
        "prompt past the context",
        "/v1/completions",
        {"prompt": list(range(CONFIG.context_limit))},
        400,
        "maximum context length",
    ),
    (
        "prompt and output past the context",
        "/v1/completions",
        {"prompt": list(range(CONFIG.context_limit - 10)), "max_tokens": 11},
        400,
        "maximum context length",
    ),
    ("no messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    (
        "bad prefix hashes",
        "/v1/completions",
        {"prompt": "hi", "inferfleet": {"prefix_hashes": ["x"]}},
        400,
        "prefix_hashes",
    ),
    (
        "more KV than the replica has",
        "/v1/completions",
        {"prompt": words(100), "max_tokens": 100},
        400,
        "exceed the KV cache",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
async def test_bad_requests_get_vllm_error_bodies(
    start_engine: StartEngine, path: str, body: object, status: int, message: str
) -> None:
    # A 10-block KV cache (160 tokens) makes the scheduler reject the last case.
    client = (await start_engine(kv_capacity_blocks=10)).client()
    if isinstance(body, bytes):
        response = await client.post(path, content=body)
    else:
        response = await client.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert message in error["message"]
    # The engine still serves.
    ok = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


# Disconnects and shutdown.


async def wait_for(condition: Callable[[], Awaitable[bool]], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_client_disconnect_aborts_the_request(start_engine: StartEngine) -> None:
    running = await start_engine()
    client, observer = running.client(), running.client()
    body = {"prompt": words(500), "max_tokens": 5000, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.aiter_lines()
        received = 0
        while received < 3:
            if (await anext(lines)).startswith("data: {"):
                received += 1
        metrics = await scrape(observer)
        assert sample(metrics, "vllm:num_requests_running") == 1
        assert sample(metrics, "vllm:kv_cache_usage_perc") > 0
    # Leaving the block unread closes the connection.

    async def aborted() -> bool:
        metrics = await scrape(observer)
        return sample(metrics, "vllm:request_success_total", finished_reason="abort") == 1

    await wait_for(aborted)
    metrics = await scrape(observer)
    assert sample(metrics, "vllm:num_requests_running") == 0
    assert sample(metrics, "vllm:num_requests_waiting") == 0
    assert sample(metrics, "vllm:kv_cache_usage_perc") == 0
    assert sample(metrics, "vllm:generation_tokens_total") < 5000


async def test_non_streaming_client_timeout_aborts_too(start_engine: StartEngine) -> None:
    running = await start_engine()
    impatient, observer = running.client(timeout=0.05), running.client()
    with pytest.raises(httpx.ReadTimeout):
        await impatient.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5000})

    async def idle() -> bool:
        metrics = await scrape(observer)
        return sample(metrics, "vllm:num_requests_running") == 0

    await wait_for(idle)
    assert running.server.engine.stats().kv_usage == 0


async def test_graceful_shutdown_finishes_in_flight_requests(start_engine: StartEngine) -> None:
    running = await start_engine(drain_timeout_s=5.0)
    client = running.client()
    pending = asyncio.create_task(
        stream(client, "/v1/completions", {"prompt": words(20), "max_tokens": 30})
    )
    await wait_for(lambda: asyncio.sleep(0, running.server.engine.in_flight == 1))
    await running.server.stop()
    result = await pending
    assert result.done
    assert len(result.chunks) == 30
    with pytest.raises(httpx.ConnectError):
        await running.client().get("/health")


async def test_shutdown_past_the_drain_timeout_aborts(start_engine: StartEngine) -> None:
    running = await start_engine(drain_timeout_s=0.05)
    client = running.client()
    pending = asyncio.create_task(
        client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5000})
    )
    await wait_for(lambda: asyncio.sleep(0, running.server.engine.in_flight == 1))
    started = time.monotonic()
    await running.server.stop()
    assert time.monotonic() - started < 1.0
    with pytest.raises(httpx.HTTPError):
        await pending
    engine = running.server.engine
    assert engine.in_flight == 0
    assert engine.stats().running == 0
    assert engine.metrics.finished["abort"] == 1


async def test_a_failing_engine_loop_fails_requests_and_health(
    start_engine: StartEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = await start_engine()
    client = running.client()

    def broken(now: float) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(running.server.engine.core, "step", broken)
    response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "InternalServerError"
    assert (await client.get("/health")).status_code == 503


# Disaggregated prefill.


async def test_prefill_decode_hand_off_across_two_engines(start_engine: StartEngine) -> None:
    link = 1e9  # bytes/s: slow enough that the transfer is clearly visible in the TTFT
    prefill = await start_engine(Role.PREFILL)
    decode = await start_engine(Role.DECODE, kv_transfer_bytes_per_s=link)
    to_prefill, to_decode = prefill.client(), decode.client()
    prompt, output = 512, 10
    original = {"model": MODEL, "prompt": words(prompt), "max_tokens": output}

    # Either role refuses requests that skip the hand-off.
    for client in (to_prefill, to_decode):
        refused = await client.post("/v1/completions", json=original)
        assert refused.status_code == 400
        assert "kv_transfer_params" in refused.json()["error"]["message"]

    # The router's prefill call, as vLLM's disaggregated proxy makes it.
    prefill_body = {
        **original,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    answer = (await to_prefill.post("/v1/completions", json=prefill_body)).json()
    assert answer["choices"][0]["text"] == " tok1"
    assert answer["usage"]["completion_tokens"] == 1
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    assert params["do_remote_decode"] is False
    assert len(params["remote_block_ids"]) == blocks_for(prompt)
    assert {"remote_engine_id", "remote_host", "remote_port"} <= params.keys()

    # The decode call: the original request with the prefill's parameters.
    await to_decode.get("/health")
    result = await stream(to_decode, "/v1/completions", {**original, "kv_transfer_params": params})
    assert result.done
    assert [chunk["choices"][0]["text"] for chunk in result.chunks] == [
        f" tok{i}" for i in range(1, output + 1)
    ]
    transfer_s = prompt * kv_bytes_per_token_replica(CONFIG) / link
    first_step_s = decode_step_seconds(CONFIG, 1, prompt)  # recomputes the last prompt token
    assert transfer_s + first_step_s <= result.times[0] <= transfer_s + first_step_s + 0.05

    # Each engine has its own registry: the prefill one generated one token, the decode one all.
    prefill_metrics, decode_metrics = await scrape(to_prefill), await scrape(to_decode)
    assert sample(prefill_metrics, "vllm:generation_tokens_total") == 1
    assert sample(prefill_metrics, "vllm:prompt_tokens_total") == prompt
    assert sample(decode_metrics, "vllm:generation_tokens_total") == output
    assert sample(decode_metrics, "vllm:kv_cache_usage_perc") == 0


# Load.


def ideal_seconds(config: ReplicaConfig, count: int, prompt: int, output: int) -> float:
    """How long the modelled engine takes for `count` requests arriving together."""
    core = EngineCore(config)
    for index in range(count):
        core.add_request(EngineRequest(str(index), prompt, output))
    now = 0.0
    while core.has_work:
        now += core.step(now).duration_s
    return now


SERVER_PROCESS = f"""
import asyncio
from inferfleet.api.catalog import GpuCatalog, GpuType, catalog_models
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.openai_api import serve

gpu = GpuType.H200_141GB
model = catalog_models()["{MODEL}"]
config = ReplicaConfig(model=model, gpu_type=gpu, gpu=GpuCatalog.builtin()[gpu])
ready = lambda port: print(port, flush=True)
asyncio.run(serve(config, "{MODEL}", host="127.0.0.1", port=0, on_ready=ready))
"""


async def test_hundreds_of_concurrent_streams_in_real_time(
    record_property: Callable[[str, object], None],
) -> None:
    # The server runs in its own process, started as a deployment would (`serve`, stopped by
    # SIGTERM), so that the figures measure the emulator rather than the test's HTTP clients.
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER_PROCESS, stdout=asyncio.subprocess.PIPE
    )
    running = Running(cast(SimServer, None), "")
    try:
        assert process.stdout is not None
        port = int(await asyncio.wait_for(process.stdout.readline(), timeout=10))
        running.url = f"http://127.0.0.1:{port}"
        await stream_concurrently(running, record_property)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=5) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        for client in running.clients:
            await client.aclose()


async def stream_concurrently(
    running: Running, record_property: Callable[[str, object], None]
) -> None:
    count, prompt, output = 200, 100, 32
    # One client per stream: httpx's shared pool costs far more CPU than the server with
    # hundreds of connections.
    clients = [running.client(timeout=30) for _ in range(count)]
    await asyncio.gather(*(client.get("/health") for client in clients))
    before = await scrape(clients[0])
    body = {"prompt": words(prompt), "max_tokens": output, "stream": True}

    async def one(client: httpx.AsyncClient) -> int:
        tokens = 0
        done = False
        async with client.stream("POST", "/v1/completions", json=body) as response:
            async for chunk in response.aiter_bytes():
                tokens += chunk.count(b'data: {"id"')
                done = done or b"data: [DONE]" in chunk
        assert done
        return tokens

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(client) for client in clients))
    wall = time.perf_counter() - started
    assert counts == [output] * count
    after = await scrape(clients[0])

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("vllm:generation_tokens_total") == count * output
    assert delta("vllm:request_success_total", finished_reason="length") == count
    steps = delta("vllm:iteration_tokens_total_count")
    figures = {
        "wall_s": round(wall, 3),
        "ideal_s": round(ideal_seconds(CONFIG, count, prompt, output), 3),
        "modelled_busy_s": round(delta("inferfleet_sim_step_seconds_total"), 3),
        "steps": steps,
        "mean_late_ms": round(1000 * delta("inferfleet_sim_late_seconds_total") / steps, 2),
        "schedule_resets": delta("inferfleet_sim_schedule_resets_total"),
        "mean_e2e_s": round(delta("vllm:e2e_request_latency_seconds_sum") / count, 3),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"{count} streams x {output} tokens: {figures}")
    # Loose: the test's clients share this machine's cores with the server.
    assert wall < 3 * figures["ideal_s"] + 1.0


async def test_lora_adapters_are_served_by_name_beside_the_base_model(
    start_engine: StartEngine,
) -> None:
    """As vLLM with --lora-modules: /v1/models lists each adapter with the base model as its
    parent, a request naming an adapter is answered under that name, another name is a 404."""
    client = (await start_engine(adapters=["sql-assistant", "support-triage"])).client()
    models = (await client.get("/v1/models")).json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [
        (MODEL, None),
        ("sql-assistant", MODEL),
        ("support-triage", MODEL),
    ]
    for stream in (False, True):
        answer = await client.post(
            "/v1/completions",
            json={"model": "sql-assistant", "prompt": "hi", "max_tokens": 2, "stream": stream},
        )
        assert answer.status_code == 200
        assert '"model":"sql-assistant"' in answer.text.replace(" ", "")
    missing = await client.post("/v1/completions", json={"model": "sql", "prompt": "hi"})
    assert missing.status_code == 404
