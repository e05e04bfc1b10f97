"""The advisor: the cheapest configuration of a model that meets an SLO at a load.

Starting from a ModelDeployment, it varies what sets most of a fleet's cost: the GPU type, the
weight and KV-cache precisions, the tensor and pipeline sizes and the topology (aggregated, or
prefill and decode disaggregated), and sizes each candidate with the planner
(`capacity.plan`) for the load and the SLO. The batching limits, the engine and everything
else stay as the ModelDeployment has them. Candidates that meet the SLO are ranked by cost per
1M output tokens at that load (then by GPUs); the others are kept with the reason they fail.

A candidate is first validated as a ModelDeploymentSpec, with the same rules the API server
applies (a precision the GPU cannot run, a tensor size the heads do not divide), then offered
to the caller's `refuse` (the engine adapters' refusals live above this layer), then sized.
Pipeline stages are tried only to span nodes, each node a whole tensor-parallel group: within a
node, tensor parallelism serves the same GPUs with fewer bubbles.

Quality: 16-bit weights and KV cache change nothing in what the model answers; so does the
precision a model is published in (DeepSeek-V3's FP8, gpt-oss's MXFP4). Every other choice
quantizes the published checkpoint and is marked with what it trades, so that it is never
preferred silently; `forbid` takes such choices out of the search.

Every option carries the planner's error band for its GPU, from the calibration table
(`calibration`): the largest error against a published point of that GPU, per metric, or "no
published point". Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

from pydantic import ValidationError

from inferfleet.api.catalog import GpuCatalog, GpuType
from inferfleet.api.model_deployment import (
    KvCacheDtype,
    ModelDeploymentSpec,
    QuantizationMethod,
    Role,
    TopologyMode,
    WeightPrecision,
)
from inferfleet.planning import calibration
from inferfleet.planning.capacity import CapacityPlan, Workload, idle_misses, plan
from inferfleet.planning.memory import plan_memory
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.slo import Slo


@dataclass(frozen=True)
class PrecisionChoice:
    weights: WeightPrecision
    method: QuantizationMethod | None = None
    kv_cache: KvCacheDtype = KvCacheDtype.AUTO

    def to_wire(self) -> dict[str, str]:
        wire = {"weights": self.weights.value, "kvCache": self.kv_cache.value}
        if self.method is not None:
            wire["method"] = self.method.value
        return wire

    @property
    def label(self) -> str:
        text = self.weights.value
        if self.method is not None and self.method.value != self.weights.value:
            text += f" ({self.method.value})"
        if self.kv_cache == KvCacheDtype.FP8:
            text += ", fp8 KV"
        return text

    @property
    def key(self) -> tuple[WeightPrecision, QuantizationMethod | None]:
        return self.weights, self.method


DEFAULT_PRECISIONS: Final = (
    PrecisionChoice(WeightPrecision.BF16),
    PrecisionChoice(WeightPrecision.BF16, kv_cache=KvCacheDtype.FP8),
    PrecisionChoice(WeightPrecision.FP8, QuantizationMethod.FP8),
    PrecisionChoice(WeightPrecision.FP8, QuantizationMethod.FP8, KvCacheDtype.FP8),
    PrecisionChoice(WeightPrecision.INT8, QuantizationMethod.SMOOTHQUANT),
    PrecisionChoice(WeightPrecision.INT4, QuantizationMethod.AWQ),
    PrecisionChoice(WeightPrecision.FP4, QuantizationMethod.NVFP4),
)

_FP8_NATIVE: Final = PrecisionChoice(WeightPrecision.FP8, QuantizationMethod.FP8)
_MXFP4_NATIVE: Final = PrecisionChoice(WeightPrecision.FP4, QuantizationMethod.MXFP4)
PUBLISHED_PRECISION: Final[dict[str, PrecisionChoice]] = {
    # config.json quantization_config: fp8 (e4m3, 128 x 128 blocks).
    "deepseek-v3": _FP8_NATIVE,
    "deepseek-r1": _FP8_NATIVE,
    # config.json quantization_config: mxfp4 (the experts).
    "gpt-oss-120b": _MXFP4_NATIVE,
    "gpt-oss-20b": _MXFP4_NATIVE,
}
"""Catalog models published in a precision other than 16-bit: that precision is their own."""

LOSSLESS_WEIGHTS: Final = frozenset({WeightPrecision.BF16, WeightPrecision.FP16})
FORBIDDABLE: Final = ("fp8", "int8", "int4", "fp4", "fp8-kv")
"""What `forbid` takes: a weight precision that quantizes, or an FP8 KV cache."""


def quality_trade_off(choice: PrecisionChoice, model: str) -> str | None:
    """What a precision trades in answers for its speed, in words; None: nothing."""
    trades = []
    published = PUBLISHED_PRECISION.get(model)
    if choice.weights not in LOSSLESS_WEIGHTS and (
        published is None or published.key != choice.key
    ):
        trades.append(f"{choice.weights.value} weights quantized from the published checkpoint")
    if choice.kv_cache == KvCacheDtype.FP8:
        trades.append("fp8 KV cache")
    return "; ".join(trades) or None


def is_forbidden(choice: PrecisionChoice, model: str, forbid: frozenset[str]) -> bool:
    """Whether `forbid` takes this precision out: a quantizing weight precision named there
    (a model's own published precision never is), or an FP8 KV cache under "fp8-kv"."""
    published = PUBLISHED_PRECISION.get(model)
    own = published is not None and published.key == choice.key
    if choice.weights not in LOSSLESS_WEIGHTS and not own and choice.weights.value in forbid:
        return True
    return choice.kv_cache == KvCacheDtype.FP8 and "fp8-kv" in forbid


@dataclass(frozen=True)
class SearchSpace:
    gpu_types: tuple[GpuType, ...] = tuple(GpuType)
    precisions: tuple[PrecisionChoice, ...] = DEFAULT_PRECISIONS
    tensor_sizes: tuple[int, ...] = (1, 2, 4, 8)
    pipeline_sizes: tuple[int, ...] = (1, 2, 4)
    topologies: tuple[TopologyMode, ...] = (TopologyMode.AGGREGATED, TopologyMode.DISAGGREGATED)
    forbid: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(self.forbid - set(FORBIDDABLE))
        if unknown:
            raise ValueError(
                f"cannot forbid {', '.join(unknown)}: choose from {', '.join(FORBIDDABLE)}"
            )


class Rejection(StrEnum):
    """Why candidates fail, worded to follow a count of them."""

    FORBIDDEN = "forbidden"
    INVALID = "refused by the API's rules"
    UNSUPPORTED = "refused by the engine"
    DOES_NOT_FIT = "do not fit"
    CONTEXT = "hold less than one request's context"
    MISSES_TTFT = "miss the TTFT target at any number of replicas"
    MISSES_TPOT = "miss the TPOT target at any number of replicas"


@dataclass(frozen=True)
class Candidate:
    gpu_type: GpuType
    precision: PrecisionChoice
    tensor: int
    pipeline: int
    topology: TopologyMode | None
    """None: rejected before the topology mattered (it does not fit either way)."""

    @property
    def label(self) -> str:
        shape = f"TP{self.tensor}" + (f"xPP{self.pipeline}" if self.pipeline > 1 else "")
        text = f"{self.gpu_type.value} {self.precision.label} {shape}"
        return text if self.topology is None else f"{text} {self.topology.value}"


NO_PUBLISHED_POINT: Final = "no published point"


@dataclass(frozen=True)
class ErrorBand:
    """The largest relative error of the planner against a published point of one GPU type,
    per metric; None: no published point for it."""

    throughput: float | None
    ttft: float | None
    tpot: float | None

    def describe(self) -> str:
        parts = [
            f"{name} ±{band:.0%}" if band is not None else f"{name}: no published point"
            for name, band in (
                ("throughput", self.throughput),
                ("TTFT", self.ttft),
                ("TPOT", self.tpot),
            )
        ]
        if all(band is None for band in (self.throughput, self.ttft, self.tpot)):
            return NO_PUBLISHED_POINT
        return ", ".join(parts)


_BAND_METRICS: Final[Mapping[calibration.Metric, str]] = {
    calibration.Metric.OUTPUT_TOKENS_PER_S: "throughput",
    calibration.Metric.THROUGHPUT_RATIO: "throughput",
    calibration.Metric.TTFT_MS: "ttft",
    calibration.Metric.ITL_MS: "tpot",
}


@functools.cache
def error_bands() -> dict[GpuType, ErrorBand]:
    """Per GPU type, the calibration table's largest error for each metric."""
    worst: dict[tuple[GpuType, str], float] = {}
    points = calibration.PUBLISHED_POINTS + calibration.VALIDATION_POINTS
    for row in calibration.table(points=points):
        key = (row.point.gpu_type, _BAND_METRICS[row.point.metric])
        worst[key] = max(worst.get(key, 0.0), abs(row.error))
    return {
        gpu: ErrorBand(
            worst.get((gpu, "throughput")), worst.get((gpu, "ttft")), worst.get((gpu, "tpot"))
        )
        for gpu in GpuType
    }


@dataclass(frozen=True)
class Option:
    """A configuration that meets the SLO at the load."""

    candidate: Candidate
    spec: ModelDeploymentSpec
    plan: CapacityPlan
    quality: str | None
    band: ErrorBand

    @property
    def cost_per_million_usd(self) -> float:
        cost = self.plan.cost_per_million_output_tokens_usd
        return float("inf") if cost is None else cost

    @property
    def hourly_usd(self) -> float:
        return self.plan.gpus * self.plan.config.gpu.hourly_price_usd

    @property
    def ttft_p95_s(self) -> float:
        """The p95 TTFT predicted at the load: the prefilling pool's."""
        return max(
            (r.point.ttft_p95_s for r in self.plan.roles if r.point and r.role != Role.DECODE),
            default=0.0,
        )

    @property
    def tpot_p95_s(self) -> float:
        """The p95 TPOT predicted at the load: the decoding pool's."""
        return max(
            (r.point.tpot_p95_s for r in self.plan.roles if r.point and r.role != Role.PREFILL),
            default=0.0,
        )


@dataclass(frozen=True)
class Rejected:
    candidate: Candidate
    why: Rejection
    detail: str


@dataclass(frozen=True)
class Recommendation:
    options: tuple[Option, ...]
    """Ranked: cheapest per 1M output tokens first, then fewest GPUs, then those without a
    quality trade-off, then the fastest TTFT."""
    rejected: tuple[Rejected, ...]
    searched: int
    """Candidates considered (options and rejections; a rejection before the topology counts
    once for both)."""
    given: Candidate | None = field(default=None)
    """The ModelDeployment's own configuration, where the space holds it."""

    @property
    def best_without_trade_off(self) -> Option | None:
        return next((o for o in self.options if o.quality is None), None)

    def rank_of(self, candidate: Candidate) -> int | None:
        """1-based rank of `candidate` among the options; None: not among them."""
        return next((i for i, o in enumerate(self.options, 1) if o.candidate == candidate), None)


Refusal = Callable[[ModelDeploymentSpec], str | None]


def candidate_of(spec: ModelDeploymentSpec) -> Candidate:
    return Candidate(
        spec.gpu.type,
        PrecisionChoice(spec.precision.weights, spec.precision.method, spec.precision.kv_cache),
        spec.parallelism.tensor,
        spec.parallelism.pipeline,
        spec.topology.mode,
    )


def _wire(base: Mapping[str, Any], candidate: Candidate) -> dict[str, Any]:
    wire = dict(base)
    wire["gpu"] = {**base.get("gpu", {}), "type": candidate.gpu_type.value}
    wire["precision"] = candidate.precision.to_wire()
    wire["parallelism"] = {"tensor": candidate.tensor, "pipeline": candidate.pipeline}
    if candidate.topology == TopologyMode.DISAGGREGATED:
        wire["topology"] = {"mode": "disaggregated", "prefill": {"replicas": 1}}
    else:
        wire["topology"] = {"mode": "aggregated"}
    return wire


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _shapes(space: SearchSpace, gpus_per_node: int) -> list[tuple[int, int]]:
    return [
        (tensor, pipeline)
        for tensor in space.tensor_sizes
        for pipeline in space.pipeline_sizes
        if tensor <= gpus_per_node and (pipeline == 1 or tensor == gpus_per_node)
    ]


def _judged(
    candidate: Candidate,
    wire: Mapping[str, Any],
    *,
    model: str,
    workload: Workload,
    slo: Slo,
    catalog: GpuCatalog,
    refuse: Refusal,
) -> Option | Rejected:
    try:
        spec = ModelDeploymentSpec.model_validate(wire)
    except ValidationError as error:
        return Rejected(candidate, Rejection.INVALID, _first_error(error))
    refused = refuse(spec)
    if refused is not None:
        return Rejected(candidate, Rejection.UNSUPPORTED, refused)
    capacity = plan(spec, catalog, workload, slo)
    if capacity.meets_slo:
        quality = quality_trade_off(candidate.precision, model)
        return Option(candidate, spec, capacity, quality, error_bands()[candidate.gpu_type])
    context = workload.input_tokens + workload.output_tokens
    if context > capacity.config.context_limit:
        return Rejected(candidate, Rejection.CONTEXT, capacity.reason)
    missed = idle_misses(capacity.config, workload, slo)
    why = Rejection.MISSES_TPOT if missed == ("TPOT",) else Rejection.MISSES_TTFT
    return Rejected(candidate, why, capacity.reason)


def recommend(
    base: ModelDeploymentSpec,
    workload: Workload,
    slo: Slo,
    *,
    catalog: GpuCatalog | None = None,
    space: SearchSpace | None = None,
    refuse: Refusal = lambda _: None,
) -> Recommendation:
    """Every configuration of `space` around `base`, sized for `workload` under `slo`."""
    catalog = catalog or GpuCatalog.builtin()
    space = space or SearchSpace()
    model = base.model.name
    wire_base = base.model_dump(by_alias=True, exclude_none=True, mode="json")
    base_config = ReplicaConfig.from_spec(base, catalog)
    options: list[Option] = []
    rejected: list[Rejected] = []
    searched = 0
    # The given precision and the model's published one are always among those searched.
    given = PrecisionChoice(base.precision.weights, base.precision.method, base.precision.kv_cache)
    extra = (given, PUBLISHED_PRECISION[model]) if model in PUBLISHED_PRECISION else (given,)
    precisions = tuple(dict.fromkeys((*space.precisions, *extra)))
    for gpu_type in space.gpu_types:
        gpu = catalog[gpu_type]
        for precision in precisions:
            for tensor, pipeline in _shapes(space, gpu.gpus_per_node):
                bare = Candidate(gpu_type, precision, tensor, pipeline, None)
                searched += 1
                if is_forbidden(precision, model, space.forbid):
                    rejected.append(Rejected(bare, Rejection.FORBIDDEN, "forbidden"))
                    continue
                config = replace(
                    base_config, gpu_type=gpu_type, gpu=gpu, weights=precision.weights,
                    method=precision.method, kv_cache=precision.kv_cache, tensor=tensor,
                    pipeline=pipeline,
                )  # fmt: skip
                memory = plan_memory(config)
                if not memory.fits:
                    rejected.append(Rejected(bare, Rejection.DOES_NOT_FIT, memory.verdict()))
                    continue
                searched -= 1
                for topology in space.topologies:
                    searched += 1
                    candidate = Candidate(gpu_type, precision, tensor, pipeline, topology)
                    judged = _judged(
                        candidate, _wire(wire_base, candidate), model=model,
                        workload=workload, slo=slo, catalog=catalog, refuse=refuse,
                    )  # fmt: skip
                    if isinstance(judged, Option):
                        options.append(judged)
                    else:
                        rejected.append(judged)
    # Equal cost: fewer GPUs, then no quality trade-off, then the faster first token.
    options.sort(
        key=lambda o: (o.cost_per_million_usd, o.plan.gpus, o.quality is not None, o.ttft_p95_s)
    )
    return Recommendation(tuple(options), tuple(rejected), searched, candidate_of(base))


def rejections_by_reason(rejected: Sequence[Rejected]) -> dict[Rejection, list[Rejected]]:
    grouped: dict[Rejection, list[Rejected]] = {}
    for entry in rejected:
        grouped.setdefault(entry.why, []).append(entry)
    return grouped
