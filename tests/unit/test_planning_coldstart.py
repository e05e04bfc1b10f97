"""Cold starts estimated from where the weights come from and their size."""

from __future__ import annotations

import pytest

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import EngineName
from inferfleet.api.model_spec import WeightSource
from inferfleet.planning.coldstart import (
    ENGINE_START_S,
    HUB_DOWNLOAD_BYTES_PER_S,
    RANK_LOAD_BYTES_PER_S,
    SHARED_VOLUME_BYTES_PER_S,
    estimate_cold_start,
)
from inferfleet.planning.memory import weight_bytes_per_gpu
from tests.unit.planning_fixtures import fp8, replica


@pytest.mark.parametrize(
    ("uri", "source"),
    [
        ("hf://meta-llama/Llama-3.1-8B-Instruct", WeightSource.NETWORK),
        ("pvc://weights/llama-3.1-8b", WeightSource.CACHE),
        ("s3://bucket/llama", None),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
    ],
)
def test_the_source_scheme_says_where_the_weights_come_from(
    uri: str, source: WeightSource | None
) -> None:
    assert WeightSource.of(uri) is source


def test_an_8b_model_from_the_hub_is_the_published_cold_start_it_was_derived_from() -> None:
    # Tensorfuse's L40S run: download 61 s, load 33 s, engine start 200 s (294 s in all).
    estimate = estimate_cold_start(
        replica(gpu=GpuType.L40S_48GB), WeightSource.NETWORK, EngineName.VLLM
    )
    assert estimate.checkpoint_bytes == pytest.approx(16.06e9, rel=0.01)
    assert estimate.download_s == pytest.approx(61, rel=0.03)
    assert estimate.load_s == pytest.approx(33, rel=0.03)
    assert estimate.seconds == pytest.approx(294, rel=0.02)
    assert "16.1 GB of weights from the model hub" in estimate.describe()


def test_a_cache_saves_the_download_and_a_big_model_saves_most() -> None:
    small = replica(gpu=GpuType.H100_80GB)
    large = replica("llama-3.3-70b", gpu=GpuType.H100_80GB, tensor=4)
    for config in (small, large):
        network = estimate_cold_start(config, WeightSource.NETWORK, EngineName.VLLM)
        cache = estimate_cold_start(config, WeightSource.CACHE, EngineName.VLLM)
        assert cache.download_s == 0
        assert cache.seconds < network.seconds
        assert cache.engine_start_s == network.engine_start_s
    saved_small = estimate_cold_start(small, WeightSource.CACHE, EngineName.VLLM).seconds / (
        estimate_cold_start(small, WeightSource.NETWORK, EngineName.VLLM).seconds
    )
    saved_large = estimate_cold_start(large, WeightSource.CACHE, EngineName.VLLM).seconds / (
        estimate_cold_start(large, WeightSource.NETWORK, EngineName.VLLM).seconds
    )
    assert saved_large < 0.5 < saved_small


def test_ranks_load_in_parallel_and_share_the_volume_of_their_node() -> None:
    # 70B bf16 over 8 GPUs of one node: 17.6 GB a rank at 0.5 GB/s is 35 s, but the node
    # reads 141 GB from the shared volume at 1.61 GB/s: 88 s.
    config = replica("llama-3.3-70b", gpu=GpuType.H100_80GB, tensor=8)
    per_gpu = weight_bytes_per_gpu(config)
    node_local = estimate_cold_start(config, WeightSource.NODE_LOCAL, EngineName.VLLM)
    cache = estimate_cold_start(config, WeightSource.CACHE, EngineName.VLLM)
    assert node_local.load_s == pytest.approx(per_gpu / RANK_LOAD_BYTES_PER_S)
    assert cache.load_s == pytest.approx(8 * per_gpu / SHARED_VOLUME_BYTES_PER_S)
    assert node_local.seconds < cache.seconds


def test_a_replica_over_two_nodes_downloads_half_the_checkpoint_on_each() -> None:
    config = replica("llama-3.1-405b", gpu=GpuType.H100_80GB, tensor=8, pipeline=2)
    assert config.nodes == 2
    estimate = estimate_cold_start(config, WeightSource.NETWORK, EngineName.VLLM)
    assert estimate.download_s == pytest.approx(
        estimate.checkpoint_bytes / 2 / HUB_DOWNLOAD_BYTES_PER_S
    )


def test_fp8_weights_halve_what_is_read() -> None:
    config = replica("llama-3.3-70b", gpu=GpuType.H100_80GB, tensor=4)
    bf16 = estimate_cold_start(config, WeightSource.NETWORK, EngineName.VLLM)
    quantised = estimate_cold_start(fp8(config), WeightSource.NETWORK, EngineName.VLLM)
    assert quantised.download_s == pytest.approx(bf16.download_s / 2, rel=0.05)
    assert quantised.engine_start_s == bf16.engine_start_s


def test_the_emulator_reads_no_weights() -> None:
    estimate = estimate_cold_start(replica(), WeightSource.NETWORK, EngineName.SIM)
    assert estimate.seconds == ENGINE_START_S[EngineName.SIM]
    assert estimate.describe() == "about 1 s: the engine loads no weights"
