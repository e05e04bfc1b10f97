"""Fleet simulator: many engine replicas, a router and a scaler, in virtual time.

Discrete-event: a heap of events (engine steps ending, replicas becoming ready, KV transfers
landing, Prometheus scrapes, scaler ticks) merged with the arrivals of an open-loop schedule.
Each replica is one `EngineCore` (the scheduler core the engine emulator runs), aggregated, or
prefill and decode with the KV handed from one pool to the other. Pure: no I/O, no wall clock;
the same schedule, configuration and scaler give the same run.

What is modelled:
* routing, as the router does it: least outstanding tokens (prompt and output tokens of the
  requests a replica holds), and with prefix hashes in the trace, the prefill a replica's cache
  would save counts against its load (a KV-aware cost, as Dynamo's KV router scores replicas).
  Disaggregated: prefill pool first; when a prompt's KV is ready it goes to the decode replica
  with the fewest outstanding tokens, which pulls it over the link (timed by the core);
* scaling: a replica asked for holds its GPUs at once and serves after its role's cold start. One
  taken away is a replica still starting (cancelled at once), else the serving replica with
  the least outstanding work, which drains: it takes no new requests, finishes what it holds,
  then gives its GPUs back. GPUs are counted per second held;
* metrics: Prometheus scrapes every replica and the router every `scrape_interval_s`; the
  scaler's `MetricsSnapshot` is computed from the scraped samples visible `scrape_delay_s`
  later, exactly as the live controller's PromQL would (see `autoscale.snapshot`): rates over
  the window between its first and last samples, gauges from the last one, p95 by
  `histogram_quantile` over bucket counts (`sim.rates`).

Simplified: per-role counters are summed over every replica that ever ran (Prometheus' `sum of
rate` also survives replicas coming and going, except for the first scrape of a new one); a
draining replica is still scraped (its pod exists until it has drained).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.snapshot import MetricsSnapshot, RoleMetrics, ServiceMetrics
from inferfleet.planning.memory import KV_BLOCK_TOKENS
from inferfleet.planning.performance import DEFAULT_EFFICIENCY, EfficiencyTerms
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.rates import cumulative, first_within, histogram_quantile
from inferfleet.sim.run import FleetRun, ReplicaLife, RequestRecord, ScaleDecision
from inferfleet.sim.scheduler import EngineCore, EngineRequest, RequestRejectedError, StepResult
from inferfleet.sim.workload import DEFAULT_HASH_BLOCK_TOKENS, TraceRequest
from inferfleet.slo import TPOT_BUCKETS_S, TTFT_BUCKETS_S, Outcome, Slo

DEFAULT_COLD_START_S = 120.0


class Scaler(Protocol):
    """What the simulator calls every `interval_s`: the replicas each role should have."""

    @property
    def interval_s(self) -> float: ...

    def desired(
        self, now_s: float, snapshot: MetricsSnapshot | None, current: Mapping[Role, int]
    ) -> Mapping[Role, int]:
        """`current`: replicas asked for per role (starting or serving, not draining)."""
        ...


class ReplicaState(Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    RELEASED = "released"


@dataclass(frozen=True)
class FleetConfig:
    """One service's fleet: how each replica runs, its topology, its SLO and the metrics."""

    replica: ReplicaConfig
    slo: Slo
    disaggregated: bool = False
    initial_replicas: Mapping[Role, int] = field(default_factory=dict)
    """Replicas serving at time 0 (warm); 1 per role where not given."""
    cold_start_s: float = DEFAULT_COLD_START_S
    role_cold_start_s: Mapping[Role, float] = field(default_factory=dict)
    """Per role, where its replicas start faster or slower than `cold_start_s` (their weights
    come from elsewhere, they wait for other GPUs)."""
    prefix_caching: bool = True
    kv_capacity_blocks: int | None = None
    """Overrides the memory plan's KV cache per replica (to study memory pressure)."""
    prefix_affinity: bool = True
    """Route prompts with prefix hashes towards replicas that cache their prefix."""
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY
    scrape_interval_s: float = 15.0
    scrape_delay_s: float = 0.0
    """Seconds between a scrape and the moment queries see it."""
    metrics_window_s: float = 60.0
    recent_window_s: float | None = None
    """The short window of the recent arrival rate; default: two scrape intervals (the
    shortest a rate can be read over), within `metrics_window_s`."""
    wake_timeout_s: float | None = None
    """How long the router holds a request that arrived while no replica of its first pool
    served (a service scaled to zero, waking) before it answers 503: it fails. None: no
    limit."""
    horizon_s: float | None = None
    """GPUs are counted over [0, horizon_s]; default: until the last arrival."""
    drain_limit_s: float = 1800.0
    """After the horizon, how long requests still in flight may run before they count as
    failed."""

    @property
    def roles(self) -> tuple[Role, ...]:
        return (Role.PREFILL, Role.DECODE) if self.disaggregated else (Role.AGGREGATED,)

    @property
    def recent_window(self) -> float:
        window = self.recent_window_s
        if window is None:
            window = 2 * self.scrape_interval_s
        return min(window, self.metrics_window_s)

    def cold_start(self, role: Role) -> float:
        return self.role_cold_start_s.get(role, self.cold_start_s)

    @property
    def slowest_cold_start_s(self) -> float:
        return max(self.cold_start(role) for role in self.roles)

    @property
    def entry_role(self) -> Role:
        return Role.PREFILL if self.disaggregated else Role.AGGREGATED


class _Replica:
    __slots__ = (
        "busy",
        "core",
        "drain_s",
        "gpus",
        "in_flight",
        "life_index",
        "outstanding",
        "peak_blocks",
        "prefix_capacity",
        "prefixes",
        "ready_s",
        "released_s",
        "replica_id",
        "requested_s",
        "role",
        "state",
        "wake_s",
    )

    def __init__(self, replica_id: int, role: Role, core: EngineCore, gpus: int) -> None:
        self.replica_id = replica_id
        self.role = role
        self.core = core
        self.gpus = gpus
        self.state = ReplicaState.STARTING
        self.requested_s = 0.0
        self.ready_s: float | None = None
        self.released_s: float | None = None
        self.drain_s: float | None = None
        self.busy = False
        self.wake_s: float | None = None
        self.outstanding = 0
        """Tokens of the requests it holds (prompt + output; prompt only on prefill)."""
        self.in_flight = 0
        self.prefixes: OrderedDict[int, None] = OrderedDict()
        """Prefix chain keys the router believes this replica caches, least recent first."""
        self.prefix_capacity = 0
        self.peak_blocks = 0
        self.life_index = 0


# Event kinds, in the order they run when they fall at the same instant.
_READY = 0
_STEP_END = 1
_WAKE = 2
_SCRAPE = 3
_TICK = 4
_PUSHED_TICK = 5
PUSH_INTERVAL_S = 1.0
"""The router pushes the requests it holds for want of a replica at most this often."""


@dataclass(slots=True)
class _Sample:
    """One scrape: cumulative counters and gauges, per role and for the router."""

    time_s: float
    prompt_tokens: dict[Role, int]
    generation_tokens: dict[Role, int]
    scraped: dict[Role, int]
    running: dict[Role, int]
    waiting: dict[Role, int]
    kv_usage_sum: dict[Role, float]
    outcomes: dict[Outcome, int]
    ttft_buckets: list[int]
    tpot_buckets: list[int]
    router_prompt_tokens: int
    router_prompt_tokens_squared: int
    router_output_tokens: int
    in_flight: int
    arrivals: int
    arrival_prompt_tokens: int


def _prefix_keys(request: TraceRequest) -> list[int]:
    """Chain keys of a request's hash blocks: key i stands for hash ids 0..i."""
    keys: list[int] = []
    key = 0
    for value in request.prefix_hashes:
        key = hash((key, value))
        keys.append(key)
    return keys


class FleetSimulator:
    """One run: build it with a schedule, a configuration and a scaler, then `run()`."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        config: FleetConfig,
        scaler: Scaler | None = None,
    ) -> None:
        self.config = config
        self.scaler = scaler
        self._requests = requests
        self._records = [
            RequestRecord(index, request.arrival_s, request.input_tokens, request.output_tokens)
            for index, request in enumerate(requests)
        ]
        self._horizon = (
            config.horizon_s
            if config.horizon_s is not None
            else max((request.arrival_s for request in requests), default=0.0)
        )
        self._events: list[tuple[float, int, int, _Replica | None, StepResult | None]] = []
        self._sequence = 0
        self._replicas: list[_Replica] = []
        self._pools: dict[Role, list[_Replica]] = {role: [] for role in config.roles}
        self._pending: dict[Role, deque[int]] = {role: deque() for role in config.roles}
        self._lives: list[ReplicaLife] = []
        self._decisions: list[ScaleDecision] = []
        self._samples: list[_Sample] = []
        self._snapshots = 0
        self._pushed_at_s = -math.inf
        self._open = 0
        """Requests arrived and not yet ended."""
        # Counters of replicas already released, so sums over the role stay monotonic.
        self._retired_prompt: dict[Role, int] = dict.fromkeys(config.roles, 0)
        self._retired_generation: dict[Role, int] = dict.fromkeys(config.roles, 0)
        # Router counters.
        self._outcomes: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self._ttft_counts = [0] * (len(TTFT_BUCKETS_S) + 1)
        self._tpot_counts = [0] * (len(TPOT_BUCKETS_S) + 1)
        self._router_prompt_tokens = 0
        self._router_prompt_tokens_squared = 0
        self._arrivals = 0
        self._arrival_prompt_tokens = 0
        self._router_output_tokens = 0
        self._prefix_keys: dict[int, list[int]] = {}

    # Events.

    def _push(
        self,
        time_s: float,
        kind: int,
        replica: _Replica | None = None,
        result: StepResult | None = None,
    ) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (time_s, kind, self._sequence, replica, result))

    # Replicas.

    def _new_replica(self, role: Role, now: float, *, warm: bool) -> _Replica:
        config = self.config
        core = EngineCore(
            config.replica,
            role,
            efficiency=config.efficiency,
            prefix_caching=config.prefix_caching,
            kv_capacity_blocks=config.kv_capacity_blocks,
        )
        replica = _Replica(len(self._replicas), role, core, config.replica.gpus)
        replica.requested_s = now
        replica.prefix_capacity = (
            core.kv_capacity_blocks * KV_BLOCK_TOKENS // DEFAULT_HASH_BLOCK_TOKENS + 1
        )
        self._replicas.append(replica)
        self._pools[role].append(replica)
        if warm:
            self._make_ready(replica, now)
        else:
            self._push(now + config.cold_start(role), _READY, replica)
        return replica

    def _make_ready(self, replica: _Replica, now: float) -> None:
        if replica.state is not ReplicaState.STARTING:
            return  # cancelled while starting
        replica.state = ReplicaState.SERVING
        replica.ready_s = now
        pending = self._pending[replica.role]
        timeout = self.config.wake_timeout_s
        while pending:
            index = pending.popleft()
            record = self._records[index]
            if timeout is not None and now - record.arrival_s > timeout:
                self._end(record, record.arrival_s + timeout, failed=True)
                continue
            self._dispatch(index, replica.role, now)

    def _release(self, replica: _Replica, now: float) -> None:
        replica.state = ReplicaState.RELEASED
        replica.released_s = now
        stats = replica.core.stats()
        self._retired_prompt[replica.role] += stats.prompt_tokens
        self._retired_generation[replica.role] += stats.generation_tokens
        self._pools[replica.role].remove(replica)

    def _asked_for(self, role: Role) -> list[_Replica]:
        return [
            replica
            for replica in self._pools[role]
            if replica.state in (ReplicaState.STARTING, ReplicaState.SERVING)
        ]

    def _scale(self, role: Role, wanted: int, now: float) -> None:
        wanted = max(0, wanted)
        asked = self._asked_for(role)
        if wanted == len(asked):
            return
        self._decisions.append(ScaleDecision(now, role, len(asked), wanted))
        if wanted > len(asked):
            for _ in range(wanted - len(asked)):
                self._new_replica(role, now, warm=False)
            return
        surplus = len(asked) - wanted
        # Replicas still starting go first (latest asked first), then the least loaded.
        starting = sorted(
            (r for r in asked if r.state is ReplicaState.STARTING),
            key=lambda r: (-r.requested_s, -r.replica_id),
        )
        serving = sorted(
            (r for r in asked if r.state is ReplicaState.SERVING),
            key=lambda r: (r.outstanding, -r.replica_id),
        )
        for replica in (starting + serving)[:surplus]:
            replica.drain_s = now
            if replica.state is ReplicaState.STARTING:
                replica.state = ReplicaState.DRAINING
                self._release(replica, now)
            else:
                replica.state = ReplicaState.DRAINING
                if not replica.busy and not replica.core.has_work:
                    self._release(replica, now)

    # Requests.

    def _route(self, role: Role, index: int) -> _Replica | None:
        """The serving replica of `role` with the lowest cost: outstanding tokens, plus on the
        entry pool the prompt tokens it would have to prefill (its cached prefix saved)."""
        best: _Replica | None = None
        best_cost = math.inf
        record = self._records[index]
        keys = self._prefix_keys.get(index) if role is self.config.entry_role else None
        request = self._requests[index]
        for replica in self._pools[role]:
            if replica.state is not ReplicaState.SERVING:
                continue
            cost = float(replica.outstanding)
            if keys:
                prefixes = replica.prefixes
                matched = 0
                for key in keys:
                    if key not in prefixes:
                        break
                    matched += 1
                cost += max(0, record.input_tokens - matched * request.hash_block_tokens)
            if cost < best_cost:
                best, best_cost = replica, cost
        return best

    def _arrive(self, index: int, now: float) -> None:
        self._open += 1
        request = self._requests[index]
        self._arrivals += 1
        self._arrival_prompt_tokens += request.input_tokens
        if self.config.prefix_affinity and request.prefix_hashes:
            self._prefix_keys[index] = _prefix_keys(request)
        self._dispatch(index, self.config.entry_role, now)

    def _dispatch(self, index: int, role: Role, now: float) -> None:
        replica = self._route(role, index)
        if replica is None:
            self._pending[role].append(index)
            self._push_held(now)
            return
        record = self._records[index]
        request = self._requests[index]
        engine_request = EngineRequest(
            str(index),
            record.input_tokens,
            record.output_tokens,
            request.prefix_hashes,
            request.hash_block_tokens,
        )
        try:
            replica.core.add_request(engine_request)
        except RequestRejectedError:
            self._end(record, now, failed=True)
            return
        tokens = record.input_tokens
        if role is Role.PREFILL:
            record.prefill_replica = replica.replica_id
        else:
            record.replica = replica.replica_id
            tokens += record.output_tokens
        replica.outstanding += tokens
        replica.in_flight += 1
        keys = self._prefix_keys.get(index)
        if keys and role is self.config.entry_role:
            prefixes = replica.prefixes
            for key in keys:
                prefixes[key] = None
                prefixes.move_to_end(key)
            while len(prefixes) > replica.prefix_capacity:
                prefixes.popitem(last=False)
        if not replica.busy:
            self._start_step(replica, now)

    def _end(self, record: RequestRecord, now: float, *, failed: bool) -> None:
        record.finish_s = now
        self._open -= 1
        self._prefix_keys.pop(record.index, None)
        ttft = record.ttft_s
        tpot = record.tpot_s
        record.outcome = self.config.slo.outcome(ok=not failed, ttft_s=ttft, tpot_s=tpot)
        if not failed:
            if ttft is not None:
                self._ttft_counts[bisect.bisect_left(TTFT_BUCKETS_S, ttft)] += 1
            if tpot is not None:
                self._tpot_counts[bisect.bisect_left(TPOT_BUCKETS_S, tpot)] += 1
            self._router_prompt_tokens += record.input_tokens
            self._router_prompt_tokens_squared += record.input_tokens**2
            self._router_output_tokens += record.output_tokens
        self._outcomes[record.outcome] += 1

    # Engine steps.

    def _start_step(self, replica: _Replica, now: float) -> None:
        result = replica.core.step(now)
        if result.idle:
            replica.busy = False
            wake = replica.core.next_wake_s
            if wake is not None and wake != replica.wake_s:
                replica.wake_s = wake
                self._push(max(wake, now), _WAKE, replica)
            return
        replica.busy = True
        core = replica.core
        held = round(core.kv_usage * core.kv_capacity_blocks)
        replica.peak_blocks = max(replica.peak_blocks, held)
        self._push(result.end_s, _STEP_END, replica, result)

    def _step_end(self, replica: _Replica, result: StepResult) -> None:
        now = result.end_s
        records = self._records
        for request_id in result.first_tokens:
            record = records[int(request_id)]
            if record.first_token_s is None:
                record.first_token_s = now
        for request_id in result.finished:
            record = records[int(request_id)]
            replica.outstanding -= record.input_tokens + record.output_tokens
            replica.in_flight -= 1
            self._end(record, now, failed=False)
        for handoff in result.handoffs:
            index = int(handoff.request_id)
            replica.outstanding -= handoff.prompt_tokens
            replica.in_flight -= 1
            self._dispatch(index, Role.DECODE, now)
        replica.busy = False
        if replica.core.has_work:
            self._start_step(replica, now)
        elif replica.state is ReplicaState.DRAINING:
            self._release(replica, now)

    def _wake(self, replica: _Replica, now: float) -> None:
        if replica.wake_s is not None and replica.wake_s <= now:
            replica.wake_s = None
        if not replica.busy and replica.state is not ReplicaState.RELEASED:
            self._start_step(replica, now)

    # Metrics.

    def _scrape(self, now: float) -> None:
        roles = self.config.roles
        prompt = dict(self._retired_prompt)
        generation = dict(self._retired_generation)
        scraped = dict.fromkeys(roles, 0)
        running = dict.fromkeys(roles, 0)
        waiting = dict.fromkeys(roles, 0)
        kv_sum = dict.fromkeys(roles, 0.0)
        for role in roles:
            for replica in self._pools[role]:
                if replica.state is ReplicaState.STARTING:
                    continue
                core = replica.core
                stats = core.stats()
                prompt[role] += stats.prompt_tokens
                generation[role] += stats.generation_tokens
                scraped[role] += 1
                running[role] += stats.running
                waiting[role] += stats.waiting
                kv_sum[role] += stats.kv_usage
        self._samples.append(
            _Sample(
                now,
                prompt,
                generation,
                scraped,
                running,
                waiting,
                kv_sum,
                dict(self._outcomes),
                cumulative(self._ttft_counts),
                cumulative(self._tpot_counts),
                self._router_prompt_tokens,
                self._router_prompt_tokens_squared,
                self._router_output_tokens,
                self._open,
                self._arrivals,
                self._arrival_prompt_tokens,
            )
        )

    def snapshot(self, now: float) -> MetricsSnapshot | None:
        """What the live controller's queries return at `now`: None before any scrape is
        visible."""
        visible_until = now - self.config.scrape_delay_s
        samples = self._samples
        last = bisect.bisect_right([s.time_s for s in samples], visible_until) - 1
        if last < 0:
            return None
        newest = samples[last]
        window = self.config.metrics_window_s
        first = first_within(samples, last, now - window)
        oldest = samples[first] if first < last else None
        recent_window = self.config.recent_window
        recent_first = first_within(samples, last, now - recent_window)
        recent_arrivals: float | None = None
        if recent_first < last:
            recent = samples[recent_first]
            recent_arrivals = (newest.arrivals - recent.arrivals) / (newest.time_s - recent.time_s)
        span = newest.time_s - oldest.time_s if oldest is not None else 0.0

        def rate(new: float, old: float) -> float:
            return max(0.0, new - old) / span if span > 0 else 0.0

        roles: dict[Role, RoleMetrics] = {}
        for role in self.config.roles:
            count = newest.scraped[role]
            roles[role] = RoleMetrics(
                role=role,
                ready_replicas=count,
                running_requests=float(newest.running[role]),
                waiting_requests=float(newest.waiting[role]),
                kv_cache_usage=min(1.0, newest.kv_usage_sum[role] / count) if count else 0.0,
                prompt_tokens_per_s=rate(
                    newest.prompt_tokens[role], oldest.prompt_tokens[role] if oldest else 0
                ),
                generation_tokens_per_s=rate(
                    newest.generation_tokens[role], oldest.generation_tokens[role] if oldest else 0
                ),
            )
        service = ServiceMetrics(requests_per_s=0.0, in_flight_requests=float(newest.in_flight))
        if oldest is not None and span > 0:
            completed = sum(newest.outcomes.values()) - sum(oldest.outcomes.values())
            met = newest.outcomes[Outcome.MET] - oldest.outcomes[Outcome.MET]
            ttft = [n - o for n, o in zip(newest.ttft_buckets, oldest.ttft_buckets, strict=True)]
            tpot = [n - o for n, o in zip(newest.tpot_buckets, oldest.tpot_buckets, strict=True)]
            arrived = newest.arrivals - oldest.arrivals
            prompt_delta = newest.router_prompt_tokens - oldest.router_prompt_tokens
            squared_delta = (
                newest.router_prompt_tokens_squared - oldest.router_prompt_tokens_squared
            )
            output_delta = newest.router_output_tokens - oldest.router_output_tokens
            service = ServiceMetrics(
                requests_per_s=completed / span,
                in_flight_requests=float(newest.in_flight),
                attainment=met / completed if completed else None,
                ttft_p95_s=histogram_quantile(0.95, TTFT_BUCKETS_S, ttft),
                tpot_p95_s=histogram_quantile(0.95, TPOT_BUCKETS_S, tpot),
                ttft_p99_s=histogram_quantile(0.99, TTFT_BUCKETS_S, ttft),
                tpot_p99_s=histogram_quantile(0.99, TPOT_BUCKETS_S, tpot),
                mean_prompt_tokens=prompt_delta / completed if completed else None,
                mean_squared_prompt_tokens=squared_delta / completed if completed else None,
                mean_output_tokens=output_delta / completed if completed else None,
                arrivals_per_s=arrived / span,
                mean_arrival_prompt_tokens=(
                    (newest.arrival_prompt_tokens - oldest.arrival_prompt_tokens) / arrived
                    if arrived
                    else None
                ),
                recent_arrivals_per_s=recent_arrivals,
            )
        self._snapshots += 1
        return MetricsSnapshot(
            taken_at_s=now,
            window_s=window,
            newest_sample_age_s=max(0.0, now - newest.time_s),
            service=replace(service, waiting_for_replicas=float(self._held())),
            roles=roles,
            recent_window_s=recent_window,
        )

    def _held(self) -> int:
        """Requests waiting for a replica of a pool that has none: what the router pushes."""
        return sum(len(pending) for pending in self._pending.values())

    def _push_held(self, now: float) -> None:
        """A request waits for a pool with no replica asked for: the router pushes its count,
        and the scaler ticks at once (at most every `PUSH_INTERVAL_S`), not at its next
        interval."""
        if self.scaler is None or now - self._pushed_at_s < PUSH_INTERVAL_S:
            return
        if all(self._asked_for(role) for role in self.config.roles):
            return
        self._pushed_at_s = now
        self._push(now, _PUSHED_TICK)

    def _tick(self, now: float) -> None:
        scaler = self.scaler
        if scaler is None:
            return
        current = {role: len(self._asked_for(role)) for role in self.config.roles}
        wanted = scaler.desired(now, self.snapshot(now), current)
        for role in self.config.roles:
            if role in wanted:
                self._scale(role, int(wanted[role]), now)

    # The run.

    def run(self) -> FleetRun:
        config = self.config
        for role in config.roles:
            for _ in range(max(1, config.initial_replicas.get(role, 1))):
                self._new_replica(role, 0.0, warm=True)
        self._push(0.0, _SCRAPE)
        if self.scaler is not None:
            self._push(self.scaler.interval_s, _TICK)
        requests = self._requests
        events = self._events
        next_arrival = 0
        stop_at = self._horizon + config.drain_limit_s
        now = 0.0
        while True:
            arrival_s = requests[next_arrival].arrival_s if next_arrival < len(requests) else None
            if arrival_s is None and self._open == 0:
                break
            if events and (arrival_s is None or events[0][0] < arrival_s):
                now, kind, _, replica, result = heapq.heappop(events)
                if now > stop_at:
                    break
                if kind == _STEP_END and replica is not None and result is not None:
                    self._step_end(replica, result)
                elif kind == _READY and replica is not None:
                    self._make_ready(replica, now)
                elif kind == _WAKE and replica is not None:
                    self._wake(replica, now)
                elif kind == _SCRAPE:
                    self._scrape(now)
                    self._push(now + config.scrape_interval_s, _SCRAPE)
                elif kind == _TICK and self.scaler is not None:
                    self._tick(now)
                    self._push(now + self.scaler.interval_s, _TICK)
                elif kind == _PUSHED_TICK:
                    self._tick(now)
            elif arrival_s is not None:
                now = arrival_s
                self._arrive(next_arrival, now)
                next_arrival += 1
            else:
                break  # requests in flight but nothing left to run them: counted as failed
        end = now
        for record in self._records:
            if record.outcome is None:
                record.finish_s = None
                record.outcome = Outcome.FAILED
        lives = [
            ReplicaLife(
                replica.replica_id,
                replica.role,
                replica.gpus,
                replica.requested_s,
                replica.ready_s,
                replica.released_s,
                replica.drain_s,
            )
            for replica in self._replicas
        ]
        return FleetRun(
            records=self._records,
            replicas=lives,
            decisions=self._decisions,
            horizon_s=self._horizon,
            end_s=end,
            peak_kv_blocks_used={r.replica_id: r.peak_blocks for r in self._replicas},
            kv_capacity_blocks={r.replica_id: r.core.kv_capacity_blocks for r in self._replicas},
            snapshots=self._snapshots,
        )


def simulate(
    requests: Sequence[TraceRequest], config: FleetConfig, scaler: Scaler | None = None
) -> FleetRun:
    """Replay `requests` open-loop through the fleet `config` describes, scaled by `scaler`
    (None: the initial replicas throughout)."""
    return FleetSimulator(requests, config, scaler).run()
