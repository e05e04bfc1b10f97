"""`inferfleet bench`: load tests against OpenAI-compatible endpoints, and autoscaling
policies in the fleet simulator. The commands import the load generator and the simulator
when they run, not when the command line is built."""

# ruff: noqa: PLC0415

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from inferfleet.api.model_spec import WeightSource
from inferfleet.cli.common import EXIT_INVALID, EXIT_NO_FIT, app
from inferfleet.slo import Slo as RequestSlo

# `bench.autoscale.POLICIES`, for the help of `--policy` without loading the simulator
# (tests/unit/test_cli_imports.py holds the two equal).
BENCH_POLICIES = (
    "goodput",
    "goodput-floor",
    "static-best",
    "static-peak",
    "static-mean",
    "hpa",
    "keda",
    "planner",
    "clairvoyant",
)

bench = typer.Typer(help="Load tests against OpenAI-compatible endpoints.", no_args_is_help=True)
app.add_typer(bench, name="bench")


@bench.command("serve")
def bench_serve(
    url: Annotated[str, typer.Option(help="Base URL, e.g. http://127.0.0.1:8000.")],
    model: Annotated[str, typer.Option(help="Model name to request.")],
    out: Annotated[Path, typer.Option(help="Directory for report.json and the plots.")],
    trace: Annotated[Path | None, typer.Option(help="Trace to replay (.csv or .jsonl).")] = None,
    rate_multiplier: Annotated[float, typer.Option(help="Replay at N x the recorded rate.")] = 1.0,
    start: Annotated[float, typer.Option(help="Trace seconds to skip.")] = 0.0,
    duration: Annotated[float | None, typer.Option(help="Seconds of trace or pattern.")] = None,
    pattern: Annotated[
        str | None, typer.Option(help="Synthetic load: poisson, step, burst or mix-shift.")
    ] = None,
    rate: Annotated[float, typer.Option(help="Requests/s of the synthetic load.")] = 1.0,
    input_tokens: Annotated[str, typer.Option(help="N, uniform:LO:HI, exp:MEAN...")] = "1000",
    output_tokens: Annotated[str, typer.Option(help="N, uniform:LO:HI, exp:MEAN...")] = "200",
    seed: Annotated[int, typer.Option(help="Seed of the synthetic load.")] = 0,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="Per-request TTFT target.")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="Per-request TPOT target.")] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots (needs matplotlib).")] = True,
) -> None:
    """Replay a trace or a synthetic pattern open-loop and report TTFT/TPOT percentiles,
    goodput and attainment against the SLO."""
    from inferfleet.bench import loadgen, traces

    try:
        if (trace is None) == (pattern is None):
            raise ValueError("give exactly one of --trace and --pattern")
        if trace is not None:
            requests = traces.requests_from_trace(
                trace, rate_multiplier=rate_multiplier, start_s=start, duration_s=duration
            )
        else:
            requests = traces.synthetic(
                str(pattern),
                rate=rate,
                duration_s=duration or 60.0,
                input_tokens=traces.parse_lengths(input_tokens),
                output_tokens=traces.parse_lengths(output_tokens),
                seed=seed,
            )
        slo = RequestSlo(ttft_p95_ms=slo_ttft_ms, tpot_p95_ms=slo_tpot_ms)
        result = loadgen.run_benchmark(
            url, requests, model=model, slo=slo, out_dir=out, plots=plots
        )
    except (ValueError, loadgen.BenchmarkError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    typer.echo(result.to_text())
    if result.slo_met is False:
        raise typer.Exit(EXIT_NO_FIT)


@bench.command("autoscale")
def bench_autoscale(
    spec: Annotated[Path, typer.Option(help="Scenario file (benchmarks/autoscale/*.yaml).")],
    trace: Annotated[
        Path | None, typer.Option(help="Trace to replay instead of the scenario's.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Rate multiplier (trace) or req/s (pattern).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(help="Policies to compare (repeat): " + ", ".join(BENCH_POLICIES)),
    ] = None,
    traces_dir: Annotated[Path, typer.Option(help="Where the scenario's trace lives.")] = Path(
        "../shared/traces"
    ),
    out: Annotated[Path, typer.Option(help="Directory for the tables and plots.")] = Path(
        "benchmarks/autoscale/results"
    ),
    plots: Annotated[bool, typer.Option(help="Write PNG plots (needs matplotlib).")] = True,
    cold_start: Annotated[
        str | None,
        typer.Option(
            help="How long the simulated replicas take to serve: SECONDS, or ROLE=SECONDS[,...] "
            "for some roles; the service's coldStartSeconds (what the policy is told) is kept."
        ),
    ] = None,
    weights_from: Annotated[
        str | None,
        typer.Option(
            help="Where the simulated replicas' weights come from: network, cache or "
            "nodeLocal. Each replica starts in the cold start estimated for it, and the "
            "policy plans with that estimate (the service's coldStartSeconds is dropped)."
        ),
    ] = None,
) -> None:
    """Compare scaling policies on a scenario in the fleet simulator: attainment, goodput per
    GPU-hour, GPU-hours against a clairvoyant schedule and a fluid lower bound, reaction time,
    oscillation."""
    from inferfleet.bench import autoscale as bench_autoscale_lib
    from inferfleet.bench import scenario as bench_scenario

    try:
        scenario = bench_scenario.load_scenario(spec)
        if trace is not None:
            scenario = dataclasses.replace(scenario, trace=trace.name, pattern=None)
            traces_dir = trace.parent
        if cold_start is not None and weights_from is not None:
            raise ValueError("give --cold-start or --weights-from, not both")
        if cold_start is not None:
            scenario = bench_scenario.with_cold_start(scenario, cold_start)
        if weights_from is not None:
            scenario = bench_scenario.with_weight_source(scenario, WeightSource(weights_from))
        result = bench_autoscale_lib.run_scenario(
            scenario,
            traces_dir,
            tuple(policy or bench_autoscale_lib.POLICIES),
            rate=rate,
            cpu_clock=time.process_time,
        )
        bench_autoscale_lib.write_results(result, out, plots=plots)
    except (ValueError, OSError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    typer.echo(bench_autoscale_lib.markdown_table(result))
