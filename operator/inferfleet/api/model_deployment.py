"""ModelDeployment: how one model runs: engine, precision, parallelism, batching, GPUs, topology."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints

from inferfleet.api.catalog import (
    GpuCatalog,
    GpuType,
    ModelArchitecture,
    catalog_models,
)
from inferfleet.api.common import (
    MAX_REPLICAS,
    Condition,
    CrossFieldRule,
    StatusModel,
    WireModel,
)
from inferfleet.api.model_spec import (
    MODEL_NAME_PATTERN,
    LoraAdapter,
    ModelSpec,
    UnresolvedArchitectureError,
)
from inferfleet.api.plan_status import CapacityPlanStatus
from inferfleet.api.rollout import RolloutSpec
from inferfleet.api.scheduling import SchedulingSpec
from inferfleet.api.weight_cache import WeightCacheStatus

KIND = "ModelDeployment"
PLURAL = "modeldeployments"

# Defaults of the engines' own CLIs, kept explicit so the plan and the engine agree.
DEFAULT_MAX_SEQUENCES = 256
DEFAULT_MAX_BATCHED_TOKENS = 8192
DEFAULT_MEMORY_UTILIZATION = 0.9

# Most replicas of one role, wherever a count is given (spec, autoscaler bounds, pins): far
# above any fleet we plan for, and far inside a Deployment's int32 spec.replicas.


class EngineName(StrEnum):
    VLLM = "vllm"
    TENSORRT_LLM = "tensorrt-llm"
    SIM = "sim"


class WeightPrecision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP4 = "fp4"


class QuantizationMethod(StrEnum):
    AWQ = "awq"
    GPTQ = "gptq"
    SMOOTHQUANT = "smoothquant"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"


class KvCacheDtype(StrEnum):
    AUTO = "auto"  # the activation dtype (16-bit)
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class SpeculativeMethod(StrEnum):
    NGRAM = "ngram"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    DRAFT_MODEL = "draft-model"
    MTP = "mtp"


class TopologyMode(StrEnum):
    AGGREGATED = "aggregated"
    DISAGGREGATED = "disaggregated"


class Role(StrEnum):
    """A pool of engine replicas with one job."""

    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


class EngineSpec(WireModel):
    name: EngineName = Field(
        strict=False,
        description="Serving engine: vllm, tensorrt-llm, or sim (the CPU emulator for tests).",
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Container image; defaults to the operator's pinned image for the engine.",
    )
    version: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[0-9A-Za-z][0-9A-Za-z.+\-]*$",
        description="Engine version, used to pick the default image and its flag set.",
    )
    extra_args: list[Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra engine CLI arguments, appended verbatim. The escape hatch: the "
        "planner does not model their effect.",
    )
    api_key_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=MODEL_NAME_PATTERN,
        description="A Secret in the same namespace whose `api-key` value the engines require "
        "as a bearer key on their API (vllm, sim); the routers of the services that route "
        "here present it, so that only they can call the engines. Engines and routers read it "
        "when they start: a new key takes a restart of both (kubectl rollout restart).",
    )


ENGINE_API_KEY: Final = "api-key"
"""The key of an engine API key Secret that holds the key."""

ENGINE_RULES: tuple[CrossFieldRule[EngineSpec], ...] = (
    CrossFieldRule(
        cel="self.name != 'tensorrt-llm' || !has(self.apiKeySecret)",
        message="engine.apiKeySecret: TensorRT-LLM's server takes no API key",
        holds=lambda e: e.name != EngineName.TENSORRT_LLM or e.api_key_secret is None,
        field_path=".apiKeySecret",
    ),
)
EngineSpec.cross_field_rules = ENGINE_RULES


class PrecisionSpec(WireModel):
    weights: WeightPrecision = Field(
        strict=False,
        default=WeightPrecision.BF16,
        description="Weight precision: bf16, fp16, fp8, int8, int4, fp4.",
    )
    method: QuantizationMethod | None = Field(
        strict=False,
        default=None,
        description="Quantization method: awq or gptq (int4, int8 weight-only), smoothquant "
        "(int8 weights and activations), fp8, nvfp4 (fp4 weights and activations, a scale per "
        "16 values: GPUs with FP4 tensor cores, B200-class) or mxfp4 (fp4 weights, a scale per "
        "32, run weight-only where the GPU has no FP4 tensor cores). 4-bit checkpoints are read "
        "as quantized (the engines take their quantization from the checkpoint's config).",
    )
    kv_cache: KvCacheDtype = Field(
        strict=False,
        default=KvCacheDtype.AUTO,
        description="KV-cache dtype: auto (the activation dtype), bf16, fp16 or fp8.",
    )


PRECISION_RULES: tuple[CrossFieldRule[PrecisionSpec], ...] = (
    CrossFieldRule(
        cel="self.weights != 'int4' || (has(self.method) && self.method in ['awq', 'gptq'])",
        message="int4 weights need method awq or gptq",
        holds=lambda p: (
            p.weights != WeightPrecision.INT4
            or p.method in (QuantizationMethod.AWQ, QuantizationMethod.GPTQ)
        ),
        field_path=".method",
        reason="FieldValueRequired",
    ),
    CrossFieldRule(
        cel="self.weights != 'int8' || "
        "(has(self.method) && self.method in ['smoothquant', 'gptq'])",
        message="int8 weights need method smoothquant or gptq",
        holds=lambda p: (
            p.weights != WeightPrecision.INT8
            or p.method in (QuantizationMethod.SMOOTHQUANT, QuantizationMethod.GPTQ)
        ),
        field_path=".method",
        reason="FieldValueRequired",
    ),
    CrossFieldRule(
        cel="self.weights != 'fp4' || (has(self.method) && self.method in ['nvfp4', 'mxfp4'])",
        message="fp4 weights need method nvfp4 or mxfp4",
        holds=lambda p: (
            p.weights != WeightPrecision.FP4
            or p.method in (QuantizationMethod.NVFP4, QuantizationMethod.MXFP4)
        ),
        field_path=".method",
        reason="FieldValueRequired",
    ),
    CrossFieldRule(
        cel="self.weights != 'fp8' || !has(self.method) || self.method == 'fp8'",
        message="fp8 weights take method fp8 or none",
        holds=lambda p: (
            p.weights != WeightPrecision.FP8 or p.method in (None, QuantizationMethod.FP8)
        ),
        field_path=".method",
    ),
    CrossFieldRule(
        cel="!(self.weights in ['bf16', 'fp16']) || !has(self.method)",
        message="16-bit weights take no quantization method",
        holds=lambda p: (
            p.weights not in (WeightPrecision.BF16, WeightPrecision.FP16) or p.method is None
        ),
        field_path=".method",
    ),
)
PrecisionSpec.cross_field_rules = PRECISION_RULES


class ParallelismSpec(WireModel):
    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size.")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel size.")
    expert_parallel: bool = Field(
        default=False,
        description="Mixture-of-experts models: place whole experts on each of the tensor-"
        "parallel GPUs (expert parallelism) instead of slicing every expert across them.",
    )

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor * self.pipeline


class BatchingSpec(WireModel):
    max_sequences: int = Field(
        default=DEFAULT_MAX_SEQUENCES,
        ge=1,
        le=65536,
        description="Most sequences in one continuous batch (vLLM --max-num-seqs).",
    )
    max_batched_tokens: int = Field(
        default=DEFAULT_MAX_BATCHED_TOKENS,
        ge=16,
        le=1_048_576,
        description="Token budget of one engine step (vLLM --max-num-batched-tokens).",
    )
    chunked_prefill: bool = Field(
        default=True, description="Split long prompts across steps so decodes keep flowing."
    )
    max_model_length: int | None = Field(
        default=None,
        ge=16,
        le=10_485_760,
        description="Longest prompt plus output, in tokens; defaults to the model's context.",
    )


BATCHING_RULES: tuple[CrossFieldRule[BatchingSpec], ...] = (
    CrossFieldRule(
        cel="self.maxBatchedTokens >= self.maxSequences",
        message="maxBatchedTokens must be at least maxSequences (each sequence needs a token "
        "of the step budget)",
        holds=lambda b: b.max_batched_tokens >= b.max_sequences,
        field_path=".maxBatchedTokens",
    ),
)
BatchingSpec.cross_field_rules = BATCHING_RULES


class SpeculativeDecodingSpec(WireModel):
    method: SpeculativeMethod = Field(
        strict=False, description="ngram (prompt lookup), eagle, eagle3, draft-model or mtp."
    )
    draft_model: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^(hf|pvc|s3|oci)://[^\s]+$",
        description="Source URI of the draft model or EAGLE head (eagle, eagle3, draft-model).",
    )
    num_tokens: int = Field(
        default=3, ge=1, le=16, description="Tokens proposed per step (num_speculative_tokens)."
    )


SPECULATIVE_RULES: tuple[CrossFieldRule[SpeculativeDecodingSpec], ...] = (
    CrossFieldRule(
        cel="!(self.method in ['eagle', 'eagle3', 'draft-model']) || has(self.draftModel)",
        message="speculative methods eagle, eagle3 and draft-model need draftModel",
        holds=lambda s: (
            s.method
            not in (
                SpeculativeMethod.EAGLE,
                SpeculativeMethod.EAGLE3,
                SpeculativeMethod.DRAFT_MODEL,
            )
            or s.draft_model is not None
        ),
        field_path=".draftModel",
        reason="FieldValueRequired",
    ),
    CrossFieldRule(
        cel="!(self.method in ['ngram', 'mtp']) || !has(self.draftModel)",
        message="speculative methods ngram and mtp take no draftModel",
        holds=lambda s: (
            s.method not in (SpeculativeMethod.NGRAM, SpeculativeMethod.MTP)
            or s.draft_model is None
        ),
        field_path=".draftModel",
        reason="FieldValueForbidden",
    ),
)
SpeculativeDecodingSpec.cross_field_rules = SPECULATIVE_RULES


class GpuSpecRequest(WireModel):
    type: GpuType = Field(
        strict=False, description="GPU type from the catalog; pods land on nodes of it."
    )
    memory_utilization: float = Field(
        default=DEFAULT_MEMORY_UTILIZATION,
        ge=0.1,
        le=0.99,
        description="Fraction of each GPU's memory the engine may use (weights, activations, "
        "KV cache).",
    )


class PrefillPoolSpec(WireModel):
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Prefill replicas. The autoscaler and pins override this in the workloads, "
        "never here.",
    )


class TopologySpec(WireModel):
    mode: TopologyMode = Field(
        strict=False,
        default=TopologyMode.AGGREGATED,
        description="aggregated: each replica prefills and decodes. disaggregated: a prefill "
        "pool hands KV caches to the decode pool (spec.replicas).",
    )
    prefill: PrefillPoolSpec | None = Field(
        default=None, description="The prefill pool; required when disaggregated."
    )


TOPOLOGY_RULES: tuple[CrossFieldRule[TopologySpec], ...] = (
    CrossFieldRule(
        cel="self.mode != 'disaggregated' || has(self.prefill)",
        message="disaggregated topology needs a prefill pool (topology.prefill); the decode "
        "pool is spec.replicas",
        holds=lambda t: t.mode != TopologyMode.DISAGGREGATED or t.prefill is not None,
        field_path=".prefill",
        reason="FieldValueRequired",
    ),
    CrossFieldRule(
        cel="self.mode != 'aggregated' || !has(self.prefill)",
        message="aggregated topology has no prefill pool; set mode: disaggregated to use one",
        holds=lambda t: t.mode != TopologyMode.AGGREGATED or t.prefill is None,
        field_path=".prefill",
        reason="FieldValueForbidden",
    ),
)
TopologySpec.cross_field_rules = TOPOLOGY_RULES


def _gpus_per_node_cel() -> str:
    per_node = {t.value: spec.gpus_per_node for t, spec in GpuCatalog.builtin().items()}
    return json.dumps(per_node, sort_keys=True)


def _fp4_gpus() -> list[str]:
    """The catalog's GPU types with FP4 tensor cores."""
    return sorted(t.value for t, spec in GpuCatalog.builtin().items() if spec.fp4_flops)


def _fp4_fits_gpu(s: ModelDeploymentSpec) -> bool:
    return (
        s.precision.method != QuantizationMethod.NVFP4
        or GpuCatalog.builtin()[s.gpu.type].fp4_flops is not None
    )


# Known at apply: given in full, or a catalog name that no ConfigMap overrides.
_MODEL_KNOWN_CEL = (
    "has(self.model.architecture) || (!has(self.model.architectureFrom) && self.model.name in "
    + json.dumps(sorted(catalog_models()))
    + ")"
)


def _if_model_known(rule: str) -> str:
    """A rule about the architecture holds vacuously for an unknown model: MODEL_RULES refuses
    that one, and a second error about made-up layer counts would only mislead."""
    return f"!({_MODEL_KNOWN_CEL}) || ({rule})"


def _when_known(
    holds: Callable[[ModelDeploymentSpec], bool],
) -> Callable[[ModelDeploymentSpec], bool]:
    """`_if_model_known` for the pydantic side: a rule about the architecture holds vacuously
    until the architecture is known (an unknown name is refused by MODEL_RULES; one read from
    a ConfigMap is checked when the operator has read it into the spec)."""
    return lambda spec: not spec.architecture_known or holds(spec)


def _architecture_cel(field: str) -> str:
    """CEL for one architecture field: given in full, else looked up in the catalog (0 for an
    unknown name; rules using it are wrapped in `_if_model_known`)."""
    table = json.dumps(
        {name: arch.to_wire()[field] for name, arch in sorted(catalog_models().items())},
        sort_keys=True,
    )
    return (
        f"(has(self.model.architecture) ? self.model.architecture.{field} : "
        f"(self.model.name in {table} ? {table}[self.model.name] : 0))"
    )


class ModelDeploymentSpec(WireModel):
    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(description="The serving engine.")
    precision: PrecisionSpec = Field(
        default_factory=PrecisionSpec, description="Weight and KV-cache precision."
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description="Tensor and pipeline parallelism; GPUs per replica = tensor x pipeline.",
    )
    batching: BatchingSpec = Field(
        default_factory=BatchingSpec, description="Continuous-batching limits."
    )
    prefix_caching: bool = Field(
        default=True, description="Reuse KV blocks of shared prompt prefixes across requests."
    )
    speculative_decoding: SpeculativeDecodingSpec | None = Field(
        default=None, description="Speculative decoding; off when absent."
    )
    gpu: GpuSpecRequest = Field(description="GPU type and memory budget.")
    topology: TopologySpec = Field(
        default_factory=TopologySpec, description="Aggregated, or prefill/decode disaggregated."
    )
    rollout: RolloutSpec | None = Field(
        default=None,
        description="How a rollout replaces replicas, and how long a replica going away "
        "drains its streams. Unset: one surged replica at a time, capacity never drops (a "
        "replica over several nodes: one group down at a time, none surged), 50 s of drain.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Serving replicas: aggregated engines, or the decode pool when "
        "disaggregated. The scale subresource (kubectl scale) sets it.",
    )
    adapters: list[LoraAdapter] = Field(
        default_factory=list,
        max_length=32,
        description="LoRA adapters served beside the base model, each by its own name; every "
        "replica holds all of them (vllm, sim).",
    )
    scheduling: SchedulingSpec | None = Field(
        default=None,
        description="Where the engine pods may run beside the GPU type's nodes, and what else "
        "they ask of them.",
    )

    def architecture(self) -> ModelArchitecture:
        """The model's architecture: given in full, else from the catalog. A spec whose
        architecture comes from a ConfigMap has it once the operator has read it in
        (`api.architecture_source.read_architecture`)."""
        if self.model.architecture is not None:
            return self.model.architecture
        known = catalog_models().get(self.model.name)
        if known is None or self.model.architecture_from is not None:
            raise UnresolvedArchitectureError(
                "model.architectureFrom has not been read: the operator reads it from the "
                "ConfigMap (`inferfleet architecture config.json` prints the block to give "
                "in full instead)"
            )
        return known

    @property
    def architecture_known(self) -> bool:
        """Whether the architecture is in the spec, or in the catalog and not to be read from a
        ConfigMap (which overrides the catalog, as the architecture in full does)."""
        return self.model.architecture is not None or (
            self.model.architecture_from is None and self.model.name in catalog_models()
        )

    def max_model_length(self) -> int:
        return self.batching.max_model_length or self.architecture().max_context_length

    def drain_seconds(self) -> int:
        """How long a replica going away serves on the streams it holds (`spec.rollout`)."""
        return (self.rollout or RolloutSpec()).drain_seconds


def _replica_fits_nodes(s: ModelDeploymentSpec) -> bool:
    """A replica fits one node, or whole nodes as the engines run one over several: each node
    a whole share of the tensor groups (`tensor` divides the node's GPUs, or spans whole
    nodes), serving aggregated, by an engine with a multi-node launch (not the sim engine)."""
    per_node = GpuCatalog.builtin()[s.gpu.type].gpus_per_node
    gpus, tensor = s.parallelism.gpus_per_replica, s.parallelism.tensor
    return gpus <= per_node or (
        s.engine.name in (EngineName.VLLM, EngineName.TENSORRT_LLM)
        and s.topology.mode == TopologyMode.AGGREGATED
        and gpus % per_node == 0
        and (per_node % tensor == 0 or tensor % per_node == 0)
    )


def _replica_fits_nodes_cel() -> str:
    per_node = _gpus_per_node_cel() + "[self.gpu.type]"
    gpus, tensor = (
        "(self.parallelism.tensor * self.parallelism.pipeline)",
        "self.parallelism.tensor",
    )
    return (
        f"{gpus} <= {per_node} || (self.engine.name in ['vllm', 'tensorrt-llm'] && "
        f"self.topology.mode == 'aggregated' && {gpus} % {per_node} == 0 && "
        f"({per_node} % {tensor} == 0 || {tensor} % {per_node} == 0))"
    )


_MAX_LEN_CEL = (
    "(has(self.batching.maxModelLength) ? self.batching.maxModelLength : "
    + _architecture_cel("maxContextLength")
    + ")"
)

DEPLOYMENT_RULES: tuple[CrossFieldRule[ModelDeploymentSpec], ...] = (
    CrossFieldRule(
        cel="!has(self.adapters) || size(self.adapters) == 0 || self.engine.name != 'tensorrt-llm'",
        message="adapters: TensorRT-LLM's server takes LoRA weights per request, not named "
        "adapters; use vllm",
        holds=lambda s: not s.adapters or s.engine.name != EngineName.TENSORRT_LLM,
        field_path=".adapters",
    ),
    CrossFieldRule(
        cel="!has(self.adapters) || self.adapters.all(a, a.name != self.model.name && "
        "self.adapters.exists_one(b, b.name == a.name))",
        message="adapter names must be unique and differ from model.name",
        holds=lambda s: len({a.name for a in s.adapters} | {s.model.name}) == len(s.adapters) + 1,
        field_path=".adapters",
    ),
    CrossFieldRule(
        cel=_replica_fits_nodes_cel(),
        message="GPUs per replica (parallelism.tensor x parallelism.pipeline) must fit on one "
        "node of the GPU type (8 GPUs), or fill whole nodes with parallelism.tensor dividing "
        "a node's GPUs or spanning whole nodes; a replica over several nodes is served by "
        "vllm or tensorrt-llm, aggregated (a LeaderWorkerSet per replica)",
        holds=_replica_fits_nodes,
        field_path=".parallelism",
    ),
    CrossFieldRule(
        cel="!has(self.scheduling) || !has(self.scheduling.groupTopology) || "
        "self.parallelism.tensor * self.parallelism.pipeline > "
        + _gpus_per_node_cel()
        + "[self.gpu.type]",
        message="scheduling.groupTopology places the nodes of a replica that spans several; "
        "this replica fits one node (use spreadAcross or nodeAffinity)",
        holds=lambda s: (
            s.scheduling is None
            or s.scheduling.group_topology is None
            or s.parallelism.gpus_per_replica > GpuCatalog.builtin()[s.gpu.type].gpus_per_node
        ),
        field_path=".scheduling.groupTopology",
    ),
    CrossFieldRule(
        cel="!has(self.precision.method) || self.precision.method != 'nvfp4' || "
        f"self.gpu.type in {json.dumps(_fp4_gpus())}",
        message="nvfp4 (FP4 weights and activations) needs a GPU with FP4 tensor cores ("
        + ", ".join(_fp4_gpus())
        + "); elsewhere use fp8, int4, or an mxfp4 checkpoint (run weight-only)",
        holds=_fp4_fits_gpu,
        field_path=".precision.method",
    ),
    CrossFieldRule(
        cel="!self.parallelism.expertParallel || ("
        + _if_model_known(_architecture_cel("experts") + " > 1")
        + " && self.parallelism.tensor > 1)",
        message="parallelism.expertParallel needs a mixture-of-experts model (experts > 1) "
        "and parallelism.tensor > 1 to spread its experts over",
        holds=lambda s: (
            not s.parallelism.expert_parallel
            or ((not s.architecture_known or s.architecture().is_moe) and s.parallelism.tensor > 1)
        ),
        field_path=".parallelism.expertParallel",
    ),
    CrossFieldRule(
        cel=_if_model_known(
            _architecture_cel("attentionHeads") + " % self.parallelism.tensor == 0"
        ),
        message="parallelism.tensor must divide the model's attention heads",
        holds=_when_known(lambda s: s.architecture().attention_heads % s.parallelism.tensor == 0),
        field_path=".parallelism.tensor",
    ),
    CrossFieldRule(
        cel=_if_model_known(
            f"{_architecture_cel('kvHeads')} % self.parallelism.tensor == 0 || "
            f"self.parallelism.tensor % {_architecture_cel('kvHeads')} == 0"
        ),
        message="parallelism.tensor must divide the model's KV heads, or be a multiple of them "
        "(KV heads are then replicated)",
        holds=_when_known(
            lambda s: (
                s.architecture().kv_heads % s.parallelism.tensor == 0
                or s.parallelism.tensor % s.architecture().kv_heads == 0
            )
        ),
        field_path=".parallelism.tensor",
    ),
    CrossFieldRule(
        cel=_if_model_known("self.parallelism.pipeline <= " + _architecture_cel("layers")),
        message="parallelism.pipeline cannot exceed the model's layers",
        holds=_when_known(lambda s: s.parallelism.pipeline <= s.architecture().layers),
        field_path=".parallelism.pipeline",
    ),
    CrossFieldRule(
        cel=_if_model_known(
            "!has(self.batching.maxModelLength) || self.batching.maxModelLength <= "
            + _architecture_cel("maxContextLength")
        ),
        message="batching.maxModelLength cannot exceed the model's maxContextLength",
        holds=_when_known(
            lambda s: (
                s.batching.max_model_length is None
                or s.batching.max_model_length <= s.architecture().max_context_length
            )
        ),
        field_path=".batching.maxModelLength",
    ),
    CrossFieldRule(
        cel=_if_model_known(
            "self.batching.chunkedPrefill || self.batching.maxBatchedTokens >= " + _MAX_LEN_CEL
        ),
        message="without chunked prefill, batching.maxBatchedTokens must hold a whole prompt "
        "(at least the max model length)",
        holds=_when_known(
            lambda s: (
                s.batching.chunked_prefill or s.batching.max_batched_tokens >= s.max_model_length()
            )
        ),
        field_path=".batching.maxBatchedTokens",
    ),
)
ModelDeploymentSpec.cross_field_rules = DEPLOYMENT_RULES


class RoleStatus(StatusModel):
    role: Role = Field(description="aggregated, prefill or decode.")
    desired: int = Field(ge=0, description="Replicas the operator wants for the role.")
    ready: int = Field(default=0, ge=0, description="Replicas ready to serve.")
    pinned: bool = Field(default=False, description="Whether an SRE pin fixes the count.")


class AutoscaledRole(StatusModel):
    role: Role = Field(description="aggregated, prefill or decode.")
    replicas: int = Field(
        ge=0, description="Replicas the autoscaler chose for the role (0: scaled to zero)."
    )


ADVICE_REASONS: Final = (
    "EnablePrefixCaching, Fp8Weights, Fp8KvCache, RolloutWithoutSurgeMissesSlo, "
    "DisaggregatePrefill, AggregateServing"
)


class FleetAdvice(StatusModel):
    reason: str = Field(description=f"What to change, as a CamelCase reason: {ADVICE_REASONS}.")
    message: str = Field(
        default="",
        description="Why, from what the running fleet measured, and the effect the "
        "planner predicts. Never applied by itself.",
    )
    inputs: dict[str, float] = Field(
        default_factory=dict,
        max_length=16,
        description="The measurements and predictions it rests on.",
    )


class Bound(StrEnum):
    """What limits a pool of replicas, read from its measured utilisation (a roofline)."""

    COMPUTE = "compute"
    BANDWIDTH = "bandwidth"
    LIGHT = "light"
    """Neither: the pool uses a small share of what its GPUs attain."""


class RoleDiagnosis(StatusModel):
    role: Role = Field(description="aggregated, prefill or decode.")
    bound: Bound = Field(
        description="compute or bandwidth: whichever of its measured MFU and MBU is the larger "
        "share of what the GPU's kernels attain (the planner's efficiency terms); light: "
        "neither reaches a fifth of it."
    )
    message: str = Field(
        default="",
        description="The diagnosis in words: what bounds the pool, its decode steps against "
        "the planner's at the measured load, KV-cache pressure, and queueing against prefill "
        "in the engines' share of TTFT.",
    )
    inputs: dict[str, float] = Field(
        default_factory=dict,
        max_length=16,
        description="The measurements and predictions it rests on.",
    )


class AutoscalingStatus(StatusModel):
    service: str = Field(description="The InferenceService whose autoscaler decided.")
    replicas: list[AutoscaledRole] = Field(description="Replicas per role it chose.")
    reason: str = Field(description="Why, as a CamelCase reason.")
    time: datetime = Field(description="When it decided.")
    advice: list[FleetAdvice] | None = Field(
        default=None,
        max_length=16,
        description="What that autoscaler, from what the running fleet measured, suggests "
        "changing in this deployment (the InferenceService's status.advice); an Event on the "
        "InferenceService when it is new.",
    )
    diagnosis: list[RoleDiagnosis] | None = Field(
        default=None,
        max_length=3,
        description="Per role, what limits it, from what the running fleet measured over "
        "the rate window (the InferenceService's status.diagnosis).",
    )


class ModelDeploymentStatus(StatusModel):
    observed_generation: int | None = Field(
        default=None, description="metadata.generation this status was computed from."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Fits, Progressing, Degraded."
    )
    replicas: int = Field(
        default=0, ge=0, description="Serving replicas that exist (scale subresource)."
    )
    ready_replicas: int = Field(default=0, ge=0, description="Serving replicas that are ready.")
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (scale subresource)."
    )
    roles: list[RoleStatus] = Field(default_factory=list, description="Replicas per role.")
    plan: CapacityPlanStatus | None = Field(default=None, description="The capacity plan.")
    autoscaling: AutoscalingStatus | None = Field(
        default=None,
        description="Replicas an InferenceService's autoscaler chose; they replace spec.replicas "
        "(and the prefill pool's) while that service autoscales this deployment. A pin wins.",
    )
    generated_secrets: list[str] | None = Field(
        default=None,
        description="Secrets the operator created with generated data for this deployment "
        "(the SSH keys of a replica over several nodes): deleted once it no longer renders "
        "them.",
    )
    weight_cache: WeightCacheStatus | None = Field(
        default=None, description="The fill of the weight cache (spec.model.cache)."
    )


class ModelDeployment(WireModel):
    """A ModelDeployment as stored by the API server."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["inferfleet.io/v1alpha1"] = Field(
        default="inferfleet.io/v1alpha1", description="API version."
    )
    kind: Literal["ModelDeployment"] = Field(default="ModelDeployment", description="Kind.")
    metadata: dict[str, object] = Field(default_factory=dict, description="Object metadata.")
    spec: ModelDeploymentSpec = Field(description="Desired state.")
    status: ModelDeploymentStatus | None = Field(default=None, description="Observed state.")
