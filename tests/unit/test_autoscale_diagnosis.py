"""The diagnosis of a running fleet, per role: what bounds it on a roofline, its decode steps
against the planner's at the measured load, KV-cache pressure, and queueing against prefill."""

from __future__ import annotations

import pytest

from inferfleet.api.model_deployment import Bound, Role
from inferfleet.autoscale.advice import FleetReading
from inferfleet.autoscale.diagnosis import LIGHT_LOAD, diagnose, measured_mfu
from inferfleet.autoscale.snapshot import RoleMetrics
from inferfleet.planning.load import operating_point
from inferfleet.planning.performance import DEFAULT_EFFICIENCY
from tests.unit.test_autoscale_advice import deployment, metrics


def test_each_role_is_diagnosed_as_the_roofline_reads_its_measurements() -> None:
    _, config = deployment(topology={"mode": "disaggregated", "prefill": {"replicas": 2}})
    terms = DEFAULT_EFFICIENCY.for_gpu(config.gpu_type)
    # Prefill: 20,000 prompt tokens/s a replica of an 8B model is 3.2e14 FLOP/s, a third of an
    # H100's dense bf16 peak: over half of what its kernels attain.
    prefill = RoleMetrics(
        Role.PREFILL, 2, running_requests=4.0, waiting_requests=0.0, kv_cache_usage=0.1,
        prompt_tokens_per_s=40000.0, generation_tokens_per_s=20.0,
    )  # fmt: skip
    # Decode: 64 sequences a replica at 120 steps/s, each step reading 16 GB of weights.
    decode = RoleMetrics(
        Role.DECODE, 2, running_requests=128.0, waiting_requests=0.0, kv_cache_usage=0.5,
        prompt_tokens_per_s=0.0, generation_tokens_per_s=15360.0,
    )  # fmt: skip
    # A third pool that barely works (not a real topology: only the rule is read here).
    idle = metrics(running_requests=1.0, prompt_tokens_per_s=50.0, generation_tokens_per_s=20.0)
    found = {
        d.role: d
        for d in diagnose(
            config,
            FleetReading({Role.PREFILL: prefill, Role.DECODE: decode, Role.AGGREGATED: idle}),
        )
    }
    assert found[Role.PREFILL].bound is Bound.COMPUTE
    assert found[Role.PREFILL].inputs["mfu"] == pytest.approx(measured_mfu(config, prefill))
    assert measured_mfu(config, prefill) / terms.compute > 0.5
    assert found[Role.PREFILL].inputs["mbu"] == 0  # no decode step is measured there
    assert found[Role.PREFILL].message.startswith("prefill: compute-bound (MFU ")

    assert found[Role.DECODE].bound is Bound.BANDWIDTH
    assert found[Role.DECODE].inputs["mbu"] == pytest.approx(0.57, abs=0.02)
    decode_inputs = found[Role.DECODE].inputs
    assert decode_inputs["mfu"] / terms.compute < decode_inputs["mbu"] / terms.bandwidth
    assert "decode: bandwidth-bound (MFU " in found[Role.DECODE].message

    assert found[Role.AGGREGATED].bound is Bound.LIGHT
    shares = (
        found[Role.AGGREGATED].inputs["mfu"] / terms.compute,
        found[Role.AGGREGATED].inputs["mbu"] / terms.bandwidth,
    )
    assert max(shares) < LIGHT_LOAD
    assert "lightly loaded" in found[Role.AGGREGATED].message


def test_engine_time_per_token_is_set_beside_the_planners_at_the_measured_load() -> None:
    _, config = deployment()
    pool = metrics(ready_replicas=2, running_requests=30.0, generation_tokens_per_s=1200.0)
    without_load = diagnose(config, FleetReading({Role.AGGREGATED: pool}))[0]
    # Little's law: 30 running over 1,200 tokens/s is 25 ms of a request's running time a token.
    assert without_load.inputs["runningPerReplica"] == 15
    assert without_load.inputs["msPerOutputToken"] == pytest.approx(25.0)
    assert "15 sequences running a replica, 25 ms of engine time a token" in without_load.message
    assert "plannedMsPerOutputToken" not in without_load.inputs
    measured = FleetReading(
        {Role.AGGREGATED: pool}, mean_prompt_tokens=1000, mean_output_tokens=200,
        requests_per_s=6.0,
    )  # fmt: skip
    with_load = diagnose(config, measured)[0]
    point = operating_point(config, 3.0, 1000, 200)
    planned_ms = (point.ttft_mean_s + 200 * point.tpot_s) / 200 * 1e3
    assert with_load.inputs["plannedMsPerOutputToken"] == pytest.approx(planned_ms)
    assert f"(planner at the measured load: {planned_ms:,.0f} ms)" in with_load.message
    # Early in a load, or on a young replica, the instant count is a full batch while the
    # rates still average the window's idle part: the running time the engines counted over
    # the same window is what Little's law sets beside them.
    early = metrics(ready_replicas=2, running_requests=30.0, running_seconds_per_s=6.0,
                    generation_tokens_per_s=240.0)  # fmt: skip
    [windowed] = diagnose(config, FleetReading({Role.AGGREGATED: early}))
    assert windowed.inputs["msPerOutputToken"] == pytest.approx(25.0)
    assert windowed.inputs["runningPerReplica"] == 3
    # A load past what a replica serves is said so, not given a figure.
    flooded = FleetReading(
        {Role.AGGREGATED: pool}, mean_prompt_tokens=1000, mean_output_tokens=200,
        requests_per_s=10_000.0,
    )  # fmt: skip
    past = diagnose(config, flooded)[0]
    assert "plannedMsPerOutputToken" not in past.inputs
    assert "the planner finds the measured load past one replica's" in past.message


@pytest.mark.parametrize(
    ("queued_s", "prefill_s", "verdict"),
    [(1.2, 0.4, "queueing dominates"), (0.05, 0.4, "prefill dominates")],
)
def test_queueing_is_told_from_prefill_time(
    queued_s: float, prefill_s: float, verdict: str
) -> None:
    _, config = deployment()
    pool = metrics(queue_p95_s=queued_s, prefill_p95_s=prefill_s)
    [found] = diagnose(config, FleetReading({Role.AGGREGATED: pool}))
    assert f"{queued_s * 1e3:,.0f} ms queued, {prefill_s * 1e3:,.0f} ms prefilling: {verdict}" in (
        found.message
    )
    assert found.inputs["queueP95Ms"] == pytest.approx(queued_s * 1e3)
    assert found.inputs["prefillP95Ms"] == pytest.approx(prefill_s * 1e3)
    # Nothing admitted in the window: no quantile, no claim.
    [unknown] = diagnose(config, FleetReading({Role.AGGREGATED: metrics()}))
    assert "queued" not in unknown.message
    assert "queueP95Ms" not in unknown.inputs


def test_a_decode_pool_says_nothing_of_prefill_queueing() -> None:
    _, config = deployment(topology={"mode": "disaggregated", "prefill": {"replicas": 1}})
    decode = RoleMetrics(
        Role.DECODE, 1, running_requests=8.0, waiting_requests=0.0, kv_cache_usage=0.2,
        prompt_tokens_per_s=0.0, generation_tokens_per_s=400.0, queue_p95_s=0.01,
        prefill_p95_s=0.0,
    )  # fmt: skip
    [found] = diagnose(config, FleetReading({Role.DECODE: decode}))
    assert "prefilling" not in found.message
    assert "queueP95Ms" not in found.inputs


def test_kv_cache_pressure_is_named_when_it_holds_requests_back() -> None:
    _, config = deployment()
    [full] = diagnose(
        config, FleetReading({Role.AGGREGATED: metrics(kv_cache_usage=0.95, waiting_requests=7)})
    )
    assert "KV cache 95% full, 7 requests waiting: admission is held back by the KV cache" in (
        full.message
    )
    [used] = diagnose(config, FleetReading({Role.AGGREGATED: metrics(kv_cache_usage=0.95)}))
    assert "KV cache 95% full, none waiting" in used.message
    assert "held back" not in used.message


def test_pools_without_a_serving_replica_are_left_out_and_the_wire_form_is_rounded() -> None:
    _, config = deployment()
    reading = FleetReading({Role.AGGREGATED: metrics(ready_replicas=0, running_requests=0.0)})
    assert diagnose(config, reading) == ()
    [found] = diagnose(config, FleetReading({Role.AGGREGATED: metrics()}))
    wire = found.to_wire()
    assert wire["role"] == "aggregated"
    assert wire["bound"] == found.bound.value
    assert wire["inputs"] == {k: round(v, 4) for k, v in sorted(found.inputs.items())}
