"""Capacity plans: replicas per role for a load under an SLO, and what they cost."""

from __future__ import annotations

import pytest

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.inference_service import LoadSpec
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.planning.capacity import Workload, plan
from inferfleet.planning.load import closed_loop_point, operating_point
from inferfleet.slo import Slo
from tests.unit.planning_fixtures import fp8, replica


def spec(**overrides: object) -> ModelDeploymentSpec:
    document: dict[str, object] = {
        "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"name": "vllm"},
        "gpu": {"type": "H100-80GB"},
        "batching": {"maxModelLength": 16384},
    }
    document.update(overrides)
    return ModelDeploymentSpec.model_validate(document)


DISAGGREGATED = {"topology": {"mode": "disaggregated", "prefill": {"replicas": 1}}}
SLO = Slo.in_seconds(ttft_p95_s=0.5, tpot_p95_s=0.05)


def test_more_load_needs_more_replicas_and_each_replica_meets_the_slo() -> None:
    counts = []
    for rate in (5, 50, 200):
        capacity = plan(spec(), workload=Workload(rate, 1000, 200), slo=SLO)
        assert capacity.meets_slo is True
        (role,) = capacity.roles
        assert role.role == Role.AGGREGATED
        assert role.point is not None
        assert role.point.ttft_p95_s <= 0.5
        assert role.point.tpot_s <= 0.05
        counts.append(role.replicas)
    assert counts[0] <= counts[1] < counts[2]


def test_the_plan_is_the_fewest_replicas() -> None:
    capacity = plan(spec(), workload=Workload(200, 1000, 200), slo=SLO)
    (role,) = capacity.roles
    one_fewer = operating_point(capacity.config, 200 / (role.replicas - 1), 1000, 200)
    assert not (one_fewer.stable and one_fewer.ttft_p95_s <= 0.5 and one_fewer.tpot_s <= 0.05)


def test_a_tighter_slo_needs_more_replicas() -> None:
    load = Workload(100, 2000, 300)
    loose = plan(spec(), workload=load, slo=Slo.in_seconds(ttft_p95_s=2.0, tpot_p95_s=0.1))
    tight = plan(spec(), workload=load, slo=Slo.in_seconds(ttft_p95_s=0.3, tpot_p95_s=0.02))
    assert tight.gpus > loose.gpus


def test_an_unreachable_slo_says_why_in_numbers() -> None:
    capacity = plan(spec(), workload=Workload(1, 8000, 100), slo=Slo.in_seconds(ttft_p95_s=0.01))
    assert capacity.meets_slo is False
    assert "an idle replica already needs p95 TTFT 256 ms" in capacity.reason
    assert "target 10 ms" in capacity.reason


def test_prompts_that_spread_widely_need_more_replicas_and_can_miss_even_idle() -> None:
    """The p95 prompt of lengths as varied as an exponential's (CV 1) is about 2.8 times the
    mean: its own prefill sets the tail, which no number of replicas shortens."""
    alike = plan(spec(), workload=Workload(60, 4000, 100), slo=SLO)
    varied = plan(spec(), workload=Workload(60, 4000, 100, input_tokens_cv2=1.0), slo=SLO)
    assert alike.meets_slo
    assert varied.meets_slo
    assert varied.gpus > alike.gpus
    (role,) = varied.roles
    assert role.point is not None
    assert role.point.ttft_p95_s <= 0.5
    slo = Slo.in_seconds(ttft_p95_s=0.3)
    assert plan(spec(), workload=Workload(1, 8000, 100), slo=slo).meets_slo is True
    idle = plan(spec(), workload=Workload(1, 8000, 100, input_tokens_cv2=1.0), slo=slo)
    assert idle.meets_slo is False
    assert "an idle replica already needs p95 TTFT 687 ms (target 300 ms)" in idle.reason
    assert "(prompt lengths' CV 1)" in idle.reason


def test_a_workload_spread_is_read_from_the_expected_load_and_never_negative() -> None:
    load = LoadSpec.model_validate(
        {"requestsPerSecond": 4, "inputTokens": 1000, "outputTokens": 100, "inputTokensCv": 0.5}
    )
    assert Workload.from_spec(load) == Workload(4, 1000, 100, input_tokens_cv2=0.25)
    default = LoadSpec.model_validate(
        {"requestsPerSecond": 4, "inputTokens": 1000, "outputTokens": 100}
    )
    assert Workload.from_spec(default).input_tokens_cv2 == 1.0
    with pytest.raises(ValueError, match="spread must be >= 0"):
        Workload(4, 1000, 100, input_tokens_cv2=-0.1)


def test_longer_prompts_shift_disaggregated_capacity_to_prefill() -> None:
    rate = 10
    short = plan(spec(**DISAGGREGATED), workload=Workload(rate, 500, 400), slo=SLO)
    long = plan(spec(**DISAGGREGATED), workload=Workload(rate, 6000, 400), slo=SLO)
    assert short.meets_slo
    assert long.meets_slo
    replicas = {c: {r.role: r.replicas for r in c.roles} for c in (short, long)}
    assert replicas[long][Role.PREFILL] > replicas[short][Role.PREFILL]
    ratio_short = replicas[short][Role.PREFILL] / replicas[short][Role.DECODE]
    ratio_long = replicas[long][Role.PREFILL] / replicas[long][Role.DECODE]
    assert ratio_long > ratio_short


def test_cost_per_million_output_tokens() -> None:
    load = Workload(50, 1000, 200)
    capacity = plan(spec(), workload=load, slo=SLO)
    cost = capacity.cost_per_million_output_tokens_usd
    tokens_per_hour = 50 * 200 * 3600
    assert cost == pytest.approx(capacity.gpus * 2.50 / tokens_per_hour * 1e6)


def test_without_a_load_the_declared_replicas_stand() -> None:
    capacity = plan(spec(replicas=3))
    assert capacity.meets_slo is None
    assert [(r.role, r.replicas, r.gpus) for r in capacity.roles] == [(Role.AGGREGATED, 3, 3)]
    assert capacity.cost_per_million_output_tokens_usd is not None


def test_a_spec_that_does_not_fit_plans_nothing_and_costs_nothing() -> None:
    capacity = plan(
        spec(model={"name": "llama-3.1-405b", "source": "hf://x/y"}, gpu={"type": "L40S-48GB"}),
        workload=Workload(1, 1000, 100),
        slo=SLO,
    )
    assert capacity.meets_slo is False
    assert capacity.reason.startswith("does not fit")
    assert capacity.cost_per_million_output_tokens_usd is None


def test_overload_is_reported_not_extrapolated() -> None:
    config = replica(max_sequences=64)
    point = operating_point(config, 1000, 1000, 1000)
    assert not point.stable
    assert point.limit


def test_closed_loop_holds_its_concurrency() -> None:
    config = fp8(replica("llama-3.3-70b", tensor=2, max_model_length=8192))
    point = closed_loop_point(config, 32, 2000, 200)
    in_flight = point.rate * (point.ttft_mean_s + 200 * point.tpot_s)
    assert in_flight == pytest.approx(32, rel=0.02)


def test_gpu_catalogs_with_the_same_figures_are_one_cache_key() -> None:
    """The operator caches plans by (spec, catalog): equal overrides must hit the cache, and
    different ones must not."""
    priced = GpuCatalog.builtin().with_overrides({"H100-80GB": {"hourlyPriceUsd": 2.1}})
    again = GpuCatalog.builtin().with_overrides({"H100-80GB": {"hourlyPriceUsd": 2.1}})
    assert priced == again
    assert hash(priced) == hash(again)
    assert priced != GpuCatalog.builtin()
    assert len({priced, again, GpuCatalog.builtin()}) == 2
