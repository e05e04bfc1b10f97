"""Memory per GPU: weights, activations, runtime reserve and what is left for the KV cache.

KV cache bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes. Under tensor
parallelism each GPU holds kv_heads / tensor heads (at least one: when tensor exceeds kv_heads,
heads are replicated); under pipeline parallelism each GPU holds layers / pipeline layers.
Multi-head latent attention caches one latent of `kv_latent_dim` per token and layer instead,
whole on every tensor-parallel rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferfleet.planning.replica import ACTIVATION_BYTES, ReplicaConfig

GIB = 1024**3
# Paged KV caches allocate in blocks of 16 tokens (vLLM's default block size).
KV_BLOCK_TOKENS = 16
# CUDA context, cuBLAS workspaces and captured CUDA graphs: what an engine holds beside tensors.
RUNTIME_RESERVE_BYTES = int(1.5 * GIB)
# NCCL buffers when the replica spans several GPUs.
COLLECTIVES_RESERVE_BYTES = int(0.5 * GIB)
# Logits and probabilities of the sampler are fp32, one row per running sequence.
_SAMPLER_BYTES_PER_VOCAB_ENTRY = 8


def linear_parameters(config: ReplicaConfig) -> int:
    """Parameters in the transformer blocks' matrices (what quantisation shrinks)."""
    return config.model.parameter_count - config.model.embedding_parameters


def lora_parameters(config: ReplicaConfig) -> int:
    """Parameters of one LoRA adapter slot: an A (in x r) and a B (r x out) matrix for each
    projection of each layer (q, k, v, o and the gated MLP's three), at the slot's rank."""
    m = config.model
    attention_width = m.attention_heads * m.head_dim
    kv_width = m.kv_heads * m.head_dim
    in_plus_out = (
        2 * (m.hidden_size + attention_width)  # q and o
        + 2 * (m.hidden_size + kv_width)  # k and v
        + 3 * (m.hidden_size + m.intermediate_size)  # gate, up and down
    )
    return m.layers * config.lora_rank * in_plus_out


def weight_bytes_per_gpu(config: ReplicaConfig) -> float:
    """This GPU's shard of the weights (shards are taken as even across TP and PP), with the
    LoRA adapter slots the engine reserves (16-bit, every adapter resident)."""
    quantised = linear_parameters(config) * config.weight_bytes_per_param
    embeddings = config.model.embedding_parameters * ACTIVATION_BYTES
    adapters = config.lora_slots * lora_parameters(config) * ACTIVATION_BYTES
    return (quantised + embeddings + adapters) / config.gpus


def kv_heads_per_gpu(config: ReplicaConfig) -> int:
    return max(1, config.model.kv_heads // config.tensor)


def kv_width_per_gpu(config: ReplicaConfig) -> int:
    """Elements one token caches per layer on one GPU: K and V of its KV heads, or under
    multi-head latent attention the whole latent, which every tensor-parallel rank holds (the
    heads are split, the latent they share is not)."""
    m = config.model
    if m.kv_latent_dim is not None:
        return m.kv_latent_dim
    return 2 * kv_heads_per_gpu(config) * m.head_dim


def kv_bytes_per_token(config: ReplicaConfig) -> int:
    """KV bytes one token occupies on one GPU of the replica."""
    layers_per_gpu = math.ceil(config.model.layers / config.pipeline)
    return layers_per_gpu * kv_width_per_gpu(config) * config.kv_bytes_per_element


def kv_bytes_per_token_replica(config: ReplicaConfig) -> int:
    """KV bytes one token's cache holds once across the replica (what a KV transfer moves): a
    latent replicated over tensor-parallel ranks moves once."""
    copies = 1 if config.model.kv_latent_dim is not None else config.tensor
    return kv_bytes_per_token(config) * config.pipeline * copies


def activation_bytes_per_gpu(config: ReplicaConfig) -> float:
    """Peak activations of a step at the full token budget, as engines profile at start-up:
    the residual stream, the QKV output and the MLP's gate/up output, plus sampler buffers."""
    m = config.model
    tokens = config.max_batched_tokens
    qkv_width = (m.attention_heads + 2 * m.kv_heads) * m.head_dim / config.tensor
    mlp_width = 2 * m.intermediate_size * m.experts_per_token / config.tensor
    per_token = (2 * m.hidden_size + qkv_width + mlp_width) * ACTIVATION_BYTES
    sampler = config.max_sequences * m.vocab_size * _SAMPLER_BYTES_PER_VOCAB_ENTRY
    return tokens * per_token + sampler


def runtime_bytes_per_gpu(config: ReplicaConfig) -> int:
    return RUNTIME_RESERVE_BYTES + (COLLECTIVES_RESERVE_BYTES if config.gpus > 1 else 0)


@dataclass(frozen=True)
class MemoryPlan:
    """Memory of one GPU of the replica, in bytes, and the KV capacity that follows."""

    total: int
    usable: float
    weights: float
    activations: float
    runtime: int
    kv_bytes_per_token: int
    context_limit: int
    max_sequences: int

    @property
    def kv_cache(self) -> float:
        return self.usable - self.weights - self.activations - self.runtime

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the replica's KV cache holds, in whole blocks."""
        if self.kv_cache <= 0:
            return 0
        blocks = int(self.kv_cache // (self.kv_bytes_per_token * KV_BLOCK_TOKENS))
        return blocks * KV_BLOCK_TOKENS

    def max_concurrency(self, context_tokens: int) -> int:
        """Sequences of `context_tokens` (prompt + output) held at once, capped by the batch."""
        if context_tokens <= 0:
            raise ValueError(f"context_tokens must be positive (got {context_tokens})")
        blocks_per_sequence = math.ceil(context_tokens / KV_BLOCK_TOKENS)
        by_memory = self.kv_capacity_tokens // (blocks_per_sequence * KV_BLOCK_TOKENS)
        return min(self.max_sequences, by_memory)

    @property
    def fits(self) -> bool:
        """The engine starts: weights and reserves fit, and one full-length sequence fits."""
        return self.kv_capacity_tokens >= self.context_limit

    def verdict(self) -> str:
        """The fit decision in words, with the numbers behind it."""
        weights = self.weights / GIB
        reserve = (self.activations + self.runtime) / GIB
        usable = self.usable / GIB
        if self.kv_cache <= 0:
            return (
                f"does not fit: weights {weights:.1f} GiB + activations and runtime "
                f"{reserve:.1f} GiB per GPU exceed the usable {usable:.1f} GiB "
                f"(short by {-self.kv_cache / GIB:.1f} GiB)"
            )
        if not self.fits:
            return (
                f"does not fit: {self.kv_cache / GIB:.1f} GiB left for KV cache holds "
                f"{self.kv_capacity_tokens} tokens, fewer than one sequence of max model length "
                f"{self.context_limit}"
            )
        return (
            f"fits: weights {weights:.1f} GiB + reserve {reserve:.1f} GiB of usable "
            f"{usable:.1f} GiB per GPU leave {self.kv_cache / GIB:.1f} GiB of KV cache "
            f"({self.kv_capacity_tokens} tokens, {self.max_concurrency(self.context_limit)} "
            f"sequences of {self.context_limit} tokens)"
        )


def plan_memory(config: ReplicaConfig) -> MemoryPlan:
    total = config.gpu.memory_bytes
    return MemoryPlan(
        total=total,
        usable=total * config.memory_utilization,
        weights=weight_bytes_per_gpu(config),
        activations=activation_bytes_per_gpu(config),
        runtime=runtime_bytes_per_gpu(config),
        kv_bytes_per_token=kv_bytes_per_token(config),
        context_limit=config.context_limit,
        max_sequences=config.max_sequences,
    )
