"""Built-in catalogs of GPU types and open model architectures.

They live in the API layer because specs name their entries (`gpu.type`, `model.name`) and the
CRD's CEL rules embed the facts that validation needs (GPUs per node, attention heads). The
planner reads the same entries. Hardware figures are dense (no structured sparsity) datasheet
values; every figure can be overridden with `GpuCatalog.with_overrides`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import Field

from inferfleet.api.common import CrossFieldRule, WireModel

TERA = 1e12
GIGA = 1e9
MIB = 1024**2


class GpuType(StrEnum):
    A100_80GB = "A100-80GB"
    H100_80GB = "H100-80GB"
    H200_141GB = "H200-141GB"
    B200_180GB = "B200-180GB"
    L40S_48GB = "L40S-48GB"
    L4_24GB = "L4-24GB"


class GpuSpec(WireModel):
    """Datasheet figures of one GPU type (per GPU, dense math)."""

    bf16_flops: float = Field(gt=0, description="Dense BF16 tensor-core FLOP/s.")
    fp8_flops: float | None = Field(
        default=None, gt=0, description="Dense FP8 tensor-core FLOP/s; None where unsupported."
    )
    fp4_flops: float | None = Field(
        default=None,
        gt=0,
        description="Dense FP4 tensor-core FLOP/s (NVFP4, MXFP4); None where unsupported.",
    )
    int8_ops: float = Field(gt=0, description="Dense INT8 tensor-core OP/s.")
    memory_bandwidth: float = Field(gt=0, description="HBM/GDDR bandwidth in bytes/s.")
    memory_bytes: int = Field(gt=0, description="Device memory in bytes, as the driver reports.")
    interconnect_bandwidth: float = Field(
        gt=0,
        description="Per-direction GPU-to-GPU bandwidth in bytes/s (NVLink, else PCIe).",
    )
    node_network_bandwidth: float = Field(
        gt=0,
        description="Per-GPU bandwidth to other nodes in bytes/s (the node's compute fabric: "
        "one RDMA NIC per GPU on HGX/DGX nodes); what a replica spanning nodes sends between "
        "pipeline stages crosses it.",
    )
    gpus_per_node: int = Field(ge=1, le=64, description="GPUs in the largest common node.")
    hourly_price_usd: float = Field(
        ge=0, description="Default on-demand price per GPU-hour; override with your own."
    )
    node_product_label: str = Field(
        description="Value of the nvidia.com/gpu.product node label (GPU feature discovery).",
        min_length=1,
        max_length=63,
    )


# node_network_bandwidth: HGX/DGX H100, H200 and B200 nodes give each GPU one 400 Gb/s
# ConnectX-7 (NVIDIA DGX BasePOD reference architecture, core components); DGX A100 one 200 Gb/s
# HDR ConnectX-6. PCIe L40S and L4 servers have no standard compute fabric: 200 Gb/s Ethernet per
# 8-GPU node is assumed (a catalog override sets a node pool's own).
_GPU_CATALOG: dict[GpuType, GpuSpec] = {
    # A100 SXM4 80GB: no FP8 tensor cores (FP8 weights run weight-only at BF16 rate).
    GpuType.A100_80GB: GpuSpec(
        bf16_flops=312 * TERA,
        int8_ops=624 * TERA,
        memory_bandwidth=2.039e12,
        memory_bytes=81920 * MIB,
        interconnect_bandwidth=300 * GIGA,
        node_network_bandwidth=25 * GIGA,
        gpus_per_node=8,
        hourly_price_usd=1.80,
        node_product_label="NVIDIA-A100-SXM4-80GB",
    ),
    # H100 SXM5 80GB.
    GpuType.H100_80GB: GpuSpec(
        bf16_flops=989.4 * TERA,
        fp8_flops=1978.9 * TERA,
        int8_ops=1978.9 * TERA,
        memory_bandwidth=3.35e12,
        memory_bytes=81559 * MIB,
        interconnect_bandwidth=450 * GIGA,
        node_network_bandwidth=50 * GIGA,
        gpus_per_node=8,
        hourly_price_usd=2.50,
        node_product_label="NVIDIA-H100-80GB-HBM3",
    ),
    # H200 SXM 141GB: H100 compute, HBM3e.
    GpuType.H200_141GB: GpuSpec(
        bf16_flops=989.4 * TERA,
        fp8_flops=1978.9 * TERA,
        int8_ops=1978.9 * TERA,
        memory_bandwidth=4.8e12,
        memory_bytes=143771 * MIB,
        interconnect_bandwidth=450 * GIGA,
        node_network_bandwidth=50 * GIGA,
        gpus_per_node=8,
        hourly_price_usd=3.50,
        node_product_label="NVIDIA-H200",
    ),
    # B200 (HGX, 1000 W): NVLink 5. FP4: NVIDIA's HGX B200 specifications give 18 PFLOPS per
    # GPU with 2:4 sparsity (FP8 9 PFLOPS), half of it dense.
    GpuType.B200_180GB: GpuSpec(
        bf16_flops=2250 * TERA,
        fp8_flops=4500 * TERA,
        fp4_flops=9000 * TERA,
        int8_ops=4500 * TERA,
        memory_bandwidth=8.0e12,
        memory_bytes=183359 * MIB,
        interconnect_bandwidth=900 * GIGA,
        node_network_bandwidth=50 * GIGA,
        gpus_per_node=8,
        hourly_price_usd=5.50,
        node_product_label="NVIDIA-B200",
    ),
    # L40S 48GB GDDR6: PCIe Gen4 x16 between GPUs, no NVLink.
    GpuType.L40S_48GB: GpuSpec(
        bf16_flops=362.05 * TERA,
        fp8_flops=733 * TERA,
        int8_ops=733 * TERA,
        memory_bandwidth=864 * GIGA,
        memory_bytes=46068 * MIB,
        interconnect_bandwidth=32 * GIGA,
        node_network_bandwidth=3.125 * GIGA,
        gpus_per_node=8,
        hourly_price_usd=1.20,
        node_product_label="NVIDIA-L40S",
    ),
    # L4 24GB: PCIe Gen4 x16.
    GpuType.L4_24GB: GpuSpec(
        bf16_flops=121 * TERA,
        fp8_flops=242.5 * TERA,
        int8_ops=242.5 * TERA,
        memory_bandwidth=300 * GIGA,
        memory_bytes=23034 * MIB,
        interconnect_bandwidth=32 * GIGA,
        node_network_bandwidth=3.125 * GIGA,
        gpus_per_node=8,
        hourly_price_usd=0.55,
        node_product_label="NVIDIA-L4",
    ),
}


class GpuCatalog:
    """GPU figures by type; the built-in defaults, optionally overridden field by field."""

    def __init__(self, entries: Mapping[GpuType, GpuSpec]) -> None:
        self._entries = dict(entries)

    @functools.cached_property
    def _key(self) -> tuple[tuple[str, str], ...]:
        """Planning caches key on the catalog: equal figures, equal key."""
        return tuple(
            (gpu_type.value, spec.model_dump_json())
            for gpu_type, spec in sorted(self._entries.items())
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GpuCatalog) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    @classmethod
    def builtin(cls) -> GpuCatalog:
        return cls(_GPU_CATALOG)

    def items(self) -> list[tuple[GpuType, GpuSpec]]:
        return list(self._entries.items())

    def __getitem__(self, gpu_type: GpuType) -> GpuSpec:
        return self._entries[gpu_type]

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> GpuCatalog:
        """Override figures of known types, e.g. `{"H100-80GB": {"hourlyPriceUsd": 2.1}}`.

        Unknown types or fields raise `ValueError` naming them: a price sheet with a typo must
        not silently keep the default.
        """
        entries = dict(self._entries)
        for name, fields in overrides.items():
            try:
                gpu_type = GpuType(name)
            except ValueError:
                known = ", ".join(t.value for t in GpuType)
                message = f"unknown GPU type {name!r} in overrides (known: {known})"
                raise ValueError(message) from None
            merged = entries[gpu_type].to_wire() | dict(fields)
            entries[gpu_type] = GpuSpec.model_validate(merged)
        return GpuCatalog(entries)


class ModelArchitecture(WireModel):
    """The shape of a transformer, as its config.json gives it."""

    parameter_count: int = Field(
        ge=1_000_000, le=20_000_000_000_000, description="Total parameters, embeddings included."
    )
    active_parameter_count: int | None = Field(
        default=None,
        ge=1_000_000,
        le=20_000_000_000_000,
        description="Parameters used per token (MoE); defaults to parameterCount for dense models.",
    )
    layers: int = Field(ge=1, le=1024, description="Transformer layers (num_hidden_layers).")
    hidden_size: int = Field(ge=64, le=131072, description="Model width (hidden_size).")
    attention_heads: int = Field(ge=1, le=1024, description="Query heads (num_attention_heads).")
    kv_heads: int = Field(
        ge=1, le=1024, description="Key/value heads (num_key_value_heads); fewer than heads is GQA."
    )
    head_dim: int = Field(ge=16, le=1024, description="Dimension of one attention head.")
    intermediate_size: int = Field(ge=64, le=1_048_576, description="MLP width per expert.")
    vocab_size: int = Field(ge=256, le=4_194_304, description="Vocabulary size.")
    max_context_length: int = Field(
        ge=128, le=10_485_760, description="Longest context the model supports, in tokens."
    )
    experts: int = Field(default=1, ge=1, le=1024, description="MoE experts per layer (1: dense).")
    experts_per_token: int = Field(
        default=1, ge=1, le=1024, description="Experts each token is routed to (MoE top-k)."
    )
    tied_embeddings: bool = Field(
        default=False, description="Whether the output head shares the input embedding matrix."
    )
    prediction_layers: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Multi-token-prediction layers the checkpoint ships beside the model "
        "(num_nextn_predict_layers), which speculativeDecoding.method mtp drafts with.",
    )
    kv_latent_dim: int | None = Field(
        default=None,
        ge=16,
        le=65536,
        description=(
            "Multi-head latent attention (MLA): the width each layer caches per token, the "
            "compressed key/value latent and the rotary key (kv_lora_rank + qk_rope_head_dim). "
            "Unset: keys and values are cached per KV head (2 x kvHeads x headDim)."
        ),
    )

    @property
    def active_parameters(self) -> int:
        return self.active_parameter_count or self.parameter_count

    @property
    def embedding_parameters(self) -> int:
        """Input embedding plus output head (counted once when tied)."""
        per_matrix = self.vocab_size * self.hidden_size
        return per_matrix if self.tied_embeddings else 2 * per_matrix

    @property
    def output_head_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def routed_expert_parameters(self) -> int:
        """Parameters of the routed experts, all layers: what a token may skip. Every
        parameter is read by every token except the routed experts it was not sent to, so
        total - active = (experts - experts per token) x one expert, across the MoE layers,
        whatever else (dense layers, shared experts) the model has."""
        if self.experts_per_token >= self.experts:
            return 0  # every expert is read by every token: none is skipped
        skipped = self.parameter_count - self.active_parameters
        return skipped * self.experts // (self.experts - self.experts_per_token)


ARCHITECTURE_RULES: tuple[CrossFieldRule[ModelArchitecture], ...] = (
    CrossFieldRule(
        cel="self.kvHeads <= self.attentionHeads && self.attentionHeads % self.kvHeads == 0",
        message="kvHeads must divide attentionHeads (grouped-query attention)",
        holds=lambda a: a.kv_heads <= a.attention_heads and a.attention_heads % a.kv_heads == 0,
        field_path=".kvHeads",
    ),
    CrossFieldRule(
        cel="!has(self.activeParameterCount) || self.activeParameterCount <= self.parameterCount",
        message="activeParameterCount cannot exceed parameterCount",
        holds=lambda a: (
            a.active_parameter_count is None or a.active_parameter_count <= a.parameter_count
        ),
        field_path=".activeParameterCount",
    ),
    CrossFieldRule(
        cel="self.expertsPerToken <= self.experts",
        message="expertsPerToken cannot exceed experts",
        holds=lambda a: a.experts_per_token <= a.experts,
        field_path=".expertsPerToken",
    ),
    CrossFieldRule(
        cel="self.experts == 1 || has(self.activeParameterCount)",
        message="a mixture-of-experts model (experts > 1) needs activeParameterCount",
        holds=lambda a: a.experts == 1 or a.active_parameter_count is not None,
        field_path=".activeParameterCount",
    ),
)


ModelArchitecture.cross_field_rules = ARCHITECTURE_RULES

_DEEPSEEK_V3 = ModelArchitecture(
    parameter_count=671_026_419_200,
    active_parameter_count=37_552_297_472,
    layers=61,
    hidden_size=7168,
    attention_heads=128,
    kv_heads=128,
    head_dim=192,
    intermediate_size=2048,
    vocab_size=129280,
    max_context_length=163840,
    experts=256,
    experts_per_token=8,
    kv_latent_dim=576,
    prediction_layers=1,
)

_MODEL_CATALOG: dict[str, ModelArchitecture] = {
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama-3.1-8b": ModelArchitecture(
        parameter_count=8_030_261_248,
        layers=32,
        hidden_size=4096,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_context_length=131072,
    ),
    # meta-llama/Llama-3.3-70B-Instruct
    "llama-3.3-70b": ModelArchitecture(
        parameter_count=70_553_706_496,
        layers=80,
        hidden_size=8192,
        attention_heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        max_context_length=131072,
    ),
    # meta-llama/Llama-3.1-405B-Instruct
    "llama-3.1-405b": ModelArchitecture(
        parameter_count=405_853_388_800,
        layers=126,
        hidden_size=16384,
        attention_heads=128,
        kv_heads=8,
        head_dim=128,
        intermediate_size=53248,
        vocab_size=128256,
        max_context_length=131072,
    ),
    # Qwen/Qwen2.5-7B-Instruct: GQA ratio 7 (28 query heads over 4 KV heads).
    "qwen2.5-7b": ModelArchitecture(
        parameter_count=7_615_616_512,
        layers=28,
        hidden_size=3584,
        attention_heads=28,
        kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        max_context_length=32768,
    ),
    # Qwen/Qwen2.5-72B-Instruct
    "qwen2.5-72b": ModelArchitecture(
        parameter_count=72_706_203_648,
        layers=80,
        hidden_size=8192,
        attention_heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate_size=29568,
        vocab_size=152064,
        max_context_length=32768,
    ),
    # Qwen/Qwen3-8B config.json (QK norms, untied output head; "8.2B" on its model card).
    "qwen3-8b": ModelArchitecture(
        parameter_count=8_190_735_360,
        layers=36,
        hidden_size=4096,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        max_context_length=40960,
    ),
    # Qwen/Qwen3-32B config.json ("32.8B" on its model card).
    "qwen3-32b": ModelArchitecture(
        parameter_count=32_762_123_264,
        layers=64,
        hidden_size=5120,
        attention_heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate_size=25600,
        vocab_size=151936,
        max_context_length=40960,
    ),
    # mistralai/Mistral-7B-Instruct-v0.3
    "mistral-7b": ModelArchitecture(
        parameter_count=7_248_023_552,
        layers=32,
        hidden_size=4096,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32768,
        max_context_length=32768,
    ),
    # mistralai/Mixtral-8x7B-Instruct-v0.1: 8 experts, top-2 routing.
    "mixtral-8x7b": ModelArchitecture(
        parameter_count=46_702_792_704,
        active_parameter_count=12_879_925_248,
        layers=32,
        hidden_size=4096,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        max_context_length=32768,
        experts=8,
        experts_per_token=2,
    ),
    # Qwen/Qwen3-30B-A3B config.json (num_experts 128, num_experts_per_tok 8,
    # moe_intermediate_size 768; "30.5B in total and 3.3B activated" on its model card). The
    # counts are the config's: embeddings and output head untied, QK norms included.
    "qwen3-30b-a3b": ModelArchitecture(
        parameter_count=30_532_122_624,
        active_parameter_count=3_353_032_704,
        layers=48,
        hidden_size=2048,
        attention_heads=32,
        kv_heads=4,
        head_dim=128,
        intermediate_size=768,
        vocab_size=151936,
        max_context_length=40960,
        experts=128,
        experts_per_token=8,
    ),
    # openai/gpt-oss-120b config.json (num_local_experts 128, experts_per_token 4; 116.8B total,
    # 5.1B active excluding the input embedding, on its model card; here the active count
    # includes it, as for every entry). Published as MXFP4 experts with BF16 attention. Every
    # second layer attends to a 128-token sliding window; the planner counts full-context KV
    # for all of them, so its KV capacity for long contexts is low by up to half.
    "gpt-oss-120b": ModelArchitecture(
        parameter_count=116_829_156_672,
        active_parameter_count=5_711_982_912,
        layers=36,
        hidden_size=2880,
        attention_heads=64,
        kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
        max_context_length=131072,
        experts=128,
        experts_per_token=4,
    ),
    # openai/gpt-oss-20b config.json (num_local_experts 32, experts_per_token 4; "21B
    # parameters with 3.6B active" on its model card, the active count there without the input
    # embedding). MXFP4 experts, BF16 attention, every second layer a 128-token sliding window
    # (counted here as full context, as for gpt-oss-120b).
    "gpt-oss-20b": ModelArchitecture(
        parameter_count=20_914_757_184,
        active_parameter_count=4_187_440_704,
        layers=24,
        hidden_size=2880,
        attention_heads=64,
        kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
        max_context_length=131072,
        experts=32,
        experts_per_token=4,
    ),
    # deepseek-ai/DeepSeek-V3 config.json (model_type deepseek_v3: multi-head latent attention
    # with kv_lora_rank 512 and qk_rope_head_dim 64, so 576 cached per token and layer;
    # first_k_dense_replace 3, then n_routed_experts 256 and n_shared_experts 1 of width 2048,
    # num_experts_per_tok 8). "671B total, 36.6B activated" on its model card, the active count
    # there without the input embedding, and both without the multi-token prediction layer
    # (num_nextn_predict_layers 1, loaded only to speculate with mtp; its weights are not
    # planned, as no speculative method's are). Published in FP8 (128x128 blocks).
    "deepseek-v3": _DEEPSEEK_V3,
    # deepseek-ai/DeepSeek-R1: the same config.json as DeepSeek-V3, other weights.
    "deepseek-r1": _DEEPSEEK_V3,
}


def catalog_models() -> Mapping[str, ModelArchitecture]:
    """The built-in model architectures, by the name a spec uses in `model.name`."""
    return _MODEL_CATALOG
