"""Roofline step-time model of one engine replica, with fitted efficiency terms.

An engine step runs the batch's tokens through every layer. Its time is the sum of parts that
run one after another on the GPU:

* linear layers (GEMMs): max(FLOPs / (peak x compute efficiency),
  weight bytes / (bandwidth x bandwidth efficiency)). Prefill tokens make them compute-bound;
  a decode-only batch is bound by reading the weights once per step;
* attention, a roofline of its own: the slower of the K/V bytes read and the attention FLOPs
  at the bf16 tensor-core peak, taken separately for the decodes (each sequence reads its
  whole cache: bandwidth-bound) and for the prompt chunks (each query attends to every earlier
  position: compute-bound for long prompts). Both the bytes and the FLOPs of a decode grow in
  proportion to its context, so the roofline of the batch's summed context is the sum of each
  sequence's roofline: no mean context enters;
* tensor-parallel all-reduces (two per layer) and pipeline hops;
* a fixed per-step overhead (scheduling, sampling, kernel launches).

Pipeline stages are taken as sequential for one step (latency of the whole model); the
throughput gain of filling the pipeline with micro-batches is not modelled, so PP plans are
conservative. The efficiency terms are fitted to published measurements (see `calibration`);
a GPU type whose published points call for other kernel efficiencies has its own terms
(`EfficiencyTerms.per_gpu`), every other type uses the fitted H100 terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from inferfleet.api.catalog import GpuType
from inferfleet.planning.memory import (
    kv_bytes_per_token,
    linear_parameters,
    weight_bytes_per_gpu,
)
from inferfleet.planning.replica import ACTIVATION_BYTES, ReplicaConfig


@dataclass(frozen=True)
class EfficiencyTerms:
    """Fractions of datasheet peaks that real kernels reach, and fixed costs.

    Defaults are fitted to the published points in `calibration.PUBLISHED_POINTS`. The four
    terms apply to every GPU type not listed in `per_gpu`; a listed type uses its own terms
    (its kernels reach another share of its peaks), fitted to its own published points.
    """

    compute: float = 0.51
    bandwidth: float = 0.90
    step_overhead_s: float = 0.0015
    allreduce_latency_s: float = 30e-6
    per_gpu: tuple[tuple[GpuType, EfficiencyTerms], ...] = ()

    def for_gpu(self, gpu_type: GpuType) -> EfficiencyTerms:
        """The terms that time a step on `gpu_type`."""
        for listed, terms in self.per_gpu:
            if listed is gpu_type:
                return terms
        return self

    def with_gpu(self, gpu_type: GpuType, terms: EfficiencyTerms) -> EfficiencyTerms:
        """These terms with `gpu_type` timed by `terms` (whose own `per_gpu` is dropped)."""
        own = replace(terms, per_gpu=())
        others = tuple((listed, t) for listed, t in self.per_gpu if listed is not gpu_type)
        listed_types = sorted((*others, (gpu_type, own)), key=lambda pair: pair[0].value)
        return replace(self, per_gpu=tuple(listed_types))


# Fitted to the H100 points; the A100 and L40S measured beside an H100 in one table reach other
# shares of their peaks (and the L40S's PCIe all-reduce is slower). docs/calibration.md has the
# evidence; every other type uses the H100 terms.
DEFAULT_EFFICIENCY = EfficiencyTerms(
    per_gpu=(
        (GpuType.A100_80GB, EfficiencyTerms(compute=0.64, allreduce_latency_s=50e-6)),
        (
            GpuType.L40S_48GB,
            EfficiencyTerms(compute=0.42, bandwidth=0.75, allreduce_latency_s=200e-6),
        ),
    )
)


@dataclass(frozen=True)
class StepLoad:
    """The work in one engine step."""

    decode_sequences: int = 0
    """Sequences producing one token each."""
    decode_context_tokens: int = 0
    """Sum of the decode sequences' context lengths (the KV bytes their attention reads)."""
    prefill_tokens: int = 0
    """Prompt tokens processed in the step (a chunk, or several prompts)."""
    prefill_attention_pairs: float = 0.0
    """Sum over prefill tokens of the positions each attends to (causal)."""

    @property
    def tokens(self) -> int:
        return self.decode_sequences + self.prefill_tokens

    @classmethod
    def prefill_chunk(cls, chunk_tokens: int, start_position: int = 0) -> StepLoad:
        return cls(
            prefill_tokens=chunk_tokens,
            prefill_attention_pairs=chunk_tokens * (start_position + chunk_tokens / 2),
        )


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step, by part, with the work done (for MFU and MBU)."""

    linear_s: float
    attention_s: float
    communication_s: float
    overhead_s: float
    flops_per_gpu: float
    bytes_per_gpu: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.communication_s + self.overhead_s


def _moe_weight_fraction(config: ReplicaConfig, tokens: int) -> float:
    """Fraction of the linear weights a step reads: dense models read all of them; an MoE step
    reads everything but the routed experts, and of those the ones its tokens were routed to
    (uniform routing)."""
    m = config.model
    if not m.is_moe:
        return 1.0
    linear = linear_parameters(config)
    # An active count given below the embeddings would make the routed experts more than all.
    routed = min(m.routed_expert_parameters, linear)
    untouched = (1 - m.experts_per_token / m.experts) ** max(tokens, 1)
    return (linear - routed * untouched) / linear


def linear_work(config: ReplicaConfig, load: StepLoad) -> tuple[float, float]:
    """FLOPs and weight bytes per GPU of a step's linear layers: the active parameters for
    every token, the output head only for decode tokens (a prompt's logits are not sampled)."""
    m = config.model
    active_linear = m.active_parameters - m.embedding_parameters
    head = m.output_head_parameters
    flops = (2 * active_linear * load.tokens + 2 * head * load.decode_sequences) / config.gpus
    head_bytes = head * ACTIVATION_BYTES / config.gpus
    quantised_bytes = weight_bytes_per_gpu(config) - m.embedding_parameters * (
        ACTIVATION_BYTES / config.gpus
    )
    return flops, quantised_bytes * _moe_weight_fraction(config, load.tokens) + head_bytes


def step_time(
    config: ReplicaConfig, load: StepLoad, efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY
) -> StepTime:
    m = config.model
    gpu = config.gpu
    tokens = load.tokens
    efficiency = efficiency.for_gpu(config.gpu_type)

    linear_flops, weight_bytes = linear_work(config, load)
    linear_s = max(
        linear_flops / (config.linear_flops_rate * efficiency.compute),
        weight_bytes / (gpu.memory_bandwidth * efficiency.bandwidth),
    )

    # Attention: QK^T and PV are 2 x 2 FLOPs per (query, key) pair; a decode's query meets every
    # cached position, a prompt chunk's queries the causal pairs. Each part is a roofline.
    bandwidth = gpu.memory_bandwidth * efficiency.bandwidth
    attention_rate = gpu.bf16_flops * efficiency.compute
    heads_per_stage = m.layers * (m.attention_heads / config.tensor) / config.pipeline
    flops_per_pair = 4 * heads_per_stage * m.head_dim
    # Multi-head latent attention decodes against the latent itself (the up-projections
    # absorbed into the query and output): each head's query meets the whole latent width.
    # Prompts are attended with keys and values expanded per head, as for any other model.
    decode_flops_per_pair = (
        flops_per_pair if m.kv_latent_dim is None else 4 * heads_per_stage * m.kv_latent_dim
    )
    kv_per_token = kv_bytes_per_token(config)
    decode_read = load.decode_context_tokens * kv_per_token
    decode_flops = decode_flops_per_pair * load.decode_context_tokens
    prefill_flops = flops_per_pair * load.prefill_attention_pairs
    # A chunk reads the K/V of its prompt up to its end once: the start plus the chunk itself.
    prefill_read = 0.0
    if load.prefill_tokens:
        prefill_context = (
            load.prefill_attention_pairs / load.prefill_tokens + load.prefill_tokens / 2
        )
        prefill_read = prefill_context * kv_per_token
    attention_s = max(decode_read / bandwidth, decode_flops / attention_rate) + max(
        prefill_read / bandwidth, prefill_flops / attention_rate
    )
    attention_flops = decode_flops + prefill_flops
    kv_read = decode_read + prefill_read

    # Two ring all-reduces per layer over the activations; one hop per pipeline boundary.
    # Within a node they cross NVLink (or PCIe); a tensor-parallel group wider than a node, and
    # a stage boundary between nodes, cross the node's network.
    communication_s = 0.0
    activation_bytes = tokens * m.hidden_size * ACTIVATION_BYTES
    if config.tensor > 1:
        ring_bytes = 2 * (config.tensor - 1) / config.tensor * activation_bytes
        ring_bandwidth = (
            gpu.interconnect_bandwidth
            if config.tensor <= gpu.gpus_per_node
            else gpu.node_network_bandwidth
        )
        per_allreduce = efficiency.allreduce_latency_s + ring_bytes / ring_bandwidth
        communication_s += 2 * m.layers * per_allreduce
    if config.pipeline > 1:
        # A stage hands the next its hidden states and the residual stream: two activations.
        hop_bytes = 2 * activation_bytes
        between_nodes = config.pipeline_hops_between_nodes
        within_node = config.pipeline - 1 - between_nodes
        communication_s += within_node * (
            efficiency.allreduce_latency_s + hop_bytes / gpu.interconnect_bandwidth
        )
        communication_s += between_nodes * (
            efficiency.allreduce_latency_s + hop_bytes / gpu.node_network_bandwidth
        )

    return StepTime(
        linear_s=linear_s,
        attention_s=attention_s,
        communication_s=communication_s,
        overhead_s=efficiency.step_overhead_s,
        flops_per_gpu=linear_flops + attention_flops,
        bytes_per_gpu=weight_bytes + kv_read,
    )


def prefill_seconds(
    config: ReplicaConfig,
    prompt_tokens: int,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
    *,
    chunk_tokens: int | None = None,
    decode_sequences: int = 0,
    decode_context_tokens: int = 0,
) -> float:
    """Time to prefill one prompt, in chunks of the step budget left after `decode_sequences`
    ride along in each step (chunked prefill), or in one step when chunking is off."""
    if prompt_tokens <= 0:
        return 0.0
    if config.chunked_prefill:
        budget = chunk_tokens or config.max_batched_tokens
        chunk = max(1, budget - decode_sequences)
    else:
        chunk = prompt_tokens
    total = 0.0
    done = 0
    while done < prompt_tokens:
        size = min(chunk, prompt_tokens - done)
        step = StepLoad(
            decode_sequences=decode_sequences,
            decode_context_tokens=decode_context_tokens,
            prefill_tokens=size,
            prefill_attention_pairs=size * (done + size / 2),
        )
        total += step_time(config, step, efficiency).total_s
        done += size
    return total


def decode_step_seconds(
    config: ReplicaConfig,
    batch: int,
    mean_context_tokens: float,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> float:
    """One decode step of `batch` sequences (the TPOT of a decode-only batch)."""
    load = StepLoad(
        decode_sequences=batch, decode_context_tokens=math.ceil(batch * mean_context_tokens)
    )
    return step_time(config, load, efficiency).total_s


@dataclass(frozen=True)
class Throughput:
    """Saturated throughput of one replica for fixed input/output lengths."""

    batch: int
    step_s: float
    output_tokens_per_s: float
    mfu: float
    mbu: float


def saturated_batch(
    config: ReplicaConfig, input_tokens: int, output_tokens: int, kv_capacity_tokens: int
) -> int:
    """Sequences a saturated replica runs at once: each reserves its whole context (input +
    output) in the KV cache, as a no-eviction scheduler does, within `max_sequences`."""
    context = input_tokens + output_tokens
    return max(1, min(config.max_sequences, kv_capacity_tokens // context))


def max_throughput(
    config: ReplicaConfig,
    input_tokens: int,
    output_tokens: int,
    kv_capacity_tokens: int,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> Throughput:
    """Throughput with the batch as full as memory and `max_sequences` allow.

    In steady state each step decodes `batch` tokens and prefills the prompts of the requests
    that replace finished ones: batch x input / output prompt tokens per step, with the batch of
    `saturated_batch`.
    """
    batch = saturated_batch(config, input_tokens, output_tokens, kv_capacity_tokens)
    prefill_per_step = batch * input_tokens / output_tokens
    load = StepLoad(
        decode_sequences=batch,
        decode_context_tokens=math.ceil(batch * (input_tokens + output_tokens / 2)),
        prefill_tokens=math.ceil(prefill_per_step),
        prefill_attention_pairs=prefill_per_step * input_tokens / 2,
    )
    step = step_time(config, load, efficiency)
    return Throughput(
        batch=batch,
        step_s=step.total_s,
        output_tokens_per_s=batch / step.total_s,
        mfu=utilisation(step.flops_per_gpu, step.total_s, config.linear_flops_rate),
        mbu=utilisation(step.bytes_per_gpu, step.total_s, config.gpu.memory_bandwidth),
    )


def queued_run_throughput(
    config: ReplicaConfig,
    input_tokens: int,
    output_tokens: int,
    kv_capacity_tokens: int,
    *,
    requests: int,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> float:
    """Output tokens/s of a run that queues `requests` identical requests at once and ends when
    the last one completes: what an offline throughput benchmark measures (trtllm-bench
    `throughput` over a dataset of fixed lengths).

    The batch (`saturated_batch`) fills in waves. Identical lengths keep each wave's
    requests together: they are admitted as the wave before leaves, their prompts prefilled in
    full steps of the token budget, each step also decoding the sequences beside them, and they
    finish together. So a wave lasts as many steps as its outputs have tokens, or as its
    prefill takes when that is longer; and the last wave runs with the requests left over. In
    `max_throughput`'s steady state, by contrast, every step prefills a sliver of a prompt,
    which a decode step bound by its weight reads carries for nearly nothing."""
    batch = saturated_batch(config, input_tokens, output_tokens, kv_capacity_tokens)
    full_waves, left_over = divmod(requests, batch)
    seconds = full_waves * _wave_seconds(config, input_tokens, output_tokens, batch, efficiency)
    if left_over:
        seconds += _wave_seconds(config, input_tokens, output_tokens, left_over, efficiency)
    return requests * output_tokens / seconds


def _wave_seconds(
    config: ReplicaConfig,
    input_tokens: int,
    output_tokens: int,
    batch: int,
    efficiency: EfficiencyTerms,
) -> float:
    """One wave of `queued_run_throughput`: `prefill_steps` steps that prefill the wave's prompts
    (a token budget shared with the decodes in the step) and decode what runs beside them, then
    decode-only steps of the whole wave until its outputs are done."""
    prompt_tokens = batch * input_tokens

    def decoding_beside(prefill_steps: int) -> float:
        # The wave lasts max(output, prefill) steps and decodes batch x output tokens in them.
        return batch * min(1.0, output_tokens / prefill_steps)

    prefill_steps = math.ceil(prompt_tokens / config.max_batched_tokens)
    for _ in range(4):  # the decodes in a prefill step and the steps needed settle together
        budget = max(1.0, config.max_batched_tokens - decoding_beside(prefill_steps))
        prefill_steps = math.ceil(prompt_tokens / budget)
    decoding = decoding_beside(prefill_steps)
    steps = max(output_tokens, prefill_steps)
    # A sequence's context over its life: its prompt and, on average, half its output.
    context = input_tokens + output_tokens / 2
    chunk = prompt_tokens / prefill_steps
    prefill_step = StepLoad(
        decode_sequences=round(decoding),
        decode_context_tokens=math.ceil(decoding * context),
        prefill_tokens=math.ceil(chunk),
        # Each prompt token attends to half its prompt on average (causal).
        prefill_attention_pairs=chunk * input_tokens / 2,
    )
    seconds = prefill_steps * step_time(config, prefill_step, efficiency).total_s
    if steps > prefill_steps:
        seconds += (steps - prefill_steps) * decode_step_seconds(config, batch, context, efficiency)
    return seconds


def utilisation(work_per_gpu: float, seconds: float, peak_per_second: float) -> float:
    """Achieved rate over peak (MFU for FLOPs, MBU for bytes)."""
    return work_per_gpu / seconds / peak_per_second
