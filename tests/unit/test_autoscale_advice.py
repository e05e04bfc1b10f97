"""Advice from the running fleet: each rule fires on the measurements that call for it, names
its inputs and the planner's predicted effect, and stays silent otherwise."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import (
    ModelDeploymentSpec,
    QuantizationMethod,
    Role,
    WeightPrecision,
)
from inferfleet.autoscale.advice import (
    BANDWIDTH_BOUND_MBU,
    FleetReading,
    advise,
    measured_mbu,
)
from inferfleet.autoscale.snapshot import RoleMetrics
from inferfleet.planning.advisor import NO_PUBLISHED_POINT, error_bands
from inferfleet.planning.capacity import Workload, plan_replica
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.slo import Slo


def deployment(**changes: Any) -> tuple[ModelDeploymentSpec, ReplicaConfig]:
    wire: dict[str, Any] = {
        "model": {"name": "llama-3.1-8b", "source": "hf://org/model"},
        "engine": {"name": "vllm"},
        "gpu": {"type": "H100-80GB"},
        "prefixCaching": False,
    }
    spec = ModelDeploymentSpec.model_validate(wire | changes)
    return spec, ReplicaConfig.from_spec(spec, GpuCatalog.builtin())


def metrics(**fields: float) -> RoleMetrics:
    values: dict[str, Any] = {
        "ready_replicas": 2, "running_requests": 8.0, "waiting_requests": 0.0,
        "kv_cache_usage": 0.2, "prompt_tokens_per_s": 4000.0, "generation_tokens_per_s": 400.0,
    } | fields  # fmt: skip
    return RoleMetrics(Role.AGGREGATED, **values)


def reasons(spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading) -> list[str]:
    return [a.reason for a in advise(spec, config, reading)]


def test_prompts_that_share_prefixes_get_prefix_caching_advised_with_its_effect() -> None:
    spec, config = deployment()
    shared = FleetReading(
        {Role.AGGREGATED: metrics()}, prefix_blocks_per_s=40.0, prefix_blocks_seen_per_s=30.0,
        mean_prompt_tokens=2000,
    )  # fmt: skip
    [advice] = advise(spec, config, shared)
    assert advice.reason == "EnablePrefixCaching"
    assert "75% of the prompts' leading blocks repeat" in advice.message
    assert advice.inputs["repeatedPrefixShare"] == 0.75
    assert advice.inputs["predictedIdleTtftCachedMs"] < 0.5 * advice.inputs["predictedIdleTtftMs"]
    # Silent with caching on, prompts that do not repeat, or too few prompts to judge.
    on, on_config = deployment(prefixCaching=True)
    assert reasons(on, on_config, shared) == []
    distinct = FleetReading(
        {Role.AGGREGATED: metrics()}, prefix_blocks_per_s=40.0, prefix_blocks_seen_per_s=4.0
    )  # fmt: skip
    assert reasons(spec, config, distinct) == []
    few = FleetReading(
        {Role.AGGREGATED: metrics()}, prefix_blocks_per_s=0.05, prefix_blocks_seen_per_s=0.05
    )  # fmt: skip
    assert reasons(spec, config, few) == []


def test_a_bandwidth_bound_decode_pool_in_bf16_gets_fp8_weights_advised() -> None:
    spec, config = deployment(prefixCaching=True)
    # 2 replicas, 64 sequences each, 1,600 output tokens/s a replica: 25 steps/s, each reading
    # 16 GB of weights: 400 GB/s of the H100's 3.35 TB/s is 12%; at 120 steps/s, 57%.
    light = FleetReading({Role.AGGREGATED: metrics(running_requests=128.0,
                                                   generation_tokens_per_s=3200.0)})  # fmt: skip
    assert measured_mbu(config, light.roles[Role.AGGREGATED]) < BANDWIDTH_BOUND_MBU
    assert reasons(spec, config, light) == []
    heavy_metrics = metrics(running_requests=128.0, generation_tokens_per_s=15360.0)
    heavy = FleetReading({Role.AGGREGATED: heavy_metrics}, mean_prompt_tokens=500)
    assert measured_mbu(config, heavy_metrics) == pytest.approx(0.57, abs=0.02)
    # Where the engines time the gap between tokens, a step is that long, whatever the gauge
    # of running sequences says at this instant (120 steps/s here too).
    timed = metrics(running_requests=128.0, generation_tokens_per_s=3200.0,
                    inter_token_mean_s=1 / 120)  # fmt: skip
    assert measured_mbu(config, timed) == pytest.approx(measured_mbu(config, heavy_metrics))
    [advice] = advise(spec, config, heavy)
    assert advice.reason == "Fp8Weights"
    assert "quality trade-off" in advice.message
    assert advice.inputs["batch"] == 64
    assert advice.inputs["predictedTpotFp8Ms"] < advice.inputs["predictedTpotMs"]
    # With the load and SLO measured, the fleet the planner sizes in each precision.
    slo = Slo(1000, 30)
    loaded = replace(heavy, requests_per_s=160.0, mean_output_tokens=400, slo=slo)
    [sized] = advise(spec, config, loaded)
    fp8_config = replace(config, weights=WeightPrecision.FP8, method=QuantizationMethod.FP8)
    assert (sized.inputs["gpusNow"], sized.inputs["gpusFp8"]) == tuple(
        sized_gpus(c, False, Workload(160, 500, 400), slo) for c in (config, fp8_config)
    )
    assert sized.inputs["gpusFp8"] < sized.inputs["gpusNow"]
    now, after = sized.inputs["gpusNow"], sized.inputs["gpusFp8"]
    assert f"sized for the measured 160 req/s, the fleet goes from {now:g} GPUs to {after:g}" in (
        sized.message
    )
    # Already fp8, or a prefill pool (it does not decode): nothing to advise.
    fp8, fp8_config = deployment(prefixCaching=True, precision={"weights": "fp8", "method": "fp8"})
    assert reasons(fp8, fp8_config, heavy) == []
    prefill_only = FleetReading({Role.PREFILL: heavy_metrics})
    assert reasons(spec, config, prefill_only) == []


def test_a_full_kv_cache_with_requests_waiting_gets_an_fp8_kv_cache_advised() -> None:
    spec, config = deployment(prefixCaching=True)
    full = FleetReading({Role.AGGREGATED: metrics(kv_cache_usage=0.97, waiting_requests=12.0)})
    [advice] = advise(spec, config, full)
    assert advice.reason == "Fp8KvCache"
    assert advice.inputs["kvCapacityTokensFp8"] >= 1.9 * advice.inputs["kvCapacityTokens"]
    # Full but nobody waits (the cache is simply used), or already fp8: nothing.
    busy = FleetReading({Role.AGGREGATED: metrics(kv_cache_usage=0.97)})
    assert reasons(spec, config, busy) == []
    fp8, fp8_config = deployment(prefixCaching=True, precision={"kvCache": "fp8"})
    assert reasons(fp8, fp8_config, full) == []


def test_advice_is_wire_ready_and_names_its_inputs() -> None:
    spec, config = deployment()
    reading = FleetReading(
        {Role.AGGREGATED: metrics()}, prefix_blocks_per_s=10.0, prefix_blocks_seen_per_s=5.0
    )  # fmt: skip
    [advice] = advise(spec, config, reading)
    wire = advice.to_wire()
    assert wire["reason"] == "EnablePrefixCaching"
    assert wire["inputs"] == {k: round(v, 4) for k, v in sorted(advice.inputs.items())}


def test_a_rollout_without_surge_that_would_leave_too_few_replicas_is_reported() -> None:
    spec, config = deployment(prefixCaching=True, rollout={"maxSurge": 0, "maxUnavailable": 1})
    slo = Slo(500, 50)

    def reading(rate: float, held: int) -> FleetReading:
        return FleetReading(
            {Role.AGGREGATED: metrics(ready_replicas=held)}, mean_prompt_tokens=1000,
            mean_output_tokens=200, requests_per_s=rate, replicas={Role.AGGREGATED: held},
            slo=slo,
        )  # fmt: skip

    needed = plan_replica(
        config, disaggregated=False, replicas=0, prefill_replicas=0,
        workload=Workload(40, 1000, 200), slo=slo,
    ).roles[0].replicas  # fmt: skip
    assert needed >= 2
    [advice] = advise(spec, config, reading(40, needed))
    assert advice.reason == "RolloutWithoutSurgeMissesSlo"
    assert advice.inputs == {
        "requestsPerSecond": 40, "replicas": needed,
        "servingDuringRollout": needed - 1, "neededReplicas": needed,
    }  # fmt: skip
    assert f"leaves {needed - 1} of {needed} aggregated replicas serving" in advice.message
    # One replica more than needed rides out a rollout; so does a spec that surges.
    assert reasons(spec, config, reading(40, needed + 1)) == []
    surging, surging_config = deployment(prefixCaching=True)
    assert reasons(surging, surging_config, reading(40, needed)) == []
    # No load measured, nothing to predict.
    assert reasons(spec, config, reading(0, needed)) == []


def sized_gpus(config: ReplicaConfig, disaggregated: bool, load: Workload, slo: Slo) -> int:
    return plan_replica(
        config, disaggregated=disaggregated, replicas=0, prefill_replicas=0, workload=load,
        slo=slo,
    ).gpus  # fmt: skip


def test_long_prompts_queueing_in_an_aggregated_pool_get_a_disaggregated_prefill_advised() -> None:
    # 8,000-token prompts chunked into the decodes' steps stretch every TPOT beside them.
    spec, config = deployment(prefixCaching=True)
    slo, load = Slo(2000, 15), Workload(8, 8000, 300)
    queued = metrics(ready_replicas=4, queue_p95_s=1.2, prefill_p95_s=0.4)
    reading = FleetReading(
        {Role.AGGREGATED: queued}, mean_prompt_tokens=8000, mean_output_tokens=300,
        requests_per_s=8, replicas={Role.AGGREGATED: 4}, slo=slo,
    )  # fmt: skip
    [advice] = advise(spec, config, reading)
    assert advice.reason == "DisaggregatePrefill"
    aggregated, disaggregated = (sized_gpus(config, d, load, slo) for d in (False, True))
    assert disaggregated < aggregated
    assert advice.inputs == {
        "requestsPerSecond": 8, "gpus": disaggregated, "gpusNow": aggregated,
        "queueP95Ms": 1200, "prefillP95Ms": 400,
    }  # fmt: skip
    assert advice.message.startswith(
        "prompts wait 1,200 ms p95 in the engines' queues against 400 ms prefilling; at the "
        "measured 8 req/s of 8000/300 tokens, a prefill pool of "
    )
    assert f"{aggregated - disaggregated} fewer than the {aggregated} GPUs of " in advice.message
    # Short prompts at the same rate: aggregated is as cheap, nothing to advise.
    short = replace(reading, mean_prompt_tokens=500)
    assert sized_gpus(config, True, Workload(8, 500, 300), slo) >= sized_gpus(
        config, False, Workload(8, 500, 300), slo
    )
    assert reasons(spec, config, short) == []
    # No SLO or no load measured: nothing to size for.
    assert reasons(spec, config, replace(reading, slo=None)) == []
    assert reasons(spec, config, replace(reading, requests_per_s=0.0)) == []


def test_a_disaggregated_deployment_at_a_light_load_gets_aggregated_serving_advised() -> None:
    spec, config = deployment(
        prefixCaching=True, topology={"mode": "disaggregated", "prefill": {"replicas": 1}}
    )
    slo = Slo(1000, 50)
    light = FleetReading(
        {Role.PREFILL: metrics(ready_replicas=1), Role.DECODE: metrics(ready_replicas=1)},
        mean_prompt_tokens=1000, mean_output_tokens=200, requests_per_s=1,
        replicas={Role.PREFILL: 1, Role.DECODE: 1}, slo=slo,
    )  # fmt: skip
    [advice] = advise(spec, config, light)
    assert advice.reason == "AggregateServing"
    assert advice.inputs == {"requestsPerSecond": 1, "gpus": 1, "gpusNow": 2}
    assert (
        "1 aggregated replica (spec.topology.mode aggregated) would meet the SLO with 1 GPU, "
        in (advice.message)
    )
    assert "1 fewer than the 2 GPUs of a prefill pool of 1 and a decode pool of 1" in advice.message


def test_no_topology_is_advised_that_the_apis_rules_refuse() -> None:
    # A replica over two nodes is served aggregated only: long prompts or not, the rule stays
    # silent rather than advise a spec the API server would refuse.
    spec, config = deployment(
        model={"name": "llama-3.1-405b", "source": "hf://org/model"},
        parallelism={"tensor": 8, "pipeline": 2}, prefixCaching=True,
    )  # fmt: skip
    assert config.nodes == 2
    slo, load = Slo(3000, 40), Workload(1, 4000, 300)
    assert sized_gpus(config, True, load, slo) < sized_gpus(config, False, load, slo)
    reading = FleetReading(
        {Role.AGGREGATED: metrics(ready_replicas=1)}, mean_prompt_tokens=4000,
        mean_output_tokens=300, requests_per_s=1, replicas={Role.AGGREGATED: 1}, slo=slo,
    )  # fmt: skip
    assert "DisaggregatePrefill" not in reasons(spec, config, reading)


def test_every_piece_of_advice_carries_the_planners_error_band_for_its_gpu() -> None:
    reading = FleetReading(
        {Role.AGGREGATED: metrics()}, prefix_blocks_per_s=40.0, prefix_blocks_seen_per_s=30.0
    )  # fmt: skip
    spec, config = deployment()
    [h100] = advise(spec, config, reading)
    band = error_bands()[config.gpu_type]
    assert band.ttft is not None  # the H100 has published points
    assert h100.message.endswith(
        f"; the planner's error against published H100-80GB points: {band.describe()}"
    )
    l4, l4_config = deployment(gpu={"type": "L4-24GB"})
    assert error_bands()[l4_config.gpu_type].describe() == NO_PUBLISHED_POINT
    advised = advise(l4, l4_config, reading)
    assert advised
    for advice in advised:
        assert advice.message.endswith("; no published L4-24GB point bounds the planner's error")
