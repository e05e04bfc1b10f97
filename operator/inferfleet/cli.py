"""`inferfleet`: capacity plans, CRD generation and calibration from the command line."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from inferfleet import __version__
from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.crd import crd_files
from inferfleet.api.inference_service import InferenceService, InferenceServiceSpec
from inferfleet.api.model_deployment import ModelDeployment, ModelDeploymentSpec, Role
from inferfleet.autoscale.controller import AutoscalerSettings
from inferfleet.bench import autoscale as bench_autoscale_lib
from inferfleet.bench import loadgen, traces
from inferfleet.demo import DemoSettings, run_demo
from inferfleet.devcluster.binaries import BinariesUnavailableError, ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, DevClusterError, Runtime
from inferfleet.devcluster.images import ImagesUnavailableError
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.prometheus import PrometheusUnavailableError
from inferfleet.engines.common import DEFAULT_SIM_ENGINE_IMAGE
from inferfleet.kube import Kube, NoConfigurationError
from inferfleet.planning import calibration
from inferfleet.planning.capacity import CapacityPlan, Slo, Workload, plan, report
from inferfleet.planning.performance import DEFAULT_EFFICIENCY
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.reconcile import operator
from inferfleet.render import (
    DEFAULT_ROUTER_IMAGE,
    EngineOptions,
    InstallSettings,
    MissingReferenceError,
    UnsupportedSpecError,
    render_inference_service,
    render_model_deployment,
)
from inferfleet.router import proxy as router_proxy
from inferfleet.router.config import DiscoveryMode, RouterConfig, parse_backends
from inferfleet.router.discovery import discovery_for
from inferfleet.sim import openai_api as sim_server
from inferfleet.slo import Slo as RequestSlo

app = typer.Typer(
    help="inferfleet: plan, validate and operate LLM inference fleets on Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"inferfleet {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """inferfleet: plan, validate and operate LLM inference fleets on Kubernetes."""


DEFAULT_CRD_DIR = Path("crds")
# Helm installs a chart's CRDs from its own crds/ folder; the same files, written together.
DEFAULT_CHART_CRD_DIR = Path("charts/inferfleet/crds")
DEFAULT_CALIBRATION_DOC = Path("docs/calibration.md")
EXIT_INVALID = 2
# Planned fine, but a deployment does not fit or cannot meet its SLO: lets pipelines gate on it.
EXIT_NO_FIT = 3
GPU_CATALOG_EXAMPLE = "{H100-80GB: {hourlyPriceUsd: 2.1}, L4-24GB: {hourlyPriceUsd: 0.7}}"
GPU_CATALOG_HELP = (
    "YAML overriding GPU figures: GPU type to the fields to change, e.g. a file holding "
    f"`{GPU_CATALOG_EXAMPLE}`."
)
KNOWN_KINDS = ("ModelDeployment", "InferenceService")


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class InvalidInputError(Exception):
    """Input the user must fix; the message names the file, the field, the value and the rule."""


@dataclass(frozen=True)
class Document:
    kind: str
    name: str
    spec: Mapping[str, Any]


def _load_documents(path: Path) -> Iterator[Document]:
    try:
        text = path.read_text()
    except OSError as error:
        raise InvalidInputError(f"{path}: cannot read: {error.strerror}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InvalidInputError(f"{path}: not valid YAML: {error}") from None
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise InvalidInputError(f"{path}: document {index + 1} is not a mapping")
        kind = document.get("kind")
        metadata = document.get("metadata") or {}
        name = metadata.get("name", f"document-{index + 1}") if isinstance(metadata, dict) else ""
        spec = document.get("spec")
        if not isinstance(spec, dict):
            raise InvalidInputError(f"{path}: {kind} {name}: spec: required mapping is missing")
        yield Document(str(kind), str(name), spec)


def _inferfleet_documents(path: Path) -> list[Document]:
    """The file's ModelDeployments and InferenceServices; any other kind is named on stderr
    (a Namespace or a Secret beside them is normal, a typo in a kind is not) and skipped."""
    documents = list(_load_documents(path))
    for doc in documents:
        if doc.kind not in KNOWN_KINDS:
            typer.echo(
                f"warning: {path}: skipped {doc.kind} {doc.name}: not a kind inferfleet reads "
                f"({', '.join(KNOWN_KINDS)})",
                err=True,
            )
    return [doc for doc in documents if doc.kind in KNOWN_KINDS]


# A cross-field rule's message starts with the path of the field it blames.
_BLAMED_FIELD = re.compile(r"^(?P<path>[A-Za-z][\w.]*): (?P<message>.*)$", re.DOTALL)


def _explain(error: ValidationError, prefix: str) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in (prefix, *item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        value = item.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        blamed = _BLAMED_FIELD.match(message)
        if blamed and item["type"] == "value_error":
            where, message, shown = f"{where}.{blamed['path']}", blamed["message"], ""
        lines.append(f"  {where}: {message}{shown}")
    return "\n".join(lines)


def _validated(model: type[ModelDeploymentSpec] | type[InferenceServiceSpec], doc: Document,
               path: Path) -> Any:  # fmt: skip
    try:
        return model.model_validate(doc.spec)
    except ValidationError as error:
        raise InvalidInputError(
            f"{path}: {doc.kind} {doc.name} is invalid:\n{_explain(error, 'spec')}"
        ) from None


def _gpu_catalog(overrides: Path | None) -> GpuCatalog:
    catalog = GpuCatalog.builtin()
    if overrides is None:
        return catalog
    try:
        data = yaml.safe_load(overrides.read_text()) or {}
        if not isinstance(data, dict):
            raise InvalidInputError(f"{overrides}: expected a mapping of GPU type to figures")
        return catalog.with_overrides(data)
    except (OSError, yaml.YAMLError, ValueError, ValidationError) as error:
        raise InvalidInputError(f"{overrides}: {error}") from None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f} ms"


def _vs(predicted: float, target: float | None) -> str:
    if target is None:
        return _ms(predicted)
    verdict = "meets" if predicted <= target else "MISSES"
    return f"{_ms(predicted)}  ({verdict} target {_ms(target)})"


def render_text(name: str, capacity: CapacityPlan) -> str:
    config, memory = capacity.config, capacity.memory
    gib = 1024**3
    request = capacity.request
    context = request.input_tokens + request.output_tokens
    lines = [
        f"ModelDeployment {name}: {config.model.parameter_count / 1e9:.1f}B parameters, "
        f"{config.weights.value} weights, {config.kv_cache.value} KV cache, "
        f"TP{config.tensor} x PP{config.pipeline} on {config.gpu_type.value}",
        f"  Fit:               {memory.verdict()}",
        "  Memory per GPU:",
        f"    total            {memory.total / gib:8.1f} GiB",
        f"    usable           {memory.usable / gib:8.1f} GiB "
        f"(memoryUtilization {config.memory_utilization})",
        f"    weights          {memory.weights / gib:8.1f} GiB",
        f"    activations      {memory.activations / gib:8.1f} GiB",
        f"    runtime          {memory.runtime / gib:8.1f} GiB",
        f"    KV cache         {memory.kv_cache / gib:8.1f} GiB "
        f"({memory.kv_bytes_per_token:,} bytes/token/GPU)",
        f"  KV capacity:       {memory.kv_capacity_tokens:,} tokens per replica",
        f"  Max concurrency:   {memory.max_concurrency(memory.context_limit)} at max model length "
        f"{memory.context_limit:,}; {memory.max_concurrency(context)} at "
        f"{request.input_tokens}+{request.output_tokens} tokens",
    ]
    if memory.fits:
        lines += [
            f"  Idle TTFT:         {_vs(capacity.idle_ttft_s, capacity.slo.ttft_p95_s)} "
            f"for a {request.input_tokens}-token prompt",
            f"  Idle TPOT:         {_vs(capacity.idle_tpot_s, capacity.slo.tpot_p95_s)}",
            f"  Saturated output:  {capacity.saturated_output_tokens_per_s:,.0f} tokens/s per "
            "replica",
        ]
    if capacity.workload is not None:
        load = capacity.workload
        lines.append(
            f"  Load:              {load.requests_per_second:g} req/s x "
            f"{load.input_tokens}/{load.output_tokens} tokens; SLO p95 TTFT "
            f"{_ms(capacity.slo.ttft_p95_s)}, TPOT {_ms(capacity.slo.tpot_p95_s)}"
        )
    if capacity.reason != memory.verdict():
        lines.append(f"  Plan:              {capacity.reason}")
    for role in capacity.roles:
        line = f"    {role.role.value:<12} {role.replicas:>4} replicas  {role.gpus:>5} GPUs"
        if role.point is not None:
            point = role.point
            line += f"  per replica: {point.rate:.2f} req/s, batch {point.batch:.1f}"
            if point.ttft_p95_s > 0:
                line += f", p95 TTFT {_ms(point.ttft_p95_s)}"
            if point.tpot_s > 0:
                line += f", TPOT {_ms(point.tpot_s)}"
            line += f", MFU {point.mfu:.0%}, MBU {point.mbu:.0%}"
        lines.append(line)
    cost = capacity.cost_per_million_output_tokens_usd
    lines += [
        f"  GPUs:              {capacity.gpus} x {config.gpu_type.value} "
        f"(${capacity.gpus * config.gpu.hourly_price_usd:,.2f}/h)",
        "  Cost per 1M output tokens: "
        + ("-" if cost is None else f"${cost:,.3f}")
        + ("" if capacity.workload else " (replicas saturated)"),
    ]
    return "\n".join(lines)


@app.command("plan")
def plan_command(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML with ModelDeployments (and "
                                       "InferenceServices that give SLO and load).")],
    rps: Annotated[float | None, typer.Option(help="Requests per second to plan for.")] = None,
    input_tokens: Annotated[int | None, typer.Option(help="Prompt length, tokens.")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="Output length, tokens.")] = None,
    ttft_ms: Annotated[float | None, typer.Option(help="p95 TTFT target, ms.")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="p95 TPOT target, ms.")] = None,
    gpu_catalog: Annotated[Path | None, typer.Option(help=GPU_CATALOG_HELP)] = None,
    output: Annotated[OutputFormat, typer.Option("-o", "--output")] = OutputFormat.TEXT,
) -> None:  # fmt: skip
    """Print the capacity plan of each ModelDeployment in FILE."""
    try:
        gpus = _gpu_catalog(gpu_catalog)
        documents = _inferfleet_documents(file)
        services = [
            (doc, _validated(InferenceServiceSpec, doc, file))
            for doc in documents
            if doc.kind == "InferenceService"
        ]
        deployments = [
            (doc, _validated(ModelDeploymentSpec, doc, file))
            for doc in documents
            if doc.kind == "ModelDeployment"
        ]
        if not deployments:
            raise InvalidInputError(f"{file}: no ModelDeployment to plan")
        plans = []
        for doc, spec in deployments:
            service = next(
                (s for _, s in services if any(d.name == doc.name for d in s.deployments)), None
            )
            plans.append(
                (
                    doc.name,
                    _plan_one(
                        spec,
                        service=service,
                        gpus=gpus,
                        rps=rps,
                        input_tokens=input_tokens,
                        output_tokens=output_tokens,
                        ttft_ms=ttft_ms,
                        tpot_ms=tpot_ms,
                    ),
                )
            )
    except InvalidInputError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    if output == OutputFormat.JSON:
        typer.echo(json.dumps([{"name": n, **report(p)} for n, p in plans], indent=2))
    else:
        typer.echo("\n\n".join(render_text(name, p) for name, p in plans))
    if any(not p.memory.fits or p.meets_slo is False for _, p in plans):
        raise typer.Exit(EXIT_NO_FIT)


def _plan_one(
    spec: ModelDeploymentSpec,
    *,
    service: InferenceServiceSpec | None,
    gpus: GpuCatalog,
    rps: float | None,
    input_tokens: int | None,
    output_tokens: int | None,
    ttft_ms: float | None,
    tpot_ms: float | None,
) -> CapacityPlan:
    expected = service.expected_load if service else None
    rate = rps if rps is not None else (expected.requests_per_second if expected else None)
    inp = input_tokens or (expected.input_tokens if expected else None)
    out = output_tokens or (expected.output_tokens if expected else None)
    workload = None
    if rate is not None or inp is not None or out is not None:
        if rate is None or inp is None or out is None:
            raise InvalidInputError(
                "a load needs --rps, --input-tokens and --output-tokens together "
                "(or an InferenceService with expectedLoad)"
            )
        try:
            workload = Workload(rate, inp, out)
        except ValueError as error:
            raise InvalidInputError(str(error)) from None
    slo_ttft = ttft_ms if ttft_ms is not None else (service.slo.ttft_p95_ms if service else None)
    slo_tpot = tpot_ms if tpot_ms is not None else (service.slo.tpot_p95_ms if service else None)
    for label, value in (("--ttft-ms", slo_ttft), ("--tpot-ms", slo_tpot)):
        if value is not None and not value > 0:
            raise InvalidInputError(f"{label} must be positive (got {value})")
    slo = Slo(
        ttft_p95_s=None if slo_ttft is None else slo_ttft / 1e3,
        tpot_p95_s=None if slo_tpot is None else slo_tpot / 1e3,
    )
    return plan(spec, gpus, workload, slo)


@app.command("crds")
def crds_command(
    directory: Annotated[Path, typer.Option("--dir", help="Where to write.")] = DEFAULT_CRD_DIR,
    chart_directory: Annotated[
        Path, typer.Option("--chart-dir", help="Where the Helm chart keeps the same files.")
    ] = DEFAULT_CHART_CRD_DIR,
) -> None:
    """Regenerate the CustomResourceDefinitions from the API models, for kubectl and Helm."""
    for target in (directory, chart_directory):
        target.mkdir(parents=True, exist_ok=True)
        for name, text in crd_files().items():
            path = target / name
            path.write_text(text, encoding="utf-8")
            typer.echo(f"wrote {path}")


@app.command("calibrate")
def calibrate_command(
    doc: Annotated[Path, typer.Option(help="Markdown file whose table to rewrite.")] = (
        DEFAULT_CALIBRATION_DOC
    ),
    refit: Annotated[bool, typer.Option(help="Search the efficiency terms first (slow).")] = False,
) -> None:
    """Predict every published point, and rewrite the calibration table in DOC."""
    terms = DEFAULT_EFFICIENCY
    if refit:
        terms = calibration.fit(progress=lambda line: typer.echo(line, err=True))
    rows = calibration.table(terms)
    held_out = calibration.leave_one_out(start=terms)
    table = calibration.render_markdown(terms, rows, held_out)
    doc.write_text(calibration.replace_table(doc.read_text(), table))
    typer.echo(table)


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
        Runtime,
        typer.Option(
            help="How the fleet runs pods: venv (host processes of this install's inferfleet, "
            "quick) or oci (each pod from its image through crun, the operator as a pod too)."
        ),
    ] = Runtime.VENV,
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
    try:
        pools = NodePool.parse(nodes)
    except ValueError as error:
        typer.echo(f"error: --nodes: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    cluster = DevCluster(directory)
    started = time.monotonic()
    try:
        bin_dir = ensure_binaries()
        cluster.up(bin_dir, pools, cpu_nodes=cpu_nodes, timeout_s=timeout)
        if crds or with_fleet:
            cluster.install_crds()
        if with_fleet:
            cluster.start_fleet(
                timeout_s=timeout, runtime=runtime, images=images, operator=with_operator
            )
    except (
        DevClusterError,
        BinariesUnavailableError,
        PrometheusUnavailableError,
        ImagesUnavailableError,
    ) as error:
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
    killed = DevCluster(directory).down()
    typer.echo("stopped" + (f" ({', '.join(killed)} needed SIGKILL)" if killed else ""))


@dev_cluster.command("status")
def dev_cluster_status(directory: StateDir = DEFAULT_DEV_CLUSTER_DIR) -> None:
    """Each component: running or stopped, healthy or not."""
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
    try:
        bin_dir = ensure_binaries()
    except BinariesUnavailableError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    kubeconfig = DevCluster(directory).kubeconfig_path
    argv = [str(bin_dir / "kube"), "kubectl", f"--kubeconfig={kubeconfig}", *ctx.args]
    os.execv(argv[0], argv)


@app.command("sim-engine")
def sim_engine_command(
    model: Annotated[str, typer.Option(help="Catalog model name, e.g. llama-3.1-8b.")],
    gpu: Annotated[str, typer.Option(help="GPU type to emulate, e.g. H100-80GB.")],
    model_name: Annotated[
        str | None, typer.Option(help="Served model name (default: --model).")
    ] = None,
    tensor: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 1,
    pipeline: Annotated[int, typer.Option(help="Pipeline-parallel size.")] = 1,
    weights: Annotated[str, typer.Option(help="bf16, fp16, fp8, int8 or int4.")] = "bf16",
    method: Annotated[str | None, typer.Option(help="awq, gptq, smoothquant or fp8.")] = None,
    kv_cache: Annotated[str, typer.Option(help="auto, bf16, fp16 or fp8.")] = "auto",
    max_sequences: Annotated[int, typer.Option(help="Most sequences in a batch.")] = 256,
    max_batched_tokens: Annotated[int, typer.Option(help="Token budget of a step.")] = 8192,
    max_model_length: Annotated[int | None, typer.Option(help="Longest request.")] = None,
    memory_utilization: Annotated[float, typer.Option(help="GPU memory fraction.")] = 0.9,
    architecture: Annotated[
        str | None, typer.Option(help="The model's shape as JSON (ModelArchitecture wire form).")
    ] = None,
    chunked_prefill: Annotated[bool, typer.Option(help="Split prompts across steps.")] = True,
    prefix_caching: Annotated[bool, typer.Option(help="Reuse cached prompt prefixes.")] = True,
    role: Annotated[str, typer.Option(help="aggregated, prefill or decode.")] = "aggregated",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Serve a CPU emulation of a vLLM engine: the OpenAI API and vLLM's metrics, with timing
    from the performance model (the `sim` engine of a ModelDeployment)."""
    try:
        shape = json.loads(architecture) if architecture else None
    except json.JSONDecodeError as error:
        typer.echo(f"error: --architecture: not JSON: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    settings: dict[str, Any] = {
        "model": {"name": model, "source": f"hf://{model}"}
        | ({"architecture": shape} if shape is not None else {}),
        "engine": {"name": "sim"},
        "gpu": {"type": gpu, "memoryUtilization": memory_utilization},
        "parallelism": {"tensor": tensor, "pipeline": pipeline},
        "precision": {"weights": weights, "kvCache": kv_cache}
        | ({"method": method} if method else {}),
        "batching": {
            "maxSequences": max_sequences,
            "maxBatchedTokens": max_batched_tokens,
            "chunkedPrefill": chunked_prefill,
        }
        | ({"maxModelLength": max_model_length} if max_model_length else {}),
    }
    try:
        spec = ModelDeploymentSpec.model_validate(settings)
        engine_role = Role(role)
    except (ValidationError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    config = ReplicaConfig.from_spec(spec, GpuCatalog.builtin())
    sim_server.run(
        config, model_name or model, engine_role, host=host, port=port,
        prefix_caching=prefix_caching,
    )  # fmt: skip


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
    duration: Annotated[float, typer.Option(help="Seconds of trace to replay.")] = 120.0,
    nodes: Annotated[str, typer.Option(help="GPU node pools.")] = "L4-24GB=2",
    state_dir: Annotated[
        Path | None, typer.Option("--dir", help="Where the fleet's state and logs go.")
    ] = None,
) -> None:
    """Start a local fleet (dev cluster, fleet agent, operator, Prometheus), apply an
    autoscaled example, replay a trace through its router and watch the fleet scale; then
    stop everything."""
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
    except (DevClusterError, BinariesUnavailableError, PrometheusUnavailableError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command("router")
def router_command(
    backend: Annotated[
        list[str],
        typer.Option(
            "--backend",
            help="A deployment's role: deployment=NAME,role=ROLE,engine=ENGINE,weight=W,"
            "model=SERVED_NAME and service=SVC,port=P (Kubernetes EndpointSlices) or "
            "urls=URL;URL (fixed replicas). Repeatable.",
        ),
    ],
    service: Annotated[
        str, typer.Option(help="The InferenceService's name: the service label of metrics.")
    ],
    namespace: Annotated[
        str | None, typer.Option(help="Namespace of the backends' Services.")
    ] = None,
    discovery: Annotated[
        DiscoveryMode,
        typer.Option(
            help="Find replicas in the Services' EndpointSlices, or as Ready pods "
            "their selectors pick (clusters with loopback pod addresses)."
        ),
    ] = DiscoveryMode.ENDPOINT_SLICES,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    slo_ttft_p95_ms: Annotated[float | None, typer.Option(help="TTFT target, ms.")] = None,
    slo_tpot_p95_ms: Annotated[float | None, typer.Option(help="TPOT target, ms.")] = None,
    slo_attainment_target: Annotated[
        float, typer.Option(help="Share of requests that should meet the targets.")
    ] = 0.99,
    max_request_bytes: Annotated[int, typer.Option(help="Larger bodies get 413.")] = 16 * 1024**2,
    max_attempts: Annotated[int, typer.Option(help="Replicas tried per request.")] = 3,
    drain_delay: Annotated[
        float, typer.Option(help="Seconds /health says 503 before the listener closes.")
    ] = 5.0,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds in-flight streams may run on after that.")
    ] = 120.0,
) -> None:
    """Serve an InferenceService's router: an OpenAI-compatible streaming proxy that picks
    replicas by outstanding tokens and prefix, hands prefill over to decode, and counts each
    request's SLO outcome for Prometheus."""
    try:
        config = RouterConfig(
            service=service,
            namespace=namespace,
            discovery=discovery,
            backends=parse_backends(backend),
            slo=RequestSlo(slo_ttft_p95_ms, slo_tpot_p95_ms, slo_attainment_target),
            max_request_bytes=max_request_bytes,
            max_attempts=max_attempts,
            drain_delay_s=drain_delay,
            drain_timeout_s=drain_timeout,
        )
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    router_proxy.run(config, host=host, port=port, discovery=discovery_for(config))


@app.command("run")
def run_command(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only these namespaces (repeatable)."),
    ] = None,
    liveness: Annotated[
        str | None, typer.Option(help="Serve a liveness probe, e.g. http://0.0.0.0:8080/healthz.")
    ] = None,
    router_discovery: Annotated[
        DiscoveryMode,
        typer.Option(
            help="How rendered routers find replicas: endpointslices, or pods where "
            "pod addresses are loopback (the dev cluster)."
        ),
    ] = DiscoveryMode.ENDPOINT_SLICES,
    prometheus_url: Annotated[
        str | None,
        typer.Option(help="Prometheus that scrapes routers and engines (autoscaling reads it)."),
    ] = None,
    autoscale_interval: Annotated[
        float, typer.Option(help="Seconds between autoscaling ticks of a service.")
    ] = 15.0,
    metrics_window: Annotated[
        float, typer.Option(help="Rate window of the autoscaler's queries, seconds.")
    ] = 60.0,
    metrics_port: Annotated[
        int,
        typer.Option(
            envvar="INFERFLEET_METRICS_PORT",
            min=0,
            max=65535,
            help="Serve the operator's Prometheus metrics on this port (0: off).",
        ),
    ] = 8080,
    metrics_address: Annotated[
        str,
        typer.Option(
            envvar="INFERFLEET_METRICS_ADDRESS",
            help="Address the metrics port listens on (in a pod: its IP, as the chart sets).",
        ),
    ] = "127.0.0.1",
    router_image: Annotated[
        str,
        typer.Option(
            envvar="INFERFLEET_ROUTER_IMAGE",
            help="Image of the routers it renders (where this install pushed it).",
        ),
    ] = DEFAULT_ROUTER_IMAGE,
    sim_engine_image: Annotated[
        str,
        typer.Option(
            envvar="INFERFLEET_SIM_ENGINE_IMAGE",
            help="Image of `sim` engines whose spec names none (engine.version picks its tag).",
        ),
    ] = DEFAULT_SIM_ENGINE_IMAGE,
) -> None:
    """Run the operator: reconcile ModelDeployments and InferenceServices into workloads, and
    autoscale the services with `autoscaling.policy: goodput` from Prometheus."""
    try:
        Kube.from_environment()
    except NoConfigurationError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    autoscaler = AutoscalerSettings(
        prometheus_url=prometheus_url, interval_s=autoscale_interval, window_s=metrics_window
    )
    autoscaler = operator.serve_metrics(autoscaler, metrics_address, metrics_port)
    install = InstallSettings(
        router_image=router_image,
        router_discovery=router_discovery,
        engines=EngineOptions(sim_engine_image=sim_engine_image),
    )
    operator.run(namespace or (), liveness, install, autoscaler)


@app.command("render")
def render_command(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML with ModelDeployments and "
                                       "InferenceServices.")],
    namespace: Annotated[str, typer.Option("-n", "--namespace")] = "default",
) -> None:  # fmt: skip
    """Print the Kubernetes objects the operator would create, for review and GitOps. A
    ModelDeployment that does not fit gets none, as in the cluster: exit status 3."""
    try:
        documents = _inferfleet_documents(file)
        deployments = {
            doc.name: ModelDeployment(
                metadata={"name": doc.name, "namespace": namespace},
                spec=_validated(ModelDeploymentSpec, doc, file),
            )
            for doc in documents
            if doc.kind == "ModelDeployment"
        }
        objects: list[dict[str, Any]] = []
        unfit = []
        for name, md in deployments.items():
            memory = plan(md.spec).memory
            if memory.fits:
                objects += render_model_deployment(md)
            else:
                unfit.append(f"ModelDeployment {name} does not fit, nothing rendered for it: "
                             f"{memory.verdict()}")  # fmt: skip
        for doc in documents:
            if doc.kind == "InferenceService":
                service = InferenceService(
                    metadata={"name": doc.name, "namespace": namespace},
                    spec=_validated(InferenceServiceSpec, doc, file),
                )
                objects += render_inference_service(service, deployments)
    except (InvalidInputError, UnsupportedSpecError, MissingReferenceError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    typer.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)
    for message in unfit:
        typer.echo(f"error: {file}: {message}", err=True)
    if unfit:
        raise typer.Exit(EXIT_NO_FIT)


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
        typer.Option(
            help="Policies to compare (repeat): " + ", ".join(bench_autoscale_lib.POLICIES)
        ),
    ] = None,
    traces_dir: Annotated[Path, typer.Option(help="Where the scenario's trace lives.")] = Path(
        "../shared/traces"
    ),
    out: Annotated[Path, typer.Option(help="Directory for the tables and plots.")] = Path(
        "benchmarks/autoscale/results"
    ),
    plots: Annotated[bool, typer.Option(help="Write PNG plots (needs matplotlib).")] = True,
) -> None:
    """Compare scaling policies on a scenario in the fleet simulator: attainment, goodput per
    GPU-hour, GPU-hours against a clairvoyant oracle, reaction time, oscillation."""
    try:
        scenario = bench_autoscale_lib.load_scenario(spec)
        if trace is not None:
            scenario = dataclasses.replace(scenario, trace=trace.name, pattern=None)
            traces_dir = trace.parent
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


def main() -> None:
    app(prog_name="inferfleet")


if __name__ == "__main__":
    main()
