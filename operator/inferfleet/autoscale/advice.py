"""Advice from the running fleet: what the physics says a ModelDeployment should change, with
the effect the planner predicts. Never applied: an SRE reads it in the deployment's status.

Each rule reads what the engines and the router measured over the rate window and names its
inputs:
* `EnablePrefixCaching`: prefix caching is off and the prompts repeat a recent prompt's
  prefix (the router's `inferfleet_router_prefix_blocks_seen_total` over
  `..._prefix_blocks_total`, counted where prompts are prefilled): that share of the prefill
  would be served from cache. Predicted: an idle replica's TTFT for the mean prompt, whole and
  with that share cached.
* `Fp8Weights`: a pool that decodes is bandwidth-bound (its measured MBU, the weights read once
  per decode step, at or over `BANDWIDTH_BOUND_MBU`), its weights are 16-bit and its GPU has FP8
  tensor cores: FP8 weights halve the bytes each step reads. Predicted: the decode step at the
  measured batch and context, in both precisions, and where a load and an SLO are known, the
  GPUs the planner sizes the fleet with in each. A quality trade-off, and said so.
* `Fp8KvCache`: a pool's KV cache is full (`KV_FULL`) while requests wait, with a 16-bit KV
  cache on a GPU with FP8 support: FP8 doubles the tokens a replica holds. Predicted: the KV
  capacity of one replica in both. A quality trade-off too.
* `RolloutWithoutSurgeMissesSlo`: the deployment rolls out without a spare GPU
  (`spec.rollout.maxSurge` 0), and the replicas left serving while `maxUnavailable` are
  replaced are fewer than the planner needs for the measured load: a rollout now would miss
  the SLO.
* `DisaggregatePrefill` / `AggregateServing`: sized by the planner for the measured load and the
  SLO, the other topology meets the SLO with fewer GPUs than this one needs (or this one meets
  it with no number of replicas). Long prompts queue behind each other's prefills and stretch
  every running sequence's decode steps in an aggregated pool; a disaggregated one pays a KV
  transfer and a pool each. The engines' p95 time queued and prefilling are quoted beside it.
  The other topology must pass the API's rules and the engine's.

Every message ends with the planner's error band for the deployment's GPU type, from the
calibration table (`planning.advisor.error_bands`), or says that no published point bounds it.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from pydantic import ValidationError

from inferfleet import engines
from inferfleet.api.model_deployment import (
    KvCacheDtype,
    ModelDeploymentSpec,
    QuantizationMethod,
    Role,
    TopologyMode,
    WeightPrecision,
)
from inferfleet.autoscale.snapshot import RoleMetrics
from inferfleet.planning.advisor import NO_PUBLISHED_POINT, error_bands
from inferfleet.planning.capacity import CapacityPlan, Workload, plan_replica
from inferfleet.planning.memory import plan_memory, weight_bytes_per_gpu
from inferfleet.planning.performance import decode_step_seconds, prefill_seconds
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.slo import Slo

REPEATED_PREFIX_SHARE: Final = 0.25
"""The share of prompts' leading blocks seen before from which caching them is advised."""
MIN_PREFIX_BLOCKS_PER_S: Final = 0.1
"""Below this many blocks looked at per second, the share is too few prompts to judge by."""
BANDWIDTH_BOUND_MBU: Final = 0.4
"""Measured MBU from which a decoding pool is taken as bandwidth-bound: the weights' reads
alone fill this much of the memory bandwidth (KV reads come on top)."""
KV_FULL: Final = 0.9


@dataclass(frozen=True)
class FleetReading:
    """What the advice reads of one running ModelDeployment over the rate window."""

    roles: Mapping[Role, RoleMetrics]
    prefix_blocks_per_s: float = 0.0
    """Leading prompt blocks the routers looked at, per second, where prompts are prefilled."""
    prefix_blocks_seen_per_s: float = 0.0
    """Of those, the ones a recent prompt to the same pool began with."""
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    requests_per_s: float = 0.0
    """This deployment's share of the service's completed requests per second."""
    replicas: Mapping[Role, int] = field(default_factory=dict)
    """Replicas each pool holds now."""
    slo: Slo | None = None


@dataclass(frozen=True)
class Advice:
    reason: str
    message: str
    inputs: Mapping[str, float] = field(default_factory=dict)
    """The measurements and predictions it rests on, by name."""

    def to_wire(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "message": self.message,
            "inputs": {k: round(v, 4) for k, v in sorted(self.inputs.items())},
        }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def _prefix_caching(
    spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading
) -> Advice | None:
    if spec.prefix_caching or reading.prefix_blocks_per_s < MIN_PREFIX_BLOCKS_PER_S:
        return None
    share = min(1.0, reading.prefix_blocks_seen_per_s / reading.prefix_blocks_per_s)
    if share < REPEATED_PREFIX_SHARE:
        return None
    prompt = max(1, round(reading.mean_prompt_tokens or 1000))
    whole = prefill_seconds(config, prompt)
    cached = prefill_seconds(config, max(1, math.ceil(prompt * (1 - share))))
    return Advice(
        "EnablePrefixCaching",
        f"{share:.0%} of the prompts' leading blocks repeat a recent prompt's, and prefix "
        f"caching is off: with spec.prefixCaching true, about that share of the prefill is "
        f"served from cache; an idle replica's TTFT for the mean {prompt}-token prompt goes "
        f"from {_ms(whole)} to about {_ms(cached)} (planner)",
        {
            "repeatedPrefixShare": share,
            "prefixBlocksPerSecond": reading.prefix_blocks_per_s,
            "meanPromptTokens": prompt,
            "predictedIdleTtftMs": whole * 1e3,
            "predictedIdleTtftCachedMs": cached * 1e3,
        },
    )


def _decode_roles(reading: FleetReading) -> list[tuple[Role, RoleMetrics]]:
    return [
        (role, metrics)
        for role, metrics in sorted(reading.roles.items())
        if role is not Role.PREFILL and metrics.decode_steps_per_s > 0 and metrics.ready_replicas
    ]


def measured_mbu(config: ReplicaConfig, metrics: RoleMetrics) -> float:
    """The share of a decoding pool's memory bandwidth its weight reads take while it decodes:
    each replica reads its weights once a decode step (`RoleMetrics.decode_steps_per_s`); KV
    reads left out, so a lower bound, as in status.observed."""
    steps_per_s = metrics.decode_steps_per_s
    return min(1.0, steps_per_s * weight_bytes_per_gpu(config) / config.gpu.memory_bandwidth)


def _fp8_weights(
    spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading
) -> Advice | None:
    if config.weights not in (WeightPrecision.BF16, WeightPrecision.FP16):
        return None
    if config.gpu.fp8_flops is None or config.method is not None:
        return None
    for role, metrics in _decode_roles(reading):
        mbu = measured_mbu(config, metrics)
        if mbu < BANDWIDTH_BOUND_MBU:
            continue
        batch = max(1, round(metrics.mean_running_requests / metrics.ready_replicas))
        context = (reading.mean_prompt_tokens or 1000) + (reading.mean_output_tokens or 200) / 2
        now = decode_step_seconds(config, batch, context)
        fp8 = replace(config, weights=WeightPrecision.FP8, method=QuantizationMethod.FP8)
        after = decode_step_seconds(fp8, batch, context)
        inputs = {
            "measuredMbu": mbu,
            "batch": batch,
            "predictedTpotMs": now * 1e3,
            "predictedTpotFp8Ms": after * 1e3,
        }
        fleet = ""
        load = _measured_load(reading)
        disaggregated = spec.topology.mode == TopologyMode.DISAGGREGATED
        if load is not None and reading.slo is not None:
            here, there = (_sized(c, disaggregated, load, reading.slo) for c in (config, fp8))
            if here.meets_slo and there.meets_slo:
                inputs |= {"gpusNow": here.gpus, "gpusFp8": there.gpus}
                fleet = (
                    f"; sized for the measured {load.requests_per_second:.3g} req/s, the fleet "
                    f"goes from {_gpus(here.gpus)} to {_gpus(there.gpus)}"
                )
        return Advice(
            "Fp8Weights",
            f"the {role.value} pool is bandwidth-bound (MBU {mbu:.0%} from its weight reads "
            f"alone): fp8 weights (spec.precision weights and method fp8) halve the bytes each "
            f"decode step reads; at the measured batch of {batch}, TPOT goes from {_ms(now)} "
            f"to about {_ms(after)}{fleet} (planner). A quality trade-off: the fp8 "
            "checkpoint's accuracy is to be checked",
            inputs,
        )
    return None


def _fp8_kv_cache(
    spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading
) -> Advice | None:
    if config.kv_cache == KvCacheDtype.FP8 or config.gpu.fp8_flops is None:
        return None
    for role, metrics in sorted(reading.roles.items()):
        if metrics.kv_cache_usage < KV_FULL or metrics.waiting_requests <= 0:
            continue
        now = plan_memory(config).kv_capacity_tokens
        after = plan_memory(replace(config, kv_cache=KvCacheDtype.FP8)).kv_capacity_tokens
        return Advice(
            "Fp8KvCache",
            f"the {role.value} pool's KV cache is {metrics.kv_cache_usage:.0%} full with "
            f"{metrics.waiting_requests:.0f} requests waiting: an fp8 KV cache "
            f"(spec.precision.kvCache fp8) holds {after:,} tokens a replica instead of "
            f"{now:,} (planner). A quality trade-off, smaller than quantizing the weights",
            {
                "kvCacheUsage": metrics.kv_cache_usage,
                "waitingRequests": metrics.waiting_requests,
                "kvCapacityTokens": now,
                "kvCapacityTokensFp8": after,
            },
        )
    return None


def _rollout_without_surge(
    spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading
) -> Advice | None:
    rollout = spec.rollout
    if rollout is None or rollout.max_surge > 0 or reading.slo is None:
        return None
    load = _measured_load(reading)
    if load is None:
        return None
    sized = _sized(config, spec.topology.mode == TopologyMode.DISAGGREGATED, load, reading.slo)
    if not sized.meets_slo:
        return None  # no count meets it: the autoscaler's decisions say so
    for role_plan in sized.roles:
        held = reading.replicas.get(role_plan.role, 0)
        serving = max(0, held - rollout.max_unavailable)
        if held == 0 or serving >= role_plan.replicas:
            continue
        return Advice(
            "RolloutWithoutSurgeMissesSlo",
            f"a rollout now, without a spare GPU (maxSurge 0, maxUnavailable "
            f"{rollout.max_unavailable}), leaves {serving} of {held} {role_plan.role.value} "
            f"replicas serving; at the measured {load.requests_per_second:.3g} req/s of "
            f"{load.input_tokens}/{load.output_tokens} tokens the planner needs "
            f"{role_plan.replicas} to meet the SLO: let it surge (spec.rollout.maxSurge 1) or "
            "roll out when the load is lower",
            {
                "requestsPerSecond": load.requests_per_second,
                "replicas": held,
                "servingDuringRollout": serving,
                "neededReplicas": role_plan.replicas,
            },
        )
    return None


def _measured_load(reading: FleetReading) -> Workload | None:
    if reading.requests_per_s <= 0 or not reading.mean_prompt_tokens:
        return None
    return Workload(
        reading.requests_per_s,
        max(1, round(reading.mean_prompt_tokens)),
        max(1, round(reading.mean_output_tokens or 1)),
    )


def _sized(config: ReplicaConfig, disaggregated: bool, load: Workload, slo: Slo) -> CapacityPlan:
    """The fewest replicas of `config` the planner finds meet `slo` at `load`."""
    return plan_replica(
        config, disaggregated=disaggregated, replicas=0, prefill_replicas=0, workload=load,
        slo=slo,
    )  # fmt: skip


def _accepts(spec: ModelDeploymentSpec, mode: TopologyMode) -> bool:
    """Whether the API's rules and the spec's engine accept it in topology `mode`."""
    wire = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    wire["topology"] = {"mode": mode.value}
    if mode == TopologyMode.DISAGGREGATED:
        wire["topology"]["prefill"] = {"replicas": 1}
    try:
        other = ModelDeploymentSpec.model_validate(wire)
    except ValidationError:
        return False
    return engines.refusal(other) is None


def _gpus(count: int) -> str:
    return f"{count} GPU{'' if count == 1 else 's'}"


def _pools(sized: CapacityPlan) -> str:
    counts = {plan.role: plan.replicas for plan in sized.roles}
    if Role.AGGREGATED in counts:
        n = counts[Role.AGGREGATED]
        return f"{n} aggregated replica{'' if n == 1 else 's'}"
    return f"a prefill pool of {counts[Role.PREFILL]} and a decode pool of {counts[Role.DECODE]}"


def _topology(
    spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading
) -> Advice | None:
    load, slo = _measured_load(reading), reading.slo
    if load is None or slo is None:
        return None
    now = spec.topology.mode
    other_mode = (
        TopologyMode.AGGREGATED if now == TopologyMode.DISAGGREGATED else TopologyMode.DISAGGREGATED
    )
    if not _accepts(spec, other_mode):
        return None

    here, there = (
        _sized(config, mode == TopologyMode.DISAGGREGATED, load, slo) for mode in (now, other_mode)
    )
    if not there.meets_slo or (here.meets_slo and there.gpus >= here.gpus):
        return None
    inputs = {"requestsPerSecond": load.requests_per_second, "gpus": there.gpus}
    if here.meets_slo:
        inputs["gpusNow"] = here.gpus
        against = f"{here.gpus - there.gpus} fewer than the {_gpus(here.gpus)} of {_pools(here)}"
    else:
        against = f"where no number of {now.value} replicas meets it ({here.reason})"
    evidence = ""
    pool = reading.roles.get(Role.AGGREGATED)
    if other_mode == TopologyMode.DISAGGREGATED and pool and pool.queue_p95_s is not None:
        queued, prefill = pool.queue_p95_s, pool.prefill_p95_s or 0.0
        inputs |= {"queueP95Ms": queued * 1e3, "prefillP95Ms": prefill * 1e3}
        evidence = (
            f"prompts wait {_ms(queued)} p95 in the engines' queues against {_ms(prefill)} "
            "prefilling; "
        )
    reason = (
        "DisaggregatePrefill" if other_mode == TopologyMode.DISAGGREGATED else "AggregateServing"
    )
    return Advice(
        reason,
        f"{evidence}at the measured {load.requests_per_second:.3g} req/s of "
        f"{load.input_tokens}/{load.output_tokens} tokens, {_pools(there)} "
        f"(spec.topology.mode {other_mode.value}) would meet the SLO with {_gpus(there.gpus)}, "
        f"{against}, as the planner sizes both",
        inputs,
    )


def advise(
    spec: ModelDeploymentSpec, config: ReplicaConfig, reading: FleetReading
) -> tuple[Advice, ...]:
    """Every rule's advice for one deployment, in a fixed order."""
    rules = (_prefix_caching, _fp8_weights, _fp8_kv_cache, _rollout_without_surge, _topology)
    band = error_bands()[config.gpu_type].describe()
    gpu = config.gpu_type.value
    bounded = (
        f"no published {gpu} point bounds the planner's error"
        if band == NO_PUBLISHED_POINT
        else f"the planner's error against published {gpu} points: {band}"
    )
    return tuple(
        replace(advice, message=f"{advice.message}; {bounded}")
        for advice in (rule(spec, config, reading) for rule in rules)
        if advice is not None
    )
