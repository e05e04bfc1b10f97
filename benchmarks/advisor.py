"""How long `inferfleet plan --recommend` searches its default space, per example.

    .venv/bin/python -m benchmarks.advisor [--repeat 3]

For each example with an InferenceService that gives a load and an SLO, the advisor
(`planning.advisor.recommend`, with the engine adapters' refusals as the CLI uses them) is
timed over the default search space, best of `--repeat`; the baseline, in the same run, is one
capacity plan of the example's own ModelDeployment (`planning.capacity.plan`), so that the
search's cost reads as a number of plans. The calibration table behind the error bands is
computed once, before any timing (the CLI computes it once per run too; its time is reported
apart). Writes `advisor.json` and `advisor.md` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.serving_harness import RESULTS, machine, machine_line
from inferfleet.api.inference_service import InferenceServiceSpec
from inferfleet.api.model_deployment import ModelDeploymentSpec
from inferfleet.engines import refusal as engine_refusal
from inferfleet.planning.advisor import error_bands, recommend
from inferfleet.planning.capacity import Workload, plan
from inferfleet.slo import Slo

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GOAL_S = 2.0


def _best_of(repeat: int, run: Any) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _cases() -> list[tuple[str, ModelDeploymentSpec, Workload, Slo]]:
    cases = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
        deployments = [d for d in documents if d.get("kind") == "ModelDeployment"]
        services = [d for d in documents if d.get("kind") == "InferenceService"]
        if len(deployments) != 1 or not services:
            continue
        service = InferenceServiceSpec.model_validate(services[0]["spec"])
        spec = ModelDeploymentSpec.model_validate(deployments[0]["spec"])
        if service.expected_load is None or "architectureFrom" in deployments[0]["spec"]["model"]:
            continue
        cases.append(
            (path.stem, spec, Workload.from_spec(service.expected_load), Slo.from_spec(service.slo))
        )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    start = time.perf_counter()
    error_bands()
    calibration_s = time.perf_counter() - start
    rows: list[dict[str, Any]] = []
    for name, spec, workload, slo in _cases():
        baseline = _best_of(args.repeat, lambda: plan(spec, None, workload, slo))  # noqa: B023
        found = recommend(spec, workload, slo, refuse=engine_refusal)
        search = _best_of(
            args.repeat,
            lambda: recommend(spec, workload, slo, refuse=engine_refusal),  # noqa: B023
        )
        rows.append(
            {
                "example": name,
                "searched": found.searched,
                "meetSlo": len(found.options),
                "searchS": search,
                "planS": baseline,
                "plans": search / baseline,
            }
        )
        print(
            f"{name}: {found.searched} searched in {search:.2f} s ({search / baseline:.0f} plans)"
        )
    info = machine()
    document = {"machine": info, "calibrationS": calibration_s, "goalS": GOAL_S, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "advisor.json").write_text(json.dumps(document, indent=2) + "\n")
    worst = max(row["searchS"] for row in rows)
    lines = [
        "# The advisor's search: `inferfleet plan --recommend`",
        "",
        f"{machine_line(info).rstrip('.')}; best of {args.repeat}. The default space: every "
        "catalog GPU type, seven precisions (and the example's own), tensor sizes 1 to 8, "
        "pipeline sizes that span nodes, aggregated and disaggregated. Baseline: one capacity "
        "plan of the "
        "example's own ModelDeployment, in the same run.",
        "",
        f"Goal: under {GOAL_S:g} s for the default space on this machine; slowest "
        f"{worst:.2f} s ({'met' if worst < GOAL_S else 'not met'}). The calibration table "
        f"behind the error bands, computed once per run: {calibration_s:.2f} s.",
        "",
        "| example | configurations | meet the SLO | search | / one plan |",
        "|---|---|---|---|---|",
        *(
            f"| {r['example']} | {r['searched']} | {r['meetSlo']} | {r['searchS']:.2f} s | "
            f"{r['plans']:.0f} |"
            for r in rows
        ),
        "",
    ]
    (args.out / "advisor.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
