"""The references of `bench autoscale`: the fluid lower bound against a hand calculation, the
clairvoyant schedule and static-best on a short simulated step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.bench.autoscale import policy_names
from inferfleet.bench.clairvoyant import (
    LATE_HEADROOM_MAX,
    LATE_HEADROOM_PRECISION,
    clairvoyant_schedule,
    late_headroom,
    schedule_gpu_seconds,
    without_foresight,
)
from inferfleet.bench.reference_report import references_line
from inferfleet.bench.references import (
    Oracle,
    allowed_misses,
    attainment,
    fluid_bound,
    misses,
    per_window_oracle,
    simulated_schedule,
    static_best,
    static_counts,
)
from inferfleet.bench.scenario import (
    fleet_config,
    horizon_s,
    parse_scenario,
    scenario_requests,
    service_of,
)
from inferfleet.planning.memory import kv_bytes_per_token, plan_memory, weight_bytes_per_gpu
from inferfleet.planning.performance import DEFAULT_EFFICIENCY
from inferfleet.planning.replica import ACTIVATION_BYTES
from inferfleet.sim.workload import TraceRequest
from tests.unit.bench_fixtures import tiny_scenario

AGG = Role.AGGREGATED


def test_the_fluid_bound_is_the_work_at_full_efficiency_by_hand() -> None:
    scenario = parse_scenario(tiny_scenario("H100-80GB"))
    service = service_of(scenario)
    config = replace(service.replica, max_sequences=4)
    service = replace(service, replica=config)
    block = 16
    requests = [
        # Window 0: two long prompts sharing their first 64 blocks (1,024 tokens), short outputs.
        TraceRequest(1.0, 2048, 10, tuple(range(128)), block),
        TraceRequest(2.0, 2048, 10, (*range(64), *range(1000, 1064)), block),
        # Window 1: a short prompt with a long output: decode bound by reading the weights,
        # four sequences per step at most.
        TraceRequest(61.0, 16, 1000),
    ]
    bound = fluid_bound(requests, service, 120.0, 60.0)

    m = config.model
    gpu = config.gpu
    compute = config.linear_flops_rate * DEFAULT_EFFICIENCY.compute
    bandwidth = gpu.memory_bandwidth * DEFAULT_EFFICIENCY.bandwidth
    linear = m.active_parameters - m.embedding_parameters
    prefill_token = 2 * linear / compute
    decode_token = 2 * (linear + m.output_head_parameters) / compute
    weight_read = (
        weight_bytes_per_gpu(config)
        - m.embedding_parameters * ACTIVATION_BYTES
        + m.output_head_parameters * ACTIVATION_BYTES
    ) / bandwidth
    # Attention: K/V bytes read at the bandwidth and FLOPs at the bf16 peak; the bound takes
    # them added or, as a roofline, the larger: it lies between the two.
    attention_flops = 4 * m.layers * m.attention_heads * m.head_dim
    pair_s = attention_flops / (gpu.bf16_flops * DEFAULT_EFFICIENCY.compute)
    context_bytes_s = kv_bytes_per_token(config) / bandwidth

    def window(prompts: list[tuple[int, int]], outputs: list[tuple[int, int]], batch: int
               ) -> tuple[float, float]:  # fmt: skip
        new = sum(n - cached for n, cached in prompts)
        pairs = sum((n - cached) * (cached + (n - cached) / 2) for n, cached in prompts)
        decoded = sum(out for _, out in outputs)
        context = sum(out * (prompt + out / 2) for prompt, out in outputs)
        linear_s = max(new * prefill_token + decoded * decode_token,
                       math.ceil(decoded / batch) * weight_read)  # fmt: skip
        low = linear_s + pairs * pair_s + max(context * context_bytes_s, context * pair_s)
        high = linear_s + pairs * pair_s + context * (context_bytes_s + pair_s)
        return low, high

    # The second prompt's first 1,024 tokens are cached: only 1,024 of it is prefilled.
    first = window([(2048, 0), (2048, 1024)], [(2048, 10), (2048, 10)], batch=4)
    second = window([(16, 0)], [(16, 1000)], batch=4)
    assert plan_memory(config).kv_capacity_tokens > 4 * 2100  # max_sequences binds, not KV
    assert first[0] <= bound.gpu_seconds[0][AGG] <= first[1]
    assert second[0] <= bound.gpu_seconds[1][AGG] <= second[1]
    # Window 1 is weight-bound: 250 steps of reading the weights.
    assert bound.gpu_seconds[1][AGG] >= 250 * weight_read
    assert bound.gpu_hours == pytest.approx(sum(sum(w.values()) for w in bound.gpu_seconds) / 3600)
    assert bound.gpus()[1][AGG] == pytest.approx(bound.gpu_seconds[1][AGG] / 60)

    # Without prefix caching the second prompt is prefilled whole.
    uncached = fluid_bound(requests, service, 120.0, 60.0, prefix_caching=False)
    assert uncached.gpu_seconds[0][AGG] == pytest.approx(
        bound.gpu_seconds[0][AGG] + 1024 * prefill_token + (2048 * 1024 - 1024 * 1536) * pair_s,
        rel=1e-6,
    )

    # Disaggregated: the prefill role gets the prompts, the decode role the rest, and neither
    # shares the other's weight reads.
    split = fluid_bound(requests, replace(service, roles=(Role.PREFILL, Role.DECODE)), 120.0)
    assert split.gpu_seconds[1][Role.PREFILL] == pytest.approx(16 * prefill_token + 128 * pair_s)
    assert split.gpu_seconds[1][Role.DECODE] >= 250 * weight_read
    assert sum(split.gpu_seconds[0].values()) >= bound.gpu_seconds[0][AGG]


def test_the_miss_budget_keeps_attainment_at_the_target() -> None:
    assert allowed_misses(19366, 0.99) == 193
    assert allowed_misses(100, 0.95) == 5
    assert allowed_misses(10, 1.0) == 0
    assert allowed_misses(0, 0.99) == 0


def test_a_window_below_the_next_saves_nothing_within_a_cold_start() -> None:
    # The scaler asks for a window's replicas a cold start ahead: while the next window needs
    # five, lowering this one from two to one frees no GPU.
    needs = [{AGG: 2}, {AGG: 2}, {AGG: 5}, {AGG: 5}]
    lowered = [{AGG: 2}, {AGG: 1}, {AGG: 5}, {AGG: 5}]
    full = schedule_gpu_seconds(needs, 60.0, 120.0, 1, 240.0)
    assert schedule_gpu_seconds(lowered, 60.0, 120.0, 1, 240.0) == full
    assert schedule_gpu_seconds([{AGG: 1}] * 4, 60.0, 120.0, 2, 240.0) == pytest.approx(480.0)


def test_oracle_is_taken_for_the_clairvoyant_schedule() -> None:
    assert policy_names(["oracle", "goodput", "clairvoyant"]) == ["clairvoyant", "goodput"]
    with pytest.raises(ValueError, match="unknown policy 'perfect'"):
        policy_names(["perfect"])


def test_the_clairvoyant_schedule_meets_the_overall_target_with_less_than_the_oracle() -> None:
    # A step to 26 req/s: the per-window oracle, lowered once, holds more than the target needs.
    body = tiny_scenario().replace("rate_after: 16", "rate_after: 26")
    scenario = parse_scenario(body)
    requests = scenario_requests(scenario, ".")
    horizon = horizon_s(scenario, requests, scenario.rate)
    service = service_of(scenario)
    config = fleet_config(scenario, service, horizon, {})
    oracle = per_window_oracle(requests, service, config, 60.0, max_lower_passes=1)
    clairvoyant = clairvoyant_schedule(requests, service, config, oracle, 60.0, max_simulations=4)
    target = service.slo.attainment_target
    assert attainment(clairvoyant.run) >= target
    assert (
        misses(clairvoyant.run)
        <= clairvoyant.allowed_misses
        == allowed_misses(len(requests), target)
    )
    assert clairvoyant.aimed_misses == math.floor(clairvoyant.allowed_misses * 0.9)
    assert clairvoyant.simulations <= 4
    assert clairvoyant.run.gpu_seconds() < oracle.run.gpu_seconds()
    assert any(search.accepted for search in clairvoyant.passes)
    assert all(
        need[AGG] <= before[AGG]
        for need, before in zip(clairvoyant.needs, oracle.needs, strict=True)
    )
    # Without foresight the step's replicas serve a cold start late: more misses, no more GPUs.
    unforeseen = without_foresight(requests, config, clairvoyant, 60.0).unforeseen
    assert unforeseen is not None
    assert misses(unforeseen) > misses(clairvoyant.run)
    assert unforeseen.gpu_seconds() <= clairvoyant.run.gpu_seconds()
    # The headroom on those fleets that meets the target late: found within the precision of
    # a factor that missed, its run the fleets scaled by it (counts rounded to the nearest).
    headroom = without_foresight(
        requests, config, clairvoyant, 60.0, target=target, max_simulations=6
    ).late_headroom
    assert headroom is not None
    assert headroom.factor is not None
    assert headroom.run is not None
    assert headroom.tried[0] == (1.0, attainment(unforeseen))
    assert attainment(headroom.run) >= target
    missed = max(factor for factor, value in headroom.tried if value < target)
    assert headroom.factor - LATE_HEADROOM_PRECISION <= missed < headroom.factor
    bound = fluid_bound(requests, service, horizon, 60.0)
    served = clairvoyant.served(60.0)
    busiest = max(range(len(served)), key=lambda w: served[w][AGG])
    late_s = busiest * 60.0 + config.cold_start_s + 10.0
    assert headroom.run.accepting(AGG, late_s) == math.floor(
        headroom.factor * served[busiest][AGG] + 0.5
    )
    assert headroom.run.gpu_seconds() > unforeseen.gpu_seconds()
    assert 0 < headroom.simulations <= 6
    line = references_line(
        bound, replace(clairvoyant, unforeseen=unforeseen, late_headroom=headroom)
    )
    assert f"meet the target with {headroom.factor:.2f}x their replicas" in line
    # A target no headroom meets: the search stops at its largest factor and says so.
    never = late_headroom(
        requests, config, served, 60.0, target=1.01, unforeseen=unforeseen, max_simulations=6
    )
    assert never.factor is None
    assert never.run is None
    assert max(factor for factor, _ in never.tried) == LATE_HEADROOM_MAX
    line = references_line(bound, replace(clairvoyant, unforeseen=unforeseen, late_headroom=never))
    assert (
        f"No headroom up to {LATE_HEADROOM_MAX:.2f}x their replicas meets the target late" in line
    )
    # It replays the fleets the clairvoyant run served, not the searched schedule: with a cold
    # start longer than a window, the replicas asked for ahead of the step serve the first
    # window, whose own entry is one replica; replayed late, it runs with what it served.
    slow = replace(config, cold_start_s=120.0)
    assert clairvoyant.needs[0][AGG] == 1 < clairvoyant.needs[2][AGG]
    ahead = replace(clairvoyant, run=simulated_schedule(requests, slow, clairvoyant.needs, 60.0))
    late = without_foresight(requests, slow, ahead, 60.0).unforeseen
    assert late is not None
    assert late.accepting(AGG, 30.0) == ahead.served(60.0)[0][AGG] == clairvoyant.needs[2][AGG]
    # Nothing that serves every request uses less than the fluid bound.
    assert 0 < bound.gpu_hours < clairvoyant.run.gpu_seconds() / 3600

    # Static-best: the fewest replicas held all the time that meet the target; one fewer was
    # tried and missed it.
    peak = static_counts(oracle.needs, service.roles, peak=True)
    best = static_best(requests, service, config, peak, bound.static_floor(horizon))
    assert attainment(best.run) >= target
    count = best.replicas[AGG]
    assert count <= peak[AGG]
    tried = {fleet[AGG]: value for fleet, value in best.tried}
    assert tried[count] >= target
    assert count == 1 or tried[count - 1] < target
    assert best.simulations == len(best.tried) <= 1 + math.ceil(math.log2(peak[AGG])) + 1


def test_a_schedule_that_misses_the_overall_target_is_raised_until_it_meets_it() -> None:
    body = tiny_scenario()
    scenario = parse_scenario(body)
    requests = scenario_requests(scenario, ".")
    horizon = horizon_s(scenario, requests, scenario.rate)
    service = service_of(scenario)
    config = fleet_config(scenario, service, horizon, {})
    # A start that holds one replica through the step, as an oracle that missed would.
    short = [{AGG: 1}] * 4
    start = Oracle(short, short, simulated_schedule(requests, config, short, 60.0), 1)
    assert attainment(start.run) < service.slo.attainment_target
    clairvoyant = clairvoyant_schedule(requests, service, config, start, 60.0, max_simulations=6)
    assert attainment(clairvoyant.run) >= service.slo.attainment_target
    assert clairvoyant.simulations <= 6
    assert max(need[AGG] for need in clairvoyant.needs) > 1
