"""What the caller stores between ticks (an annotation on the InferenceService): recent
recommendations and demand, and what the policy learned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.spec import Reason


@dataclass(frozen=True)
class Recommendation:
    """A tick's recommendation before constraints, kept for scale-down stabilisation."""

    at_s: float
    replicas: Mapping[Role, int]


@dataclass(frozen=True)
class DemandSample:
    """A tick's demand estimate, kept for the trend."""

    at_s: float
    requests_per_s: float
    in_flight_requests: float
    recent_requests_per_s: float = 0.0
    """The short window's arrivals beyond their counting noise (0: not measured)."""
    forecast_requests_per_s: float = 0.0
    """What the tick sized for from the load and its trend (bursts' capacity left out)."""
    backlog_requests: float = 0.0
    """Requests queued in the engines at the tick."""


@dataclass(frozen=True)
class MissFloor:
    """After a miss: the count that answered it, at what load, until when."""

    replicas: int
    requests_per_s: float
    until_s: float


@dataclass(frozen=True)
class LastDecision:
    at_s: float
    replicas: Mapping[Role, int]
    reason: Reason


@dataclass(frozen=True)
class MixMemory:
    """Mean prompt and output lengths, averaged over `PolicySpec.mix_memory_s`."""

    at_s: float
    input_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class OutcomeTally:
    """Requests completed and requests that met the SLO, each an exponentially decayed sum over
    `PolicySpec.attainment_memory_s`: the attainment the target is judged on, over far more
    requests than one rate window holds."""

    at_s: float
    requests: float
    met: float

    @property
    def attainment(self) -> float | None:
        return self.met / self.requests if self.requests > 0 else None


@dataclass(frozen=True)
class LatencyFactors:
    """One factor per latency target: a pool sized on a latency whose factor is f is planned
    for f times the load (a prefill pool on TTFT, a decode pool on TPOT, an aggregated pool on
    the larger of the two)."""

    ttft: float = 1.0
    tpot: float = 1.0

    def to_wire(self) -> dict[str, float]:
        return {"ttft": self.ttft, "tpot": self.tpot}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> LatencyFactors:
        return cls(float(data.get("ttft", 1.0)), float(data.get("tpot", 1.0)))


@dataclass(frozen=True)
class Calibration:
    """What the planner misses for this workload, measured at the running fleet: TTFT as an
    offset (waiting the model leaves out, in the router, the queue or the hand-off, does not
    shrink with more replicas), TPOT as a ratio (the spread of decode steps around the mean
    the planner predicts grows with the step)."""

    ttft_offset_s: float = 0.0
    tpot_ratio: float = 1.0

    def to_wire(self) -> dict[str, float]:
        return {"ttftOffsetS": self.ttft_offset_s, "tpotRatio": self.tpot_ratio}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Calibration:
        return cls(float(data.get("ttftOffsetS", 0.0)), float(data.get("tpotRatio", 1.0)))


@dataclass(frozen=True)
class ColdStarts:
    """One role's cold starts (`policy.coldstart`): the scale-up awaited, ordered at
    `ordered_at_s` when `ready_before` replicas served, and the recent measurements."""

    ordered_at_s: float | None = None
    ready_before: int = 0
    measured_s: tuple[float, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "orderedAtS": self.ordered_at_s,
            "readyBefore": self.ready_before,
            "measuredS": list(self.measured_s),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ColdStarts:
        ordered = data.get("orderedAtS")
        return cls(
            None if ordered is None else float(ordered),
            int(data.get("readyBefore", 0)),
            tuple(float(s) for s in data.get("measuredS", [])),
        )


@dataclass(frozen=True)
class PolicyHistory:
    """Small and immutable: recent recommendations and demand, when each role last grew, what
    the policy learned about latency, and the last decision taken on fresh metrics."""

    recommendations: tuple[Recommendation, ...] = ()
    demand: tuple[DemandSample, ...] = ()
    last_scale_up_s: Mapping[Role, float] = field(default_factory=dict)
    calibration: Calibration = Calibration()
    """Measured latency against the planner's prediction at the running fleet (moving average):
    a model optimistic for this workload is corrected before attainment suffers, and a
    pessimistic one stops holding GPUs it does not need."""
    tightening: LatencyFactors = LatencyFactors()
    """Learned from attainment misses the model did not explain: how much more load than the
    demand the pools sized on the latency that missed are planned for. Load, not a tighter
    latency target: where a latency barely moves with the load (TPOT, bound by reading the
    weights), a target a few percent tighter asks for many times more replicas."""
    tightened_at_s: float | None = None
    attainment_when_tightened: float | None = None
    """The attainment that taught the last lesson: the next one needs it to have improved."""
    miss_floors: Mapping[Role, MissFloor] = field(default_factory=dict)
    last_decision: LastDecision | None = None
    mix: MixMemory | None = None
    outcomes: OutcomeTally | None = None
    cold_starts: Mapping[Role, ColdStarts] = field(default_factory=dict)
    requests_seen_at_s: float | None = None
    """The last tick whose metrics showed a request (`policy.idle`)."""
    woke_at_s: float | None = None
    """When the pools were last ordered back from zero, while that wake lasts."""
    wake_caught_up_at_s: float | None = None
    """When every pool served again after that wake, with no request queued in its engines
    (None: not yet)."""

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON-able data (camelCase), for an annotation."""

        def counts(replicas: Mapping[Role, int]) -> dict[str, int]:
            return {role.value: n for role, n in sorted(replicas.items())}

        last = self.last_decision
        mix = self.mix
        outcomes = self.outcomes
        return {
            "recommendations": [
                {"atS": r.at_s, "replicas": counts(r.replicas)} for r in self.recommendations
            ],
            "demand": [
                {
                    "atS": d.at_s,
                    "requestsPerS": d.requests_per_s,
                    "inFlight": d.in_flight_requests,
                    "recentRequestsPerS": d.recent_requests_per_s,
                    "forecastRequestsPerS": d.forecast_requests_per_s,
                    "backlog": d.backlog_requests,
                }
                for d in self.demand
            ],
            "lastScaleUpS": {role.value: t for role, t in sorted(self.last_scale_up_s.items())},
            "calibration": self.calibration.to_wire(),
            "tightening": self.tightening.to_wire(),
            "tightenedAtS": self.tightened_at_s,
            "attainmentWhenTightened": self.attainment_when_tightened,
            "missFloors": {
                role.value: {
                    "replicas": f.replicas,
                    "requestsPerS": f.requests_per_s,
                    "untilS": f.until_s,
                }
                for role, f in sorted(self.miss_floors.items())
            },
            "lastDecision": None
            if last is None
            else {"atS": last.at_s, "replicas": counts(last.replicas), "reason": last.reason.value},
            "mix": None
            if mix is None
            else {
                "atS": mix.at_s,
                "inputTokens": mix.input_tokens,
                "outputTokens": mix.output_tokens,
            },
            "outcomes": None
            if outcomes is None
            else {"atS": outcomes.at_s, "requests": outcomes.requests, "met": outcomes.met},
            "coldStarts": {
                role.value: starts.to_wire() for role, starts in sorted(self.cold_starts.items())
            },
            "requestsSeenAtS": self.requests_seen_at_s,
            "wokeAtS": self.woke_at_s,
            "wakeCaughtUpAtS": self.wake_caught_up_at_s,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PolicyHistory:
        """The inverse of `to_wire`; raises ValueError (or KeyError/TypeError) on bad data."""

        def counts(raw: Mapping[str, Any]) -> dict[Role, int]:
            return {Role(role): int(n) for role, n in raw.items()}

        last = data.get("lastDecision")
        mix = data.get("mix")
        outcomes = data.get("outcomes")
        tightened = data.get("tightenedAtS")
        taught = data.get("attainmentWhenTightened")
        seen = data.get("requestsSeenAtS")
        woke = data.get("wokeAtS")
        served = data.get("wakeCaughtUpAtS")
        return cls(
            recommendations=tuple(
                Recommendation(float(r["atS"]), counts(r["replicas"]))
                for r in data.get("recommendations", [])
            ),
            demand=tuple(
                DemandSample(
                    float(d["atS"]),
                    float(d["requestsPerS"]),
                    float(d["inFlight"]),
                    float(d.get("recentRequestsPerS", 0.0)),
                    float(d.get("forecastRequestsPerS", 0.0)),
                    float(d.get("backlog", 0.0)),
                )
                for d in data.get("demand", [])
            ),
            last_scale_up_s={Role(r): float(t) for r, t in data.get("lastScaleUpS", {}).items()},
            calibration=Calibration.from_wire(data.get("calibration", {})),
            tightening=LatencyFactors.from_wire(data.get("tightening", {})),
            tightened_at_s=None if tightened is None else float(tightened),
            attainment_when_tightened=None if taught is None else float(taught),
            miss_floors={
                Role(role): MissFloor(
                    int(f["replicas"]), float(f["requestsPerS"]), float(f["untilS"])
                )
                for role, f in data.get("missFloors", {}).items()
            },
            last_decision=None
            if last is None
            else LastDecision(float(last["atS"]), counts(last["replicas"]), Reason(last["reason"])),
            mix=None
            if mix is None
            else MixMemory(
                float(mix["atS"]), float(mix["inputTokens"]), float(mix["outputTokens"])
            ),
            outcomes=None
            if outcomes is None
            else OutcomeTally(
                float(outcomes["atS"]), float(outcomes["requests"]), float(outcomes["met"])
            ),
            cold_starts={
                Role(role): ColdStarts.from_wire(starts)
                for role, starts in data.get("coldStarts", {}).items()
            },
            requests_seen_at_s=None if seen is None else float(seen),
            woke_at_s=None if woke is None else float(woke),
            wake_caught_up_at_s=None if served is None else float(served),
        )
