"""Per-request SLO outcomes: the one definition the router's counters, the load generator's
report and the fleet simulator share.

A request meets the SLO when it succeeded and met every target that is set. TTFT is judged on
every request; TPOT, (last token - first token) / (tokens - 1), only on answers of two tokens
or more (a one-token answer has no time per output token).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferfleet.api.inference_service import SloSpec


# The buckets of the router's latency histograms (`inferfleet_router_ttft_seconds`,
# `..._tpot_seconds`). The autoscaler's p95 is interpolated inside one of them, as Prometheus
# does, so the fleet simulator counts into the same ones.
TTFT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TPOT_BUCKETS_S = (
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
    0.125, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip


class Outcome(StrEnum):
    """What a request did against the SLO (the `outcome` label of the router's counters)."""

    MET = "met"
    MISSED_TTFT = "missed_ttft"
    MISSED_TPOT = "missed_tpot"
    MISSED_BOTH = "missed_both"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request targets, in ms (None: not judged), and the share of requests that should
    meet them all."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    attainment_target: float = 0.99

    def __post_init__(self) -> None:
        for name in ("ttft_p95_ms", "tpot_p95_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 < self.attainment_target <= 1:
            raise ValueError(f"attainment_target must be in (0, 1], got {self.attainment_target}")

    @classmethod
    def from_spec(cls, spec: SloSpec) -> Slo:
        """The SLO of an InferenceService."""
        return cls(spec.ttft_p95_ms, spec.tpot_p95_ms, spec.attainment_target)

    @classmethod
    def in_seconds(
        cls,
        ttft_p95_s: float | None = None,
        tpot_p95_s: float | None = None,
        attainment_target: float = 0.99,
    ) -> Slo:
        """Targets given in seconds, the planner's unit."""
        return cls(
            None if ttft_p95_s is None else ttft_p95_s * 1000.0,
            None if tpot_p95_s is None else tpot_p95_s * 1000.0,
            attainment_target,
        )

    @property
    def ttft_p95_s(self) -> float | None:
        return None if self.ttft_p95_ms is None else self.ttft_p95_ms / 1000.0

    @property
    def tpot_p95_s(self) -> float | None:
        return None if self.tpot_p95_ms is None else self.tpot_p95_ms / 1000.0

    def outcome(self, *, ok: bool, ttft_s: float | None, tpot_s: float | None) -> Outcome:
        """The outcome of one request; `ttft_s` None on a success means no token came."""
        if not ok:
            return Outcome.FAILED
        ttft_missed = self.ttft_p95_ms is not None and (
            ttft_s is None or ttft_s * 1000.0 > self.ttft_p95_ms
        )
        tpot_missed = (
            self.tpot_p95_ms is not None
            and tpot_s is not None
            and tpot_s * 1000.0 > self.tpot_p95_ms
        )
        if ttft_missed and tpot_missed:
            return Outcome.MISSED_BOTH
        if ttft_missed:
            return Outcome.MISSED_TTFT
        if tpot_missed:
            return Outcome.MISSED_TPOT
        return Outcome.MET
