"""`inferfleet plan`, `render`, `crds` and `calibrate`: specs read from files, checked, planned
and rendered."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from inferfleet.api.architecture_source import architecture_source, read_architecture
from inferfleet.api.catalog import GpuCatalog, GpuType
from inferfleet.api.crd import crd_files
from inferfleet.api.hf_config import UnsupportedConfigError, architecture_from_hf_config
from inferfleet.api.inference_service import (
    DEFAULT_INPUT_TOKENS_CV,
    MAX_INPUT_TOKENS_CV,
    InferenceService,
    InferenceServiceSpec,
)
from inferfleet.api.model_deployment import ModelDeployment, ModelDeploymentSpec
from inferfleet.cli.common import (
    EXIT_INVALID,
    EXIT_NO_FIT,
    GPU_CATALOG_HELP,
    app,
    load_gpu_catalog,
)
from inferfleet.planning import calibration
from inferfleet.planning.capacity import CapacityPlan, Workload, plan, report
from inferfleet.planning.performance import DEFAULT_EFFICIENCY
from inferfleet.render import (
    MissingReferenceError,
    UnsupportedSpecError,
    render_inference_service,
    render_model_deployment,
)
from inferfleet.render.manifest_yaml import dump_manifests
from inferfleet.slo import Slo

DEFAULT_CRD_DIR = Path("crds")
# Helm installs a chart's CRDs from its own crds/ folder; the same files, written together.
DEFAULT_CHART_CRD_DIR = Path("charts/inferfleet/crds")
DEFAULT_CALIBRATION_DOC = Path("docs/calibration.md")
KNOWN_KINDS = ("ModelDeployment", "InferenceService")


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"
    YAML = "yaml"


class InvalidInputError(Exception):
    """Input the user must fix; the message names the file, the field, the value and the rule."""


@dataclass(frozen=True)
class Document:
    kind: str
    name: str
    spec: Mapping[str, Any]
    data: Mapping[str, Any] = field(default_factory=dict)
    """A ConfigMap's data (a model's config.json that a ModelDeployment reads)."""


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
        if kind not in KNOWN_KINDS:  # a ConfigMap's data is read; other kinds are skipped
            data = document.get("data")
            yield Document(str(kind), str(name), {}, data=data if isinstance(data, dict) else {})
            continue
        spec = document.get("spec")
        if not isinstance(spec, dict):
            raise InvalidInputError(f"{path}: {kind} {name}: spec: required mapping is missing")
        yield Document(str(kind), str(name), spec)


def _inferfleet_documents(path: Path) -> list[Document]:
    """The file's ModelDeployments and InferenceServices; any other kind is named on stderr
    (a Namespace or a Secret beside them is normal, a typo in a kind is not) and skipped."""
    documents = list(_load_documents(path))
    read = [*KNOWN_KINDS, "ConfigMap"]
    for doc in documents:
        if doc.kind not in read:
            typer.echo(
                f"warning: {path}: skipped {doc.kind} {doc.name}: not a kind inferfleet reads "
                f"({', '.join(read)})",
                err=True,
            )
    return [doc for doc in documents if doc.kind in read]


def _deployment_spec(doc: Document, documents: list[Document], path: Path) -> ModelDeploymentSpec:
    """A ModelDeployment's spec, its architecture read as the operator reads it: from a
    ConfigMap of the same file when `model.architectureFrom` names one."""
    configs = {d.name: d.data for d in documents if d.kind == "ConfigMap"}
    source = architecture_source({"spec": doc.spec})
    read = read_architecture({"spec": doc.spec}, configs.get(source.name) if source else None)
    if read.problem is not None:
        raise InvalidInputError(f"{path}: {doc.kind} {doc.name}: {read.problem} in this file")
    spec: ModelDeploymentSpec = _validated(
        ModelDeploymentSpec, Document(doc.kind, doc.name, read.body["spec"]), path
    )
    return spec


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
    try:
        return load_gpu_catalog(overrides)
    except ValueError as error:
        raise InvalidInputError(str(error)) from None


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
    model = config.model
    parameters = f"{model.parameter_count / 1e9:.1f}B parameters"
    if model.is_moe:
        parameters += (
            f" ({model.active_parameters / 1e9:.1f}B active: {model.experts_per_token} of "
            f"{model.experts} experts a token)"
        )
    weights = config.weights.value
    if config.method is not None and config.method.value != weights:
        weights += f" ({config.method.value})"
    lines = [
        f"ModelDeployment {name}: {parameters}, "
        f"{weights} weights, {config.kv_cache.value} KV cache, "
        f"TP{config.tensor} x PP{config.pipeline} on {config.gpu_type.value}"
        + (
            f", {config.nodes} nodes of {config.gpu.gpus_per_node} GPUs per replica"
            if config.nodes > 1
            else ""
        ),
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
    if capacity.cold_start is not None:
        lines.append(f"  Cold start:        {capacity.cold_start.describe()}")
    if capacity.workload is not None:
        load = capacity.workload
        lines.append(
            f"  Load:              {load.requests_per_second:g} req/s x "
            f"{load.input_tokens}/{load.output_tokens} tokens (prompt lengths' CV "
            f"{math.sqrt(load.input_tokens_cv2):.2g}); SLO p95 TTFT "
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
                line += f", p95 TPOT {_ms(point.tpot_p95_s)}"
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
    input_tokens_cv: Annotated[float | None, typer.Option(
        help="How widely prompt lengths spread: their standard deviation over their mean "
        f"(default: the InferenceService's, else {DEFAULT_INPUT_TOKENS_CV:g})."
    )] = None,
    ttft_ms: Annotated[float | None, typer.Option(help="p95 TTFT target, ms.")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="p95 TPOT target, ms.")] = None,
    gpu_catalog: Annotated[Path | None, typer.Option(help=GPU_CATALOG_HELP)] = None,
    output: Annotated[OutputFormat, typer.Option("-o", "--output", help=(
        "text, json, or (with --recommend) yaml: the chosen configuration as a ModelDeployment."
    ))] = OutputFormat.TEXT,
    recommend: Annotated[bool, typer.Option(help=(
        "Search GPU types, precisions, tensor and pipeline sizes and topologies for the "
        "cheapest configurations that meet the SLO at the load, and rank them."
    ))] = False,
    top: Annotated[int, typer.Option(min=1, help="With --recommend: options shown.")] = 5,
    pick: Annotated[int, typer.Option(min=1, help=(
        "With --recommend -o yaml: the rank of the option to print."
    ))] = 1,
    forbid: Annotated[list[str] | None, typer.Option(help=(
        "With --recommend, repeatable: a quality trade-off to leave out (fp8, int8, int4, fp4 "
        "weights quantized from the published checkpoint; fp8-kv)."
    ))] = None,
    gpu_type: Annotated[list[str] | None, typer.Option(help=(
        "With --recommend, repeatable: the GPU types to search (default: the catalog's)."
    ))] = None,
) -> None:  # fmt: skip
    """Print the capacity plan of each ModelDeployment in FILE, or with --recommend the
    cheapest configurations of each that meet its SLO at its load."""
    if not recommend and (output == OutputFormat.YAML or forbid or gpu_type):
        typer.echo("error: -o yaml, --forbid and --gpu-type go with --recommend", err=True)
        raise typer.Exit(EXIT_INVALID)
    try:
        gpus = _gpu_catalog(gpu_catalog)
        plans = []
        advised: list[tuple[Any, bool]] = []
        for doc, spec, service in _deployments_and_services(file):
            workload, slo = _load_and_slo(
                service, rps=rps, input_tokens=input_tokens, output_tokens=output_tokens,
                input_tokens_cv=input_tokens_cv, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
            )  # fmt: skip
            if recommend:
                advised.append(_recommend(
                    doc, spec, workload, slo, gpus=gpus, output=output, top=top, pick=pick,
                    forbid=forbid or [], gpu_types=gpu_type or [],
                ))  # fmt: skip
                continue
            plans.append((doc.name, plan(spec, gpus, workload, slo)))
    except InvalidInputError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    if recommend:
        _print_advice(advised, output)
        return
    if output == OutputFormat.JSON:
        typer.echo(json.dumps([{"name": n, **report(p)} for n, p in plans], indent=2))
    else:
        typer.echo("\n\n".join(render_text(name, p) for name, p in plans))
    if any(not p.memory.fits or p.meets_slo is False for _, p in plans):
        raise typer.Exit(EXIT_NO_FIT)


def _deployments_and_services(
    file: Path,
) -> list[tuple[Document, ModelDeploymentSpec, InferenceServiceSpec | None]]:
    """Each ModelDeployment of the file, with the InferenceService that routes to it, if any."""
    documents = _inferfleet_documents(file)
    services = [
        _validated(InferenceServiceSpec, doc, file)
        for doc in documents
        if doc.kind == "InferenceService"
    ]
    deployments = [
        (
            doc,
            _deployment_spec(doc, documents, file),
            next((s for s in services if any(d.name == doc.name for d in s.deployments)), None),
        )
        for doc in documents
        if doc.kind == "ModelDeployment"
    ]
    if not deployments:
        raise InvalidInputError(f"{file}: no ModelDeployment to plan")
    return deployments


def _print_advice(advised: list[tuple[Any, bool]], output: OutputFormat) -> None:
    chunks = [chunk for chunk, _ in advised]
    if output == OutputFormat.JSON:
        typer.echo(json.dumps(chunks, indent=2))
    else:
        typer.echo(("---\n" if output == OutputFormat.YAML else "\n").join(chunks), nl=False)
    if not all(met for _, met in advised):
        raise typer.Exit(EXIT_NO_FIT)


def _recommend(
    doc: Document,
    spec: ModelDeploymentSpec,
    workload: Workload | None,
    slo: Slo,
    *,
    gpus: GpuCatalog,
    output: OutputFormat,
    top: int,
    pick: int,
    forbid: list[str],
    gpu_types: list[str],
) -> tuple[Any, bool]:
    """The advice for one ModelDeployment in the output format (a JSON object, a YAML
    document, a text block), and whether any configuration meets its SLO."""
    # The engine adapters and the advisor, for --recommend only.
    from inferfleet import engines  # noqa: PLC0415
    from inferfleet.cli import advice  # noqa: PLC0415
    from inferfleet.planning.advisor import SearchSpace, recommend  # noqa: PLC0415

    if workload is None or (slo.ttft_p95_ms is None and slo.tpot_p95_ms is None):
        raise InvalidInputError(
            f"{doc.name}: --recommend needs a load and an SLO: an InferenceService with "
            "expectedLoad and slo, or --rps, --input-tokens, --output-tokens and --ttft-ms or "
            "--tpot-ms"
        )
    try:
        types = tuple(GpuType(t) for t in gpu_types) or tuple(GpuType)
        space = SearchSpace(gpu_types=types, forbid=frozenset(forbid))
    except ValueError as error:
        raise InvalidInputError(f"--gpu-type/--forbid: {error}") from None
    found = recommend(spec, workload, slo, catalog=gpus, space=space, refuse=engines.refusal)
    met = bool(found.options)
    if output == OutputFormat.JSON:
        return advice.render_json(doc.name, found, top=top), met
    if output == OutputFormat.YAML:
        if pick > len(found.options):
            raise InvalidInputError(
                f"{doc.name}: --pick {pick}: {len(found.options)} configurations meet the SLO"
            )
        return advice.model_deployment(doc.name, found.options[pick - 1], spec), met
    return advice.render_text(doc.name, found, workload, slo, top=top) + "\n", met


def _load_and_slo(
    service: InferenceServiceSpec | None,
    *,
    rps: float | None,
    input_tokens: int | None,
    output_tokens: int | None,
    input_tokens_cv: float | None,
    ttft_ms: float | None,
    tpot_ms: float | None,
) -> tuple[Workload | None, Slo]:
    expected = service.expected_load if service else None
    rate = rps if rps is not None else (expected.requests_per_second if expected else None)
    inp = input_tokens or (expected.input_tokens if expected else None)
    out = output_tokens or (expected.output_tokens if expected else None)
    if input_tokens_cv is None:
        input_tokens_cv = expected.input_tokens_cv if expected else DEFAULT_INPUT_TOKENS_CV
    if not (0 <= input_tokens_cv <= MAX_INPUT_TOKENS_CV):
        raise InvalidInputError(
            f"--input-tokens-cv must be between 0 and {MAX_INPUT_TOKENS_CV:g} "
            f"(got {input_tokens_cv})"
        )
    workload = None
    if rate is not None or inp is not None or out is not None:
        if rate is None or inp is None or out is None:
            raise InvalidInputError(
                "a load needs --rps, --input-tokens and --output-tokens together "
                "(or an InferenceService with expectedLoad)"
            )
        try:
            workload = Workload(rate, inp, out, input_tokens_cv**2)
        except ValueError as error:
            raise InvalidInputError(str(error)) from None
    slo_ttft = ttft_ms if ttft_ms is not None else (service.slo.ttft_p95_ms if service else None)
    slo_tpot = tpot_ms if tpot_ms is not None else (service.slo.tpot_p95_ms if service else None)
    for label, value in (("--ttft-ms", slo_ttft), ("--tpot-ms", slo_tpot)):
        if value is not None and not value > 0:
            raise InvalidInputError(f"{label} must be positive (got {value})")
    return workload, Slo(slo_ttft, slo_tpot)


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
    validation = calibration.table(terms, calibration.VALIDATION_POINTS)
    table = calibration.render_markdown(terms, rows, held_out, validation)
    doc.write_text(calibration.replace_table(doc.read_text(), table))
    typer.echo(table)


@app.command("render")
def render_command(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML with ModelDeployments and "
                                       "InferenceServices.")],
    namespace: Annotated[str, typer.Option("-n", "--namespace")] = "default",
    gpu_catalog: Annotated[Path | None, typer.Option(help=GPU_CATALOG_HELP)] = None,
) -> None:  # fmt: skip
    """Print the Kubernetes objects the operator would create, for review and GitOps. A
    ModelDeployment that does not fit gets none, as in the cluster: exit status 3."""
    try:
        gpus = _gpu_catalog(gpu_catalog)
        documents = _inferfleet_documents(file)
        deployments = {
            doc.name: ModelDeployment(
                metadata={"name": doc.name, "namespace": namespace},
                spec=_deployment_spec(doc, documents, file),
            )
            for doc in documents
            if doc.kind == "ModelDeployment"
        }
        objects: list[dict[str, Any]] = []
        unfit = []
        for name, md in deployments.items():
            memory = plan(md.spec, gpus).memory
            if memory.fits:
                objects += render_model_deployment(md, gpus=gpus)
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
    typer.echo(dump_manifests(objects), nl=False)
    for message in unfit:
        typer.echo(f"error: {file}: {message}", err=True)
    if unfit:
        raise typer.Exit(EXIT_NO_FIT)


@app.command("architecture")
def architecture_command(
    config: Annotated[Path, typer.Argument(help="A model's Hugging Face config.json.")],
) -> None:
    """Print the `model.architecture` block of a ModelDeployment for a model the catalog does
    not know, counted from its config.json (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE and
    gpt-oss layouts): paste it under `spec.model`. Exit status 2 for a config it cannot read."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise UnsupportedConfigError("config.json is not a JSON object")
        architecture = architecture_from_hf_config(data)
    except (OSError, json.JSONDecodeError, UnsupportedConfigError, ValidationError) as error:
        typer.echo(f"error: {config}: {error}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    typer.echo(yaml.safe_dump({"architecture": architecture.to_wire()}, sort_keys=False), nl=False)
