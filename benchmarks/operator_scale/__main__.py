"""`python -m benchmarks.operator_scale`: options, node sizing, and writing the results."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from benchmarks.operator_scale import __doc__ as package_doc
from benchmarks.operator_scale.harness import Config, log, measure
from benchmarks.operator_scale.procfs import ROOT
from benchmarks.operator_scale.report import markdown
from benchmarks.operator_scale.summary import PODS_PER_NODE, summarise
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.components import ClientRateLimit
from inferfleet.render.inference_service import ROUTER_REPLICAS

# What Kubernetes' own scalability tests give the controller manager and the scheduler
# (CONTROLLER_MANAGER_TEST_ARGS, SCHEDULER_TEST_ARGS); their defaults are 20/30 and 50/100.
KUBE_API_QPS = 100.0
KUBE_API_BURST = 100


def nodes_for(pods: int) -> int:
    """Nodes that hold `pods` at 80 % of a node's pod limit, plus a spare."""
    return math.ceil(pods / (PODS_PER_NODE * 0.8)) + 1


def default_nodes(services: int, baseline_samples: int) -> str:
    """L4 nodes for one engine pod per service (warm-up and single services included; the
    bare Deployments' pods are gone before the rollout)."""
    return f"L4-24GB={nodes_for(services + baseline_samples + 1)}"


def default_cpu_nodes(services: int, baseline_samples: int) -> int:
    """Untainted CPU nodes for every router pod (ROUTER_REPLICAS per service)."""
    return nodes_for(ROUTER_REPLICAS * (services + baseline_samples + 1))


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Path]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.operator_scale",
        description=(package_doc or "").split("\n\n")[0],
    )
    parser.add_argument("--services", type=int, default=1000, help="services applied at once")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--baseline-samples", type=int, default=3)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument(
        "--quiet-timeout-seconds",
        type=float,
        default=300.0,
        help="after all Ready, how long to wait for the operator to go quiet",
    )
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--timeout-seconds", type=float, default=1200.0)
    parser.add_argument("--nodes", help="GPU node pools, e.g. L4-24GB=4 (default: sized to fit)")
    parser.add_argument(
        "--cpu-nodes", type=int, help="untainted CPU nodes for the routers (default: sized to fit)"
    )
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        default=KUBE_API_QPS,
        help="client QPS of the controller manager and the scheduler",
    )
    parser.add_argument(
        "--kube-api-burst",
        type=int,
        default=KUBE_API_BURST,
        help="client burst of the controller manager and the scheduler",
    )
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the cluster's state directory (logs)"
    )
    args = parser.parse_args(argv)
    if args.services < 1 or args.baseline_samples < 1:
        parser.error("--services and --baseline-samples must be at least 1")
    if args.kube_api_qps <= 0 or args.kube_api_burst < 1:
        parser.error("--kube-api-qps must be positive and --kube-api-burst at least 1")
    config = Config(
        services=args.services,
        baseline_samples=args.baseline_samples,
        settle_s=args.settle_seconds,
        quiet_timeout_s=args.quiet_timeout_seconds,
        steady_s=args.steady_seconds,
        timeout_s=args.timeout_seconds,
        nodes=args.nodes or default_nodes(args.services, args.baseline_samples),
        cpu_nodes=args.cpu_nodes
        if args.cpu_nodes is not None
        else default_cpu_nodes(args.services, args.baseline_samples),
        keep_state=args.keep_state,
        client_rate=ClientRateLimit(qps=args.kube_api_qps, burst=args.kube_api_burst),
    )
    return config, args.out


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the stacks: operator and cluster get stopped


def main(argv: Sequence[str] | None = None) -> int:
    config, out = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    bin_dir = ensure_binaries()
    state_dir = Path(tempfile.mkdtemp(prefix="inferfleet-operator-scale-"))
    try:
        run = measure(config, bin_dir, state_dir)
        result = summarise(run)
    finally:
        if config.keep_state:
            log(f"state kept in {state_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    report = markdown(result)
    (out / "operator_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "operator_scale.md").write_text(report)
    print(report)
    leftovers = result["measurement"]["leftover_processes"]
    if leftovers:
        log(f"processes left behind: {leftovers}")
    complete = result["headline"]["complete"] and result["bare_deployments"]["complete"]
    return 0 if complete and not leftovers else 1


if __name__ == "__main__":
    sys.exit(main())
