"""The advisor: known cases where the cheapest configuration that meets the SLO is clear, the
search's bounds, quality trade-offs and the planner's error band."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import (
    KvCacheDtype,
    ModelDeploymentSpec,
    QuantizationMethod,
    TopologyMode,
    WeightPrecision,
)
from inferfleet.planning.advisor import (
    DEFAULT_PRECISIONS,
    FORBIDDABLE,
    LOSSLESS_WEIGHTS,
    PrecisionChoice,
    Recommendation,
    Rejection,
    SearchSpace,
    error_bands,
    quality_trade_off,
    recommend,
)
from inferfleet.planning.capacity import Workload
from inferfleet.slo import Slo

H100_ONLY = (GpuType.H100_80GB,)
QUANTIZING = frozenset(FORBIDDABLE)


def deployment(model: str = "llama-3.1-8b", **changes: Any) -> ModelDeploymentSpec:
    wire: dict[str, Any] = {
        "model": {"name": model, "source": "hf://org/model"},
        "engine": {"name": "vllm"},
        "gpu": {"type": "H100-80GB"},
        "batching": {"maxModelLength": 16384},
    }
    return ModelDeploymentSpec.model_validate(wire | changes)


def best(found: Recommendation) -> Any:
    assert found.options, "nothing meets the SLO"
    return found.options[0]


def test_a_model_that_fits_only_over_several_gpus_gets_tensor_parallelism() -> None:
    # Llama-3.3-70B in bf16 is 141 GB: no single H100 holds it.
    found = recommend(
        deployment("llama-3.3-70b"), Workload(1, 1000, 200), Slo(2000, 60),
        space=SearchSpace(gpu_types=H100_ONLY, forbid=QUANTIZING),
    )  # fmt: skip
    bf16 = PrecisionChoice(WeightPrecision.BF16)
    single = [
        r for r in found.rejected if r.candidate.tensor == 1 and r.candidate.precision == bf16
    ]
    assert single
    assert all(r.why is Rejection.DOES_NOT_FIT for r in single)
    assert best(found).candidate.tensor >= 2
    assert all(o.candidate.tensor >= 2 for o in found.options)


def test_on_a_decode_heavy_load_fp8_weights_win_and_are_marked() -> None:
    # 200-token prompts, 2000-token answers, a tight TPOT: decode reads the weights every
    # step, and FP8 halves them.
    found = recommend(
        deployment(), Workload(20, 200, 2000), Slo(1000, 20),
        space=SearchSpace(gpu_types=H100_ONLY, forbid=frozenset({"int8", "int4", "fp4"})),
    )  # fmt: skip
    top = best(found)
    assert top.candidate.precision.weights == WeightPrecision.FP8
    assert top.quality is not None
    assert "fp8 weights quantized" in top.quality
    lossless = found.best_without_trade_off
    assert lossless is not None
    assert lossless.candidate.precision.weights == WeightPrecision.BF16
    assert lossless.cost_per_million_usd >= 1.5 * top.cost_per_million_usd


def test_on_long_prompts_with_a_tight_tpot_disaggregation_wins() -> None:
    # 8000-token prompts chunked into an aggregated replica's steps slow every decode beside
    # them; a prefill pool keeps them away from the decodes.
    found = recommend(
        deployment(), Workload(8, 8000, 300), Slo(2000, 15),
        space=SearchSpace(gpu_types=H100_ONLY, forbid=QUANTIZING),
    )  # fmt: skip
    top = best(found)
    assert top.candidate.topology is TopologyMode.DISAGGREGATED
    aggregated = [o for o in found.options if o.candidate.topology is TopologyMode.AGGREGATED]
    assert aggregated
    assert min(o.plan.gpus for o in aggregated) > top.plan.gpus


def test_forbidden_precisions_are_left_out_but_a_models_own_is_not() -> None:
    found = recommend(
        deployment(), Workload(20, 200, 2000), Slo(1000, 20),
        space=SearchSpace(gpu_types=H100_ONLY, forbid=QUANTIZING),
    )  # fmt: skip
    assert found.options
    for option in found.options:
        assert option.candidate.precision.weights in LOSSLESS_WEIGHTS
        assert option.candidate.precision.kv_cache != KvCacheDtype.FP8
        assert option.quality is None
    forbidden = [r for r in found.rejected if r.why is Rejection.FORBIDDEN]
    assert {r.candidate.precision.weights for r in forbidden} >= {
        WeightPrecision.FP8, WeightPrecision.INT4
    }  # fmt: skip
    # DeepSeek-V3 is published in FP8: forbidding fp8 quantization leaves its own precision.
    own = PrecisionChoice(WeightPrecision.FP8, QuantizationMethod.FP8)
    assert quality_trade_off(own, "deepseek-v3") is None
    assert quality_trade_off(own, "llama-3.1-8b") is not None
    native = recommend(
        deployment("deepseek-v3", precision={"weights": "fp8", "method": "fp8"},
                   parallelism={"tensor": 8}),
        Workload(1, 1000, 200), Slo(3000, 100),
        space=SearchSpace(gpu_types=(GpuType.H200_141GB,), forbid=QUANTIZING),
    )  # fmt: skip
    assert any(o.candidate.precision.key == own.key for o in native.options)


def test_the_search_is_exhaustive_within_its_bounds() -> None:
    space = SearchSpace(gpu_types=(GpuType.H100_80GB, GpuType.L4_24GB))
    found = recommend(deployment(), Workload(5, 1000, 200), Slo(1000, 50), space=space)
    judged = Counter(
        (c.gpu_type, c.precision, c.tensor, c.pipeline, c.topology)
        for c in [o.candidate for o in found.options] + [r.candidate for r in found.rejected]
    )
    assert max(judged.values()) == 1
    # Per GPU type: every precision, tensor size of a node and pipeline size that spans nodes
    # (8 GPUs a node: TP 1, 2, 4, 8, and TP8 x PP2, PP4), each topology or once when it does
    # not fit at all.
    shapes = [(t, 1) for t in (1, 2, 4, 8)] + [(8, 2), (8, 4)]
    for gpu in space.gpu_types:
        for precision in DEFAULT_PRECISIONS:
            for tensor, pipeline in shapes:
                whole = judged[(gpu, precision, tensor, pipeline, None)]
                per_topology = sum(
                    judged[(gpu, precision, tensor, pipeline, t)] for t in TopologyMode
                )
                assert (whole, per_topology) in ((1, 0), (0, 2))
    assert found.searched == sum(judged.values())


def test_the_given_configuration_is_ranked_among_the_options() -> None:
    given = deployment()
    found = recommend(given, Workload(20, 1000, 200), Slo(500, 50))
    assert found.given is not None
    rank = found.rank_of(found.given)
    assert rank is not None
    assert found.options[rank - 1].spec.gpu.type == GpuType.H100_80GB
    costs = [o.cost_per_million_usd for o in found.options]
    assert costs == sorted(costs)


def test_every_option_carries_the_planners_error_band_for_its_gpu() -> None:
    bands = error_bands()
    assert bands[GpuType.H100_80GB].throughput is not None
    assert bands[GpuType.H100_80GB].ttft is not None
    assert bands[GpuType.B200_180GB].describe() == "no published point"
    assert "TTFT: no published point" in bands[GpuType.H200_141GB].describe()
    found = recommend(
        deployment(), Workload(20, 1000, 200), Slo(500, 50),
        space=SearchSpace(gpu_types=H100_ONLY),
    )  # fmt: skip
    assert all(o.band == bands[GpuType.H100_80GB] for o in found.options)


def test_a_refusal_from_the_engine_rejects_a_candidate() -> None:
    def no_fp8(spec: ModelDeploymentSpec) -> str | None:
        return "no fp8 here" if spec.precision.weights == WeightPrecision.FP8 else None

    found = recommend(
        deployment(), Workload(5, 1000, 200), Slo(1000, 50),
        space=SearchSpace(gpu_types=H100_ONLY), refuse=no_fp8,
    )  # fmt: skip
    refused = [r for r in found.rejected if r.why is Rejection.UNSUPPORTED]
    assert refused
    assert all(r.detail == "no fp8 here" for r in refused)
    assert all(o.candidate.precision.weights != WeightPrecision.FP8 for o in found.options)


def test_only_trade_offs_may_be_forbidden() -> None:
    with pytest.raises(ValueError, match="cannot forbid bf16"):
        SearchSpace(forbid=frozenset({"bf16"}))
