"""Capacity plans: does a spec fit, how fast is it, and how many replicas per role a load needs.

Aggregated: the fewest replicas whose per-replica operating point meets the SLO. Disaggregated:
the prefill pool is sized on TTFT (prefill service, queueing for the pool, and the KV transfer
to the decode pool), the decode pool on TPOT, the batch limit and the KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.inference_service import LoadSpec
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role, TopologyMode
from inferfleet.planning.coldstart import ColdStartEstimate, estimate_cold_start
from inferfleet.planning.load import OperatingPoint, operating_point
from inferfleet.planning.memory import MemoryPlan, kv_bytes_per_token, plan_memory
from inferfleet.planning.performance import (
    DEFAULT_EFFICIENCY,
    EfficiencyTerms,
    decode_step_seconds,
    max_throughput,
    prefill_seconds,
)
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.slo import Slo

# A replica pool larger than this is a planning error, not a plan.
MAX_REPLICAS_PER_ROLE = 10_000
# Per-GPU RDMA bandwidth between prefill and decode nodes (one 400 Gb/s NIC per GPU).
KV_TRANSFER_BYTES_PER_S = 50e9
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class Workload:
    """A steady load: request rate, mean prompt and output lengths, and how widely prompt
    lengths spread (the squared coefficient of variation; 0: all alike)."""

    requests_per_second: float
    input_tokens: int
    output_tokens: int
    input_tokens_cv2: float = 0.0

    def __post_init__(self) -> None:
        if not (self.requests_per_second >= 0 and math.isfinite(self.requests_per_second)):
            raise ValueError(f"requests_per_second must be >= 0 (got {self.requests_per_second})")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"input and output tokens must be >= 1 (got {self.input_tokens}, "
                f"{self.output_tokens})"
            )
        if not (self.input_tokens_cv2 >= 0 and math.isfinite(self.input_tokens_cv2)):
            raise ValueError(
                f"the prompt lengths' spread must be >= 0 (got {self.input_tokens_cv2})"
            )

    @classmethod
    def from_spec(cls, load: LoadSpec) -> Workload:
        return cls(
            load.requests_per_second,
            load.input_tokens,
            load.output_tokens,
            load.input_tokens_cv**2,
        )


# The request shape for latency predictions when no workload is given.
REFERENCE_REQUEST = Workload(requests_per_second=0.0, input_tokens=1000, output_tokens=200)


@dataclass(frozen=True)
class RolePlan:
    role: Role
    replicas: int
    gpus: int
    point: OperatingPoint | None
    """The per-replica operating point at the planned load; None without a load."""


@dataclass(frozen=True)
class CapacityPlan:
    config: ReplicaConfig
    memory: MemoryPlan
    request: Workload
    idle_ttft_s: float
    idle_tpot_s: float
    saturated_output_tokens_per_s: float
    roles: tuple[RolePlan, ...]
    meets_slo: bool | None
    """None: no load to judge against."""
    reason: str
    workload: Workload | None
    slo: Slo
    cold_start: ColdStartEstimate | None = None
    """From where the spec's weights come from; None: a source no engine reads."""

    @property
    def gpus(self) -> int:
        return sum(role.gpus for role in self.roles)

    @property
    def output_tokens_per_s(self) -> float:
        """At the planned load, or every replica saturated without one."""
        if self.workload is not None:
            return self.workload.requests_per_second * self.workload.output_tokens
        return self.saturated_output_tokens_per_s * sum(
            r.replicas for r in self.roles if r.role != Role.PREFILL
        )

    @property
    def cost_per_million_output_tokens_usd(self) -> float | None:
        tokens_per_hour = self.output_tokens_per_s * SECONDS_PER_HOUR
        if not self.memory.fits or tokens_per_hour <= 0:
            return None
        cost = self.gpus * self.config.gpu.hourly_price_usd / tokens_per_hour * 1e6
        # A vanishing load has no meaningful cost per token.
        return cost if math.isfinite(cost) else None


def p95_tpot(point: OperatingPoint) -> float:
    return point.tpot_p95_s


def mean_tpot(point: OperatingPoint) -> float:
    return point.tpot_s


def meets_slo(
    point: OperatingPoint,
    slo: Slo,
    extra_ttft_s: float = 0.0,
    *,
    tpot_of: Callable[[OperatingPoint], float] = p95_tpot,
) -> bool:
    """Whether one replica's operating point holds the targets; `extra_ttft_s` is added to its
    TTFT (a prefill pool's KV hand-off). `tpot_of`: the TPOT held to the TPOT target, the p95
    over requests as the SLO says; the autoscaler holds the mean to a target it calibrated
    from the tail it measures (`autoscale.policy.learning.planning_slo`)."""
    if not point.stable:
        return False
    if slo.ttft_p95_s is not None and point.ttft_p95_s + extra_ttft_s > slo.ttft_p95_s:
        return False
    return slo.tpot_p95_s is None or tpot_of(point) <= slo.tpot_p95_s


def fewest_replicas(
    meets_with: Callable[[int], bool], *, limit: int = MAX_REPLICAS_PER_ROLE, hint: int = 1
) -> int | None:
    """The fewest replicas, up to `limit`, that meet the SLO (more replicas never hurt); None
    when `limit` does not. The search gallops from `hint` (the count in service: under a steady
    load the answer is there, and two evaluations confirm it), then bisects."""
    start = min(max(hint, 1), limit)
    step = 1
    if meets_with(start):
        # Invariant: `high` meets, `low` does not (zero replicas never meet).
        high, low = start, start - 1
        while low > 0 and meets_with(low):
            high, step = low, step * 2
            low = max(0, high - step)
    else:
        low, high = start, min(limit, start + 1)
        while not meets_with(high):
            if high >= limit:
                return None
            low, step = high, step * 2
            high = min(limit, high + step)
    while high - low > 1:
        middle = (low + high) // 2
        if meets_with(middle):
            high = middle
        else:
            low = middle
    return high


def _idle_point(
    config: ReplicaConfig, request: Workload, efficiency: EfficiencyTerms
) -> OperatingPoint:
    # Idle, the p95 TTFT is the prefill of the p95 prompt: the spread counts even at no load.
    return operating_point(
        config, 0.0, request.input_tokens, request.output_tokens, efficiency=efficiency,
        input_tokens_cv2=request.input_tokens_cv2,
    )  # fmt: skip


def idle_misses(
    config: ReplicaConfig,
    request: Workload,
    slo: Slo,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> tuple[str, ...]:
    """The targets ("TTFT", "TPOT") an idle replica already misses for `request`: those no
    number of replicas meets."""
    idle = _idle_point(config, request, efficiency)
    missed = []
    if slo.ttft_p95_s is not None and idle.ttft_p95_s > slo.ttft_p95_s:
        missed.append("TTFT")
    if slo.tpot_p95_s is not None and idle.tpot_p95_s > slo.tpot_p95_s:
        missed.append("TPOT")
    return tuple(missed)


def _infeasible(
    role: Role, config: ReplicaConfig, request: Workload, slo: Slo, efficiency: EfficiencyTerms
) -> str:
    idle = _idle_point(config, request, efficiency)
    spread = math.sqrt(request.input_tokens_cv2)
    return (
        f"no number of {role.value} replicas meets the SLO: an idle replica already needs "
        f"p95 TTFT {idle.ttft_p95_s * 1e3:.0f} ms (target {_ms(slo.ttft_p95_s)}) and TPOT "
        f"{idle.tpot_s * 1e3:.1f} ms (target {_ms(slo.tpot_p95_s)}) for "
        f"{request.input_tokens}/{request.output_tokens} tokens"
        + (f" (prompt lengths' CV {spread:.2g})" if spread > 0 else "")
    )


def _replicas(count: int, role: str) -> str:
    return f"{count} {role} replica" + ("" if count == 1 else "s")


def _ms(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1e3:.0f} ms"


def plan(
    spec: ModelDeploymentSpec,
    gpus: GpuCatalog | None = None,
    workload: Workload | None = None,
    slo: Slo | None = None,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> CapacityPlan:
    config = ReplicaConfig.from_spec(spec, gpus or GpuCatalog.builtin())
    capacity = plan_replica(
        config,
        disaggregated=spec.topology.mode == TopologyMode.DISAGGREGATED,
        replicas=spec.replicas,
        prefill_replicas=spec.topology.prefill.replicas if spec.topology.prefill else 0,
        workload=workload,
        slo=slo or Slo(),
        efficiency=efficiency,
    )
    source = spec.model.weight_source
    if source is None:
        return capacity
    return replace(capacity, cold_start=estimate_cold_start(config, source, spec.engine.name))


def _saturated_output_tokens_per_s(
    config: ReplicaConfig, memory: MemoryPlan, request: Workload, efficiency: EfficiencyTerms
) -> float:
    if not memory.fits:
        return 0.0
    return max_throughput(
        config, request.input_tokens, request.output_tokens, memory.kv_capacity_tokens, efficiency
    ).output_tokens_per_s


def plan_replica(
    config: ReplicaConfig,
    *,
    disaggregated: bool,
    replicas: int,
    prefill_replicas: int,
    workload: Workload | None,
    slo: Slo,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> CapacityPlan:
    memory = plan_memory(config)
    request = workload or REFERENCE_REQUEST
    context = request.input_tokens + request.output_tokens
    idle_ttft = prefill_seconds(config, request.input_tokens, efficiency)
    idle_tpot = decode_step_seconds(config, 1, request.input_tokens + request.output_tokens / 2)
    saturated = _saturated_output_tokens_per_s(config, memory, request, efficiency)

    def result(roles: tuple[RolePlan, ...], meets: bool | None, reason: str) -> CapacityPlan:
        return CapacityPlan(
            config=config,
            memory=memory,
            request=request,
            idle_ttft_s=idle_ttft,
            idle_tpot_s=idle_tpot,
            saturated_output_tokens_per_s=saturated,
            roles=roles,
            meets_slo=meets,
            reason=reason,
            workload=workload,
            slo=slo,
        )

    counts = {Role.PREFILL: prefill_replicas, Role.DECODE: replicas}
    if not disaggregated:
        counts = {Role.AGGREGATED: replicas}
    # The replicas the spec declares, without a load to size them for.
    declared = tuple(RolePlan(role, n, n * config.gpus, None) for role, n in counts.items())
    if not memory.fits:
        return result(declared, False if workload else None, memory.verdict())
    if context > config.context_limit:
        return result(
            declared,
            False if workload else None,
            f"requests of {context} tokens exceed max model length {config.context_limit}",
        )
    if workload is None:
        return result(declared, None, memory.verdict())

    rate = workload.requests_per_second
    if not disaggregated:
        aggregated = _size_aggregated(config, workload, slo, efficiency)
        if aggregated is None:
            why = _infeasible(Role.AGGREGATED, config, request, slo, efficiency)
            return result(declared, False, why)
        count = aggregated.replicas
        return result(
            (aggregated,),
            True,
            f"{_replicas(count, 'aggregated')} {'meets' if count == 1 else 'meet'} the SLO at "
            f"{rate:g} req/s",
        )

    transfer_s = workload.input_tokens * kv_bytes_per_token(config) / KV_TRANSFER_BYTES_PER_S
    pools = _size_disaggregated(config, workload, slo, efficiency, transfer_s)
    if isinstance(pools, Role):
        return result(declared, False, _infeasible(pools, config, request, slo, efficiency))
    prefill, decode = pools
    return result(
        pools,
        True,
        f"{_replicas(prefill.replicas, 'prefill')} and {_replicas(decode.replicas, 'decode')} "
        "meet the SLO at "
        f"{rate:g} req/s (KV transfer adds {transfer_s * 1e3:.1f} ms to TTFT)",
    )


def _size_aggregated(
    config: ReplicaConfig, workload: Workload, slo: Slo, efficiency: EfficiencyTerms
) -> RolePlan | None:
    """The fewest aggregated replicas that meet the SLO at the workload's rate; None: no
    number does."""
    rate = workload.requests_per_second
    inp, out = workload.input_tokens, workload.output_tokens

    def point(count: int) -> OperatingPoint:
        return operating_point(
            config, rate / max(count, 1), inp, out, efficiency=efficiency,
            input_tokens_cv2=workload.input_tokens_cv2,
        )  # fmt: skip

    count = fewest_replicas(lambda n: meets_slo(point(n), slo))
    if count is None:
        return None
    return RolePlan(Role.AGGREGATED, count, count * config.gpus, point(count))


def _size_disaggregated(
    config: ReplicaConfig,
    workload: Workload,
    slo: Slo,
    efficiency: EfficiencyTerms,
    transfer_s: float,
) -> tuple[RolePlan, RolePlan] | Role:
    """The fewest prefill replicas that meet the TTFT target with the KV transfer added, and
    the fewest decode replicas that meet the TPOT target; the role that no number of replicas
    serves within the SLO, if one does not."""
    rate = workload.requests_per_second
    inp, out = workload.input_tokens, workload.output_tokens

    def prefill_point(count: int) -> OperatingPoint:
        return operating_point(
            config, rate / max(count, 1), inp, out, efficiency=efficiency, decode=False,
            input_tokens_cv2=workload.input_tokens_cv2,
        )  # fmt: skip

    def decode_point(count: int) -> OperatingPoint:
        return operating_point(
            config, rate / max(count, 1), inp, out, efficiency=efficiency, prefill=False
        )

    prefill_count = fewest_replicas(lambda n: meets_slo(prefill_point(n), slo, transfer_s))
    decode_count = fewest_replicas(lambda n: meets_slo(decode_point(n), slo))
    if prefill_count is None or decode_count is None:
        return Role.PREFILL if prefill_count is None else Role.DECODE
    return (
        RolePlan(Role.PREFILL, prefill_count, prefill_count * config.gpus,
                 prefill_point(prefill_count)),
        RolePlan(Role.DECODE, decode_count, decode_count * config.gpus,
                 decode_point(decode_count)),
    )  # fmt: skip


def _point_report(point: OperatingPoint | None) -> dict[str, float] | None:
    if point is None:
        return None
    return {
        "requestsPerSecond": point.rate,
        "ttftP95Ms": point.ttft_p95_s * 1e3,
        "tpotMs": point.tpot_s * 1e3,
        "tpotP95Ms": point.tpot_p95_s * 1e3,
        "batch": point.batch,
        "prefillUtilisation": point.prefill_utilisation,
        "mfu": point.mfu,
        "mbu": point.mbu,
    }


def report(capacity: CapacityPlan) -> dict[str, object]:
    """The plan as plain data (camelCase), for `-o json` and for status."""
    memory = capacity.memory
    context = capacity.request.input_tokens + capacity.request.output_tokens
    gib = 1024**3
    return {
        "fits": memory.fits,
        "verdict": memory.verdict(),
        "gpuType": capacity.config.gpu_type.value,
        "gpusPerReplica": capacity.config.gpus,
        "nodesPerReplica": capacity.config.nodes,
        "memoryPerGpuGiB": {
            "total": memory.total / gib,
            "usable": memory.usable / gib,
            "weights": memory.weights / gib,
            "activations": memory.activations / gib,
            "runtime": memory.runtime / gib,
            "kvCache": memory.kv_cache / gib,
        },
        "kvBytesPerTokenPerGpu": memory.kv_bytes_per_token,
        "kvCapacityTokens": memory.kv_capacity_tokens,
        "maxModelLength": memory.context_limit,
        "maxConcurrency": {
            "atMaxModelLength": memory.max_concurrency(memory.context_limit),
            "atRequestLength": memory.max_concurrency(context),
        },
        "request": {
            "inputTokens": capacity.request.input_tokens,
            "outputTokens": capacity.request.output_tokens,
        },
        "idle": {"ttftMs": capacity.idle_ttft_s * 1e3, "tpotMs": capacity.idle_tpot_s * 1e3},
        "saturatedOutputTokensPerSecondPerReplica": capacity.saturated_output_tokens_per_s,
        "workload": None
        if capacity.workload is None
        else {
            "requestsPerSecond": capacity.workload.requests_per_second,
            "inputTokens": capacity.workload.input_tokens,
            "outputTokens": capacity.workload.output_tokens,
            "inputTokensCv": math.sqrt(capacity.workload.input_tokens_cv2),
        },
        "slo": {
            "ttftP95Ms": capacity.slo.ttft_p95_ms,
            "tpotP95Ms": capacity.slo.tpot_p95_ms,
        },
        "meetsSlo": capacity.meets_slo,
        "reason": capacity.reason,
        "roles": [
            {
                "role": role.role.value,
                "replicas": role.replicas,
                "gpus": role.gpus,
                "perReplica": _point_report(role.point),
            }
            for role in capacity.roles
        ],
        "gpus": capacity.gpus,
        "hourlyCostUsd": capacity.gpus * capacity.config.gpu.hourly_price_usd,
        "costPerMillionOutputTokensUsd": capacity.cost_per_million_output_tokens_usd,
        "coldStart": None
        if capacity.cold_start is None
        else {
            "weightSource": capacity.cold_start.source.value,
            "seconds": capacity.cold_start.seconds,
            "message": capacity.cold_start.describe(),
        },
    }
