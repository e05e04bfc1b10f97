"""Latency of one replica under a steady load: the operating point of continuous batching.

At an arrival rate of `rate` requests/s with fixed prompt and output lengths, a mean step of
length t decodes B = rate x output x t sequences (Little's law) and must absorb the
rate x input x t prompt tokens that arrived meanwhile. Engines prefill a prompt in as few steps
as the token budget allows, so the prompt tokens are not spread thinly over every step: a share
of steps carries a whole prompt (or chunk) and is compute-bound, the rest only decode and are
bandwidth-bound. The mean step t is the smallest fixed point of that mix; none exists when the
replica is overloaded (the batch, the KV cache or the token budget would have to grow without
bound).

TTFT is the rest of the step running when the request arrives, the prefill service time
(chunks sharing steps with the running decodes) and a queueing wait for the prefill budget,
taken as M/D/1: mean W = rho x S / (2 (1 - rho)); for percentiles the wait is an atom at zero
(probability 1 - rho) and an exponential tail of mean W / rho. A step takes every prompt
waiting when it starts and all of them get their first token when it ends, so the p95 also
counts the prompts that share a prompt's last step (`_sharing_step_s`). Against the emulated
engine scheduler (`inferfleet.sim.scheduler.EngineCore`) under Poisson arrivals of Llama 3.1
8B FP8 on an H100 (1000/200, 200/500, 2000/100 and 8000/200 tokens, 30-90% of saturation) the
p95 TTFT is within 11% (M/D/1 alone: up to 18% low); a prefill-only replica (500-4000-token
prompts, 50-85% of saturation) within 18%, where M/D/1 alone was up to 34% low, and 16-26%
high at 92%. The mean is 1-14% low up to 70% (19% at 2000/100) and up to 20% low at 90%.
The exact M/D/1 tail (Cramer-Lundberg) fitted the emulator worse and was not kept.

Prompts of varied lengths (`input_tokens_cv2`, their squared coefficient of variation) queue
longer, by Pollaczek-Khinchine's 1 + cv2, and a long prompt's own prefill sets the tail
(`_served_percentile`). Production prompts spread (cv2 0.92 and 0.93 in the Azure 2023
conversation and code traces); against the scheduler with lognormal lengths of cv2 0.5-1, the
p95 TTFT is within 24% (mostly 15%), where planning at the mean length was 25-59% low.

TPOT is the mean step as a decoding request lives it: under Poisson arrivals prompts bunch and
the batch grows while they are prefilled back to back, so requests spend more of their steps in
the long ones than the plain mean step says (`_request_step`). Against the same emulator, TPOT
is within 6% for 1000/200 and 200/500, and low by up to 14% (2000/100) and 23% (8000/200) at
90% of saturation, where the plain mean step was 24% and 32% low. The p95 over requests is not
the mean: a request that decodes few tokens lives through few steps, and whether prompt chunks
fall in them decides its TPOT (`_tpot_spread`). Against the fleet simulator's emulated engines
(Llama 3.1 8B on an L40S, the Azure 2023 conversation trace and lognormal lengths, per minute)
the p95 is 0-9% low at the median, where the mean taken as the p95 was 13-22% low
(docs/calibration.md).

Open-loop arrivals also wait for a sequence slot: the mean batch may fit the KV cache while
Poisson arrivals find it full part of the time (`_admission_wait`, M/M/c). For Llama 3.1 8B
BF16 on an L4 (about 20 sequences of 1000/200 tokens) at 90% of the cache's limit, the
emulator's p95 TTFT is 3.3 s and this wait gives 4.2 s; without it the planner said 0.6 s.

Closed-loop clients (`closed_loop_point`) do not bunch; beyond the sequences the replica admits
they wait in its admission queue, which Little's law prices.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from inferfleet.planning.memory import plan_memory
from inferfleet.planning.performance import (
    DEFAULT_EFFICIENCY,
    EfficiencyTerms,
    StepLoad,
    StepTime,
    prefill_seconds,
    step_time,
    utilisation,
)
from inferfleet.planning.replica import ReplicaConfig

_MAX_ITERATIONS = 200
_TOLERANCE = 1e-9
_BISECTIONS = 60
_TPOT_BISECTIONS = 30
_RATE_TOLERANCE = 1e-5
# Below this share of the clients, a shortfall of the bisection is not a queue.
_QUEUE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class TpotSpread:
    """What spreads requests' TPOT around its mean (`_tpot_spread`). `step_s`: the standard
    deviation one step adds to a request's summed step lengths (the chunks some steps carry,
    by their share and the prompts' spread); a request of n output tokens has its TPOT spread
    by step_s / sqrt(n - 1). `output_tokens`: the requests' mean output length. All zero:
    every request's TPOT is the mean."""

    step_s: float = 0.0
    output_tokens: int = 0


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
    """The mean over requests of their TPOT."""
    tpot_spread: TpotSpread
    """How requests' TPOT spreads around the mean (`tpot_percentile`)."""
    prefill_utilisation: float
    mfu: float
    mbu: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch / self.step_s if self.step_s > 0 else 0.0

    @property
    def tpot_p95_s(self) -> float:
        """The p95 over requests of their TPOT (what an SLO's TPOT target is judged on)."""
        return self.tpot_percentile(0.95)

    def tpot_percentile(self, quantile: float) -> float:
        """The `quantile` over requests of their TPOT."""
        return _tpot_percentile(self.tpot_s, self.tpot_spread, quantile)


@dataclass(frozen=True)
class _StepMix:
    """Steps that decode only, and steps that also carry a prompt (a `prefill_share` of them)."""

    batch: float
    arriving_prefill_tokens: float
    prefill_share: float
    prompts_per_prefill_step: float
    decode_only: StepTime
    mixed: StepTime

    def _mean(self, decode_only: float, mixed: float) -> float:
        return (1 - self.prefill_share) * decode_only + self.prefill_share * mixed

    @property
    def mean_s(self) -> float:
        return self._mean(self.decode_only.total_s, self.mixed.total_s)

    @property
    def flops_per_gpu(self) -> float:
        return self._mean(self.decode_only.flops_per_gpu, self.mixed.flops_per_gpu)

    @property
    def bytes_per_gpu(self) -> float:
        return self._mean(self.decode_only.bytes_per_gpu, self.mixed.bytes_per_gpu)


def _wait_percentile(mean_wait: float, rho: float, quantile: float) -> float:
    """Percentile of a wait with P(wait > 0) = rho and an exponential tail of mean mean_wait/rho."""
    tail = 1 - quantile
    if rho <= tail or mean_wait <= 0:
        return 0.0
    return mean_wait / rho * math.log(rho / tail)


def _request_step(mix: _StepMix, mean_step_s: float, output_tokens: int) -> float:
    """The mean step as decoding requests live it (their TPOT), under Poisson arrivals.

    Each step gives every running sequence one token, so a request's TPOT is the mean of the
    steps it runs through: steps weighted by the batch, E[B s] / E[B], not the plain mean. The
    two differ because the batch grows while prompts are prefilled back to back: arrivals
    bunch, a busy period of prefill steps follows, and every prompt it finishes joins the
    decodes while the steps are long. In a busy period of the prefill queue (M/D/1, time share
    rho in prefill steps), a prefill step has on average ((1 - rho)^-2 - 1) / 2 earlier steps
    of its period, each adding its prompts to the batch. With B_p = B_d + extra in prefill
    steps (share q, length P) and B_d in decode-only ones (length d):
    E[B s] / E[B] = mean step + q (1 - q) extra (P - d) / E[B]."""
    share = mix.prefill_share
    if share <= 0 or share >= 1 or mix.batch <= 0:
        return mean_step_s
    busy = share * mix.mixed.total_s / mean_step_s
    if busy >= 1:
        return mean_step_s
    joined = mix.prompts_per_prefill_step
    # Bounded by the batch itself, and by what joins before the first joiner finishes.
    extra = min(joined * ((1 - busy) ** -2 - 1) / 2, mix.batch / share, joined * output_tokens)
    longer = mix.mixed.total_s - mix.decode_only.total_s
    return mean_step_s + share * (1 - share) * extra * longer / mix.batch


# Output lengths are neither declared nor measured: they are taken to spread as exponentially
# distributed lengths do (a coefficient of variation of 1; the Azure 2023 conversation trace
# measures 0.77, the code trace 2.1), at these evenly spaced quantiles.
_OUTPUT_LENGTH_QUANTILES = tuple((i + 0.5) / 32 for i in range(32))


def _tpot_spread(mix: _StepMix, output_tokens: int, input_tokens_cv2: float) -> TpotSpread:
    """How requests' TPOT spreads: the steps each one runs through, of which a share carries a
    prompt chunk and lasts longer.

    A request decoding n tokens runs through n - 1 steps after its first, K of them carrying a
    chunk (share q) that adds D to the step. Chunks come in the busy periods of the prefill
    queue, not one step at a time: over a window the busy time of an M/D/1 queue varies as
    rho x S x T (a renewal count of its busy cycles), q (n - 1) steps' worth rather than the
    binomial q (1 - q) (n - 1); and D varies as the prompts do (cv2 of the prompt lengths). So
    a request's TPOT has the mean TPOT as its mean and variance q E[D]^2 (1 + cv2) / (n - 1),
    taken as normal: requests of few tokens spread widest."""
    share = mix.prefill_share
    longer = mix.mixed.total_s - mix.decode_only.total_s
    if share <= 0 or longer <= 0 or output_tokens < 2:
        return TpotSpread()
    return TpotSpread(longer * math.sqrt(share * (1 + input_tokens_cv2)), output_tokens)


@functools.lru_cache(maxsize=4096)
def _tpot_percentile(mean_s: float, spread: TpotSpread, quantile: float) -> float:
    """The `quantile` over requests of their TPOT, over exponentially distributed output
    lengths (`_OUTPUT_LENGTH_QUANTILES`): the mixture's tail, solved by bisection."""
    if spread.step_s <= 0 or not math.isfinite(mean_s):
        return mean_s
    deviations = [
        spread.step_s / math.sqrt(max(2.0, -spread.output_tokens * math.log(1 - u)) - 1)
        for u in _OUTPUT_LENGTH_QUANTILES
    ]
    tail = 1 - quantile

    def beyond(excess: float) -> float:
        return sum(math.erfc(excess / (d * math.sqrt(2))) for d in deviations) / (
            2 * len(deviations)
        )

    low, high = 0.0, 10 * max(deviations)
    for _ in range(_TPOT_BISECTIONS):
        middle = (low + high) / 2
        if beyond(middle) > tail:
            low = middle
        else:
            high = middle
    return mean_s + high


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
        tpot_spread=TpotSpread(),
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
    input_tokens_cv2: float = 0.0,
) -> OperatingPoint:
    """Steady state at `rate` req/s. `prefill`/`decode` False model a disaggregated pool that
    does only the other half of the work. The KV cache must hold every decoding sequence's whole
    context (input + output): the margin a planner keeps, as an engine whose paged cache fills
    up preempts and recomputes. `input_tokens_cv2`: the squared coefficient of variation of
    the prompt lengths (variance over the squared mean; 0: all `input_tokens` long)."""
    return _steady_state(
        config,
        rate,
        input_tokens,
        output_tokens,
        efficiency=efficiency,
        prefill=prefill,
        decode=decode,
        held_whole=True,
        poisson=True,
        input_tokens_cv2=input_tokens_cv2,
    )


@dataclass(frozen=True)
class _Load:
    """What one replica is asked to serve: the arrivals, their lengths, and which halves of the
    work it does (a disaggregated pool does only one)."""

    config: ReplicaConfig
    rate: float
    input_tokens: int
    output_tokens: int
    efficiency: EfficiencyTerms
    prefill: bool
    decode: bool
    input_tokens_cv2: float = 0.0

    @property
    def mean_context(self) -> float:
        return self.input_tokens + self.output_tokens / 2


def _steady_state(
    config: ReplicaConfig,
    rate: float,
    input_tokens: int,
    output_tokens: int,
    *,
    efficiency: EfficiencyTerms,
    prefill: bool,
    decode: bool,
    held_whole: bool,
    poisson: bool,
    input_tokens_cv2: float = 0.0,
) -> OperatingPoint:
    """`held_whole` False: a sequence holds only its mean context in a paged KV cache
    (input + output / 2), as engines that allocate blocks as tokens come do on average.
    `poisson`: arrivals are independent (open loop), so they bunch and the requests' TPOT is
    longer than the mean step; closed-loop clients stay spread out."""
    if rate < 0 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("rate must be >= 0 and token counts >= 1")
    if not (input_tokens_cv2 >= 0 and math.isfinite(input_tokens_cv2)):
        raise ValueError(f"input_tokens_cv2 must be >= 0 (got {input_tokens_cv2})")
    load = _Load(
        config, rate, input_tokens, output_tokens, efficiency, prefill, decode, input_tokens_cv2
    )
    context = input_tokens + output_tokens if held_whole else load.mean_context
    step_s = _mean_step(load, context)
    if isinstance(step_s, str):
        return _unstable(rate, step_s)
    mix = _steps_at(load, step_s)
    ttft = _ttft(load, mix.batch, step_s) if prefill else (0.0, 0.0, 0.0)
    if isinstance(ttft, str):
        return _unstable(rate, ttft)
    ttft_mean, ttft_p95, rho = ttft
    tpot = 0.0
    if decode:
        tpot = _request_step(mix, step_s, output_tokens) if poisson else step_s
    if poisson and decode:
        admission = _admission_wait(load, context, ttft_mean + output_tokens * step_s)
        if isinstance(admission, str):
            return _unstable(rate, admission)
        ttft_mean, ttft_p95 = ttft_mean + admission[0], ttft_p95 + admission[1]
    return OperatingPoint(
        rate=rate,
        stable=True,
        limit="",
        step_s=step_s,
        batch=mix.batch,
        ttft_mean_s=ttft_mean,
        ttft_p95_s=ttft_p95,
        tpot_s=tpot,
        tpot_spread=_tpot_spread(mix, output_tokens, input_tokens_cv2) if decode else TpotSpread(),
        prefill_utilisation=rho,
        mfu=utilisation(mix.flops_per_gpu, mix.mean_s, config.linear_flops_rate),
        mbu=utilisation(mix.bytes_per_gpu, mix.mean_s, config.gpu.memory_bandwidth),
    )


def _erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (Erlang C), from the Erlang B
    recursion, which stays stable for hundreds of servers and a fractional offered load."""
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1 - blocking))


def _admission_wait(load: _Load, context: float, lifetime_s: float) -> tuple[float, float] | str:
    """Mean and p95 wait for a free sequence slot under Poisson arrivals, or why none frees.

    The replica holds at most `slots` sequences (its KV cache full of whole contexts, or
    `max_sequences`); each holds its slot for its lifetime (prefill and every decode step).
    Taken as M/M/c: lifetimes vary as output lengths do, and exponential lifetimes sit between
    fixed-length benchmarks (a shorter wait) and production tails (a longer one). P(wait > t) =
    C exp(-(c - a) t / lifetime), with C the Erlang C probability and a = rate x lifetime. Near
    a full cache this wait dominates TTFT, where the mean batch alone still looks stable."""
    config = load.config
    capacity = plan_memory(config).kv_capacity_tokens
    slots = max(1, min(config.max_sequences, math.floor(capacity / context)))
    offered = load.rate * lifetime_s
    if offered >= slots:
        return f"KV cache of {capacity} tokens full"
    if offered <= 0:
        return 0.0, 0.0
    waits = _erlang_c(slots, offered)
    drain_s = lifetime_s / (slots - offered)
    tail = 1 - 0.95
    p95 = drain_s * math.log(waits / tail) if waits > tail else 0.0
    return waits * drain_s, p95


def _steps_at(load: _Load, mean_step_s: float) -> _StepMix:
    """The mix of steps when the mean step lasts `mean_step_s`: a prompt is prefilled in as few
    steps as the budget allows (as engines schedule it), so a fraction of steps carries
    prefill work and the rest only decode."""
    config, input_tokens = load.config, load.input_tokens
    budget = config.max_batched_tokens
    batch = load.rate * load.output_tokens * mean_step_s if load.decode else 0.0
    riders = math.ceil(batch)
    arriving = load.rate * input_tokens * mean_step_s if load.prefill else 0.0
    room = max(1, budget - riders) if config.chunked_prefill else input_tokens
    per_prefill_step = min(room, max(float(min(input_tokens, room)), arriving))
    share = min(1.0, arriving / per_prefill_step) if arriving > 0 else 0.0
    decode_only = StepLoad(
        decode_sequences=riders, decode_context_tokens=math.ceil(batch * load.mean_context)
    )
    mixed = StepLoad(
        decode_sequences=riders,
        decode_context_tokens=decode_only.decode_context_tokens,
        prefill_tokens=math.ceil(per_prefill_step),
        prefill_attention_pairs=per_prefill_step * input_tokens / 2,
    )
    return _StepMix(
        batch=batch,
        arriving_prefill_tokens=arriving,
        prefill_share=share,
        prompts_per_prefill_step=per_prefill_step / input_tokens,
        decode_only=step_time(config, decode_only, load.efficiency),
        mixed=step_time(config, mixed, load.efficiency),
    )


def _mean_step(load: _Load, context: float) -> float | str:
    """The mean step of the steady state (the smallest fixed point, from an idle step up), or
    what keeps the replica from one when it is overloaded. `context`: tokens of KV cache one
    decoding sequence holds."""
    config = load.config
    capacity = plan_memory(config).kv_capacity_tokens
    budget = config.max_batched_tokens
    step_s = step_time(config, StepLoad(), load.efficiency).total_s
    for _ in range(_MAX_ITERATIONS):
        mix = _steps_at(load, step_s)
        if mix.batch > config.max_sequences:
            return f"batch above maxSequences {config.max_sequences}"
        if mix.batch * context > capacity:
            return f"KV cache of {capacity} tokens full"
        if config.chunked_prefill and mix.arriving_prefill_tokens + mix.batch > budget:
            return f"step token budget {budget} exhausted"
        following = mix.mean_s
        converged = abs(following - step_s) <= _TOLERANCE * following
        step_s = following
        if converged:
            return step_s
    return "no steady state: load grows faster than steps"


def _ttft(load: _Load, batch: float, step_s: float) -> tuple[float, float, float] | str:
    """Mean and p95 TTFT and the prefill queue's utilisation (rho) at the steady state, or why
    prefill cannot keep up."""
    config, input_tokens = load.config, load.input_tokens
    budget = config.max_batched_tokens
    riders = math.ceil(batch) if load.decode else 0
    service = prefill_seconds(
        config,
        input_tokens,
        load.efficiency,
        decode_sequences=riders,
        decode_context_tokens=math.ceil(batch * load.mean_context),
    )
    chunk = max(1, budget - riders) if config.chunked_prefill else input_tokens
    full_step = step_time(
        config,
        StepLoad(
            decode_sequences=riders,
            decode_context_tokens=math.ceil(batch * load.mean_context),
            prefill_tokens=chunk,
            prefill_attention_pairs=chunk * input_tokens / 2,
        ),
        load.efficiency,
    ).total_s
    rho = load.rate * input_tokens * full_step / chunk
    if rho >= 1:
        return "prefill demand exceeds prefill capacity"
    cv2 = load.input_tokens_cv2
    # Pollaczek-Khinchine: prompts of varied lengths queue longer than fixed ones, by the
    # spread of their service times (taken as proportional to their lengths).
    mean_wait = rho * service * (1 + cv2) / (2 * (1 - rho))
    # An arrival also waits out the step already running (half of one, on average).
    residual = min(1.0, batch) * step_s / 2
    ttft_mean = residual + service + mean_wait
    ttft_p95 = (
        step_s * min(1.0, batch)
        + _served_percentile(service, cv2, mean_wait, rho, 0.95)
        + _sharing_step_s(service, rho, prompts_per_step=chunk / input_tokens, cv2=cv2)
    )
    return ttft_mean, ttft_p95, rho


_LENGTH_QUANTILES = 64


def _served_percentile(
    service: float, cv2: float, mean_wait: float, rho: float, quantile: float
) -> float:
    """Percentile of a prompt's queueing wait plus its own prefill, independent of each other.

    The wait is as `_wait_percentile` takes it. With fixed lengths the prefill is `service`;
    else it is proportional to the prompt's length, taken as lognormal with the given squared
    coefficient of variation and mean `service` (a long prompt's own prefill is what sets the
    tail of a varied load: at the conversation trace's spread, cv2 0.92, the p95 TTFT of a
    prefill replica is twice that of the same load at its mean length)."""
    if cv2 <= 0:
        return service + _wait_percentile(mean_wait, rho, quantile)
    sigma = math.sqrt(math.log1p(cv2))
    normal = NormalDist(math.log(service) - sigma * sigma / 2, sigma)
    # Prefill times at evenly spaced quantiles of the lengths, each as likely as the others.
    served_at = [
        math.exp(normal.inv_cdf((i + 0.5) / _LENGTH_QUANTILES)) for i in range(_LENGTH_QUANTILES)
    ]
    tail = mean_wait / rho if rho > 0 else 0.0

    def exceeds(t: float) -> float:
        above = 0.0
        for served in served_at:
            if served >= t:
                above += 1
            elif tail > 0:
                above += rho * math.exp(-(t - served) / tail)
        return above / _LENGTH_QUANTILES

    # Past the longest prompt's prefill plus the wait's own percentile, fewer exceed.
    low, high = 0.0, served_at[-1] + _wait_percentile(mean_wait, rho, quantile)
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        if exceeds(middle) > 1 - quantile:
            low = middle
        else:
            high = middle
    return high


def _sharing_step_s(
    service: float, rho: float, *, prompts_per_step: float, cv2: float = 0.0
) -> float:
    """What a prompt waits, at its p95, for the prompts that share its last step.

    A step takes the prompts waiting when it starts, and all of them get their first token
    when it ends: a prompt waits for the work queued behind it in its step as well as the
    work ahead of it, which M/D/1 (one prompt served at a time) leaves out. By symmetry the
    prompts that join its step after it carry, on average, as much as those it found there:
    the M/D/1 queue, rho^2 / (2 (1 - rho)) prompts, and half of the one in service; at most
    half of a full step. Against a Monte Carlo of that gated, chunked queue (Poisson
    arrivals, 500-4000-token prompts, an 8,192-token budget, 50-92% utilisation) the p95
    comes within 9%, where M/D/1 alone was up to 29% low. The mean is left as it was (4-24%
    below that queue's): the closed-loop points of the calibration table compare means, and
    the p95 is what sizes a pool."""
    queued = (rho * rho / (2 * (1 - rho)) + rho / 2) * (1 + cv2)
    return service * min(queued, prompts_per_step / 2)


def closed_loop_point(
    config: ReplicaConfig,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
) -> OperatingPoint:
    """Steady state with `concurrency` clients each sending the next request when the last one
    ends (how benchmark tools sweep concurrency): the rate where rate x latency = concurrency.

    The replica admits at most `admitted_sequences` requests at once (its paged KV cache full
    of sequences at their mean context, or `max_sequences`); clients beyond
    the requests it holds wait in its admission queue. Little's law gives that wait: the queue
    holds the clients not in service, and drains at the request rate, so each queued request
    waits queued / rate before its prefill starts. It adds to TTFT, mean and p95 alike: with a
    fixed number of clients the queue stays about as long, so its wait barely varies."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 (got {concurrency})")

    def point_at(rate: float) -> OperatingPoint:
        return _steady_state(
            config,
            rate,
            input_tokens,
            output_tokens,
            efficiency=efficiency,
            prefill=True,
            decode=True,
            held_whole=False,
            poisson=False,
        )

    def in_flight(point: OperatingPoint) -> float:
        return point.rate * (point.ttft_mean_s + output_tokens * point.tpot_s)

    served = min(concurrency, admitted_sequences(config, input_tokens, output_tokens))
    low, high = 0.0, 1.0
    point = point_at(high)
    while point.stable and in_flight(point) < served:
        low, high = high, high * 2
        point = point_at(high)
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        point = point_at(middle)
        if point.stable and in_flight(point) < served:
            low = middle
        else:
            high = middle
        if high - low <= _RATE_TOLERANCE * high:
            break
    point = point_at(low)
    queued = concurrency - in_flight(point)
    if point.rate <= 0 or queued <= _QUEUE_TOLERANCE * concurrency:
        return point
    wait = queued / point.rate
    return replace(
        point,
        limit=f"{queued:.0f} of {concurrency} clients queue for admission",
        ttft_mean_s=point.ttft_mean_s + wait,
        ttft_p95_s=point.ttft_p95_s + wait,
    )


def admitted_sequences(config: ReplicaConfig, input_tokens: int, output_tokens: int) -> int:
    """Requests the replica holds at once in steady state, whichever bound is lower: its paged
    KV cache, which engines fill block by block as tokens come (a sequence half way through
    its output on average: input + output / 2 tokens), or `max_sequences`."""
    capacity = plan_memory(config).kv_capacity_tokens
    mean_context = input_tokens + output_tokens / 2
    return max(1, min(config.max_sequences, math.floor(capacity / mean_context)))
