"""What the router adds to a request, against the same engines reached directly, in one run.

    .venv/bin/python -m benchmarks.router_overhead [--streams 100,500,1000] [--engines 2]

Starts `--engines` emulated engines (`inferfleet sim-engine`) and two routers in front of
them (`inferfleet router`, static URLs): one without tenants, and one with `--tenants` tenants
(API keys, limits, the fair-share gate), each its own process; the load runs in this process.
For each stream count C it drives the same load three times, straight to the engines (stream
i to engine i mod N), through the router, and through the router with tenants (stream i with
tenant i mod T's key), and compares TTFT p50/p99, TPOT and output tokens/s between them.

The load is closed-loop at exactly C streams: C workers, each sending its next request as
soon as the last one ended, so that C streams are open whatever the latency (an open loop
sized from a predicted latency drifts off C when the prediction is off, and the two paths
would then be measured at different concurrencies). The workers are started over
`--ramp-seconds`; after `--settle-seconds` more, the requests sent in the next
`--measure-seconds` are measured. The workers use the load generator's HTTP client
(`inferfleet.bench.loadgen`: its asyncio transport and prompt builder) with
`--streams-per-pool` streams per connection pool (4: at 500 streams the load generator's 32
per pool held requests for seconds before sending them on this machine, while 4 per pool,
or an aiohttp client, did not), and the SSE reader the router itself uses
(`inferfleet.streaming`).

It writes `router_overhead.json` and `router_overhead.md` to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serving_harness import (
    RESULTS,
    CpuMeter,
    EngineShape,
    Service,
    delta,
    machine,
    machine_line,
    mean_ms,
    other_busy_cores,
    ratio,
    running,
    scrape,
    start_engine,
    start_router,
    table,
)
from inferfleet.bench.loadgen import DEFAULT_STREAMS_PER_CLIENT, PromptBuilder
from inferfleet.bench.report import Distribution, RequestResult
from inferfleet.bench.transport import AsyncioTransport
from inferfleet.planning.load import closed_loop_point
from inferfleet.sim.workload import TraceRequest
from inferfleet.streaming import TokenStream


@dataclass(frozen=True, slots=True)
class Load:
    """One closed-loop run's shape."""

    streams: int
    input_tokens: int
    output_tokens: int
    ramp_s: float
    settle_s: float
    measure_s: float

    @property
    def window(self) -> tuple[float, float]:
        start = self.ramp_s + self.settle_s
        return start, start + self.measure_s


async def closed_loop(
    urls: Sequence[str],
    load: Load,
    model: str,
    streams_per_pool: int,
    keys: Sequence[str] = (),
) -> list[RequestResult]:
    """`load.streams` workers, worker i on `urls[i % len(urls)]` (with the API key
    `keys[i % len(keys)]` where keys are given), each sending its next request when the last
    ended, until the measuring window closes."""
    loop = asyncio.get_running_loop()
    prompts = PromptBuilder(load.input_tokens + 16)
    request = TraceRequest(0.0, load.input_tokens, load.output_tokens)
    head = json.dumps(
        {
            "model": model,
            "max_tokens": load.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
        separators=(",", ":"),
    )[:-1]
    pools = math.ceil(load.streams / streams_per_pool)
    clients = [
        httpx.AsyncClient(
            transport=AsyncioTransport(),
            timeout=httpx.Timeout(None, connect=10.0),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        for _ in range(pools)
    ]
    results: list[RequestResult] = []
    _, stop_at = load.window
    counter = iter(range(1 << 62))

    async def one(client: httpx.AsyncClient, url: str, t0: float, key: str | None) -> None:
        index = next(counter)
        # A unique leading word: no prefix is shared, so prefix affinity plays no part.
        body = f'{head},"prompt":"{prompts.prompt(request, index)}"}}'.encode()
        result = RequestResult(index, loop.time() - t0, load.input_tokens, load.output_tokens)
        result.sent_s = result.scheduled_s
        results.append(result)
        stream = TokenStream(gaps=result.gaps)
        try:
            headers = None if key is None else {"Authorization": f"Bearer {key}"}
            async with client.stream("POST", url, content=body, headers=headers) as response:
                result.http_status = response.status_code
                if response.status_code != 200:
                    await response.aread()
                    result.error = f"http_{response.status_code}"
                    return
                async for received in response.aiter_raw():
                    stream.feed(received, loop.time() - t0)
                    if stream.error is not None:
                        result.error = "stream_error"
                        break
        except httpx.HTTPError as error:
            result.error = type(error).__name__
        result.first_token_s = stream.first_token_at
        result.last_token_s = stream.last_token_at
        result.tokens = stream.tokens
        result.chunks = stream.chunks
        result.end_s = loop.time() - t0
        if result.error is None and not stream.done:
            result.error = "incomplete_stream"

    async def worker(slot: int, t0: float) -> None:
        await asyncio.sleep(load.ramp_s * slot / load.streams)
        client = clients[slot // streams_per_pool]
        url = urls[slot % len(urls)].rstrip("/") + "/v1/completions"
        key = keys[slot % len(keys)] if keys else None
        while loop.time() - t0 < stop_at:
            await one(client, url, t0, key)

    # As the load generator does: keep the collector off the long-lived objects.
    gc.collect()
    gc.freeze()
    try:
        t0 = loop.time()
        await asyncio.gather(*(worker(slot, t0) for slot in range(load.streams)))
    finally:
        gc.unfreeze()
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()
    return results


@dataclass(frozen=True, slots=True)
class PathResult:
    """One path (direct or routed) at one stream count, over the measured window."""

    path: str
    requests: int
    measured: int
    errors: dict[str, int]
    in_flight_mean: float
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    output_tokens_per_s: float
    window_s: float
    cpu_cores: dict[str, float]
    cpu_us_per_token: dict[str, float]
    engine_ttft_ms_mean: float
    """The engines' own TTFT (request in to first token out), over the whole run."""
    router_ttft_ms_mean: float
    """The router's own TTFT (request in to first token passed on), over the whole run."""
    engine_queue_ms_mean: float
    engine_preemptions: float
    engine_late_ms_per_step: float
    engine_schedule_resets: float
    other_work: dict[str, float]
    """CPU seconds of the busiest processes outside the benchmark, by command name."""


def in_flight_mean(results: Sequence[RequestResult], start: float, end: float) -> float:
    """Mean streams open over [start, end]: each request's open time inside it, over its span."""
    open_s = 0.0
    for result in results:
        if result.sent_s is None:
            continue
        finish = result.end_s if result.end_s is not None else end
        open_s += max(0.0, min(finish, end) - max(result.sent_s, start))
    return open_s / (end - start)


def tokens_in_window(results: Sequence[RequestResult], start: float, end: float) -> float:
    """Output tokens delivered in [start, end], each stream's spread evenly over its life."""
    total = 0.0
    for result in results:
        first, last = result.first_token_s, result.last_token_s
        if first is None or last is None or result.tokens == 0:
            continue
        if last <= first:
            total += result.tokens if start <= first <= end else 0
            continue
        overlap = max(0.0, min(last, end) - max(first, start))
        total += result.tokens * overlap / (last - first)
    return total


def engine_figures(
    engines: Sequence[Service], before: list[dict[str, float]], after: list[dict[str, float]]
) -> tuple[float, float, float, float]:
    queued_s = queued = preemptions = late_s = steps = resets = 0.0
    for _, old, new in zip(engines, before, after, strict=True):
        queued_s += delta(new, old, "vllm:request_queue_time_seconds_sum")
        queued += delta(new, old, "vllm:request_queue_time_seconds_count")
        preemptions += delta(new, old, "vllm:num_preemptions_total")
        late_s += delta(new, old, "inferfleet_sim_late_seconds_total")
        steps += delta(new, old, "vllm:iteration_tokens_total_count")
        resets += delta(new, old, "inferfleet_sim_schedule_resets_total")
    return (
        1e3 * queued_s / queued if queued else math.nan,
        preemptions,
        1e3 * late_s / steps if steps else math.nan,
        resets,
    )


def measure(
    path: str,
    engines: Sequence[Service],
    router: Service,
    *,
    load: Load,
    model: str,
    streams_per_pool: int,
    keys: Sequence[str] = (),
) -> PathResult:
    pids = {f"engine {i}": engine.pid for i, engine in enumerate(engines)} | {"router": router.pid}
    urls = [engine.url for engine in engines] if path == "direct" else [router.url]
    meter = CpuMeter(pids)
    before = [scrape(engine.metrics_url) for engine in engines]
    router_before = scrape(router.metrics_url)
    meter.start()
    results = asyncio.run(closed_loop(urls, load, model, streams_per_pool, keys))
    meter.stop()
    after = [scrape(engine.metrics_url) for engine in engines]
    router_after = scrape(router.metrics_url)
    ttft_sum = sum(
        delta(new, old, "vllm:time_to_first_token_seconds_sum")
        for old, new in zip(before, after, strict=True)
    )
    ttft_count = sum(
        delta(new, old, "vllm:time_to_first_token_seconds_count")
        for old, new in zip(before, after, strict=True)
    )
    start, end = load.window
    window = [r for r in results if r.sent_s is not None and start <= r.sent_s < end]
    measured = [r for r in window if r.ok]
    errors: dict[str, int] = {}
    for result in results:
        if not result.ok:
            errors[result.error or "unknown"] = errors.get(result.error or "unknown", 0) + 1
    tokens = tokens_in_window(results, start, end)
    used = meter.used
    cores = meter.cores()
    engine_cores = sum(value for name, value in cores.items() if name.startswith("engine"))
    engine_cpu = sum(value for name, value in used.items() if name.startswith("engine"))
    grouped = {
        "engines": engine_cores,
        "router": cores["router"],
        "load generator": cores["load generator"],
        "other processes": cores["other processes"],
        "machine": cores["machine"],
    }
    total_tokens = sum(result.tokens for result in results)

    def per_token(cpu_s: float) -> float:
        return 1e6 * cpu_s / total_tokens if total_tokens else math.nan

    queue_ms, preemptions, late_ms, resets = engine_figures(engines, before, after)
    return PathResult(
        path=path,
        requests=len(results),
        measured=len(measured),
        errors=errors,
        in_flight_mean=in_flight_mean(results, start, end),
        ttft_ms=Distribution.of(1e3 * r.ttft_s for r in measured if r.ttft_s is not None),
        tpot_ms=Distribution.of(1e3 * r.tpot_s for r in measured if r.tpot_s is not None),
        e2e_ms=Distribution.of(1e3 * r.e2e_s for r in measured if r.e2e_s is not None),
        output_tokens_per_s=tokens / (end - start),
        window_s=end - start,
        cpu_cores=grouped,
        cpu_us_per_token={
            "engines": per_token(engine_cpu),
            "router": per_token(used["router"]),
            "load generator": per_token(used["load generator"]),
        },
        engine_ttft_ms_mean=1e3 * ttft_sum / ttft_count if ttft_count else math.nan,
        router_ttft_ms_mean=mean_ms(router_after, router_before, "inferfleet_router_ttft_seconds"),
        engine_queue_ms_mean=queue_ms,
        engine_preemptions=preemptions,
        engine_late_ms_per_step=late_ms,
        engine_schedule_resets=resets,
        other_work=meter.others,
    )


PATHS = ("direct", "router", "tenants")
"""Straight to the engines; through the router as it runs without tenants; through a router
with tenants' keys, their limits and the fair-share gate on."""


def tenants(directory: Path, count: int) -> tuple[list[str], list[str]]:
    """`count` tenants' keys (as a mounted Secret holds them) and the router's flags for them:
    limits far above the load (so that none refuses, and each is checked on every request),
    half of them batch."""
    keys, flags = [], []
    for i in range(count):
        name, key = f"tenant-{i}", f"key-{i}-{'x' * 32}"
        (directory / name).mkdir(parents=True)
        (directory / name / "key").write_text(key + "\n")
        priority = "batch" if i % 2 else "interactive"
        flags.append(
            f"--tenant=name={name},keys={directory / name},rps=1000000,tpm=1000000000000,"
            f"concurrency=1000000,priority={priority}"
        )
        keys.append(key)
    return keys, flags


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="100,500,1000", help="Stream counts, comma-separated.")
    parser.add_argument("--engines", type=int, default=2, help="Engine processes (replicas).")
    # A 70B model on four A100s per replica: at 1000 streams its decode steps are slow enough
    # (~150 ms) that the token rate stays within what two cores can stream, and every stream
    # fits in the running batch (no engine queue), with short prompts the prefill stays light.
    parser.add_argument("--model", default="llama-3.3-70b")
    parser.add_argument("--gpu", default="A100-80GB", help="Emulated GPU of each engine.")
    parser.add_argument("--tensor", type=int, default=4, help="GPUs per engine replica.")
    parser.add_argument("--max-sequences", type=int, default=1024)
    parser.add_argument("--input-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument(
        "--ramp-seconds", type=float, default=3.0, help="At least; else one request lifetime."
    )
    parser.add_argument(
        "--settle-seconds", type=float, default=3.0, help="At least; else half a lifetime."
    )
    parser.add_argument("--measure-seconds", type=float, default=15.0)
    parser.add_argument(
        "--streams-per-pool",
        type=int,
        default=4,
        help=f"Streams per client connection pool (the load generator uses "
        f"{DEFAULT_STREAMS_PER_CLIENT}).",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        default=4,
        help="Tenants of the third path (half interactive, half batch), the streams spread "
        "over their keys.",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    levels = [int(value) for value in args.streams.split(",")]
    shape = EngineShape(args.model, args.gpu, args.max_sequences, tensor=args.tensor)
    config = shape.replica_config()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Each stream holds two sockets through the router; children inherit the limit.
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    info = machine()
    info["busy_cores_before"] = round(other_busy_cores(), 2)
    levels_out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="router-overhead-") as logs:
        log_dir = Path(logs)
        engines = [start_engine(f"engine-{i}", shape, log_dir) for i in range(args.engines)]
        router = start_router("router", engines, args.model, log_dir)
        keys, tenant_flags = tenants(log_dir / "keys", args.tenants)
        tenanted = start_router(
            "router-tenants", engines, args.model, log_dir,
            sequences=args.max_sequences, extra=tenant_flags,
        )  # fmt: skip
        routers = {"direct": router, "router": router, "tenants": tenanted}
        with running([*engines, router, tenanted]):
            # Warm-up: connections, imports, the routers' first upstream calls.
            warm = Load(20, args.input_tokens, args.output_tokens, 0.5, 0.0, 3.0)
            for path in PATHS:
                measure(
                    path,
                    engines,
                    routers[path],
                    load=warm,
                    model=args.model,
                    streams_per_pool=args.streams_per_pool,
                    keys=keys if path == "tenants" else (),
                )
            for streams in levels:
                point = closed_loop_point(
                    config,
                    max(1, round(streams / args.engines)),
                    args.input_tokens,
                    args.output_tokens,
                )
                # Starts spread over a request lifetime, so streams do not run in lockstep.
                lifetime = point.ttft_mean_s + args.output_tokens * point.tpot_s
                load = Load(
                    streams,
                    args.input_tokens,
                    args.output_tokens,
                    max(args.ramp_seconds, lifetime),
                    max(args.settle_seconds, lifetime / 2),
                    args.measure_seconds,
                )
                paths = {}
                for path in PATHS:
                    started = time.monotonic()
                    paths[path] = result = measure(
                        path,
                        engines,
                        routers[path],
                        load=load,
                        model=args.model,
                        streams_per_pool=args.streams_per_pool,
                        keys=keys if path == "tenants" else (),
                    )
                    print(
                        f"{streams} streams, {path}: {time.monotonic() - started:.0f} s, in "
                        f"flight {result.in_flight_mean:.0f}, TTFT p50 "
                        f"{result.ttft_ms.p50 if result.ttft_ms else math.nan:.1f} ms, "
                        f"{result.output_tokens_per_s:.0f} tok/s, cores "
                        + ", ".join(f"{k} {v:.2f}" for k, v in result.cpu_cores.items()),
                        file=sys.stderr,
                    )
                levels_out.append(
                    {
                        "streams": streams,
                        "load": asdict(load),
                        "planner_tpot_ms": point.tpot_s * 1e3,
                        "planner_ttft_ms": point.ttft_mean_s * 1e3,
                        "paths": {name: asdict(value) for name, value in paths.items()},
                    }
                )
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    info["busy_cores_after"] = round(other_busy_cores(), 2)
    document = {
        "machine": info,
        "engines": args.engines,
        "engine": shape.describe(),
        "request": {"input_tokens": args.input_tokens, "output_tokens": args.output_tokens},
        "ramp_seconds": args.ramp_seconds,
        "settle_seconds": args.settle_seconds,
        "measure_seconds": args.measure_seconds,
        "streams_per_pool": args.streams_per_pool,
        "tenants": args.tenants,
        "levels": levels_out,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router_overhead.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "router_overhead.md").write_text(markdown(document))
    print(markdown(document))
    return 0


def _tenant_row(level: dict[str, Any]) -> list[Any]:
    plain, tenanted = level["paths"]["router"], level["paths"]["tenants"]
    p50, t50 = _p(plain["ttft_ms"], "p50"), _p(tenanted["ttft_ms"], "p50")
    p99, t99 = _p(plain["ttft_ms"], "p99"), _p(tenanted["ttft_ms"], "p99")
    rate, tenant_rate = plain["output_tokens_per_s"], tenanted["output_tokens_per_s"]
    return [
        level["streams"],
        f"{p50:.1f} / {t50:.1f}",
        f"{t50 - p50:+.1f} ({ratio(t50, p50):.2f}x)",
        f"{p99:.1f} / {t99:.1f}",
        f"{t99 - p99:+.1f} ({ratio(t99, p99):.2f}x)",
        f"{rate:.0f} / {tenant_rate:.0f} ({ratio(tenant_rate, rate):.3f}x)",
        f"{plain['cpu_us_per_token']['router']:.0f} / {tenanted['cpu_us_per_token']['router']:.0f}",
        f"{sum(plain['errors'].values())} / {sum(tenanted['errors'].values())}",
    ]


def _p(dist: dict[str, Any] | None, key: str) -> float:
    return math.nan if dist is None else float(dist[key])


def markdown(document: dict[str, Any]) -> str:
    info = document["machine"]
    request = document["request"]
    lines = [
        "# Router overhead against direct-to-engine",
        "",
        machine_line(info),
        f"Busy cores before the run (other work on the machine): {info['busy_cores_before']}; "
        f"after: {info['busy_cores_after']}.",
        "",
        f"{document['engines']} engine processes ({document['engine']}), one router process, "
        "and the load generator in the benchmark process, all on 127.0.0.1 and sharing the "
        f"{info['cores']} cores. Requests: {request['input_tokens']} prompt tokens, "
        f"{request['output_tokens']} output tokens, streamed. Closed loop at exactly the stream "
        "count (each stream sends its next request when the last ends); streams started over "
        "one request lifetime (as the planner predicts it; at least "
        f"{document['ramp_seconds']:g} s), then half a lifetime (at least "
        f"{document['settle_seconds']:g} s) to settle, then "
        f"the requests sent in the next {document['measure_seconds']:g} s are measured. "
        "Direct (stream i to engine i mod N) first, then through the router, then through "
        "a router with tenants, same load. The "
        f"client: the load generator's transport, {document['streams_per_pool']} streams per "
        "connection pool. "
        "Added latency = routed - direct; ratios are routed / direct from the same run.",
        "",
    ]
    rows = []
    for level in document["levels"]:
        direct, routed = level["paths"]["direct"], level["paths"]["router"]
        d50, r50 = _p(direct["ttft_ms"], "p50"), _p(routed["ttft_ms"], "p50")
        d99, r99 = _p(direct["ttft_ms"], "p99"), _p(routed["ttft_ms"], "p99")
        rows.append(
            [
                level["streams"],
                f"{direct['in_flight_mean']:.0f} / {routed['in_flight_mean']:.0f}",
                f"{d50:.1f} / {r50:.1f}",
                f"{r50 - d50:+.1f} ({ratio(r50, d50):.2f}x)",
                f"{d99:.1f} / {r99:.1f}",
                f"{r99 - d99:+.1f} ({ratio(r99, d99):.2f}x)",
                f"{_p(direct['tpot_ms'], 'p50'):.1f} / {_p(routed['tpot_ms'], 'p50'):.1f}",
                f"{direct['output_tokens_per_s']:.0f} / {routed['output_tokens_per_s']:.0f} "
                f"({ratio(routed['output_tokens_per_s'], direct['output_tokens_per_s']):.3f}x)",
                f"{sum(direct['errors'].values())} / {sum(routed['errors'].values())}",
            ]
        )
    lines += [
        "## Added latency and throughput (direct / routed)",
        "",
        table(
            [
                "streams",
                "in flight",
                "TTFT p50 ms",
                "added p50 ms",
                "TTFT p99 ms",
                "added p99 ms",
                "TPOT p50 ms",
                "output tok/s",
                "errors",
            ],
            rows,
        ),
        "",
        f"## With tenants: keys, limits and the fair-share gate on ({document['tenants']} "
        "tenants; router / router with tenants)",
        "",
        "The same load through a second router process that checks each request's API key "
        "(SHA-256 of the bearer key), charges its tenant's request, token and concurrency "
        "limits (set far above the load, so that every request is checked and none refused) "
        "and passes it through the fair-share gate (bounded by the engines' sequences, "
        "interactive and batch tenants), against the router without tenants, same run.",
        "",
        table(
            [
                "streams",
                "TTFT p50 ms",
                "added p50 ms",
                "TTFT p99 ms",
                "added p99 ms",
                "output tok/s",
                "router us/token",
                "errors",
            ],
            [_tenant_row(level) for level in document["levels"]],
        ),
        "",
        "## Where the first token's time went (means over each run, ms)",
        "",
        "TTFT as the client saw it, as the router measured it (request in to first token "
        "passed on) and as the engines did (request in to first token out). Client minus "
        "router on the routed path is the client's side of the extra hop; router minus "
        "engines is the router's own work and its upstream hop; client minus engines on the "
        "direct path is the HTTP path and the client's own lag.",
        "",
        table(
            [
                "streams",
                "direct: client",
                "direct: engines",
                "routed: client",
                "routed: router",
                "routed: engines",
            ],
            [
                [
                    level["streams"],
                    f"{_p(level['paths']['direct']['ttft_ms'], 'mean'):.1f}",
                    f"{level['paths']['direct']['engine_ttft_ms_mean']:.1f}",
                    f"{_p(level['paths']['router']['ttft_ms'], 'mean'):.1f}",
                    f"{level['paths']['router']['router_ttft_ms_mean']:.1f}",
                    f"{level['paths']['router']['engine_ttft_ms_mean']:.1f}",
                ]
                for level in document["levels"]
            ],
        ),
        "",
        "## Where the CPU went (cores used over each run; direct / routed)",
        "",
    ]
    cpu_rows = []
    for level in document["levels"]:
        direct, routed = level["paths"]["direct"], level["paths"]["router"]
        cpu_rows.append(
            [
                level["streams"],
                f"{direct['cpu_cores']['engines']:.2f} / {routed['cpu_cores']['engines']:.2f}",
                f"{direct['cpu_cores']['router']:.2f} / {routed['cpu_cores']['router']:.2f}",
                f"{direct['cpu_cores']['load generator']:.2f} / "
                f"{routed['cpu_cores']['load generator']:.2f}",
                f"{direct['cpu_cores']['other processes']:.2f} / "
                f"{routed['cpu_cores']['other processes']:.2f}",
                f"{direct['cpu_cores']['machine']:.2f} / {routed['cpu_cores']['machine']:.2f}",
                f"{routed['cpu_us_per_token']['router']:.0f}",
                f"{direct['cpu_us_per_token']['engines']:.0f} / "
                f"{routed['cpu_us_per_token']['engines']:.0f}",
                f"{direct['cpu_us_per_token']['load generator']:.0f} / "
                f"{routed['cpu_us_per_token']['load generator']:.0f}",
            ]
        )
    lines += [
        table(
            [
                "streams",
                "engines",
                "router",
                "load generator",
                "other",
                "machine",
                "router us/token",
                "engines us/token",
                "load gen us/token",
            ],
            cpu_rows,
        ),
        "",
        "## Was the engine side the bottleneck?",
        "",
    ]
    engine_rows = []
    for level in document["levels"]:
        direct, routed = level["paths"]["direct"], level["paths"]["router"]
        engine_rows.append(
            [
                level["streams"],
                f"{level['planner_tpot_ms']:.1f}",
                f"{_p(direct['tpot_ms'], 'mean'):.1f}",
                f"{direct['engine_queue_ms_mean']:.2f} / {routed['engine_queue_ms_mean']:.2f}",
                f"{direct['engine_preemptions']:.0f} / {routed['engine_preemptions']:.0f}",
                f"{direct['engine_late_ms_per_step']:.2f} / "
                f"{routed['engine_late_ms_per_step']:.2f}",
                f"{direct['engine_schedule_resets']:.0f} / {routed['engine_schedule_resets']:.0f}",
            ]
        )
    lines += [
        table(
            [
                "streams",
                "planner TPOT ms",
                "direct TPOT mean ms",
                "engine queue ms, mean",
                "preemptions",
                "engine loop late ms/step",
                "schedule resets",
            ],
            engine_rows,
        ),
        "",
        "Other work on the machine during each run (CPU s of the busiest other processes): "
        + "; ".join(
            f"{level['streams']} {name}: "
            + (", ".join(f"{proc} {cpu}" for proc, cpu in path["other_work"].items()) or "none")
            for level in document["levels"]
            for name, path in level["paths"].items()
        )
        + ".",
        "",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
