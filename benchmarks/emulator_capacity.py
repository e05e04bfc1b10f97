"""How many concurrent streams one engine emulator process drives on one core before its own
CPU distorts the timing it emulates.

    .venv/bin/python -m benchmarks.emulator_capacity [--streams 50,100,200,400,800,1200]

One `inferfleet sim-engine` process pinned to one core (`taskset`), the load generator in this
process pinned to the other. At each level C, C streamed requests (short prompts, outputs long
enough for about `--decode-seconds` of decoding) are sent within half a second, so that for
most of the run the engine decodes a batch of exactly C. In a window in the middle of that
decode the engine's own counters are read twice (`/metrics`) with its CPU time (/proc):

* stretch: wall time of the window over the modelled busy time of the steps in it
  (`inferfleet_sim_step_seconds_total`), minus 1. The engine is busy all through the window, so
  an engine that keeps pace has a stretch of 0; when handing out a step's tokens takes longer
  than the next step lasts, the loop falls behind and (past 50 ms) resets its schedule, and
  the emulated GPU runs slow by this much;
* lateness: how long after its modelled end each step's tokens were handed out, on average
  (`inferfleet_sim_late_seconds_total` over steps): timer overshoot while it keeps pace;
* the engine's CPU use over the window (1.0 = its whole core) and its CPU per emulated token;
* TPOT measured at the client (each request's whole decode) against the ideal: the planner's
  decode step for a batch of C at the requests' mean context. (The modelled mean step of the
  window is reported too; it sits above the whole-decode mean, as contexts grow.)

The knee is the first level whose stretch reaches `--tolerance` (5%). As that depends on
whatever else the machine runs, the engine's CPU seconds per modelled second are reported as
well: the share of one core it needs to keep pace, which a shared machine does not change.
Levels are run for each of `--gpus`: a faster emulated GPU has shorter steps to keep pace
with, so fewer streams fit a core. The client's own CPU is reported too: past a full core its
TPOT includes its own queueing, not the engine's.

It writes `emulator_capacity.json` and `emulator_capacity.md` to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.serving_harness import (
    RESULTS,
    EngineShape,
    Service,
    all_process_cpu_s,
    delta,
    machine,
    machine_line,
    other_busy_cores,
    process_cpu_s,
    running,
    scrape,
    start_engine,
    table,
)
from inferfleet.bench.loadgen import LoadGenerator, RunResult
from inferfleet.bench.report import Distribution
from inferfleet.planning.memory import plan_memory
from inferfleet.planning.performance import decode_step_seconds
from inferfleet.sim.workload import TraceRequest

ENGINE_CPU = 1
CLIENT_CPU = 0


@dataclass(frozen=True, slots=True)
class Level:
    gpu: str
    streams: int
    output_tokens: int
    planner_step_ms: float
    window_s: float
    steps: float
    modelled_s: float
    stretch: float
    late_ms_per_step: float
    schedule_resets: float
    engine_cpu: float
    """Cores the engine process used over the window."""
    core_share_needed: float
    """The engine's CPU seconds per modelled second: the share of one core it needs to keep
    pace at this batch, whatever else runs on the machine (near 1, it cannot)."""
    engine_us_per_token: float
    modelled_step_ms: float
    client_tpot_ms: Distribution | None
    tpot_vs_modelled: float
    """Client TPOT p50 over the modelled mean step, minus 1."""
    tpot_vs_planner: float
    client_cpu: float
    """Cores the load generator used over the whole level."""
    completed: int
    errors: int
    other_work: dict[str, float]


async def run_level(
    engine: Service,
    *,
    streams: int,
    output_tokens: int,
    input_tokens: int,
    decode_s: float,
    model: str,
) -> tuple[RunResult, dict[str, float], dict[str, float], float, float, float, float]:
    spread = 0.5
    requests = [
        TraceRequest(spread * index / streams, input_tokens, output_tokens)
        for index in range(streams)
    ]
    generator = LoadGenerator(engine.url, model=model)
    window_start = spread + 0.2 * decode_s + 1.0
    window = 0.6 * decode_s
    run = asyncio.create_task(generator.run(requests, drain_s=max(120.0, 4 * decode_s)))
    await asyncio.sleep(window_start)
    # Scraped from a thread: the load generator's loop keeps reading meanwhile.
    before = await asyncio.to_thread(scrape, engine.url)
    cpu_before, wall_before = process_cpu_s(engine.pid), time.monotonic()
    await asyncio.sleep(window)
    after = await asyncio.to_thread(scrape, engine.url)
    cpu_after, wall_after = process_cpu_s(engine.pid), time.monotonic()
    result = await run
    return result, before, after, cpu_before, cpu_after, wall_before, wall_after


def measure(
    engine: Service,
    shape: EngineShape,
    *,
    streams: int,
    input_tokens: int,
    decode_s: float,
) -> Level:
    config = shape.replica_config()
    capacity = plan_memory(config).kv_capacity_tokens
    step = decode_step_seconds(config, streams, input_tokens + 100)
    # Outputs for about `decode_s` of decoding, within the KV cache (with a margin).
    output_tokens = max(
        20, min(round(decode_s / step), int(0.9 * capacity / streams) - input_tokens)
    )
    planner_step = decode_step_seconds(config, streams, input_tokens + output_tokens / 2)
    decode_s = output_tokens * planner_step
    others_before = all_process_cpu_s()
    client_before, client_wall = time.process_time(), time.monotonic()
    run, before, after, cpu_before, cpu_after, wall_before, wall_after = asyncio.run(
        run_level(
            engine,
            streams=streams,
            output_tokens=output_tokens,
            input_tokens=input_tokens,
            decode_s=decode_s,
            model=shape.model,
        )
    )
    client_cpu = (time.process_time() - client_before) / (time.monotonic() - client_wall)
    others: dict[str, float] = {}
    for pid, (name, cpu) in all_process_cpu_s().items():
        if pid in (engine.pid, os.getpid()):
            continue
        others[name] = others.get(name, 0.0) + cpu - others_before.get(pid, (name, 0.0))[1]
    busiest = {
        name: round(cpu, 2)
        for name, cpu in sorted(others.items(), key=lambda item: -item[1])[:3]
        if cpu >= 0.05
    }
    steps = delta(after, before, "vllm:iteration_tokens_total_count")
    modelled = delta(after, before, "inferfleet_sim_step_seconds_total")
    late = delta(after, before, "inferfleet_sim_late_seconds_total")
    resets = delta(after, before, "inferfleet_sim_schedule_resets_total")
    window = wall_after - wall_before
    completed = [result for result in run.results if result.ok]
    tpot = Distribution.of(1e3 * r.tpot_s for r in completed if r.tpot_s is not None)
    modelled_step = modelled / steps if steps else math.nan
    tpot_p50 = tpot.p50 / 1e3 if tpot else math.nan
    return Level(
        gpu=shape.gpu,
        streams=streams,
        output_tokens=output_tokens,
        planner_step_ms=planner_step * 1e3,
        window_s=window,
        steps=steps,
        modelled_s=modelled,
        stretch=window / modelled - 1 if modelled else math.nan,
        late_ms_per_step=1e3 * late / steps if steps else math.nan,
        schedule_resets=resets,
        engine_cpu=(cpu_after - cpu_before) / window,
        core_share_needed=(cpu_after - cpu_before) / modelled if modelled else math.nan,
        engine_us_per_token=1e6 * (cpu_after - cpu_before) / (steps * streams)
        if steps
        else math.nan,
        modelled_step_ms=modelled_step * 1e3,
        client_tpot_ms=tpot,
        tpot_vs_modelled=tpot_p50 / modelled_step - 1 if steps else math.nan,
        tpot_vs_planner=tpot_p50 / planner_step - 1,
        client_cpu=client_cpu,
        completed=len(completed),
        errors=len(run.results) - len(completed),
        other_work=busiest,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="50,100,200,400,800,1200,1600")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument(
        "--gpus",
        default="H100-80GB,B200-180GB",
        help="Emulated GPUs, comma-separated: a faster GPU has shorter steps to keep pace with.",
    )
    parser.add_argument("--max-sequences", type=int, default=2048)
    parser.add_argument("--input-tokens", type=int, default=32)
    parser.add_argument("--decode-seconds", type=float, default=8.0)
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="Stretch that marks the knee."
    )
    parser.add_argument(
        "--share-limit", type=float, default=0.8, help="Core share that marks the CPU knee."
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    levels = [int(value) for value in args.streams.split(",")]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cores = os.cpu_count() or 1
    pinned = cores >= 2
    if pinned:
        os.sched_setaffinity(0, {CLIENT_CPU})
    info = machine()
    info["busy_cores_before"] = round(other_busy_cores(), 2)
    results: list[Level] = []
    summaries: list[dict[str, Any]] = []
    for gpu in args.gpus.split(","):
        shape = EngineShape(args.model, gpu, args.max_sequences)
        measured: list[Level] = []
        with tempfile.TemporaryDirectory(prefix="emulator-capacity-") as logs:
            engine = start_engine("engine", shape, Path(logs), {ENGINE_CPU} if pinned else None)
            with running([engine]):
                measure(engine, shape, streams=20, input_tokens=args.input_tokens, decode_s=2.0)
                for streams in levels:
                    level = measure(
                        engine,
                        shape,
                        streams=streams,
                        input_tokens=args.input_tokens,
                        decode_s=args.decode_seconds,
                    )
                    measured.append(level)
                    print(
                        f"{gpu} {streams} streams: stretch {level.stretch:+.3f}, late "
                        f"{level.late_ms_per_step:.2f} ms/step, engine CPU "
                        f"{level.engine_cpu:.2f}, needs {level.core_share_needed:.2f} of a core, "
                        f"client CPU {level.client_cpu:.2f}",
                        file=sys.stderr,
                    )
        results += measured
        knee = next((lv.streams for lv in measured if lv.stretch >= args.tolerance), None)
        cpu_knee = next(
            (lv.streams for lv in measured if lv.core_share_needed >= args.share_limit), None
        )
        summaries.append(
            {
                "gpu": gpu,
                "engine": shape.describe(),
                "knee_streams": knee,
                "cpu_knee_streams": cpu_knee,
                "largest_level_within_tolerance": max(
                    (lv.streams for lv in measured if lv.stretch < args.tolerance), default=None
                ),
            }
        )
    info["busy_cores_after"] = round(other_busy_cores(), 2)
    document: dict[str, Any] = {
        "machine": info,
        "pinned": pinned,
        "input_tokens": args.input_tokens,
        "tolerance": args.tolerance,
        "share_limit": args.share_limit,
        "gpus": summaries,
        "levels": [asdict(level) for level in results],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "emulator_capacity.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "emulator_capacity.md").write_text(markdown(document))
    print(markdown(document))
    return 0


def markdown(document: dict[str, Any]) -> str:
    info = document["machine"]
    tolerance = document["tolerance"]
    verdicts = []
    for summary in document["gpus"]:
        knee, cpu_knee = summary["knee_streams"], summary["cpu_knee_streams"]
        observed = (
            f"timing distorted (stretch >= {tolerance:.0%}) from {knee} streams, within it up "
            f"to {summary['largest_level_within_tolerance']}"
            if knee is not None
            else f"timing kept (stretch < {tolerance:.0%}) at every level"
        )
        needed = (
            f"it needs {document['share_limit']:.0%} of a core from {cpu_knee} streams"
            if cpu_knee is not None
            else f"it needs less than {document['share_limit']:.0%} of a core at every level"
        )
        verdicts.append(f"- {summary['engine']}: {observed} on this machine; {needed}.")
    lines = [
        "# Engine emulator capacity: streams per core",
        "",
        machine_line(info),
        f"Busy cores before the run (other work on the machine): {info['busy_cores_before']}; "
        f"after: {info['busy_cores_after']}.",
        "",
        "One `inferfleet sim-engine` process"
        + (
            " pinned to one core, the load generator pinned to the other"
            if document["pinned"]
            else ""
        )
        + f". Each level: that many streamed requests of {document['input_tokens']} prompt "
        "tokens sent within 0.5 s, decoding together; engine counters read over a window in "
        "the middle of the decode. Stretch: wall time over modelled busy time, minus 1 (0 while "
        "the emulator keeps pace). Core share needed: the engine's CPU seconds per modelled "
        "second, the share of a core it must get to keep pace, which does not depend on what "
        "else runs on the machine; the observed stretch does (a pinned engine that gets less "
        "of its core than it needs falls behind).",
        "",
        *verdicts,
        "",
    ]
    rows = []
    for level in document["levels"]:
        tpot = level["client_tpot_ms"]
        rows.append(
            [
                level["gpu"],
                level["streams"],
                level["output_tokens"],
                f"{level['modelled_step_ms']:.1f}",
                f"{level['planner_step_ms']:.1f}",
                f"{tpot['p50'] if tpot else math.nan:.1f}",
                f"{level['tpot_vs_planner']:+.1%}",
                f"{level['stretch']:+.1%}",
                f"{level['late_ms_per_step']:.2f}",
                f"{level['schedule_resets']:.0f}",
                f"{level['engine_cpu']:.2f}",
                f"{level['core_share_needed']:.2f}",
                f"{level['engine_us_per_token']:.1f}",
                f"{level['client_cpu']:.2f}",
                f"{level['errors']}",
            ]
        )
    lines += [
        table(
            [
                "emulated GPU",
                "streams",
                "output tokens",
                "modelled step ms",
                "planner step ms",
                "client TPOT p50 ms",
                "TPOT vs planner",
                "stretch",
                "late ms/step",
                "resets",
                "engine CPU (cores)",
                "core share needed",
                "engine us/token",
                "client CPU (cores)",
                "errors",
            ],
            rows,
        ),
        "",
        "Other work on the machine during each level (CPU s of the busiest other processes): "
        + "; ".join(
            f"{level['gpu']} {level['streams']}: "
            + (", ".join(f"{name} {cpu}" for name, cpu in level["other_work"].items()) or "none")
            for level in document["levels"]
        )
        + ".",
        "",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
