"""Latency of one replica under a steady load: the operating point of continuous batching.

At an arrival rate of `rate` requests/s with fixed prompt and output lengths, each step of
length t decodes B = rate x output x t sequences (Little's law) and prefills the
rate x input x t prompt tokens that arrived meanwhile. The step time depends on that load, so
t is the smallest fixed point of t = step_time(load(t)); none exists when the replica is
overloaded (the batch, the KV cache or the step's token budget would have to grow without bound).

TTFT is the prefill service time (chunks sharing steps with the running decodes) plus a queueing
wait for the prefill budget, taken as M/D/1: mean W = rho x S / (2 (1 - rho)), and the wait is
approximated as exponential beyond its atom at zero for percentiles. TPOT is the step time; a
request's TPOT averages over many steps, so its p95 sits close to the mean and is taken equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferfleet.planning.memory import plan_memory
from inferfleet.planning.performance import (
    DEFAULT_EFFICIENCY,
    EfficiencyTerms,
    StepLoad,
    prefill_seconds,
    step_time,
    utilisation,
)
from inferfleet.planning.replica import ReplicaConfig

_MAX_ITERATIONS = 200
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class OperatingPoint:
    """One replica's steady state at a request rate."""

    rate: float
    stable: bool
    limit: str
    """What bounds the replica when it is not stable (batch, KV cache, token budget)."""
    step_s: float
    batch: float
    ttft_mean_s: float
    ttft_p95_s: float
    tpot_s: float
    prefill_utilisation: float
    mfu: float
    mbu: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch / self.step_s if self.step_s > 0 else 0.0


def _wait_percentile(mean_wait: float, rho: float, quantile: float) -> float:
    """Percentile of a wait with P(wait > 0) = rho and an exponential tail of mean mean_wait/rho."""
    tail = 1 - quantile
    if rho <= tail or mean_wait <= 0:
        return 0.0
    return mean_wait / rho * math.log(rho / tail)


def _unstable(rate: float, limit: str) -> OperatingPoint:
    return OperatingPoint(
        rate=rate,
        stable=False,
        limit=limit,
        step_s=math.inf,
        batch=math.inf,
        ttft_mean_s=math.inf,
        ttft_p95_s=math.inf,
        tpot_s=math.inf,
        prefill_utilisation=1.0,
        mfu=0.0,
        mbu=0.0,
    )


def operating_point(
    config: ReplicaConfig,
    rate: float,
    input_tokens: int,
    output_tokens: int,
    *,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
    prefill: bool = True,
    decode: bool = True,
) -> OperatingPoint:
    """Steady state at `rate` req/s. `prefill`/`decode` False model a disaggregated pool that
    does only the other half of the work."""
    if rate < 0 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("rate must be >= 0 and token counts >= 1")
    capacity = plan_memory(config).kv_capacity_tokens
    context = input_tokens + output_tokens
    mean_context = input_tokens + output_tokens / 2
    budget = config.max_batched_tokens

    def load_at(step_s: float) -> tuple[StepLoad, float]:
        batch = rate * output_tokens * step_s if decode else 0.0
        prompt = rate * input_tokens * step_s if prefill else 0.0
        return (
            StepLoad(
                decode_sequences=math.ceil(batch),
                decode_context_tokens=math.ceil(batch * mean_context),
                prefill_tokens=math.ceil(prompt),
                prefill_attention_pairs=prompt * input_tokens / 2,
            ),
            batch,
        )

    step_s = step_time(config, StepLoad(), efficiency).total_s
    batch = 0.0
    for _ in range(_MAX_ITERATIONS):
        load, batch = load_at(step_s)
        if batch > config.max_sequences:
            return _unstable(rate, f"batch above maxSequences {config.max_sequences}")
        if batch * context > capacity:
            return _unstable(rate, f"KV cache of {capacity} tokens full")
        if load.tokens > budget and config.chunked_prefill:
            return _unstable(rate, f"step token budget {budget} exhausted")
        following = step_time(config, load, efficiency).total_s
        converged = abs(following - step_s) <= _TOLERANCE * following
        step_s = following
        if converged:
            break
    else:
        return _unstable(rate, "no steady state: load grows faster than steps")

    load, batch = load_at(step_s)
    step = step_time(config, load, efficiency)
    ttft_mean = ttft_p95 = rho = 0.0
    if prefill:
        riders = math.ceil(batch) if decode else 0
        service = prefill_seconds(
            config,
            input_tokens,
            efficiency,
            decode_sequences=riders,
            decode_context_tokens=math.ceil(batch * mean_context),
        )
        chunk = max(1, budget - riders) if config.chunked_prefill else input_tokens
        full_step = step_time(
            config,
            StepLoad(
                decode_sequences=riders,
                decode_context_tokens=math.ceil(batch * mean_context),
                prefill_tokens=chunk,
                prefill_attention_pairs=chunk * input_tokens / 2,
            ),
            efficiency,
        ).total_s
        rho = rate * input_tokens * full_step / chunk
        if rho >= 1:
            return _unstable(rate, "prefill demand exceeds prefill capacity")
        mean_wait = rho * service / (2 * (1 - rho))
        ttft_mean = service + mean_wait
        ttft_p95 = service + _wait_percentile(mean_wait, rho, 0.95)
    return OperatingPoint(
        rate=rate,
        stable=True,
        limit="",
        step_s=step_s,
        batch=batch,
        ttft_mean_s=ttft_mean,
        ttft_p95_s=ttft_p95,
        tpot_s=step_s if decode else 0.0,
        prefill_utilisation=rho,
        mfu=utilisation(step.flops_per_gpu, step.total_s, config.linear_flops_rate),
        mbu=utilisation(step.bytes_per_gpu, step.total_s, config.gpu.memory_bandwidth),
    )


def closed_loop_point(
    config: ReplicaConfig,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> OperatingPoint:
    """Steady state with `concurrency` clients each sending the next request when the last one
    ends (how benchmark tools sweep concurrency): the rate where rate x latency = concurrency.
    When the replica cannot hold that many (KV cache, batch limit), the rest would queue: the
    highest stable rate is returned."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 (got {concurrency})")

    def in_flight(point: OperatingPoint) -> float:
        return point.rate * (point.ttft_mean_s + output_tokens * point.tpot_s)

    low, high = 0.0, 1.0
    while operating_point(
        config, high, input_tokens, output_tokens, efficiency=efficiency
    ).stable and (
        in_flight(operating_point(config, high, input_tokens, output_tokens, efficiency=efficiency))
        < concurrency
    ):
        low, high = high, high * 2
    for _ in range(60):
        middle = (low + high) / 2
        point = operating_point(config, middle, input_tokens, output_tokens, efficiency=efficiency)
        if point.stable and in_flight(point) < concurrency:
            low = middle
        else:
            high = middle
    return operating_point(config, low, input_tokens, output_tokens, efficiency=efficiency)
