"""The roofline step-time model: regimes, scaling laws and bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import QuantizationMethod, WeightPrecision
from inferfleet.planning.memory import kv_bytes_per_token, plan_memory
from inferfleet.planning.performance import (
    DEFAULT_EFFICIENCY,
    EfficiencyTerms,
    StepLoad,
    decode_step_seconds,
    max_throughput,
    prefill_seconds,
    step_time,
)
from tests.unit.planning_fixtures import fp8, replica


def test_small_decode_batches_are_bandwidth_bound() -> None:
    config = replica()
    step = step_time(config, StepLoad(decode_sequences=1, decode_context_tokens=1000))
    weights_s = step.bytes_per_gpu / (config.gpu.memory_bandwidth * DEFAULT_EFFICIENCY.bandwidth)
    assert step.linear_s + step.attention_s == pytest.approx(weights_s, rel=0.02)


def test_long_prefill_is_compute_bound_and_scales_linearly() -> None:
    config = replica()
    four_k = step_time(config, StepLoad.prefill_chunk(4096)).linear_s
    eight_k = step_time(config, StepLoad.prefill_chunk(8192)).linear_s
    assert eight_k == pytest.approx(2 * four_k, rel=0.01)


def test_fp8_halves_bandwidth_bound_decode_and_speeds_prefill() -> None:
    bf16, quantised = replica(), fp8(replica())
    overhead = DEFAULT_EFFICIENCY.step_overhead_s
    ratio = (decode_step_seconds(bf16, 1, 1000) - overhead) / (
        decode_step_seconds(quantised, 1, 1000) - overhead
    )
    # Weights halve; the 16-bit output head does not, so a little under 2x.
    assert 1.7 < ratio < 2.0
    assert prefill_seconds(quantised, 8000) < 0.6 * prefill_seconds(bf16, 8000)


def test_h200_decodes_faster_than_h100_by_its_bandwidth() -> None:
    h100 = replica()
    h200 = replica(gpu=GpuType.H200_141GB)
    overhead = DEFAULT_EFFICIENCY.step_overhead_s
    ratio = (decode_step_seconds(h100, 8, 2000) - overhead) / (
        decode_step_seconds(h200, 8, 2000) - overhead
    )
    assert ratio == pytest.approx(4.8 / 3.35, rel=0.02)


def test_tensor_parallelism_cuts_decode_latency_but_pays_for_all_reduce() -> None:
    one = replica("llama-3.3-70b", weights=fp8(replica()).weights)
    two = replace(one, tensor=2)
    load = StepLoad(decode_sequences=16, decode_context_tokens=16 * 2000)
    single, split = step_time(one, load), step_time(two, load)
    assert split.communication_s > 0 == single.communication_s
    assert split.total_s < single.total_s
    # Slower PCIe links make the same all-reduce cost more.
    l40s = replace(two, gpu_type=GpuType.L40S_48GB, gpu=replica(gpu=GpuType.L40S_48GB).gpu)
    assert step_time(l40s, load).communication_s > split.communication_s


def test_decode_step_grows_with_batch_and_context() -> None:
    config = replica()
    assert decode_step_seconds(config, 64, 1000) > decode_step_seconds(config, 8, 1000)
    assert decode_step_seconds(config, 64, 8000) > decode_step_seconds(config, 64, 1000)


def test_chunked_prefill_costs_about_the_same_as_one_shot() -> None:
    chunked = replica(max_batched_tokens=2048)
    whole = replica(chunked_prefill=False, max_batched_tokens=32768)
    assert prefill_seconds(chunked, 16000) == pytest.approx(prefill_seconds(whole, 16000), rel=0.1)
    assert prefill_seconds(chunked, 16000) > prefill_seconds(whole, 16000)


def test_moe_reads_only_routed_experts_when_the_batch_is_small() -> None:
    mixtral = replica("mixtral-8x7b")
    small = step_time(mixtral, StepLoad(decode_sequences=1, decode_context_tokens=100))
    large = step_time(mixtral, StepLoad(decode_sequences=256, decode_context_tokens=256 * 100))
    # Top-2 of 8 experts: one token touches about a third of the weights; 256 touch them all.
    assert small.bytes_per_gpu < 0.45 * large.bytes_per_gpu


def test_max_throughput_is_efficient_but_below_peak() -> None:
    config = fp8(replica(max_sequences=2048))
    capacity = plan_memory(config).kv_capacity_tokens
    result = max_throughput(config, 1000, 1000, capacity)
    assert 0 < result.mfu < 1
    assert 0 < result.mbu < 1
    assert result.batch == capacity // 2000
    shorter = max_throughput(config, 128, 128, capacity)
    assert shorter.output_tokens_per_s > result.output_tokens_per_s


def test_attention_is_a_roofline_per_part_not_a_sum_of_bytes_and_flops() -> None:
    config = fp8(replica())
    efficiency = DEFAULT_EFFICIENCY
    bandwidth = config.gpu.memory_bandwidth * efficiency.bandwidth
    decode = StepLoad(decode_sequences=32, decode_context_tokens=32 * 4000)
    kv_read = decode.decode_context_tokens * kv_bytes_per_token(config)
    # Decode attention reads each cached byte for a few FLOPs: the bytes alone set its time.
    assert step_time(config, decode).attention_s == pytest.approx(kv_read / bandwidth)
    # A long prompt's attention is compute-bound: its FLOPs alone set the time.
    prompt = StepLoad.prefill_chunk(8192)
    m = config.model
    flops = 4 * m.layers * m.attention_heads * m.head_dim * prompt.prefill_attention_pairs
    rate = config.gpu.bf16_flops * efficiency.compute
    assert step_time(config, prompt).attention_s == pytest.approx(flops / rate)
    # Decodes and a prompt chunk in one step: the two rooflines add up.
    mixed = replace(prompt, decode_sequences=32, decode_context_tokens=32 * 4000)
    assert step_time(config, mixed).attention_s == pytest.approx(kv_read / bandwidth + flops / rate)


def test_decode_attention_depends_on_the_summed_context_only() -> None:
    """Bytes and FLOPs both grow with each sequence's context, so a batch's attention time is
    the same whether its contexts are equal or spread: no mean context enters."""
    config = fp8(replica())
    total = 64 * 3000
    even = step_time(config, StepLoad(decode_sequences=64, decode_context_tokens=total))
    per_sequence = sum(
        step_time(config, StepLoad(decode_sequences=1, decode_context_tokens=context)).attention_s
        for context in [1000] * 32 + [5000] * 32
    )
    assert even.attention_s == pytest.approx(per_sequence)


def test_latent_attention_decodes_against_the_latent_every_rank_holds() -> None:
    """DeepSeek-V3 on eight H200s: a decode reads 576 latent elements per token and layer on
    every rank, however many ranks split the heads, and each of the rank's 16 heads runs its
    query against the whole latent. That is 64 FLOPs per byte of an FP8 latent, below the
    H200's ridge: the bytes set the time. On four ranks, each reads the same bytes for twice
    the heads, and the FLOPs set it."""
    config = fp8(replica("deepseek-v3", GpuType.H200_141GB, tensor=8))
    m = config.model
    load = StepLoad(decode_sequences=32, decode_context_tokens=32 * 8000)
    efficiency = DEFAULT_EFFICIENCY.for_gpu(config.gpu_type)
    kv_read = load.decode_context_tokens * m.layers * 576 * 1
    flops = 4 * m.layers * (128 / 8) * 576 * load.decode_context_tokens
    read_s = kv_read / (config.gpu.memory_bandwidth * efficiency.bandwidth)
    compute_s = flops / (config.gpu.bf16_flops * efficiency.compute)
    assert compute_s < read_s
    assert step_time(config, load).attention_s == pytest.approx(read_s)
    four_ranks = step_time(replace(config, tensor=4), load).attention_s
    assert 2 * compute_s > read_s
    assert four_ranks == pytest.approx(2 * compute_s)


def test_a_gpu_type_with_its_own_terms_is_timed_by_them_and_no_other() -> None:
    shared = EfficiencyTerms()
    slower = EfficiencyTerms(compute=0.4, bandwidth=0.7)
    terms = shared.with_gpu(GpuType.A100_80GB, slower)
    assert terms.for_gpu(GpuType.A100_80GB) == slower
    assert terms.for_gpu(GpuType.H100_80GB) is terms
    assert hash(terms) == hash(shared.with_gpu(GpuType.A100_80GB, slower))
    a100, h100 = replica(gpu=GpuType.A100_80GB), replica()
    assert decode_step_seconds(a100, 8, 2000, terms) == pytest.approx(
        decode_step_seconds(a100, 8, 2000, slower)
    )
    assert decode_step_seconds(a100, 8, 2000, terms) > decode_step_seconds(a100, 8, 2000, shared)
    assert decode_step_seconds(h100, 8, 2000, terms) == decode_step_seconds(h100, 8, 2000, shared)
    # Replacing an entry keeps one per type.
    again = terms.with_gpu(GpuType.A100_80GB, shared)
    assert len(again.per_gpu) == 1
    assert again.for_gpu(GpuType.A100_80GB) == shared


def test_the_default_terms_time_the_a100_and_l40s_by_their_own_fitted_terms() -> None:
    for gpu_type in (GpuType.A100_80GB, GpuType.L40S_48GB):
        own = DEFAULT_EFFICIENCY.for_gpu(gpu_type)
        assert own is not DEFAULT_EFFICIENCY
        assert own.step_overhead_s == DEFAULT_EFFICIENCY.step_overhead_s
    assert DEFAULT_EFFICIENCY.for_gpu(GpuType.H200_141GB) is DEFAULT_EFFICIENCY
    # The A100 reaches more of its peak compute than the H100 terms grant it.
    a100 = replica(gpu=GpuType.A100_80GB)
    assert prefill_seconds(a100, 8000) < prefill_seconds(a100, 8000, EfficiencyTerms())


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "gpt-oss-120b"])
def test_moe_memory_is_the_total_and_compute_the_active_parameters(model: str) -> None:
    """The same model declared dense (every parameter used by every token): its weights take
    the same memory, but a prompt costs the total parameters' FLOPs and a small decode step
    reads every weight, where the MoE model's cost the active ones."""
    moe = replica(model, GpuType.H200_141GB)
    architecture = moe.model.model_copy(
        update={"active_parameter_count": None, "experts": 1, "experts_per_token": 1}
    )
    dense = replace(moe, model=architecture)
    assert plan_memory(moe).weights == plan_memory(dense).weights
    prompt = StepLoad.prefill_chunk(4096)
    active_share = moe.model.active_parameters / moe.model.parameter_count
    assert (
        step_time(moe, prompt).flops_per_gpu
        < 1.5 * active_share * step_time(dense, prompt).flops_per_gpu
    )
    one_token = StepLoad(decode_sequences=1, decode_context_tokens=1000)
    assert step_time(moe, one_token).bytes_per_gpu < 0.2 * step_time(dense, one_token).bytes_per_gpu


def test_nvfp4_runs_the_gemms_at_the_fp4_rate_and_mxfp4_weight_only() -> None:
    base = replica("llama-3.3-70b", GpuType.B200_180GB)
    nvfp4 = replace(base, weights=WeightPrecision.FP4, method=QuantizationMethod.NVFP4)
    mxfp4 = replace(base, weights=WeightPrecision.FP4, method=QuantizationMethod.MXFP4)
    assert nvfp4.linear_flops_rate == base.gpu.fp4_flops == 2 * base.gpu.fp8_flops  # type: ignore[operator]
    assert mxfp4.linear_flops_rate == base.gpu.bf16_flops
    # 4.5 and 4.25 bits a weight against 16.
    assert nvfp4.weight_bytes_per_param / base.weight_bytes_per_param == pytest.approx(4.5 / 16)
    assert mxfp4.weight_bytes_per_param / base.weight_bytes_per_param == pytest.approx(4.25 / 16)
    prompt = StepLoad.prefill_chunk(8192)
    assert step_time(nvfp4, prompt).linear_s < 0.3 * step_time(base, prompt).linear_s


def test_a_replica_across_nodes_pays_its_stage_hops_over_the_node_network() -> None:
    """Llama-3.1-405B in BF16 on H100s: tensor 8 within each node, two pipeline stages on two
    nodes. The one stage boundary between them moves the hidden states and the residual of
    every token over the node's network (one 400 Gb/s NIC per GPU), not NVLink."""
    config = replica("llama-3.1-405b", tensor=8, pipeline=2)
    assert (config.nodes, config.pipeline_hops_between_nodes) == (2, 1)
    one_node = replace(config, gpu=config.gpu.model_copy(update={"gpus_per_node": 16}))
    assert (one_node.nodes, one_node.pipeline_hops_between_nodes) == (1, 0)
    tokens = 4096
    load = StepLoad.prefill_chunk(tokens)
    across = step_time(config, load).communication_s
    within = step_time(one_node, load).communication_s
    hop_bytes = 2 * tokens * config.model.hidden_size * 2
    expected = hop_bytes / config.gpu.node_network_bandwidth - hop_bytes / (
        config.gpu.interconnect_bandwidth
    )
    assert across - within == pytest.approx(expected, rel=1e-6)
    # Four stages of tensor 4 on 8-GPU nodes: two stages a node, one boundary between nodes.
    narrow = replace(config, tensor=4, pipeline=4)
    assert (narrow.nodes, narrow.pipeline_hops_between_nodes) == (2, 1)
    # A tensor-parallel group wider than a node all-reduces over the node's network (50 GB/s a
    # GPU where NVLink gives 450).
    wide = replace(config, tensor=16, pipeline=1)
    wide_node = replace(wide, gpu=wide.gpu.model_copy(update={"gpus_per_node": 16}))
    slower = step_time(wide, load).communication_s / step_time(wide_node, load).communication_s
    assert slower > 5
