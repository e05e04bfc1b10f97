"""What limits each pool of a running ModelDeployment, in words and figures (pure).

Read from what its engines measured over the rate window (`FleetReading`), per role:
* **Bound.** MFU (2 x active parameters FLOPs per prompt and output token, over the GPUs' peak)
  and MBU (the weights read once a decode step; KV reads left out, so a lower bound) are each
  taken as a share of what the GPU's kernels attain (the planner's efficiency terms). The larger
  share names what bounds the pool, as on a roofline; under `LIGHT_LOAD` of it, neither does.
  Prefill pools read no MBU: a step's count is not measured where nothing decodes.
* **Time per token against the planner.** By Little's law, a pool that decodes spends
  `running / generation tokens/s` seconds of a request's running time per output token (both
  means over the rate window); the
  planner's operating point at the measured request rate per replica and mean request shape
  predicts its mean TTFT plus the output's decode steps, over the output. Much slower than
  predicted points at something the planner does not model.
* **KV-cache pressure.** The mean share of KV blocks in use, and the requests waiting.
* **Queueing against service.** The engines' p95 time queued and p95 time prefilling: which of
  the two dominates the engines' share of TTFT (more replicas shorten the first, only a faster
  or smaller prefill the second).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from inferfleet.api.model_deployment import Bound, Role
from inferfleet.autoscale.advice import KV_FULL, FleetReading, measured_mbu
from inferfleet.autoscale.snapshot import RoleMetrics
from inferfleet.planning.load import operating_point
from inferfleet.planning.performance import DEFAULT_EFFICIENCY
from inferfleet.planning.replica import ReplicaConfig

LIGHT_LOAD: Final = 0.2
"""Below this share of what its kernels attain, in compute and in bandwidth, a pool is lightly
loaded: neither limits it."""


@dataclass(frozen=True)
class RoleDiagnosis:
    role: Role
    bound: Bound
    message: str
    inputs: Mapping[str, float] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        return {
            "role": self.role.value,
            "bound": self.bound.value,
            "message": self.message,
            "inputs": {k: round(v, 4) for k, v in sorted(self.inputs.items())},
        }


def measured_mfu(config: ReplicaConfig, metrics: RoleMetrics) -> float:
    """The share of the pool's GPUs' peak FLOPs its tokens took (linear layers only)."""
    gpus = metrics.ready_replicas * config.gpus
    if gpus == 0:
        return 0.0
    flops = (
        2
        * config.model.active_parameters
        * (metrics.prompt_tokens_per_s + metrics.generation_tokens_per_s)
    )
    return min(1.0, flops / (gpus * config.linear_flops_rate))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def _bound(role: Role, mfu: float, mbu: float, config: ReplicaConfig) -> tuple[Bound, str]:
    efficiency = DEFAULT_EFFICIENCY.for_gpu(config.gpu_type)
    compute, bandwidth = mfu / efficiency.compute, mbu / efficiency.bandwidth
    kernels = f"{config.gpu_type.value} kernels attain"
    if role is Role.PREFILL:
        figures = f"MFU {mfu:.0%}: {compute:.0%} of the compute {kernels}"
    else:
        figures = (
            f"MFU {mfu:.0%}, MBU {mbu:.0%} from weight reads: {compute:.0%} of the compute and "
            f"{bandwidth:.0%} of the bandwidth {kernels}"
        )
    if max(compute, bandwidth) < LIGHT_LOAD:
        return Bound.LIGHT, f"lightly loaded ({figures})"
    if compute >= bandwidth:
        return Bound.COMPUTE, f"compute-bound ({figures})"
    return Bound.BANDWIDTH, f"bandwidth-bound ({figures})"


def _per_token(
    role: Role, metrics: RoleMetrics, config: ReplicaConfig, reading: FleetReading
) -> tuple[str, dict[str, float]]:
    """Engine time per output token, measured and as the planner predicts it at the measured
    load. By Little's law, `running / generation tokens/s` is the time a request spends
    running over the tokens it outputs; the planner's is its mean TTFT plus the output's
    decode steps, over the output."""
    if role is Role.PREFILL or metrics.mean_running_requests <= 0:
        return "", {}
    if metrics.generation_tokens_per_s <= 0:
        return "", {}
    per_token = metrics.mean_running_requests / metrics.generation_tokens_per_s
    running = metrics.mean_running_requests / metrics.ready_replicas
    text = f"{running:.3g} sequences running a replica, {_ms(per_token)} of engine time a token"
    inputs = {"runningPerReplica": running, "msPerOutputToken": per_token * 1e3}
    if reading.requests_per_s > 0 and reading.mean_prompt_tokens and reading.mean_output_tokens:
        output = max(1, round(reading.mean_output_tokens))
        point = operating_point(
            config,
            reading.requests_per_s / metrics.ready_replicas,
            max(1, round(reading.mean_prompt_tokens)),
            output,
            prefill=role is not Role.DECODE,
        )
        if point.stable:
            planned = (point.ttft_mean_s + output * point.tpot_s) / output
            text += f" (planner at the measured load: {_ms(planned)})"
            inputs["plannedMsPerOutputToken"] = planned * 1e3
        else:
            text += f" (the planner finds the measured load past one replica's {point.limit})"
    return text, inputs


def _kv_cache(metrics: RoleMetrics) -> str:
    waiting = metrics.waiting_requests
    text = f"KV cache {metrics.kv_cache_usage:.0%} full, "
    text += f"{waiting:.3g} requests waiting" if waiting > 0 else "none waiting"
    if metrics.kv_cache_usage >= KV_FULL and waiting > 0:
        text += ": admission is held back by the KV cache"
    return text


def _queueing(role: Role, metrics: RoleMetrics) -> str:
    queued, prefill = metrics.queue_p95_s, metrics.prefill_p95_s
    if role is Role.DECODE or queued is None or prefill is None:
        return ""
    verdict = "queueing dominates" if queued > prefill else "prefill dominates"
    return f"engine TTFT p95 {_ms(queued)} queued, {_ms(prefill)} prefilling: {verdict}"


def diagnose(config: ReplicaConfig, reading: FleetReading) -> tuple[RoleDiagnosis, ...]:
    """A diagnosis for each role with a replica serving, in role order."""
    found = []
    for role, metrics in sorted(reading.roles.items()):
        if metrics.ready_replicas <= 0:
            continue
        mfu = measured_mfu(config, metrics)
        decodes = role is not Role.PREFILL and metrics.decode_steps_per_s > 0
        mbu = measured_mbu(config, metrics) if decodes else 0.0
        bound, bound_text = _bound(role, mfu, mbu, config)
        per_token_text, inputs = _per_token(role, metrics, config, reading)
        inputs |= {
            "mfu": mfu,
            "mbu": mbu,
            "kvCacheUsage": metrics.kv_cache_usage,
            "waitingRequests": metrics.waiting_requests,
        }
        if role is not Role.DECODE and metrics.queue_p95_s is not None:
            inputs["queueP95Ms"] = metrics.queue_p95_s * 1e3
        if role is not Role.DECODE and metrics.prefill_p95_s is not None:
            inputs["prefillP95Ms"] = metrics.prefill_p95_s * 1e3
        parts = [bound_text, per_token_text, _kv_cache(metrics), _queueing(role, metrics)]
        message = f"{role.value}: " + "; ".join(part for part in parts if part)
        found.append(RoleDiagnosis(role, bound, message, inputs))
    return tuple(found)
