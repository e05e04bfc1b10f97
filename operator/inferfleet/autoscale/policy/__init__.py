"""The goodput autoscaling policy: (spec, metrics snapshot, current replicas, history) ->
(replicas per role, reason, new history). Pure: no I/O and no clock; time comes from the
snapshot, so the live controller and the fleet simulator drive the same function.

One tick, in order:

1. Demand (`demand`). Requests/s arriving (router completions, plus the growth of the requests
   in flight), the rate that drains the engines' queues within `backlog_drain_s`, and the
   prompt/output mix (router means, else engine token rates, else the expected load),
   remembered over `mix_memory_s` because a window's mean reads short while the load rises. A
   replica ordered now serves only after a cold start, so the demand is sized that far ahead:
   a least-squares trend over recent ticks when the load keeps rising, and at least the
   `growth_quantile` of the growth this load showed within a cold start over
   `growth_memory_s` (headroom measured, not assumed). The cold start is the configured one
   until the roles' own, measured from the scale-ups they served, contradict it
   (`coldstart`).
2. Feed-forward. Each pool is sized with the planner (`inferfleet.planning.load`) for that
   demand: the prefill pool on TTFT (prefill service, queueing, KV transfer), the decode pool on
   TPOT, its batch limit and its KV cache, an aggregated pool on both. Measured concurrency and
   KV-cache usage give floors of their own (the decode pool must hold the sequences running
   now). As the mix shifts, each pool follows its own half of the work: prefill:decode rebalances.
3. Calibration and feedback. The planner plans against the targets corrected by the
   calibration (measured TTFT less predicted, measured TPOT over predicted, at the replicas
   that served them), for the demand times the tightening (a load factor). Latencies are
   read at the quantile of the planned attainment: the attainment target, lowered while the
   decayed tally of all requests (`attainment_memory_s`) holds the target with misses to
   spare, since the target is judged over all requests, not per window. The tightening is
   learned from misses beyond the window's noise (`miss_significance` binomial standard
   errors) or with the tally below target: a miss raises the load factor of the latency that
   missed (TTFT -> prefill or aggregated, TPOT -> decode or aggregated; load rather than a
   tighter target, because TPOT barely moves with the load and a target a few percent
   tighter would ask for many times the replicas), with replicas added in proportion to
   the shortfall (`lesson_gain`, at least one) for the roles it concerns, once per cold start
   and only while the last lesson helped; it relaxes slowly while the target is met, and the
   count that answered the miss holds while the load that missed does (`miss_memory_s`). A
   role that misses keeps the replicas that served the miss (not those still starting).
4. Scale-down stabilisation, as the HPA does: a role shrinks only to the highest recommendation
   of the last `scale_down_stabilization_s`, and only to a count that holds `scale_down_margin`
   more load (hysteresis), so steady load never oscillates. What a queue or a rising trend asks
   for is not remembered: once it has drained or stopped, the fleet goes back to what arrivals
   need. Calibration and tightening together
   never ask for more than `max_calibrated_growth` times the planner's own count.
5. Constraints, in one place: bounds, pins (the pinned count wins), GPU budget (given first to
   roles whose SLO is missed), never below one replica while the service serves.
6. Scale to zero, on purpose only (`idle`): where every pool allows zero replicas, all go to
   zero after `idle_before_zero_s` without a request, and all come back at once when the
   router shows one.

Stale or missing metrics hold the last decision.
"""

from inferfleet.autoscale.policy.decision import Decision, decide
from inferfleet.autoscale.policy.explanation import RoleEstimate
from inferfleet.autoscale.policy.history import (
    Calibration,
    DemandSample,
    LastDecision,
    LatencyFactors,
    MissFloor,
    OutcomeTally,
    PolicyHistory,
    Recommendation,
)
from inferfleet.autoscale.policy.learning import planning_slo
from inferfleet.autoscale.policy.spec import (
    DECODING_ROLES,
    PREFILLING_ROLES,
    PolicySpec,
    Reason,
    RolePolicy,
    policy_spec,
)

__all__ = [
    "DECODING_ROLES",
    "PREFILLING_ROLES",
    "Calibration",
    "Decision",
    "DemandSample",
    "LastDecision",
    "LatencyFactors",
    "MissFloor",
    "OutcomeTally",
    "PolicyHistory",
    "PolicySpec",
    "Reason",
    "Recommendation",
    "RoleEstimate",
    "RolePolicy",
    "decide",
    "planning_slo",
    "policy_spec",
]
