"""Memory accounting: weights, KV bytes per token, KV capacity, fit verdicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import (
    KvCacheDtype,
    QuantizationMethod,
    WeightPrecision,
)
from inferfleet.api.model_spec import LoraAdapter, lora_slot_rank
from inferfleet.planning.memory import (
    GIB,
    KV_BLOCK_TOKENS,
    kv_bytes_per_token,
    kv_bytes_per_token_replica,
    lora_parameters,
    plan_memory,
    weight_bytes_per_gpu,
)
from tests.unit.planning_fixtures import replica


@pytest.mark.parametrize(
    ("model", "tensor", "kv_cache", "expected"),
    [
        # 2 x layers x kv_heads x head_dim x bytes
        ("llama-3.1-8b", 1, KvCacheDtype.AUTO, 2 * 32 * 8 * 128 * 2),
        ("llama-3.1-8b", 1, KvCacheDtype.FP8, 2 * 32 * 8 * 128 * 1),
        ("llama-3.1-8b", 2, KvCacheDtype.AUTO, 2 * 32 * 4 * 128 * 2),
        # GQA 7:1 (28 query heads over 4 KV heads); TP8 replicates the 4 KV heads: 1 per GPU.
        ("qwen2.5-7b", 1, KvCacheDtype.BF16, 2 * 28 * 4 * 128 * 2),
        ("qwen2.5-7b", 4, KvCacheDtype.BF16, 2 * 28 * 1 * 128 * 2),
        ("llama-3.3-70b", 8, KvCacheDtype.FP8, 2 * 80 * 1 * 128 * 1),
        # Multi-head latent attention: one 512 + 64 latent per layer, whole on every TP rank.
        ("deepseek-v3", 1, KvCacheDtype.BF16, 61 * 576 * 2),
        ("deepseek-v3", 8, KvCacheDtype.FP8, 61 * 576 * 1),
    ],
)
def test_kv_bytes_per_token_is_gqa_and_tp_aware(
    model: str, tensor: int, kv_cache: KvCacheDtype, expected: int
) -> None:
    assert kv_bytes_per_token(replica(model, tensor=tensor, kv_cache=kv_cache)) == expected


def test_pipeline_splits_layers_for_kv() -> None:
    whole = kv_bytes_per_token(replica("llama-3.3-70b"))
    assert kv_bytes_per_token(replica("llama-3.3-70b", pipeline=2)) == whole // 2


@pytest.mark.parametrize(("model", "copies"), [("llama-3.3-70b", 1), ("deepseek-v3", 8)])
def test_a_kv_transfer_moves_each_token_once(model: str, copies: int) -> None:
    """Split KV heads add up over the ranks; a latent every rank holds moves once."""
    config = replica(model, tensor=8, kv_cache=KvCacheDtype.FP8)
    assert kv_bytes_per_token_replica(config) * copies == 8 * kv_bytes_per_token(config)


@pytest.mark.parametrize(
    ("weights", "method", "expected_gib"),
    [
        # 6.98e9 linear params; 1.05e9 embedding + head params stay 16-bit.
        (WeightPrecision.BF16, None, 8.030e9 * 2 / GIB),
        (WeightPrecision.FP8, QuantizationMethod.FP8, (6.980e9 * 1 + 1.051e9 * 2) / GIB),
        (WeightPrecision.INT4, QuantizationMethod.AWQ, (6.980e9 * (0.5 + 2 / 128) + 2.1e9) / GIB),
    ],
)
def test_weights_per_gpu(
    weights: WeightPrecision, method: QuantizationMethod | None, expected_gib: float
) -> None:
    config = replica(weights=weights, method=method)
    assert weight_bytes_per_gpu(config) / GIB == pytest.approx(expected_gib, rel=0.01)


def test_tensor_parallel_shards_weights() -> None:
    one = weight_bytes_per_gpu(replica("llama-3.3-70b"))
    assert weight_bytes_per_gpu(replica("llama-3.3-70b", tensor=4)) == pytest.approx(one / 4)


def test_kv_capacity_is_what_memory_leaves_in_whole_blocks() -> None:
    memory = plan_memory(replica())
    assert memory.kv_cache == pytest.approx(
        memory.usable - memory.weights - memory.activations - memory.runtime
    )
    assert memory.kv_capacity_tokens % KV_BLOCK_TOKENS == 0
    assert memory.kv_capacity_tokens * memory.kv_bytes_per_token <= memory.kv_cache
    # Llama-3.1-8B bf16 on an H100 at 0.9: ~15 GiB of weights leave roughly 54 GiB, 440k tokens.
    assert 400_000 < memory.kv_capacity_tokens < 480_000


def test_memory_utilisation_moves_kv_capacity() -> None:
    low = plan_memory(replica(memory_utilization=0.5)).kv_capacity_tokens
    high = plan_memory(replica(memory_utilization=0.95)).kv_capacity_tokens
    assert high > low * 2


def test_max_concurrency_falls_with_context_and_is_capped_by_batch() -> None:
    memory = plan_memory(replica(max_sequences=256))
    assert memory.max_concurrency(1024) == 256
    assert memory.max_concurrency(131072) == memory.kv_capacity_tokens // 131072
    assert memory.max_concurrency(8192) > memory.max_concurrency(32768)
    with pytest.raises(ValueError, match="context_tokens"):
        memory.max_concurrency(0)


def test_405b_bf16_on_one_l40s_does_not_fit_and_says_by_how_much() -> None:
    memory = plan_memory(replica("llama-3.1-405b", GpuType.L40S_48GB))
    assert not memory.fits
    verdict = memory.verdict()
    assert verdict.startswith("does not fit: weights 756.0 GiB")
    assert "usable 40.5 GiB" in verdict
    assert "short by 719." in verdict


def test_fits_needs_one_full_length_sequence() -> None:
    # Llama-3.3-70B bf16 on 2 x H100 (65.7 GiB of weights per GPU) leaves ~3 GiB of KV:
    # fewer tokens than one 128k-token sequence.
    memory = plan_memory(replica("llama-3.3-70b", tensor=2))
    assert memory.kv_cache > 0
    assert not memory.fits
    assert "fewer than one sequence of max model length 131072" in memory.verdict()
    shorter = plan_memory(replica("llama-3.3-70b", tensor=2, max_model_length=8192))
    assert shorter.fits


def test_lora_adapter_slots_are_reserved_beside_the_weights() -> None:
    """Llama-3.1-8B, two slots of rank 64 (every projection of 32 layers): 0.34 GB a slot."""
    base = replica()
    with_adapters = replace(base, lora_slots=2, lora_rank=64)
    slot = lora_parameters(replace(base, lora_rank=64))
    assert slot == 32 * 64 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
    added = plan_memory(with_adapters).weights - plan_memory(base).weights
    assert added == pytest.approx(2 * slot * 2)
    assert plan_memory(with_adapters).kv_capacity_tokens < plan_memory(base).kv_capacity_tokens


@pytest.mark.parametrize(("ranks", "slot"), [((), 0), ((8,), 8), ((16, 40), 64), ((512,), 512)])
def test_adapter_slots_take_the_largest_rank_rounded_up(ranks: tuple[int, ...], slot: int) -> None:
    adapters = [LoraAdapter(name=f"a{i}", source="hf://o/a", rank=r) for i, r in enumerate(ranks)]
    assert lora_slot_rank(adapters) == slot
