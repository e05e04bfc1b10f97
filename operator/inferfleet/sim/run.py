"""What a simulated run leaves: each request's life, each replica's, each scaling decision,
and the GPU time they add up to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferfleet.api.model_deployment import Role
from inferfleet.slo import Outcome


@dataclass(slots=True)
class RequestRecord:
    """One request's life in the fleet; times in seconds of the run."""

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    first_token_s: float | None = None
    finish_s: float | None = None
    replica: int | None = None
    """The aggregated or decode replica that produced its tokens."""
    prefill_replica: int | None = None
    outcome: Outcome | None = None
    """None while in flight."""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.finish_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class ReplicaLife:
    """When one replica was asked for, served, and gave its GPUs back (None: still held)."""

    replica: int
    role: Role
    gpus: int
    requested_s: float
    ready_s: float | None
    """None: cancelled before it served."""
    released_s: float | None
    drain_s: float | None = None
    """When it was asked to leave (it takes no new request from then on)."""


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    time_s: float
    role: Role
    before: int
    after: int


@dataclass(frozen=True)
class FleetRun:
    """The outcome of a simulated run."""

    records: list[RequestRecord]
    replicas: list[ReplicaLife]
    decisions: list[ScaleDecision]
    horizon_s: float
    end_s: float
    """When the last request ended (or the drain limit cut the run)."""
    peak_kv_blocks_used: Mapping[int, int]
    """Per replica, the most KV blocks held at once, checked after every step."""
    kv_capacity_blocks: Mapping[int, int]
    snapshots: int

    def gpu_seconds(self, until_s: float | None = None) -> float:
        """GPU-seconds held in [0, until_s] (default: the horizon)."""
        end = self.horizon_s if until_s is None else until_s
        total = 0.0
        for life in self.replicas:
            released = end if life.released_s is None else min(life.released_s, end)
            total += max(0.0, released - min(life.requested_s, end)) * life.gpus
        return total

    def held(self, role: Role, time_s: float) -> int:
        """Replicas of `role` holding GPUs at `time_s`."""
        return sum(
            1
            for life in self.replicas
            if life.role is role
            and life.requested_s <= time_s
            and (life.released_s is None or life.released_s > time_s)
        )

    def accepting(self, role: Role, time_s: float) -> int:
        """Replicas of `role` ready at `time_s` and taking requests (not draining)."""
        return sum(
            1
            for life in self.replicas
            if life.role is role
            and life.ready_s is not None
            and life.ready_s <= time_s
            and (life.drain_s is None or life.drain_s > time_s)
            and (life.released_s is None or life.released_s > time_s)
        )

    def serving(self, role: Role, time_s: float) -> int:
        """Replicas of `role` ready at `time_s` and not yet released (draining included)."""
        return sum(
            1
            for life in self.replicas
            if life.role is role
            and life.ready_s is not None
            and life.ready_s <= time_s
            and (life.released_s is None or life.released_s > time_s)
        )
