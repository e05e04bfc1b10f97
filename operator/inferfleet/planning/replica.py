"""One engine replica as the planner sees it: the model, the GPU and the settings that matter.

Everything in `planning` works on `ReplicaConfig`, so the maths can be driven by a spec
(`from_spec`) or directly by benchmarks and the calibration table.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from inferfleet.api.catalog import GpuCatalog, GpuSpec, GpuType, ModelArchitecture
from inferfleet.api.model_deployment import (
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MAX_SEQUENCES,
    DEFAULT_MEMORY_UTILIZATION,
    KvCacheDtype,
    ModelDeploymentSpec,
    QuantizationMethod,
    WeightPrecision,
)
from inferfleet.api.model_spec import lora_slot_rank

# Bytes per weight. Group-wise int4 (AWQ/GPTQ, group size 128) stores a 16-bit scale per group.
_WEIGHT_BYTES: dict[WeightPrecision, float] = {
    WeightPrecision.BF16: 2.0,
    WeightPrecision.FP16: 2.0,
    WeightPrecision.FP8: 1.0,
    WeightPrecision.INT8: 1.0,
    WeightPrecision.INT4: 0.5 + 2.0 / 128,
    WeightPrecision.FP4: 0.5 + 1.0 / 16,
}
# Block-scaled FP4: NVFP4 stores an 8-bit (E4M3) scale per 16 values, MXFP4 an 8-bit (E8M0)
# scale per 32 (the per-tensor scales are negligible).
_METHOD_WEIGHT_BYTES: dict[QuantizationMethod, float] = {
    QuantizationMethod.NVFP4: 0.5 + 1.0 / 16,
    QuantizationMethod.MXFP4: 0.5 + 1.0 / 32,
}

_KV_BYTES: dict[KvCacheDtype, int] = {
    KvCacheDtype.AUTO: 2,
    KvCacheDtype.BF16: 2,
    KvCacheDtype.FP16: 2,
    KvCacheDtype.FP8: 1,
}

# Embedding tables, output head, norms and activations stay 16-bit in every scheme we model.
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class ReplicaConfig:
    """The inputs of the performance model for one replica."""

    model: ModelArchitecture
    gpu_type: GpuType
    gpu: GpuSpec
    weights: WeightPrecision = WeightPrecision.BF16
    method: QuantizationMethod | None = None
    kv_cache: KvCacheDtype = KvCacheDtype.AUTO
    tensor: int = 1
    pipeline: int = 1
    max_sequences: int = DEFAULT_MAX_SEQUENCES
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    max_model_length: int | None = None
    chunked_prefill: bool = True
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION
    lora_slots: int = 0
    """LoRA adapters the GPUs hold at once (every adapter of the spec)."""
    lora_rank: int = 0
    """The rank of each adapter slot (`lora_slot_rank`)."""

    @classmethod
    def from_spec(cls, spec: ModelDeploymentSpec, gpus: GpuCatalog) -> ReplicaConfig:
        return cls(
            model=spec.architecture(),
            gpu_type=spec.gpu.type,
            gpu=gpus[spec.gpu.type],
            weights=spec.precision.weights,
            method=spec.precision.method,
            kv_cache=spec.precision.kv_cache,
            tensor=spec.parallelism.tensor,
            pipeline=spec.parallelism.pipeline,
            max_sequences=spec.batching.max_sequences,
            max_batched_tokens=spec.batching.max_batched_tokens,
            max_model_length=spec.max_model_length(),
            chunked_prefill=spec.batching.chunked_prefill,
            memory_utilization=spec.gpu.memory_utilization,
            lora_slots=len(spec.adapters),
            lora_rank=lora_slot_rank(spec.adapters),
        )

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline

    @property
    def nodes(self) -> int:
        """Nodes one replica spans: its GPUs over a node's, pipeline stages kept whole."""
        return math.ceil(self.gpus / self.gpu.gpus_per_node)

    @property
    def pipeline_hops_between_nodes(self) -> int:
        """Stage boundaries whose two stages sit on different nodes, the stages laid out in
        order, each on `tensor` consecutive GPUs."""
        per_node = self.gpu.gpus_per_node
        node_of = [stage * self.tensor // per_node for stage in range(self.pipeline)]
        return sum(1 for a, b in itertools.pairwise(node_of) if a != b)

    @property
    def context_limit(self) -> int:
        return self.max_model_length or self.model.max_context_length

    @property
    def weight_bytes_per_param(self) -> float:
        if self.method in _METHOD_WEIGHT_BYTES:
            return _METHOD_WEIGHT_BYTES[self.method]
        return _WEIGHT_BYTES[self.weights]

    @property
    def kv_bytes_per_element(self) -> int:
        return _KV_BYTES[self.kv_cache]

    @property
    def linear_flops_rate(self) -> float:
        """Peak FLOP/s of the GEMMs. Weight-only schemes (int4, GPTQ int8, FP8 on GPUs without
        FP8 tensor cores) dequantise to 16-bit and run at the BF16 rate. NVFP4 quantizes the
        activations too and runs at the FP4 rate; MXFP4 checkpoints are taken at the BF16 rate
        (weight-only, as on GPUs without FP4 tensor cores: the slowest of the engines'
        kernels for them)."""
        if self.method == QuantizationMethod.NVFP4 and self.gpu.fp4_flops is not None:
            return self.gpu.fp4_flops
        if self.weights == WeightPrecision.FP8 and self.gpu.fp8_flops is not None:
            return self.gpu.fp8_flops
        if self.weights == WeightPrecision.INT8 and self.method == QuantizationMethod.SMOOTHQUANT:
            return self.gpu.int8_ops
        return self.gpu.bf16_flops
