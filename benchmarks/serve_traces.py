"""`inferfleet bench serve` on each shared trace, against emulated engines (and through the
router for one), keeping its report and plots.

    .venv/bin/python -m benchmarks.serve_traces [--traces-dir ../shared/traces]

For each trace: start the engines (`inferfleet sim-engine`) and, where listed, a router in
front of them (`inferfleet router`), then run the command line a user would,
`inferfleet bench serve --trace ... --start ... --duration ... --rate-multiplier ...`, as its
own process, writing `report.json`, `bench_latency.png` and `bench_cdf.png` to
`--out/<trace name>/`, with the command's text output in `summary.txt`. The traces are read
where they are; nothing of them is copied: the command's `requests.jsonl` (one record per
request, with the trace's arrival times and lengths) is removed. A summary of all runs goes to
`--out/serve_traces.md` and `.json`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.serving_harness import (
    RESULTS,
    CpuMeter,
    EngineShape,
    Service,
    machine,
    machine_line,
    other_busy_cores,
    running,
    start_engine,
    start_router,
    table,
)

# `inferfleet bench serve` exits with 3 when the run missed its SLO: a result, not a failure.
EXIT_SLO_MISSED = 3


@dataclass(frozen=True, slots=True)
class TraceRun:
    """How one trace is replayed."""

    trace: str
    start_s: float
    duration_s: float
    rate_multiplier: float
    engines: int
    routed: bool
    slo_ttft_ms: float
    slo_tpot_ms: float
    why: str


RUNS = (
    TraceRun(
        "azure2023_conv.csv",
        0.0,
        120.0,
        1.0,
        1,
        False,
        1000.0,
        50.0,
        "the first two minutes as recorded (about 5.5 req/s, 1155/211 tokens mean): one replica",
    ),
    TraceRun(
        "azure2023_code.csv",
        180.0,
        120.0,
        1.0,
        1,
        False,
        2000.0,
        50.0,
        "two minutes as recorded from 180 s (the first minutes are nearly idle: 63 requests, "
        "then none from 40 s to 180 s): 2048-token prompts in bursts of up to 14 req/s, which "
        "queue for prefill",
    ),
    TraceRun(
        "mooncake_synthetic.jsonl",
        0.0,
        120.0,
        1.0,
        4,
        True,
        5000.0,
        100.0,
        "two minutes as recorded (15k-token prompts, shared prefixes) through the router over "
        "four replicas, whose prefix affinity keeps shared blocks on one replica",
    ),
)


def bench_serve(
    url: str, model: str, trace: Path, run: TraceRun, out_dir: Path
) -> tuple[int, str, float]:
    command = [
        sys.executable,
        "-m",
        "inferfleet.cli",
        "bench",
        "serve",
        f"--url={url}",
        f"--model={model}",
        f"--trace={trace}",
        f"--start={run.start_s:g}",
        f"--duration={run.duration_s:g}",
        f"--rate-multiplier={run.rate_multiplier:g}",
        f"--slo-ttft-ms={run.slo_ttft_ms:g}",
        f"--slo-tpot-ms={run.slo_tpot_ms:g}",
        f"--out={out_dir}",
    ]
    started = time.monotonic()
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    return finished.returncode, finished.stdout + finished.stderr, time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--traces-dir", type=Path, default=Path("../shared/traces"))
    parser.add_argument("--only", default="", help="Trace file names to run, comma-separated.")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve")
    args = parser.parse_args(argv)
    shape = EngineShape(args.model, args.gpu)
    chosen = {name for name in args.only.split(",") if name}
    info = machine()
    info["busy_cores_before"] = round(other_busy_cores(), 2)
    summaries: list[dict[str, Any]] = []
    failed = False
    for run in RUNS:
        if chosen and run.trace not in chosen:
            continue
        trace = (args.traces_dir / run.trace).resolve()
        out_dir = args.out / Path(run.trace).stem
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="serve-traces-") as logs:
            engines = [
                start_engine(f"engine-{index}", shape, Path(logs)) for index in range(run.engines)
            ]
            services: list[Service] = list(engines)
            if run.routed:
                services.append(start_router("router", engines, args.model, Path(logs)))
            with running(services):
                meter = CpuMeter({service.name: service.pid for service in services}, own=False)
                children = resource.getrusage(resource.RUSAGE_CHILDREN)
                meter.start()
                code, output, wall = bench_serve(services[-1].url, args.model, trace, run, out_dir)
                meter.stop()
                # The command has exited and been waited for: its CPU is in the children's.
                spent = resource.getrusage(resource.RUSAGE_CHILDREN)
                client_s = (spent.ru_utime - children.ru_utime) + (
                    spent.ru_stime - children.ru_stime
                )
                meter.used["load generator"] = client_s
                meter.used["other processes"] = max(meter.used["other processes"] - client_s, 0.0)
        (out_dir / "summary.txt").write_text(output)
        # Per-request records repeat the trace's rows (arrivals and lengths): not kept.
        (out_dir / "requests.jsonl").unlink(missing_ok=True)
        print(f"== {run.trace} ({wall:.0f} s, exit {code})\n{output}", file=sys.stderr)
        if code not in (0, EXIT_SLO_MISSED):
            failed = True
            continue
        report = json.loads((out_dir / "report.json").read_text())
        summaries.append(
            {
                "run": asdict(run),
                "exit": code,
                "wall_s": wall,
                "report": report,
                "server_cpu_cores": meter.cores(),
                "other_work": meter.others,
            }
        )
    info["busy_cores_after"] = round(other_busy_cores(), 2)
    document = {"machine": info, "engine": shape.describe(), "runs": summaries}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_traces.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "serve_traces.md").write_text(markdown(document))
    print(markdown(document))
    return 1 if failed else 0


def _ms(dist: dict[str, Any] | None, key: str) -> str:
    return "-" if dist is None else f"{dist[key]:.0f}"


def markdown(document: dict[str, Any]) -> str:
    info = document["machine"]
    lines = [
        "# `inferfleet bench serve` on the shared traces",
        "",
        machine_line(info),
        f"Busy cores before the runs (other work on the machine): {info['busy_cores_before']};"
        f" after: {info['busy_cores_after']}.",
        "",
        f"Engines: {document['engine']}, emulated (`inferfleet sim-engine`). Each directory "
        "holds the command's `report.json`, `bench_latency.png`, `bench_cdf.png` and its text "
        "output (`summary.txt`); its `requests.jsonl` repeats the trace's rows and is not kept.",
        "",
    ]
    rows = []
    for item in document["runs"]:
        run, report = item["run"], item["report"]
        rows.append(
            [
                f"`{Path(run['trace']).stem}`",
                f"{run['start_s']:g}+{run['duration_s']:g} s x{run['rate_multiplier']:g}",
                f"{run['engines']}" + (" via router" if run["routed"] else " direct"),
                f"{report['requests']} ({report['offered_rps']:.2f}/s)",
                f"{report['completed']} / {report['failed']}",
                f"{_ms(report['ttft_ms'], 'p50')} / {_ms(report['ttft_ms'], 'p99')}",
                f"{_ms(report['tpot_ms'], 'p50')} / {_ms(report['tpot_ms'], 'p99')}",
                f"{report['output_tokens_per_s']:.0f}",
                f"{run['slo_ttft_ms']:g} / {run['slo_tpot_ms']:g}",
                f"{report['attainment']:.3f}",
                f"{report['goodput_rps']:.2f}",
            ]
        )
    lines += [
        table(
            [
                "trace",
                "window x rate",
                "engines",
                "requests",
                "ok / failed",
                "TTFT p50 / p99 ms",
                "TPOT p50 / p99 ms",
                "output tok/s",
                "SLO TTFT / TPOT ms",
                "attainment",
                "goodput req/s",
            ],
            rows,
        ),
        "",
        "Why each window:",
        "",
    ]
    lines += [
        f"- `{Path(item['run']['trace']).stem}`: {item['run']['why']}." for item in document["runs"]
    ]
    lines += [
        "",
        "Server CPU (cores, mean over the run) and other work on the machine (CPU s):",
        "",
    ]
    for item in document["runs"]:
        cores = ", ".join(f"{name} {value:.2f}" for name, value in item["server_cpu_cores"].items())
        others = ", ".join(f"{name} {cpu}" for name, cpu in item["other_work"].items()) or "none"
        lines.append(f"- `{Path(item['run']['trace']).stem}`: {cores}; other work: {others}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
