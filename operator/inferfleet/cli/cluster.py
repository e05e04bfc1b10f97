"""`inferfleet dev-cluster` and `inferfleet demo`: the local control plane and the live fleet
on it. The commands import the dev cluster when they run, not when the command line is
built (`inferfleet run` must not load it)."""

# ruff: noqa: PLC0415

from __future__ import annotations

import os
import tempfile
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from inferfleet.cli.common import EXIT_INVALID, app

dev_cluster = typer.Typer(
    help="A real Kubernetes control plane on loopback with fake GPU nodes (kwok).",
    no_args_is_help=True,
)
app.add_typer(dev_cluster, name="dev-cluster")

DEFAULT_DEV_CLUSTER_DIR = (
    Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    / "inferfleet"
    / "dev-cluster"
)
DEFAULT_NODE_POOLS = "H100-80GB=2,H200-141GB=1,L40S-48GB=1"


class FleetRuntime(StrEnum):
    """`devcluster.cluster.Runtime` as the command line offers it, without loading the dev
    cluster to build the command line (tests/unit/test_cli_imports.py holds the two equal)."""

    VENV = "venv"
    OCI = "oci"


StateDir = Annotated[Path, typer.Option("--dir", help="State directory of the cluster.")]


@dev_cluster.command("up")
def dev_cluster_up(
    directory: StateDir = DEFAULT_DEV_CLUSTER_DIR,
    nodes: Annotated[
        str, typer.Option(help="Fake GPU node pools, GPU type=count, comma-separated.")
    ] = DEFAULT_NODE_POOLS,
    cpu_nodes: Annotated[
        int, typer.Option(min=0, help="Untainted nodes without GPUs, for routers and the like.")
    ] = 1,
    crds: Annotated[bool, typer.Option(help="Install the inferfleet CRDs.")] = True,
    with_fleet: Annotated[
        bool,
        typer.Option(
            help="Also run the fleet agent (a real process per sim engine and router pod), "
            "the operator and a Prometheus that discovers pods through the API server."
        ),
    ] = False,
    runtime: Annotated[
        FleetRuntime,
        typer.Option(
            help="How the fleet runs pods: venv (host processes of this install's inferfleet, "
            "quick) or oci (each pod from its image through crun, the operator as a pod too)."
        ),
    ] = FleetRuntime.VENV,
    images: Annotated[
        Path | None,
        typer.Option(
            help="With --runtime oci: the image store (OCI layouts); default: built by "
            "tools/images/build.sh."
        ),
    ] = None,
    with_operator: Annotated[
        bool,
        typer.Option(
            "--operator/--no-operator",
            help="Run the operator with the fleet (--no-operator: install it yourself).",
        ),
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds each component may take.")] = 120.0,
) -> None:
    """Build (first time only) and start the control plane; print how to reach it."""
    from inferfleet.devcluster.binaries import ensure_binaries
    from inferfleet.devcluster.cluster import DevCluster, DevClusterError, Runtime
    from inferfleet.devcluster.nodes import NodePool
    from inferfleet.devcluster.tools import ToolUnavailableError

    try:
        pools = NodePool.parse(nodes)
    except ValueError as error:
        typer.echo(f"error: --nodes: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    cluster = DevCluster(directory)
    started = time.monotonic()
    try:
        bin_dir = ensure_binaries()
        cluster.up(
            bin_dir, pools, cpu_nodes=cpu_nodes, timeout_s=timeout, readiness_by_fleet=with_fleet
        )
        if crds:
            cluster.install_crds()
        if with_fleet:
            cluster.start_fleet(
                timeout_s=timeout,
                runtime=Runtime(runtime.value),
                images=images,
                operator=with_operator,
            )
    except (DevClusterError, ToolUnavailableError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"dev cluster up in {time.monotonic() - started:.1f} s: {', '.join(nodes.split(','))}"
    )
    typer.echo(f"export KUBECONFIG={cluster.kubeconfig_path}")
    typer.echo("inferfleet dev-cluster kubectl get nodes")
    if with_fleet:
        typer.echo(f"Prometheus: {cluster.prometheus_url}")


@dev_cluster.command("down")
def dev_cluster_down(directory: StateDir = DEFAULT_DEV_CLUSTER_DIR) -> None:
    """Stop every component of the cluster (its state directory stays for inspection)."""
    from inferfleet.devcluster.cluster import DevCluster

    killed = DevCluster(directory).down()
    typer.echo("stopped" + (f" ({', '.join(killed)} needed SIGKILL)" if killed else ""))


@dev_cluster.command("status")
def dev_cluster_status(directory: StateDir = DEFAULT_DEV_CLUSTER_DIR) -> None:
    """Each component: running or stopped, healthy or not."""
    from inferfleet.devcluster.cluster import DevCluster

    cluster = DevCluster(directory)
    report = cluster.status()
    for component, state in report.items():
        typer.echo(f"{component:<24} {state}")
    if cluster.prometheus_url is not None:
        typer.echo(f"{'prometheus url':<24} {cluster.prometheus_url}")
    if any(not s.startswith("running") or "not healthy" in s for s in report.values()):
        raise typer.Exit(1)


@dev_cluster.command("kubeconfig")
def dev_cluster_kubeconfig(directory: StateDir = DEFAULT_DEV_CLUSTER_DIR) -> None:
    """Print the admin kubeconfig's path: export KUBECONFIG=$(inferfleet dev-cluster kubeconfig).
    Fails (exit 1) when no cluster runs there: a path to nothing would only fail later."""
    from inferfleet.devcluster.cluster import DevCluster

    cluster = DevCluster(directory)
    apiserver = cluster.status().get("kube-apiserver", "never started")
    if not apiserver.startswith("running") or not cluster.kubeconfig_path.is_file():
        typer.echo(
            f"error: no dev cluster runs in {cluster.state_dir} (kube-apiserver: {apiserver}); "
            "start one with `inferfleet dev-cluster up`",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(cluster.kubeconfig_path)


@dev_cluster.command(
    "kubectl", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def dev_cluster_kubectl(ctx: typer.Context, directory: StateDir = DEFAULT_DEV_CLUSTER_DIR) -> None:
    """Run the bundled kubectl against the cluster: inferfleet dev-cluster kubectl get nodes."""
    from inferfleet.devcluster.binaries import ensure_binaries
    from inferfleet.devcluster.cluster import DevCluster
    from inferfleet.devcluster.tools import ToolUnavailableError

    try:
        bin_dir = ensure_binaries()
    except ToolUnavailableError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    kubeconfig = DevCluster(directory).kubeconfig_path
    argv = [str(bin_dir / "kube"), "kubectl", f"--kubeconfig={kubeconfig}", *ctx.args]
    os.execv(argv[0], argv)


@app.command("demo")
def demo_command(
    example: Annotated[
        Path, typer.Option(help="An autoscaled ModelDeployment and InferenceService (sim).")
    ] = Path("examples/llama-3.1-8b-autoscaled-sim.yaml"),
    trace: Annotated[
        Path | None,
        typer.Option(
            help="A trace to replay (.csv or .jsonl), e.g. the Azure LLM inference trace "
            "(README: where to download it). Default: a built-in chat-shaped load."
        ),
    ] = None,
    rate_multiplier: Annotated[float, typer.Option(help="Replay at N x the recorded rate.")] = 1.0,
    start: Annotated[float, typer.Option(help="Trace seconds to skip.")] = 0.0,
    duration: Annotated[
        float, typer.Option(help="Seconds of load to replay (built-in or trace).")
    ] = 240.0,
    nodes: Annotated[str, typer.Option(help="GPU node pools.")] = "L4-24GB=2",
    state_dir: Annotated[
        Path | None, typer.Option("--dir", help="Where the fleet's state and logs go.")
    ] = None,
) -> None:
    """Start a local fleet (dev cluster, fleet agent, operator, Prometheus), apply an
    autoscaled example, send a load through its router (a built-in chat load, or a trace) and
    watch the fleet scale; then stop everything."""
    from inferfleet.demo import DemoSettings, run_demo
    from inferfleet.devcluster.cluster import DevClusterError
    from inferfleet.devcluster.tools import ToolUnavailableError

    for path in (example, trace):
        if path is not None and not path.is_file():
            typer.echo(f"error: {path} is not a file", err=True)
            raise typer.Exit(EXIT_INVALID)
    settings = DemoSettings(
        example=example, trace=trace, rate_multiplier=rate_multiplier, start_s=start,
        duration_s=duration, pools=nodes,
    )  # fmt: skip
    directory = state_dir or Path(tempfile.mkdtemp(prefix="inferfleet-demo-"))
    try:
        code = run_demo(settings, directory, typer.echo)
    except (DevClusterError, ToolUnavailableError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)
