"""Step 1 of a tick: the demand now and a cold start ahead, and the prompt/output mix."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from inferfleet.api.inference_service import MAX_INPUT_TOKENS_CV
from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.policy.history import DemandSample, MixMemory, PolicyHistory
from inferfleet.autoscale.policy.spec import PolicySpec
from inferfleet.autoscale.snapshot import MetricsSnapshot, RoleMetrics, ServiceMetrics
from inferfleet.planning.capacity import REFERENCE_REQUEST


@dataclass(frozen=True)
class Demand:
    requests_per_s: float
    """Arriving now (for this deployment)."""
    forecast_requests_per_s: float
    """Expected at now + cold start."""
    input_tokens: int
    output_tokens: int
    backlog_requests: float
    drain_requests_per_s: float
    """What the queued requests add while they drain: the backlog over
    `PolicySpec.backlog_drain_s`. Sized for but never remembered by
    scale-down stabilisation: once the queue is gone, so is the capacity it asked for."""
    growth: float
    """How much the trend alone grows the load within a cold start (1: no trend)."""
    mix: MixMemory | None = None
    """The prompt/output lengths remembered for the next tick."""
    recent_requests_per_s: float = 0.0
    """The short window's arrivals beyond their counting noise, remembered for bursts."""
    reactive_forecast_requests_per_s: float = 0.0
    """The forecast from the load and its trend alone, remembered for bursts."""
    burst_requests_per_s: float = 0.0
    """The capacity the bursts of the last `burst_memory_s` needed (0: none beyond the load)."""
    input_tokens_cv2: float = 0.0
    """How widely the prompt lengths spread: their variance over their squared mean, as the
    window's completed requests show it (`_planned_spread`)."""


def role_metrics(snapshot: MetricsSnapshot, role: Role) -> RoleMetrics:
    return snapshot.roles.get(role) or RoleMetrics(role, 0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _mean_tokens(
    router_mean: float | None, engine_tokens_per_s: float, requests_per_s: float
) -> float | None:
    if router_mean is not None and router_mean >= 1:
        return router_mean
    if requests_per_s > 0 and engine_tokens_per_s > 0:
        return max(1.0, engine_tokens_per_s / requests_per_s)
    return None


def _remembered(window: float | None, memory: float | None, *, draining: bool) -> float | None:
    """The length to plan for: the window's mean when it is longer than what was remembered (a
    shift to longer requests is acted on at once), else halfway between the two: the requests
    that complete first in a window are the short ones, so a window's mean reads low whenever
    the load rises, and longer ones follow. While the load drains (`_draining`) it is the
    other way round: the requests still completing are the long ones, and a longer mean says
    nothing of the load: what was remembered holds."""
    if window is None:
        return memory
    if memory is None:
        return window
    if window >= memory:
        return memory if draining else window
    return (window + memory) / 2


def _draining(spec: PolicySpec, snapshot: MetricsSnapshot) -> bool:
    """More requests completed over the rate window than arrived in it, beyond counting noise
    (`recent_change_significance` standard errors of the difference of the two counts): the
    load has fallen, and the requests completing are those that live long."""
    service = snapshot.service
    if service.arrivals_per_s is None:
        return False
    completed = service.requests_per_s * snapshot.window_s
    arrived = service.arrivals_per_s * snapshot.window_s
    noise = spec.recent_change_significance * math.sqrt(completed + arrived)
    return completed - arrived > noise


def _mix(
    spec: PolicySpec,
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    *,
    completed: float,
    prefill: RoleMetrics,
    decode: RoleMetrics,
) -> tuple[int, int, MixMemory | None]:
    service = snapshot.service
    fallback = spec.expected_load or REFERENCE_REQUEST
    draining = _draining(spec, snapshot)
    window_input = _mean_tokens(service.mean_prompt_tokens, prefill.prompt_tokens_per_s, completed)
    arriving_input = service.mean_arrival_prompt_tokens
    # Completions skew to the long requests while the load drains; arrivals do not.
    input_skewed = draining
    if arriving_input is not None and arriving_input >= 1:
        # Prompts are known as they arrive: a shift to longer ones shows before they finish.
        window_input = arriving_input if draining else max(window_input or 0.0, arriving_input)
        input_skewed = False
    window_output = _mean_tokens(
        service.mean_output_tokens, decode.generation_tokens_per_s, completed
    )
    memory = history.mix
    input_tokens = _remembered(
        window_input, memory.input_tokens if memory else None, draining=input_skewed
    )
    output_tokens = _remembered(
        window_output, memory.output_tokens if memory else None, draining=draining
    )
    remembered = memory
    if window_input is not None and window_output is not None:
        # An exponential moving average over `mix_memory_s`, weighted by elapsed time.
        if memory is None:
            remembered = MixMemory(snapshot.taken_at_s, window_input, window_output)
        else:
            elapsed = max(0.0, snapshot.taken_at_s - memory.at_s)
            keep = math.exp(-elapsed / spec.mix_memory_s)
            # Requests completing while the load drains are the long ones: not learned.
            learned_input = memory.input_tokens if input_skewed else window_input
            learned_output = memory.output_tokens if draining else window_output
            remembered = MixMemory(
                snapshot.taken_at_s,
                keep * memory.input_tokens + (1 - keep) * learned_input,
                keep * memory.output_tokens + (1 - keep) * learned_output,
            )
    return (
        fallback.input_tokens if input_tokens is None else max(1, round(input_tokens)),
        fallback.output_tokens if output_tokens is None else max(1, round(output_tokens)),
        remembered,
    )


# The spread is planned for in steps of this size (a noisy window reuses cached operating
# points) and never beyond the cap (a few outliers in a quiet window say little of the load).
_CV2_STEP = 0.1
_CV2_CAP = MAX_INPUT_TOKENS_CV**2


def prompt_spread(service: ServiceMetrics) -> float | None:
    """The squared coefficient of variation of the window's prompt lengths, rounded to
    `_CV2_STEP` (None when not measured)."""
    mean, squared = service.mean_prompt_tokens, service.mean_squared_prompt_tokens
    if mean is None or squared is None or mean < 1:
        return None
    cv2 = min(_CV2_CAP, max(0.0, squared / (mean * mean) - 1))
    return round(cv2 / _CV2_STEP) * _CV2_STEP


def _planned_spread(spec: PolicySpec, service: ServiceMetrics) -> float:
    """The prompt lengths' spread the planner is given: as measured, else as the
    InferenceService's expected load says, else none (every prompt the mean length)."""
    measured = prompt_spread(service)
    if measured is not None:
        return measured
    return spec.expected_load.input_tokens_cv2 if spec.expected_load else 0.0


def _trend_slope(samples: Iterable[DemandSample]) -> float:
    """Least-squares slope of requests/s over time (0 with fewer than three samples)."""
    points = [(s.at_s, s.requests_per_s) for s in samples]
    if len(points) < 3:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread <= 0:
        return 0.0
    return sum((t - mean_t) * (r - mean_r) for t, r in points) / spread


# Increments in a row that make a ramp: one rise is a step or noise, three are a trend.
_RISING_INCREMENTS = 3


def _sustained_rise(samples: list[DemandSample]) -> float:
    """Requests/s gained per second by a load that keeps rising: the least-squares slope over
    the samples, when the last `_RISING_INCREMENTS` increments are all rises, and never more per
    second than the rise seen across the samples (a plateau is not a trend). A step looks like
    a ramp for one rate window; what the forecast adds is not remembered by scale-down
    stabilisation, so the overshoot ends with the rise."""
    if len(samples) <= _RISING_INCREMENTS:
        return 0.0
    tail = [s.requests_per_s for s in samples[-_RISING_INCREMENTS - 1 :]]
    if not all(later > earlier for earlier, later in itertools.pairwise(tail)):
        return 0.0
    last = samples[-1]
    slope = _trend_slope(samples)
    span_s = last.at_s - samples[0].at_s
    seen = (last.requests_per_s - samples[0].requests_per_s) / span_s if span_s > 0 else 0.0
    return max(0.0, min(slope, seen))


def growth_headroom(
    spec: PolicySpec, samples: Sequence[DemandSample], window_s: float = math.inf
) -> float:
    """The `growth_quantile` of the demand's growth within a cold start, over the samples
    (each paired with the first one a cold start later), less one and less the growth that
    counting noise alone gives at that quantile (two rates, each counted over a `window_s`
    window, of a load that does not move: a normal approximation of Poisson counts); 0 with
    fewer than `min_growth_samples` pairs or when it never grew beyond the noise."""
    growths: list[float] = []
    counted: list[float] = []
    later = 0
    for sample in samples:
        due = sample.at_s + spec.cold_start_s
        later = max(later, bisect.bisect_left(samples, due, key=lambda s: s.at_s))
        if later >= len(samples):
            break
        if sample.requests_per_s > 0:
            growths.append(samples[later].requests_per_s / sample.requests_per_s)
            counted.append(sample.requests_per_s * window_s)
    if len(growths) < spec.min_growth_samples:
        return 0.0
    growths.sort()
    rank = min(len(growths) - 1, math.ceil(spec.growth_quantile * len(growths)) - 1)
    requests = sum(counted) / len(counted)
    noise = NormalDist().inv_cdf(spec.growth_quantile) * math.sqrt(2 / requests)
    return min(spec.max_trend_growth - 1, max(0.0, growths[rank] - 1 - noise))


def _arriving_from_completions(
    snapshot: MetricsSnapshot,
    history: PolicyHistory,
    *,
    share: float,
    completed: float,
    prompt_tokens_per_s: float,
    input_tokens: int,
) -> float:
    """Arrivals, from a router that does not count them: completions lag arrivals when the
    fleet falls behind, and what piles up in flight also arrived. Measured against a sample at
    least a rate window old, as noisy as the rates themselves."""
    in_flight = snapshot.service.in_flight_requests * share
    baseline = next(
        (s for s in reversed(history.demand) if s.at_s <= snapshot.taken_at_s - snapshot.window_s),
        None,
    )
    growing = 0.0
    if baseline is not None:
        growing = max(
            0.0, (in_flight - baseline.in_flight_requests) / (snapshot.taken_at_s - baseline.at_s)
        )
    return max(completed + growing, prompt_tokens_per_s / input_tokens)


def estimate_demand(spec: PolicySpec, snapshot: MetricsSnapshot, history: PolicyHistory) -> Demand:
    service = snapshot.service
    share = spec.traffic_share
    prefill_role = Role.PREFILL if spec.disaggregated else Role.AGGREGATED
    decode_role = Role.DECODE if spec.disaggregated else Role.AGGREGATED
    prefill = role_metrics(snapshot, prefill_role)
    decode = role_metrics(snapshot, decode_role)
    completed = service.requests_per_s * share
    input_tokens, output_tokens, mix = _mix(
        spec, snapshot, history, completed=completed, prefill=prefill, decode=decode
    )
    if service.arrivals_per_s is not None:
        # Counted as they arrive, by a router that has the counter. Completions and prefilled
        # prompts say less: both run ahead of arrivals while a backlog drains.
        arriving = service.arrivals_per_s * share
    else:
        arriving = _arriving_from_completions(
            snapshot, history, share=share, completed=completed,
            prompt_tokens_per_s=prefill.prompt_tokens_per_s, input_tokens=input_tokens,
        )  # fmt: skip
    recent = recent_arrivals(spec, snapshot, history) * share
    arriving = max(arriving, recent)
    # Queued requests are drained within `backlog_drain_s`: everyone queued behind them waits
    # until then. (The growth of the requests in flight is not a queue: more arrive per second,
    # so more are in flight at once.) The router's requests held for want of a replica (a
    # wake) are queued too, and reach the engines all at once when the first replicas serve.
    backlog = (
        prefill.waiting_requests
        + (decode.waiting_requests if spec.disaggregated else 0.0)
        + service.waiting_for_replicas * share
    )
    drain = backlog / spec.backlog_drain_s
    current = arriving

    window_start = snapshot.taken_at_s - trend_window_s(spec, snapshot)
    trend = [
        *(s for s in history.demand if window_start <= s.at_s < snapshot.taken_at_s),
        DemandSample(snapshot.taken_at_s, arriving, 0.0, recent),
    ]
    # A replica ordered now serves after a cold start: project the trend that far.
    rise = _sustained_rise(trend) * spec.cold_start_s
    forecast, growth = current, 1.0
    if current > 0 and rise > spec.trend_tolerance * current:
        growth = min(1 + rise / current, spec.max_trend_growth)
    # Headroom for how fast this load has grown within a cold start before.
    measured = [*(s for s in history.demand if s.at_s < snapshot.taken_at_s), trend[-1]]
    growth = max(growth, 1 + growth_headroom(spec, measured, snapshot.window_s))
    reactive = current * growth
    burst = 0.0
    if spec.slo.ttft_p95_s is not None:
        since = snapshot.taken_at_s - spec.burst_memory_s - spec.cold_start_s
        burst = burst_capacity(
            [
                *(s for s in history.demand if since <= s.at_s < snapshot.taken_at_s),
                DemandSample(snapshot.taken_at_s, arriving, 0.0, recent, reactive),
            ],
            lag_s=spec.cold_start_s,
            slack=spec.burst_slack,
            wait_budget_s=spec.slo.ttft_p95_s / 2,
            late_share=(1 - spec.attainment_target) * spec.burst_miss_share,
            min_samples=spec.min_growth_samples,
        )
    forecast = max(reactive, burst)
    return Demand(
        requests_per_s=arriving,
        forecast_requests_per_s=forecast,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        backlog_requests=backlog,
        drain_requests_per_s=drain,
        growth=growth,
        mix=mix,
        recent_requests_per_s=recent,
        reactive_forecast_requests_per_s=reactive,
        burst_requests_per_s=burst if burst > reactive else 0.0,
        input_tokens_cv2=_planned_spread(spec, service),
    )


def burst_capacity(
    samples: Sequence[DemandSample],
    *,
    lag_s: float,
    slack: float,
    wait_budget_s: float,
    late_share: float,
    min_samples: int,
) -> float:
    """The capacity (requests/s) to hold for bursts the reactive forecasts missed: 0 when they
    kept up. Replicas ordered at a tick serve a cold start (`lag_s`) later, so the fleet serving
    at each sample was sized for the reactive forecast of one `lag_s` before it. The short
    window's arrivals (beyond their counting noise) are replayed through a fluid queue that
    drains at the larger of that forecast and a held capacity C, times 1 + `slack` (a pool
    serves more than the rate it was sized for before it queues); the answer is the least C
    with at most `late_share` of the arrivals (at the load's rate) waiting longer than
    `wait_budget_s` behind the backlog. Nothing when the arrivals rose above what was ordered
    in one run only: a step or a rise, which the forecasts answer; bursts recur. A load that
    only moves as counting noise does asks for nothing either. What recurring bursts needed is
    held while they stay within the samples; 0 with fewer than `min_samples` samples whose
    forecast a cold start before is known."""
    steps: list[tuple[float, float, float]] = []
    arrived = 0.0
    for earlier, later in itertools.pairwise(samples):
        span = later.at_s - earlier.at_s
        ordered = bisect.bisect_right(samples, later.at_s - lag_s, key=lambda s: s.at_s)
        if span > 0 and ordered > 0:
            forecast = samples[ordered - 1].forecast_requests_per_s
            steps.append((later.recent_requests_per_s, span, forecast))
            arrived += later.requests_per_s * span
    if len(steps) < min_samples or arrived <= 0:
        return 0.0

    # Arrivals above what was ordered, run by run: one run is a step or a rise, which the
    # forecasts answer; bursts are what recur.
    above = [rate > forecast * (1 + slack) for rate, _, forecast in steps]
    runs = sum(1 for i, over in enumerate(above) if over and (i == 0 or not above[i - 1]))

    def kept_up(held: float) -> bool:
        backlog = waited = 0.0
        for rate, span, forecast in steps:
            capacity = max(held, forecast) * (1 + slack)
            backlog = max(0.0, backlog + (rate - capacity) * span)
            if backlog > capacity * wait_budget_s:
                waited += rate * span
        return waited <= late_share * arrived

    if runs < 2 or kept_up(0.0):
        return 0.0
    low, high = 0.0, max(rate for rate, _, _ in steps)
    for _ in range(30):
        middle = (low + high) / 2
        if kept_up(middle):
            high = middle
        else:
            low = middle
    return high


def recent_arrivals(spec: PolicySpec, snapshot: MetricsSnapshot, history: PolicyHistory) -> float:
    """What the short window shows of the load now (0 when not measured). A step shows here a
    few scrapes after it happens, where the rate window still averages it with the load before
    it.

    When its count is more than `recent_change_significance` standard errors above what the
    load before it (as the last tick at least a short window ago measured it) gives such a
    window, the load has changed and the window's own rate is the best estimate of it: a step
    is sized for at the first tick that sees it, not a little more at each tick as the noise
    allows (from `recent_change_min_requests` counted: a few arrivals at an idle service say
    that load came, not how much). Otherwise, its lower bound at `recent_significance` Poisson
    standard errors: a load that does not move reads below its mean, so only a real rise
    raises demand."""
    rate = snapshot.service.recent_arrivals_per_s
    window = snapshot.recent_window_s
    if rate is None or window is None or rate <= 0:
        return 0.0
    counted = rate * window
    before = _arrivals_before(spec, snapshot, history, window)
    if before is not None and counted >= spec.recent_change_min_requests:
        expected = before * window
        # The difference of two counts: the short window's, and the rate window's that
        # `expected` is scaled from. A rate over a window is counted between its first and
        # last scrapes, which can span half of a window two scrapes long: twice the Poisson
        # variance (at least one request's worth, where no load was measured before).
        variance = 2 * max(expected, 1.0) * (1 + window / snapshot.window_s)
        if counted > expected + spec.recent_change_significance * math.sqrt(variance):
            return rate
    return max(0.0, counted - spec.recent_significance * math.sqrt(counted)) / window


def _arrivals_before(
    spec: PolicySpec, snapshot: MetricsSnapshot, history: PolicyHistory, window_s: float
) -> float | None:
    """The service's arrivals per second as measured by the last tick at least `window_s`
    before this one, whose rate window ends before the short window begins (None: no such
    tick)."""
    start = snapshot.taken_at_s - window_s
    sample = next((s for s in reversed(history.demand) if s.at_s <= start), None)
    return None if sample is None else sample.requests_per_s / spec.traffic_share


def trend_window_s(spec: PolicySpec, snapshot: MetricsSnapshot) -> float:
    return max(spec.cold_start_s, 2 * snapshot.window_s, 60.0)
