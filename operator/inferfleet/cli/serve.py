"""`inferfleet run`, `router` and `sim-engine`: the processes a cluster runs (the operator, a
service's router, the engine emulator). Each command imports what it runs when it runs:
`inferfleet run` loads no simulator, `--help` no Kubernetes client."""

# ruff: noqa: PLC0415

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from inferfleet.cli.common import EXIT_INVALID, GPU_CATALOG_HELP, app, load_gpu_catalog
from inferfleet.engines.common import DEFAULT_SIM_ENGINE_IMAGE, DEFAULT_WEIGHTS_IMAGE
from inferfleet.render import DEFAULT_ROUTER_IMAGE, GPU_PRODUCT_LABEL
from inferfleet.router.config import ADMIN_PORT, DiscoveryMode, RouterConfig, parse_backends
from inferfleet.router.tenants import parse_tenant
from inferfleet.slo import Slo as RequestSlo

# `reconcile.leadership.DEFAULT_ELECTION_ID`, written here so that `--help` does not load the
# Kubernetes client to show it (tests/unit/test_cli_imports.py holds the two equal).
DEFAULT_ELECTION_ID = "inferfleet-operator"


def _adapter_settings(entries: list[str]) -> list[dict[str, Any]]:
    """`--adapter NAME=RANK` flags as a spec's adapters (the emulator reads no weights)."""
    adapters = []
    for entry in entries:
        name, _, rank = entry.partition("=")
        if not rank.isdigit():
            typer.echo(f"error: --adapter {entry!r}: expected NAME=RANK", err=True)
            raise typer.Exit(EXIT_INVALID)
        adapters.append({"name": name, "source": f"hf://{name}", "rank": int(rank)})
    return adapters


EngineDrainTimeout = Annotated[
    float,
    typer.Option(help="Seconds in-flight requests may finish after SIGTERM (vLLM's "
                 "--shutdown-timeout)."),
]  # fmt: skip


@app.command("sim-engine")
def sim_engine_command(
    model: Annotated[str, typer.Option(help="Catalog model name, e.g. llama-3.1-8b.")],
    gpu: Annotated[str, typer.Option(help="GPU type to emulate, e.g. H100-80GB.")],
    model_name: Annotated[
        str | None, typer.Option(help="Served model name (default: --model).")
    ] = None,
    tensor: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 1,
    pipeline: Annotated[int, typer.Option(help="Pipeline-parallel size.")] = 1,
    weights: Annotated[str, typer.Option(help="bf16, fp16, fp8, int8, int4 or fp4.")] = "bf16",
    method: Annotated[
        str | None, typer.Option(help="awq, gptq, smoothquant, fp8, nvfp4 or mxfp4.")
    ] = None,
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
    api_key: Annotated[
        str | None,
        typer.Option(envvar="VLLM_API_KEY", help="Require this bearer key on /v1, as vLLM does."),
    ] = None,
    adapter: Annotated[
        list[str] | None,
        typer.Option(
            help="A LoRA adapter served beside the model: NAME=RANK (its GPU memory is "
            "reserved as vLLM's is). Repeatable."
        ),
    ] = None,
    drain_timeout: EngineDrainTimeout = 30.0,
) -> None:
    """Serve a CPU emulation of a vLLM engine: the OpenAI API and vLLM's metrics, with timing
    from the performance model (the `sim` engine of a ModelDeployment)."""
    from pydantic import ValidationError

    from inferfleet.api.catalog import GpuCatalog
    from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
    from inferfleet.planning.replica import ReplicaConfig
    from inferfleet.sim import openai_api as sim_server

    try:
        shape = json.loads(architecture) if architecture else None
    except json.JSONDecodeError as error:
        typer.echo(f"error: --architecture: not JSON: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    settings: dict[str, Any] = {
        "adapters": _adapter_settings(adapter or []),
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
        prefix_caching=prefix_caching, api_key=api_key or None,
        adapters=[a.name for a in spec.adapters], drain_timeout_s=drain_timeout,
    )  # fmt: skip


# Options of `inferfleet router` that the renderer sets, named here to keep the command short.
BackendFlags = Annotated[
    list[str],
    typer.Option(
        "--backend",
        help="A deployment's role: deployment=NAME,role=ROLE,engine=ENGINE,weight=W,"
        "model=SERVED_NAME,context=TOKENS and service=SVC,port=P (Kubernetes "
        "EndpointSlices) or urls=URL;URL (fixed replicas). Repeatable.",
    ),
]
TenantFlags = Annotated[
    list[str] | None,
    typer.Option(
        "--tenant",
        help="A tenant: name=NAME,keys=DIR (one API key per file: a mounted Secret), and "
        "optional rps=, tpm= (tokens a minute), concurrency=, models=M;M. Repeatable; with "
        "any, every request needs a tenant's key.",
    ),
]
MaxRequestBytes = Annotated[
    int | None,
    typer.Option(help="Larger bodies get 413 (default: 32 per token of context, 1-16 MiB)."),
]
MaxInFlightRequests = Annotated[int, typer.Option(help="Requests held at once; more get 503.")]
MaxInFlightBytes = Annotated[
    int, typer.Option(help="Request bytes held at once; more get 503 (memory: ~4x this).")
]

WakeTimeout = Annotated[
    float | None,
    typer.Option(
        help="The service may be at zero replicas: hold a request that finds none this many "
        "seconds for one to serve (default: 503 at once)."
    ),
]
WakeConfigMap = Annotated[
    str | None,
    typer.Option(
        help="ConfigMap (in --namespace) to push the count of requests held for a replica to, "
        "so that the autoscaler wakes the service at once."
    ),
]


@app.command("router")
def router_command(
    backend: BackendFlags,
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
    admin_port: Annotated[
        int, typer.Option(help="Port of /metrics and /debug/replicas (never the users' port).")
    ] = ADMIN_PORT,
    slo_ttft_p95_ms: Annotated[float | None, typer.Option(help="TTFT target, ms.")] = None,
    slo_tpot_p95_ms: Annotated[float | None, typer.Option(help="TPOT target, ms.")] = None,
    slo_attainment_target: Annotated[
        float, typer.Option(help="Share of requests that should meet the targets.")
    ] = 0.99,
    tenant: TenantFlags = None,
    max_request_bytes: MaxRequestBytes = None,
    max_in_flight_requests: MaxInFlightRequests = 8192,
    max_in_flight_bytes: MaxInFlightBytes = 128 * 1024**2,
    max_attempts: Annotated[int, typer.Option(help="Replicas tried per request.")] = 3,
    drain_delay: Annotated[
        float, typer.Option(help="Seconds /health says 503 before the listener closes.")
    ] = 5.0,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds in-flight streams may run on after that.")
    ] = 120.0,
    wake_timeout: WakeTimeout = None,
    wake_config_map: WakeConfigMap = None,
) -> None:
    """Serve an InferenceService's router: an OpenAI-compatible streaming proxy that picks
    replicas by outstanding tokens and prefix, hands prefill over to decode, and counts each
    request's SLO outcome for Prometheus."""
    from inferfleet.router import server as router_server
    from inferfleet.router.discovery import discovery_for
    from inferfleet.router.keyfiles import engine_keys
    from inferfleet.router.wake_push import with_wake_push

    try:
        config = RouterConfig(
            service=service,
            namespace=namespace,
            discovery=discovery,
            backends=parse_backends(backend),
            tenants=tuple(parse_tenant(t) for t in tenant or ()),
            slo=RequestSlo(slo_ttft_p95_ms, slo_tpot_p95_ms, slo_attainment_target),
            max_request_bytes=max_request_bytes,
            max_in_flight_requests=max_in_flight_requests,
            max_in_flight_bytes=max_in_flight_bytes,
            max_attempts=max_attempts,
            drain_delay_s=drain_delay,
            drain_timeout_s=drain_timeout,
            wake_timeout_s=wake_timeout,
            wake_config_map=wake_config_map,
        )
        engine_keys(config.backends)  # readable now, or said so before anything starts
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if admin_port == port:
        typer.echo("error: --admin-port must differ from --port", err=True)
        raise typer.Exit(EXIT_INVALID)
    discovery_task = with_wake_push(config, discovery_for(config))
    router_server.run(config, host=host, port=port, admin_port=admin_port, discovery=discovery_task)


# Options of `inferfleet run` that the chart sets, named here to keep the command short.
MetricsPort = Annotated[
    int,
    typer.Option(
        envvar="INFERFLEET_METRICS_PORT",
        min=0,
        max=65535,
        help="Serve the operator's Prometheus metrics on this port (0: off).",
    ),
]
MetricsAddress = Annotated[
    str,
    typer.Option(
        envvar="INFERFLEET_METRICS_ADDRESS",
        help="Address the metrics port listens on (in a pod: its IP, as the chart sets).",
    ),
]
RouterImage = Annotated[
    str,
    typer.Option(
        envvar="INFERFLEET_ROUTER_IMAGE",
        help="Image of the routers it renders (where this install pushed it).",
    ),
]
WeightsImage = Annotated[
    str,
    typer.Option(
        envvar="INFERFLEET_WEIGHTS_IMAGE",
        help="Image whose `inferfleet weights` fills weight caches and holds replicas until "
        "they are filled (this install's operator image).",
    ),
]
HfEndpoint = Annotated[
    str | None,
    typer.Option(
        envvar="INFERFLEET_HF_ENDPOINT",
        help="A Hugging Face Hub mirror for weight downloads and fills (HF_ENDPOINT); "
        "default: the Hub.",
    ),
]
SimEngineImage = Annotated[
    str,
    typer.Option(
        envvar="INFERFLEET_SIM_ENGINE_IMAGE",
        help="Image of `sim` engines whose spec names none (engine.version picks its tag).",
    ),
]
AutoscaleInterval = Annotated[
    float, typer.Option(help="Seconds between autoscaling ticks of a service.")
]
MetricsWindow = Annotated[
    float, typer.Option(help="Rate window of the autoscaler's queries, seconds.")
]
RecentMetricsWindow = Annotated[
    float,
    typer.Option(
        help="Short window of the recent arrival rate, seconds (the fast path on a load step): "
        "at least two Prometheus scrape intervals.",
    ),
]
NetworkPolicies = Annotated[
    bool,
    typer.Option(
        help="Render NetworkPolicies: engines admit only their deployment's engines, the "
        "routers that route to them and Prometheus; routers' admin port admits Prometheus alone."
    ),
]
PrometheusNamespaces = Annotated[
    list[str] | None,
    typer.Option(
        "--prometheus-namespace",
        help="Namespace of the Prometheus that scrapes engines and routers, admitted by the "
        "NetworkPolicies (repeatable).",
    ),
]
GpuNodeLabel = Annotated[
    str,
    typer.Option(
        help="Node label whose value names the GPU product, selected on every engine pod "
        "(GPU feature discovery's by default); empty: none, where GPU nodes carry no such label "
        "and each ModelDeployment selects its nodes in spec.scheduling.",
    ),
]
LeaseNamespace = Annotated[
    str | None,
    typer.Option(help="Namespace of the Lease (default: the pod's own, else `default`)."),
]
LeaseName = Annotated[
    str, typer.Option(help="Name of the Lease; replicas with the same one take turns.")
]
LeaseOwner = Annotated[
    str | None,
    typer.Option(
        help="The operator's Deployment, in the Lease's namespace: the Lease's owner, so "
        "that removing the operator removes the Lease.",
    ),
]
LeaderElect = Annotated[
    bool,
    typer.Option(
        help="Reconcile only while holding a coordination.k8s.io Lease, so that replicas "
        "can run side by side with one acting (the chart turns it on)."
    ),
]


NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_NAMESPACE_NAME = 63


def _check_namespaces(names: list[str] | tuple[str, ...]) -> None:
    for name in names:
        if not NAMESPACE_NAME.fullmatch(name) or len(name) > MAX_NAMESPACE_NAME:
            typer.echo(
                f"error: --namespace {name!r} is not a namespace's name (a DNS label of at most"
                f" {MAX_NAMESPACE_NAME} characters; patterns are not served)",
                err=True,
            )
            raise typer.Exit(EXIT_INVALID)


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
    autoscale_interval: AutoscaleInterval = 15.0,
    metrics_window: MetricsWindow = 60.0,
    recent_metrics_window: RecentMetricsWindow = 30.0,
    metrics_port: MetricsPort = 8080,
    metrics_address: MetricsAddress = "127.0.0.1",
    router_image: RouterImage = DEFAULT_ROUTER_IMAGE,
    sim_engine_image: SimEngineImage = DEFAULT_SIM_ENGINE_IMAGE,
    weights_image: WeightsImage = DEFAULT_WEIGHTS_IMAGE,
    hf_endpoint: HfEndpoint = None,
    network_policies: NetworkPolicies = False,
    prometheus_namespace: PrometheusNamespaces = None,
    gpu_node_label: GpuNodeLabel = GPU_PRODUCT_LABEL,
    gpu_catalog: Annotated[Path | None, typer.Option(help=GPU_CATALOG_HELP)] = None,
    leader_elect: LeaderElect = False,
    leader_election_namespace: LeaseNamespace = None,
    leader_election_id: LeaseName = DEFAULT_ELECTION_ID,
    leader_election_owner: LeaseOwner = None,
) -> None:
    """Run the operator: reconcile ModelDeployments and InferenceServices into workloads, and
    autoscale the services with `autoscaling.policy: goodput` from Prometheus."""
    from inferfleet.autoscale.controller import AutoscalerSettings
    from inferfleet.kube import Kube, NoConfigurationError
    from inferfleet.reconcile import operator
    from inferfleet.reconcile.leadership import LeaderElection, default_namespace
    from inferfleet.render import EngineOptions, InstallSettings, Placement
    from inferfleet.render.network import NetworkIsolation

    _check_namespaces(namespace or ())
    try:
        gpus = load_gpu_catalog(gpu_catalog)
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    try:
        Kube.from_environment()
    except NoConfigurationError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    autoscaler = AutoscalerSettings(
        prometheus_url=prometheus_url,
        interval_s=autoscale_interval,
        window_s=metrics_window,
        recent_window_s=min(recent_metrics_window, metrics_window),
    )
    autoscaler = operator.serve_metrics(autoscaler, metrics_address, metrics_port)
    install = InstallSettings(
        router_image=router_image,
        router_discovery=router_discovery,
        engines=EngineOptions(
            sim_engine_image=sim_engine_image, weights_image=weights_image, hf_endpoint=hf_endpoint
        ),
        network=NetworkIsolation(tuple(prometheus_namespace or ())) if network_policies else None,
        placement=Placement(gpu_node_label or None),
        gpus=gpus,
    )
    election: LeaderElection | None = None
    if leader_elect:
        lease_namespace = leader_election_namespace or default_namespace()
        election = LeaderElection(lease_namespace, leader_election_id, leader_election_owner)
    operator.run(namespace or (), liveness, install, autoscaler, election)
