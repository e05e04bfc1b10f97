"""The open-loop load generator: prompts and bodies, every failure kind against a scripted
server, and a replay against the engine emulator checked against the engine's own model and
metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from inferfleet.api.catalog import GpuType
from inferfleet.bench.loadgen import (
    BenchmarkError,
    LoadGenerator,
    Progress,
    PromptBuilder,
    run_benchmark,
)
from inferfleet.bench.loadgen import serve_benchmark as serve
from inferfleet.bench.report import (
    ERROR_CONNECT,
    ERROR_DROPPED,
    ERROR_INCOMPLETE,
    ERROR_STREAM,
    ERROR_TIMEOUT,
    ERROR_UNFINISHED,
)
from inferfleet.bench.traces import Uniform, poisson
from inferfleet.planning.performance import prefill_seconds
from inferfleet.sim.openai_api import SimServer, completion_prompt_tokens, create_app
from inferfleet.sim.workload import TraceRequest
from inferfleet.slo import Slo
from inferfleet.streaming import is_plain_token
from tests.unit.planning_fixtures import replica

MODEL = "llama-3.1-8b"
CONFIG = replica(MODEL, GpuType.H200_141GB)


# Prompts and bodies.


def test_prompts_have_exactly_the_requested_words() -> None:
    builder = PromptBuilder(5_000)
    for tokens in (1, 2, 511, 512, 513, 4_999, 5_000):
        prompt = builder.prompt(TraceRequest(0.0, tokens, 1), key=tokens)
        assert completion_prompt_tokens(prompt) == tokens
        assert prompt == prompt.strip()
    # Without hashes each prompt starts with a word of its own: no shared prefix.
    one, two = (builder.prompt(TraceRequest(0.0, 600, 1), key=key) for key in (1, 2))
    assert one.split()[0] != two.split()[0]


def test_equal_prefix_hashes_give_equal_blocks_of_words() -> None:
    builder = PromptBuilder(4_096)
    first = builder.prompt(TraceRequest(0.0, 1_000, 1, (10, 11), 512), key=1).split()
    second = builder.prompt(TraceRequest(0.0, 1_300, 1, (10, 12, 13), 512), key=2).split()
    assert (len(first), len(second)) == (1_000, 1_300)
    assert first[:512] == second[:512]  # block 10 shared
    assert first[512:1000] != second[512:1000]
    # Hashes covering fewer tokens than the prompt: the rest is filled in.
    short = builder.prompt(TraceRequest(0.0, 700, 1, (10,), 512), key=3).split()
    assert len(short) == 700
    assert short[:512] == first[:512]


def body_of(generator: LoadGenerator, request: TraceRequest) -> dict[str, Any]:
    generator._prompts = PromptBuilder(request.input_tokens)
    parsed = json.loads(generator._body(request, 0))
    assert isinstance(parsed, dict)
    return parsed


def test_request_body_streams_with_usage_and_the_vendor_extension() -> None:
    generator = LoadGenerator("http://x/v1/", model="m", extra_body={"temperature": 0})
    assert generator.url == "http://x/v1/completions"
    assert LoadGenerator("http://x:8000", model="m").url == "http://x:8000/v1/completions"
    body = body_of(generator, TraceRequest(0.0, 700, 33, (4, 5), 512))
    assert body["model"] == "m"
    assert body["max_tokens"] == 33
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True
    assert body["temperature"] == 0
    assert body["inferfleet"] == {"prefix_hashes": [4, 5], "hash_block_tokens": 512}
    assert completion_prompt_tokens(body["prompt"]) == 700
    assert "inferfleet" not in body_of(generator, TraceRequest(0.0, 10, 1))
    quiet = LoadGenerator("http://x", model="m", send_prefix_hashes=False)
    assert "inferfleet" not in body_of(quiet, TraceRequest(0.0, 600, 1, (4, 5)))


@pytest.mark.parametrize(
    ("payload", "plain"),
    [
        (b'{"id":"x","choices":[{"index":0,"text":" tok1","finish_reason":null}]}', True),
        (b'{"choices":[{"delta":{"content":" hi"}}]}', True),
        (b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', False),
        (b'{"choices":[{"text":"","finish_reason":"length"}]}', False),
        (b'{"choices":[{"text":" a"}],"usage":{"completion_tokens":3}}', False),
        (b'{"error":{"message":"x"}}', False),
        (b'{"choices": [{"text": " spaced"}]}', False),  # not compact: decoded instead
        (b'{"choices":[{"text":" said \\"error\\""}]}', True),
    ],
)
def test_plain_token_chunks_are_told_without_decoding(payload: bytes, plain: bool) -> None:
    assert is_plain_token(payload) is plain


# Failures, against a scripted server.


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def token(index: int) -> bytes:
    return event({"choices": [{"index": 0, "text": f" tok{index}", "finish_reason": None}]})


async def scripted(request: web.Request) -> web.StreamResponse:
    """`/<mode>/v1/completions`: a server that behaves as `mode` says."""
    mode = request.match_info["mode"]
    body = await request.json()
    if mode == "error500":
        error = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
        return web.json_response(error, status=500)
    if mode == "slow":
        await asyncio.sleep(5)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if mode == "hold":
        await asyncio.sleep(0.3)
    if mode == "crlf":
        # CRLF framing, two tokens in one event write, no usage chunk: tokens are counted.
        await response.write((token(1) + token(2)).replace(b"\n", b"\r\n"))
        await response.write(b": keep-alive comment\r\n\r\n" + b"data: [DONE]\r\n\r\n")
        return response
    await response.write(token(1))
    if mode == "stream-error":
        await response.write(event({"error": {"message": "engine failed", "code": 500}}))
    elif mode == "cut":
        pass  # the stream ends with no [DONE]
    else:
        for index in range(2, body["max_tokens"] + 1):
            await response.write(token(index))
        usage = {"prompt_tokens": 1, "completion_tokens": body["max_tokens"], "total_tokens": 2}
        await response.write(event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    return response


def scripted_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/{mode}/v1/completions", scripted)
    return app


@pytest.fixture
async def scripted_url() -> AsyncIterator[str]:
    runner = web.AppRunner(scripted_app(), handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def run_one(base_url: str, output_tokens: int = 3, **options: Any) -> Any:
    drain_s = options.pop("drain_s", 5.0)
    generator = LoadGenerator(base_url, model="m", **options)
    run = await generator.run([TraceRequest(0.0, 5, output_tokens)], drain_s=drain_s)
    [result] = run.results
    return result


async def test_a_good_stream_is_timed_per_token(scripted_url: str) -> None:
    result = await run_one(f"{scripted_url}/ok", output_tokens=4)
    assert result.ok
    assert (result.tokens, result.chunks, len(result.gaps)) == (4, 4, 3)
    assert result.http_status == 200
    assert result.sent_s <= result.first_token_s <= result.last_token_s <= result.end_s


async def test_crlf_framing_comments_and_no_usage(scripted_url: str) -> None:
    result = await run_one(f"{scripted_url}/crlf")
    assert result.ok
    assert (result.tokens, result.chunks) == (2, 2)
    assert list(result.gaps) == [0.0]  # both tokens arrived in one read


@pytest.mark.parametrize(
    ("mode", "options", "kind", "detail"),
    [
        ("error500", {}, "http_500", "boom"),
        ("stream-error", {}, ERROR_STREAM, "engine failed"),
        ("cut", {}, ERROR_INCOMPLETE, "[DONE]"),
        ("slow", {"request_timeout_s": 0.2}, ERROR_TIMEOUT, "0.2 s"),
        ("slow", {"drain_s": 0.2}, ERROR_UNFINISHED, "benchmark ended"),
    ],
)
async def test_each_failure_is_recorded_by_kind(
    scripted_url: str, mode: str, options: dict[str, Any], kind: str, detail: str
) -> None:
    result = await run_one(f"{scripted_url}/{mode}", **options)
    assert result.error == kind
    assert detail in (result.error_detail or "")
    assert not result.ok


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = await run_one(f"http://127.0.0.1:{port}", connect_timeout_s=2.0)
    assert result.error == ERROR_CONNECT


async def test_the_in_flight_cap_drops_at_the_client_and_never_waits(scripted_url: str) -> None:
    generator = LoadGenerator(f"{scripted_url}/hold", model="m", max_in_flight=2)
    requests = [TraceRequest(0.01 * index, 5, 2) for index in range(4)]
    seen: list[Progress] = []
    run = await generator.run(requests, progress=seen.append, progress_every_s=0.1)
    assert [result.error for result in run.results] == [None, None, ERROR_DROPPED, ERROR_DROPPED]
    assert run.client.peak_in_flight == 2
    # Open loop: the dropped ones were not sent late either, just not at all.
    assert all(result.sent_s is None for result in run.results[2:])
    final = seen[-1]
    assert (final.scheduled, final.sent, final.completed, final.failed) == (4, 2, 2, 2)
    assert final.in_flight == 0
    # Simultaneous arrivals meet the cap too.
    burst = await generator.run([TraceRequest(0.0, 5, 2)] * 5)
    assert [result.error for result in burst.results] == [None] * 2 + [ERROR_DROPPED] * 3


async def test_the_duration_bounds_what_is_sent(scripted_url: str) -> None:
    generator = LoadGenerator(f"{scripted_url}/ok", model="m")
    requests = [TraceRequest(0.05 * index, 5, 2) for index in range(10)]
    run = await generator.run(requests, duration_s=0.22)
    assert len(run.results) == 5  # arrivals 0.0 .. 0.2
    assert all(result.ok for result in run.results)


@pytest.fixture
def threaded_server() -> Iterator[str]:
    """The scripted server on a loop of its own, for the blocking entry point."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(scripted_app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


def test_run_benchmark_blocks_and_writes_the_report(threaded_server: str, tmp_path: Path) -> None:
    requests = [TraceRequest(0.01 * index, 5, 3) for index in range(5)]
    report = run_benchmark(
        f"{threaded_server}/ok", requests, model="m", out_dir=tmp_path, plots=False
    )
    assert report.completed == 5
    assert json.loads((tmp_path / "report.json").read_text())["completed"] == 5
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 5
    assert not (tmp_path / "bench_latency.png").exists()


async def test_serve_benchmark_refuses_an_unreachable_server_before_the_run() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(BenchmarkError, match="cannot reach"):
        await serve(f"http://127.0.0.1:{port}", [TraceRequest(0.0, 5, 1)], model="m")


# Against the engine emulator.


async def test_serve_benchmark_refuses_a_model_the_server_does_not_list() -> None:
    server = SimServer(create_app(CONFIG, MODEL), "127.0.0.1", 0, drain_timeout_s=0.1)
    url = f"http://127.0.0.1:{await server.start()}"
    try:
        with pytest.raises(BenchmarkError, match=f"does not serve model 'gpt-9'.*{MODEL}"):
            await serve(url, [TraceRequest(0.0, 5, 1)], model="gpt-9")
    finally:
        await server.stop()


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name} in the engine's metrics")


async def test_open_loop_replay_against_the_engine_emulator(tmp_path: Path) -> None:
    server = SimServer(create_app(CONFIG, MODEL), "127.0.0.1", 0, drain_timeout_s=1.0)
    url = f"http://127.0.0.1:{await server.start()}"
    requests = poisson(
        6.0, 8.0, input_tokens=Uniform(64, 2048), output_tokens=Uniform(8, 96), seed=7
    )
    try:
        report = await serve(
            url,
            requests,
            model=MODEL,
            slo=Slo(ttft_p95_ms=1_000.0, tpot_p95_ms=100.0),
            out_dir=tmp_path,
            drain_s=10.0,
            metadata={"pattern": "poisson"},
        )
        async with httpx.AsyncClient(base_url=url) as client:
            metrics = (await client.get("/metrics")).text
    finally:
        await server.stop()

    assert len(requests) > 30
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == len(requests)
    for record, request in zip(records, requests, strict=True):
        assert record["error"] is None
        # The emulator always generates exactly max_tokens.
        assert record["tokens"] == request.output_tokens
        # Never faster than the modelled prefill of the prompt alone.
        assert record["ttft_ms"] / 1000 >= prefill_seconds(CONFIG, request.input_tokens)
        assert record["scheduled_s"] == request.arrival_s

    # Open loop: sent when scheduled, whatever the earlier requests were doing.
    lag = report.send_lag_ms
    assert lag is not None
    assert lag.p50 <= 3.0
    assert lag.p95 <= 10.0

    # The client's TTFT is the engine's plus the HTTP round trip on loopback.
    assert metric(metrics, "vllm:time_to_first_token_seconds_count") == len(requests)
    engine_ttft_ms = metric(metrics, "vllm:time_to_first_token_seconds_sum") / len(requests) * 1000
    assert report.ttft_ms is not None
    assert 0.0 <= report.ttft_ms.mean - engine_ttft_ms <= 15.0
    engine_tpot_ms = (
        metric(metrics, "vllm:request_time_per_output_token_seconds_sum") / len(requests) * 1000
    )
    assert report.tpot_ms is not None
    assert report.tpot_ms.mean == pytest.approx(engine_tpot_ms, abs=1.5)

    assert report.completed == len(requests)
    assert report.errors == {}
    assert report.attainment == 1.0
    assert report.output_tokens == sum(request.output_tokens for request in requests)
    assert report.client is not None
    assert report.client.http_clients == 1
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["completed"] == len(requests)
    assert saved["metadata"]["pattern"] == "poisson"
    assert saved["metadata"]["model"] == MODEL
    for name in ("bench_latency.png", "bench_cdf.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
