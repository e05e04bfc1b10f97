"""Scalers to compare the goodput policy against, driven through the same metrics snapshot.

Each has `interval_s` and `desired(now_s, snapshot, current) -> replicas per role`, the
`Scaler` protocol of the fleet simulator (`inferfleet.sim.fleet`). Pure: no I/O, no clock.

* `StaticScaler`: a fixed fleet (sized at the peak, or at the mean);
* `HpaScaler`: the Kubernetes HPA on a utilisation target. Utilisation of a role is the
  requests in its engines (`running + waiting`) per ready replica over the concurrency one
  replica holds at the SLO (what a load test at the SLO shows): 15 s sync, 10% tolerance,
  scale-down to the highest recommendation of the last 300 s, scale-up at most doubling (or +4)
  per sync, as the HPA's default behaviour does;
* `QueueScaler`: KEDA's Prometheus scaler on the engines' queue length
  (`vllm:num_requests_waiting`, an AverageValue target per replica): 30 s polling, and a 300 s
  cooldown before the replicas of a recommendation that fell are removed;
* `ThroughputPlanner`: NVIDIA Dynamo's SLA planner: every 180 s, the prefill pool sized from
  prompt tokens/s over the prefill throughput one replica sustains within the TTFT target, the
  decode pool from output tokens/s over the decode throughput one replica sustains within the
  TPOT target (both from the roofline planner, as Dynamo reads them from its profile); an
  aggregated pool from whichever half needs more. The load is the last window's (Dynamo's
  constant predictor); no stabilisation;
* `ClairvoyantScaler`: the oracle's schedule of replicas per window, known in advance: each
  window's replicas are asked for a cold start before the window begins.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.snapshot import MetricsSnapshot
from inferfleet.planning.capacity import KV_TRANSFER_BYTES_PER_S
from inferfleet.planning.load import OperatingPoint, operating_point
from inferfleet.planning.memory import kv_bytes_per_token
from inferfleet.planning.performance import DEFAULT_EFFICIENCY, EfficiencyTerms
from inferfleet.planning.replica import ReplicaConfig

HPA_SYNC_S = 15.0
HPA_TOLERANCE = 0.1
HPA_SCALE_DOWN_WINDOW_S = 300.0
KEDA_POLLING_S = 30.0
KEDA_COOLDOWN_S = 300.0
PLANNER_INTERVAL_S = 180.0


@dataclass(frozen=True)
class Bounds:
    min_replicas: int = 1
    max_replicas: int = 1000

    def clamp(self, replicas: int) -> int:
        return max(1, self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class RoleCapacity:
    """What one replica of a role holds while it meets its part of the SLO, for one mix."""

    requests_per_s: float
    """The highest request rate one replica serves within the SLO."""
    concurrency: float
    """Requests it holds at that rate (Little's law: rate x time each spends in it)."""
    prompt_tokens_per_s: float
    output_tokens_per_s: float


def _role_meets(
    point: OperatingPoint, role: Role, ttft_s: float | None, tpot_s: float | None, extra: float
) -> bool:
    if not point.stable:
        return False
    if role is not Role.DECODE and ttft_s is not None and point.ttft_p95_s + extra > ttft_s:
        return False
    return role is Role.PREFILL or tpot_s is None or point.tpot_s <= tpot_s


@lru_cache(maxsize=4096)
def role_capacity(
    config: ReplicaConfig,
    role: Role,
    *,
    input_tokens: int,
    output_tokens: int,
    ttft_s: float | None,
    tpot_s: float | None,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> RoleCapacity:
    """One replica's capacity under the SLO (a prefill pool answers for TTFT with the KV
    transfer, a decode pool for TPOT), found by bisection on the planner's operating point."""
    extra = 0.0
    if role is Role.PREFILL:
        extra = input_tokens * kv_bytes_per_token(config) / KV_TRANSFER_BYTES_PER_S

    def point(rate: float) -> OperatingPoint:
        return operating_point(
            config,
            rate,
            input_tokens,
            output_tokens,
            efficiency=efficiency,
            prefill=role is not Role.DECODE,
            decode=role is not Role.PREFILL,
        )

    low, high = 0.0, 1.0
    while _role_meets(point(high), role, ttft_s, tpot_s, extra):
        low, high = high, high * 2
        if high > 1e6:
            break
    for _ in range(40):
        middle = (low + high) / 2
        if _role_meets(point(middle), role, ttft_s, tpot_s, extra):
            low = middle
        else:
            high = middle
    rate = max(low, 1e-9)
    at = point(rate)
    if role is Role.PREFILL:
        concurrency = rate * at.ttft_mean_s
    elif role is Role.DECODE:
        concurrency = at.batch
    else:
        concurrency = rate * (at.ttft_mean_s + max(0, output_tokens - 1) * at.tpot_s)
    return RoleCapacity(
        requests_per_s=rate,
        concurrency=max(concurrency, 1e-9),
        prompt_tokens_per_s=rate * input_tokens,
        output_tokens_per_s=rate * output_tokens,
    )


@dataclass
class StaticScaler:
    """Always the same replicas."""

    replicas: Mapping[Role, int]
    interval_s: float = 3600.0

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        del now_s, snapshot, current
        return dict(self.replicas)


@dataclass
class _Stabiliser:
    """The HPA's scale-down stabilisation: the highest recommendation of the last window."""

    window_s: float
    recent: dict[Role, deque[tuple[float, int]]] = field(default_factory=dict)

    def apply(self, role: Role, now_s: float, recommendation: int, current: int) -> int:
        if role not in self.recent:
            # The fleet was running before the first sync: its size counts as a recommendation.
            self.recent[role] = deque([(now_s, current)])
        history = self.recent[role]
        history.append((now_s, recommendation))
        while history and history[0][0] <= now_s - self.window_s:
            history.popleft()
        if recommendation >= current:
            return recommendation
        return min(current, max(count for _, count in history))


def _hpa_step(current: int, desired: int) -> int:
    """The HPA's default scale-up limit: at most double, or four more, per sync."""
    return min(desired, max(2 * current, current + 4))


@dataclass
class HpaScaler:
    """Kubernetes HPA on utilisation = (running + waiting) per ready replica over
    `capacity[role].concurrency`, aiming at `target_utilisation`."""

    capacity: Mapping[Role, RoleCapacity]
    bounds: Mapping[Role, Bounds]
    target_utilisation: float = 0.7
    interval_s: float = HPA_SYNC_S
    tolerance: float = HPA_TOLERANCE
    scale_down_window_s: float = HPA_SCALE_DOWN_WINDOW_S
    _stabiliser: _Stabiliser = field(init=False)

    def __post_init__(self) -> None:
        self._stabiliser = _Stabiliser(self.scale_down_window_s)

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        wanted = dict(current)
        if snapshot is None:
            return wanted
        for role, capacity in self.capacity.items():
            metrics = snapshot.role(role)
            now_count = current.get(role, 1)
            if metrics is None or metrics.ready_replicas == 0:
                continue
            load = metrics.running_requests + metrics.waiting_requests
            utilisation = load / metrics.ready_replicas / capacity.concurrency
            ratio = utilisation / self.target_utilisation
            if abs(ratio - 1) <= self.tolerance:
                recommendation = now_count
            else:
                recommendation = math.ceil(load / capacity.concurrency / self.target_utilisation)
            recommendation = self.bounds[role].clamp(recommendation)
            recommendation = _hpa_step(now_count, recommendation)
            wanted[role] = self._stabiliser.apply(role, now_s, recommendation, now_count)
        return wanted


@dataclass
class QueueScaler:
    """KEDA on the engines' queue: replicas = ceil(waiting requests / `waiting_per_replica`)."""

    roles: Sequence[Role]
    bounds: Mapping[Role, Bounds]
    waiting_per_replica: float = 5.0
    interval_s: float = KEDA_POLLING_S
    cooldown_s: float = KEDA_COOLDOWN_S
    _stabiliser: _Stabiliser = field(init=False)

    def __post_init__(self) -> None:
        self._stabiliser = _Stabiliser(self.cooldown_s)

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        wanted = dict(current)
        if snapshot is None:
            return wanted
        for role in self.roles:
            metrics = snapshot.role(role)
            now_count = current.get(role, 1)
            if metrics is None or metrics.ready_replicas == 0:
                continue
            waiting = metrics.waiting_requests
            ratio = waiting / metrics.ready_replicas / self.waiting_per_replica
            if abs(ratio - 1) <= HPA_TOLERANCE:
                recommendation = now_count
            else:
                recommendation = math.ceil(waiting / self.waiting_per_replica)
            recommendation = self.bounds[role].clamp(recommendation)
            recommendation = _hpa_step(now_count, recommendation)
            wanted[role] = self._stabiliser.apply(role, now_s, recommendation, now_count)
        return wanted


@dataclass
class ThroughputPlanner:
    """Dynamo's SLA planner: pools sized from token rates over per-replica throughput at the
    SLO, every `interval_s`, for the mix the router measured (or `fallback_mix`)."""

    config: ReplicaConfig
    roles: Sequence[Role]
    bounds: Mapping[Role, Bounds]
    ttft_s: float | None
    tpot_s: float | None
    fallback_mix: tuple[int, int]
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY
    interval_s: float = PLANNER_INTERVAL_S

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        del now_s
        wanted = dict(current)
        if snapshot is None:
            return wanted
        service = snapshot.service
        # Rounded so the capacity cache is hit: lengths within a few percent plan the same.
        input_tokens = _rounded(service.mean_prompt_tokens or self.fallback_mix[0])
        output_tokens = _rounded(service.mean_output_tokens or self.fallback_mix[1])
        prefill_role = Role.PREFILL if Role.PREFILL in self.roles else Role.AGGREGATED
        decode_role = Role.DECODE if Role.DECODE in self.roles else Role.AGGREGATED
        prompt_per_s = snapshot.roles[prefill_role].prompt_tokens_per_s
        output_per_s = snapshot.roles[decode_role].generation_tokens_per_s
        for role in self.roles:
            capacity = role_capacity(
                self.config,
                role,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                ttft_s=self.ttft_s,
                tpot_s=self.tpot_s,
                efficiency=self.efficiency,
            )
            by_prompt = prompt_per_s / capacity.prompt_tokens_per_s
            by_output = output_per_s / capacity.output_tokens_per_s
            if role is Role.PREFILL:
                need = by_prompt
            elif role is Role.DECODE:
                need = by_output
            else:
                need = max(by_prompt, by_output)
            wanted[role] = self.bounds[role].clamp(math.ceil(need - 1e-9))
        return wanted


def _rounded(tokens: float) -> int:
    """Two significant digits (at least 1): 1155 -> 1200, 211 -> 210."""
    value = max(1.0, tokens)
    digits = max(0, math.floor(math.log10(value)) - 1)
    step = int(10**digits)
    return max(1, round(value / step) * step)


@dataclass
class ClairvoyantScaler:
    """Replays a per-window schedule (the clairvoyant schedule, or the per-window oracle it is
    searched from): `needs[i]` holds over [i * window_s, (i + 1) * window_s). A window's
    replicas are asked for a cold start (and one tick) ahead, so they serve from its first
    second; replicas leave when no window within a cold start needs them. `lead_s` 0 replays
    it without foresight: each window's fleet is asked for as the window starts, and serves a
    cold start late."""

    needs: Sequence[Mapping[Role, int]]
    window_s: float
    cold_start_s: float
    interval_s: float = 5.0
    lead_s: float | None = None
    """How far ahead windows are asked for; None: a cold start and one tick."""

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        del snapshot
        if not self.needs:
            return dict(current)
        first = int(now_s // self.window_s)
        lead_s = self.cold_start_s + self.interval_s if self.lead_s is None else self.lead_s
        last = int((now_s + lead_s) // self.window_s)
        window = [self.needs[min(i, len(self.needs) - 1)] for i in range(first, last + 1)]
        roles = {role for need in window for role in need}
        return {role: max(need.get(role, 1) for need in window) for role in roles}
