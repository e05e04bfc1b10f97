"""The engine emulator's measured TTFT and TPOT against the planner's prediction, same load.

    .venv/bin/python -m benchmarks.emulator_fidelity [--fractions 0.2,0.5,0.8]

One `inferfleet sim-engine` process and, for each request mix (fixed prompt and output
lengths) and each fraction of the planner's saturation rate (the highest rate at which
`planning.load.operating_point` finds a steady state), Poisson arrivals at that rate,
replayed open-loop by the load generator. The
planner predicts TTFT mean and p95 and one TPOT (its mean; the model takes the p50 and p95
equal to it); the client measures them per request. Requests arriving in the first request
lifetime (the batch filling up from empty) are left out.

The engine's own loop lateness over each run is reported as well: a run whose emulator fell
behind its modelled time would measure the process, not the model.

It writes `emulator_fidelity.json` and `emulator_fidelity.md` to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.serving_harness import (
    RESULTS,
    CpuMeter,
    EngineShape,
    Service,
    delta,
    machine,
    machine_line,
    other_busy_cores,
    running,
    scrape,
    start_engine,
    table,
)
from inferfleet.bench import traces
from inferfleet.bench.loadgen import LoadGenerator, RunResult
from inferfleet.bench.report import Distribution
from inferfleet.planning.load import OperatingPoint, operating_point
from inferfleet.planning.replica import ReplicaConfig

ENGINE_CPU = 1
CLIENT_CPU = 0
MIXES = ((1000, 200), (200, 500), (2000, 100))


@dataclass(frozen=True, slots=True)
class Run:
    input_tokens: int
    output_tokens: int
    fraction: float
    rate: float
    saturation_rate: float
    duration_s: float
    excluded_s: float
    requests: int
    measured: int
    errors: int
    predicted_ttft_mean_ms: float
    predicted_ttft_p95_ms: float
    predicted_tpot_ms: float
    predicted_batch: float
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    engine_ttft_mean_ms: float
    """From the engine's own TTFT histogram (arrival at the engine to the token's hand-out)."""
    engine_late_ms_per_step: float
    engine_schedule_resets: float
    send_lag_p99_ms: float
    """How late the client sent its requests against the schedule (p99): large when the
    client's own core was short, which inflates what it measures too."""
    engine_cpu: float
    client_cpu: float
    other_work: dict[str, float]


def saturation_rate(config: ReplicaConfig, input_tokens: int, output_tokens: int) -> float:
    """The highest rate with a steady state, by bisection."""
    low, high = 0.0, 1.0
    while operating_point(config, high, input_tokens, output_tokens).stable:
        low, high = high, high * 2
    for _ in range(50):
        middle = (low + high) / 2
        if operating_point(config, middle, input_tokens, output_tokens).stable:
            low = middle
        else:
            high = middle
    return low


def lifetime_s(point: OperatingPoint, output_tokens: int) -> float:
    return point.ttft_mean_s + (output_tokens - 1) * point.tpot_s


def measure(
    engine: Service,
    shape: EngineShape,
    *,
    input_tokens: int,
    output_tokens: int,
    fraction: float,
    target_requests: int,
    seed: int,
) -> Run:
    config = shape.replica_config()
    saturation = saturation_rate(config, input_tokens, output_tokens)
    rate = fraction * saturation
    point = operating_point(config, rate, input_tokens, output_tokens)
    excluded = lifetime_s(point, output_tokens)
    duration = excluded + min(max(target_requests / rate, 12.0), 30.0)
    schedule = traces.synthetic(
        "poisson",
        rate=rate,
        duration_s=duration,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        seed=seed,
    )
    meter = CpuMeter({"engine": engine.pid})
    before = scrape(engine.metrics_url)
    meter.start()
    run: RunResult = asyncio.run(
        LoadGenerator(engine.url, model=shape.model).run(schedule, drain_s=120.0)
    )
    meter.stop()
    after = scrape(engine.metrics_url)
    measured = [r for r in run.results if r.ok and r.scheduled_s >= excluded]
    steps = delta(after, before, "vllm:iteration_tokens_total_count")
    engine_ttft_count = delta(after, before, "vllm:time_to_first_token_seconds_count")
    cores = meter.cores()
    lag = Distribution.of(1e3 * r.send_lag_s for r in measured if r.send_lag_s is not None)
    return Run(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        fraction=fraction,
        rate=rate,
        saturation_rate=saturation,
        duration_s=duration,
        excluded_s=excluded,
        requests=len(run.results),
        measured=len(measured),
        errors=sum(1 for r in run.results if not r.ok),
        predicted_ttft_mean_ms=point.ttft_mean_s * 1e3,
        predicted_ttft_p95_ms=point.ttft_p95_s * 1e3,
        predicted_tpot_ms=point.tpot_s * 1e3,
        predicted_batch=point.batch,
        ttft_ms=Distribution.of(1e3 * r.ttft_s for r in measured if r.ttft_s is not None),
        tpot_ms=Distribution.of(1e3 * r.tpot_s for r in measured if r.tpot_s is not None),
        engine_ttft_mean_ms=1e3
        * delta(after, before, "vllm:time_to_first_token_seconds_sum")
        / engine_ttft_count
        if engine_ttft_count
        else math.nan,
        engine_late_ms_per_step=(
            1e3 * delta(after, before, "inferfleet_sim_late_seconds_total") / steps
            if steps
            else math.nan
        ),
        engine_schedule_resets=delta(after, before, "inferfleet_sim_schedule_resets_total"),
        send_lag_p99_ms=lag.p99 if lag else math.nan,
        engine_cpu=cores["engine"],
        client_cpu=cores["load generator"],
        other_work=meter.others,
    )


def error(measured: float | None, predicted: float) -> float:
    if measured is None or predicted <= 0 or not math.isfinite(predicted):
        return math.nan
    return measured / predicted - 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--fractions", default="0.2,0.5,0.8", help="Of the saturation rate.")
    parser.add_argument(
        "--mixes",
        default=",".join(f"{i}/{o}" for i, o in MIXES),
        help="Prompt/output tokens, comma-separated.",
    )
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--max-sequences", type=int, default=256)
    parser.add_argument("--requests", type=int, default=250, help="Target requests per run.")
    parser.add_argument(
        "--pin", action="store_true", help="Engine on core 1, load generator on core 0."
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    shape = EngineShape(args.model, args.gpu, args.max_sequences)
    fractions = [float(value) for value in args.fractions.split(",")]
    mixes = [tuple(int(n) for n in mix.split("/")) for mix in args.mixes.split(",")]
    # Not pinned: on a shared machine a pinned process waits for its one core while the other
    # may be idle. `--pin` keeps the engine and the load generator on separate cores.
    pinned = args.pin and (os.cpu_count() or 1) >= 2
    if pinned:
        os.sched_setaffinity(0, {CLIENT_CPU})
    info = machine()
    info["busy_cores_before"] = round(other_busy_cores(), 2)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="emulator-fidelity-") as logs:
        engine = start_engine("engine", shape, Path(logs), {ENGINE_CPU} if pinned else None)
        with running([engine]):
            measure(
                engine,
                shape,
                input_tokens=500,
                output_tokens=50,
                fraction=0.2,
                target_requests=20,
                seed=99,
            )  # warm-up
            for seed, (input_tokens, output_tokens) in enumerate(mixes):
                for fraction in fractions:
                    run = measure(
                        engine,
                        shape,
                        input_tokens=input_tokens,
                        output_tokens=output_tokens,
                        fraction=fraction,
                        target_requests=args.requests,
                        seed=seed,
                    )
                    runs.append(run)
                    print(
                        f"{input_tokens}/{output_tokens} at {fraction:.0%}: TTFT mean "
                        f"{run.ttft_ms.mean if run.ttft_ms else math.nan:.1f} vs "
                        f"{run.predicted_ttft_mean_ms:.1f} ms, TPOT mean "
                        f"{run.tpot_ms.mean if run.tpot_ms else math.nan:.2f} vs "
                        f"{run.predicted_tpot_ms:.2f} ms",
                        file=sys.stderr,
                    )
    info["busy_cores_after"] = round(other_busy_cores(), 2)
    document: dict[str, Any] = {
        "machine": info,
        "engine": shape.describe(),
        "pinned": pinned,
        "runs": [asdict(run) for run in runs],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "emulator_fidelity.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "emulator_fidelity.md").write_text(markdown(document))
    print(markdown(document))
    return 0


def _get(dist: dict[str, Any] | None, key: str) -> float | None:
    return None if dist is None else float(dist[key])


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.1%}"


def markdown(document: dict[str, Any]) -> str:
    info = document["machine"]
    lines = [
        "# Engine emulator fidelity: measured against the planner",
        "",
        machine_line(info),
        f"Busy cores before the run (other work on the machine): {info['busy_cores_before']}; "
        f"after: {info['busy_cores_after']}.",
        "",
        f"One `inferfleet sim-engine` process ({document['engine']})"
        + (
            " pinned to one core, the load generator on the other"
            if document["pinned"]
            else "; neither it nor the load generator pinned to a core"
        )
        + ". Poisson arrivals, open-loop, at fractions of the planner's saturation rate; "
        "fixed prompt/output lengths per mix. Measured at the client (so with the HTTP path, "
        "about a millisecond); the first request lifetime of each run is left out. The planner's "
        "TPOT p95 takes output lengths as varied as exponential ones; these runs' lengths are "
        "fixed, so the TPOT p50 and p95 are compared with its mean TPOT. "
        "Error = measured / predicted - 1. The engine-side TTFT mean is the emulator's own "
        "`vllm:time_to_first_token_seconds` (from the request reaching the engine to its first "
        "token), free of the HTTP path and of the client: where it agrees and the client's "
        "does not, the client or the machine, not the emulator, added the difference.",
        "",
        "## Errors",
        "",
    ]
    rows = []
    for run in document["runs"]:
        ttft, tpot = run["ttft_ms"], run["tpot_ms"]
        rows.append(
            [
                f"{run['input_tokens']}/{run['output_tokens']}",
                f"{run['fraction']:.0%} ({run['rate']:.2f}/s)",
                run["measured"],
                _pct(error(_get(ttft, "mean"), run["predicted_ttft_mean_ms"])),
                _pct(error(run["engine_ttft_mean_ms"], run["predicted_ttft_mean_ms"])),
                _pct(error(_get(ttft, "p95"), run["predicted_ttft_p95_ms"])),
                _pct(error(_get(tpot, "mean"), run["predicted_tpot_ms"])),
                _pct(error(_get(tpot, "p50"), run["predicted_tpot_ms"])),
                _pct(error(_get(tpot, "p95"), run["predicted_tpot_ms"])),
            ]
        )
    lines += [
        table(
            [
                "mix in/out",
                "load (rate)",
                "requests",
                "TTFT mean",
                "TTFT mean, engine-side",
                "TTFT p95",
                "TPOT mean",
                "TPOT p50",
                "TPOT p95",
            ],
            rows,
        ),
        "",
        "## Values (ms; measured / predicted)",
        "",
    ]
    value_rows = []
    for run in document["runs"]:
        ttft, tpot = run["ttft_ms"], run["tpot_ms"]

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        value_rows.append(
            [
                f"{run['input_tokens']}/{run['output_tokens']}",
                f"{run['fraction']:.0%}",
                f"{fmt(_get(ttft, 'mean'))} / {run['predicted_ttft_mean_ms']:.1f}",
                fmt(_get(ttft, "p50")),
                f"{fmt(_get(ttft, 'p95'))} / {run['predicted_ttft_p95_ms']:.1f}",
                f"{fmt(_get(tpot, 'mean'))} / {run['predicted_tpot_ms']:.2f}",
                f"{fmt(_get(tpot, 'p50'))}",
                f"{fmt(_get(tpot, 'p95'))}",
                f"{run['engine_ttft_mean_ms']:.1f}",
                f"{run['predicted_batch']:.1f}",
                f"{run['engine_late_ms_per_step']:.2f} / {run['engine_schedule_resets']:.0f}",
                f"{run['engine_cpu']:.2f} / {run['client_cpu']:.2f}",
                f"{run['send_lag_p99_ms']:.1f}",
                run["errors"],
            ]
        )
    lines += [
        table(
            [
                "mix",
                "load",
                "TTFT mean",
                "TTFT p50",
                "TTFT p95",
                "TPOT mean",
                "TPOT p50",
                "TPOT p95",
                "engine-side TTFT mean",
                "planner batch",
                "engine late ms/step / resets",
                "CPU engine / client",
                "client send lag p99",
                "errors",
            ],
            value_rows,
        ),
        "",
        "Other work on the machine during each run (CPU s of the busiest other processes): "
        + "; ".join(
            f"{run['input_tokens']}/{run['output_tokens']} {run['fraction']:.0%}: "
            + (", ".join(f"{name} {cpu}" for name, cpu in run["other_work"].items()) or "none")
            for run in document["runs"]
        )
        + ".",
        "",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
