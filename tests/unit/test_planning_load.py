"""Latency under load: the closed loop's admission queue, and open-loop TTFT against the
engine emulator's scheduler under Poisson arrivals."""

from __future__ import annotations

import math
import random
from typing import NamedTuple

import pytest

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import Role
from inferfleet.planning.load import admitted_sequences, closed_loop_point, operating_point
from inferfleet.planning.memory import plan_memory
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.scheduler import EngineCore, EngineRequest
from tests.unit.planning_fixtures import fp8, replica

LLAMA_70B_TP2 = fp8(replica("llama-3.3-70b", tensor=2, max_sequences=256))
LLAMA_8B = fp8(replica("llama-3.1-8b", max_sequences=256))
# BF16 weights leave an L4 room for about 20 sequences of a chat request: the KV cache binds.
LLAMA_8B_L4 = replica("llama-3.1-8b", gpu=GpuType.L4_24GB, max_sequences=256)


def test_the_paged_kv_cache_admits_sequences_at_their_mean_context() -> None:
    capacity = plan_memory(LLAMA_70B_TP2).kv_capacity_tokens
    assert admitted_sequences(LLAMA_70B_TP2, 5000, 500) == capacity // 5250
    capped = fp8(replica("llama-3.1-8b", max_sequences=16))
    assert admitted_sequences(capped, 200, 200) == 16


def test_clients_the_replica_holds_see_no_admission_queue() -> None:
    point = closed_loop_point(LLAMA_70B_TP2, 50, 5000, 500)
    assert point.limit == ""
    in_flight = point.rate * (point.ttft_mean_s + 500 * point.tpot_s)
    assert in_flight == pytest.approx(50, rel=1e-3)


def test_clients_beyond_the_kv_cache_wait_their_turn_by_littles_law() -> None:
    admitted = admitted_sequences(LLAMA_70B_TP2, 5000, 500)
    full = closed_loop_point(LLAMA_70B_TP2, admitted + 1, 5000, 500)
    over = closed_loop_point(LLAMA_70B_TP2, admitted + 41, 5000, 500)
    # The replica runs as full as it can either way: same rate, same decode steps.
    assert over.rate == pytest.approx(full.rate, rel=1e-6)
    assert over.tpot_s == pytest.approx(full.tpot_s, rel=1e-6)
    # 40 more clients queue; they drain at the request rate, so each waits 40 / rate longer.
    assert over.ttft_mean_s - full.ttft_mean_s == pytest.approx(40 / over.rate, rel=1e-3)
    assert over.ttft_p95_s - full.ttft_p95_s == pytest.approx(40 / over.rate, rel=1e-3)
    assert "queue for admission" in over.limit
    # Little's law over the whole loop: every client is queued, prefilling or decoding.
    assert over.rate * (over.ttft_mean_s + 500 * over.tpot_s) == pytest.approx(
        admitted + 41, rel=1e-3
    )


def test_the_max_sequences_limit_queues_clients_too() -> None:
    capped = fp8(replica("llama-3.1-8b", max_sequences=8))
    point = closed_loop_point(capped, 24, 1000, 200)
    assert point.batch <= 8
    assert point.ttft_mean_s > 16 / point.rate


class _Latency(NamedTuple):
    ttft_mean_s: float
    ttft_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float


def _emulated(
    rate: float,
    input_tokens: int,
    output_tokens: int,
    config: ReplicaConfig = LLAMA_8B,
    *,
    role: Role = Role.AGGREGATED,
    input_tokens_cv2: float = 0.0,
    output_tokens_cv2: float = 0.0,
) -> _Latency:
    """Mean and p95 TTFT and TPOT of the scheduler core under Poisson arrivals (the middle 80%
    of 1500 requests; TPOT over those of two tokens or more). In the prefill role a prompt's
    TTFT ends with its hand-off (no TPOT: 0). With `input_tokens_cv2` and `output_tokens_cv2`,
    lengths are lognormal of the given mean and squared coefficient of variation."""
    count = 1500
    lengths = _lognormal_lengths(input_tokens, input_tokens_cv2, count)
    outputs = _lognormal_lengths(output_tokens, output_tokens_cv2, count, seed=5)
    rng = random.Random(7)
    core = EngineCore(config, role, prefix_caching=False)
    arrivals: list[float] = []
    clock = 0.0
    for _ in range(count):
        clock += rng.expovariate(rate)
        arrivals.append(clock)
    first_token: dict[int, float] = {}
    finished: dict[int, float] = {}
    now, added = 0.0, 0
    while added < count or core.has_work:
        while added < count and arrivals[added] <= now:
            core.add_request(EngineRequest(str(added), lengths[added], outputs[added]))
            added += 1
        result = core.step(now) if core.has_work else None
        if result is None or result.idle:
            now = arrivals[added]
            continue
        for request_id in result.first_tokens:
            first_token[int(request_id)] = result.end_s
        for handoff in result.handoffs:
            first_token[int(handoff.request_id)] = result.end_s
        for request_id in result.finished:
            finished[int(request_id)] = result.end_s
        now = result.end_s
    middle = range(count // 10, count - count // 10)
    ttfts = sorted(first_token[k] - arrivals[k] for k in middle)
    ttft_mean, ttft_p95 = sum(ttfts) / len(ttfts), ttfts[int(0.95 * len(ttfts))]
    if role is Role.PREFILL:
        return _Latency(ttft_mean, ttft_p95, 0.0, 0.0)
    tpots = sorted(
        (finished[k] - first_token[k]) / (outputs[k] - 1) for k in middle if outputs[k] > 1
    )
    return _Latency(ttft_mean, ttft_p95, sum(tpots) / len(tpots), tpots[int(0.95 * len(tpots))])


def _lognormal_lengths(mean: int, cv2: float, count: int, seed: int = 3) -> list[int]:
    if cv2 <= 0:
        return [mean] * count
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(cv2))
    mu = math.log(mean) - sigma * sigma / 2
    return [max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(count)]


def _saturation_rate(input_tokens: int, output_tokens: int, *, decode: bool = True) -> float:
    low, high = 0.0, 1000.0
    for _ in range(40):
        middle = (low + high) / 2
        point = operating_point(LLAMA_8B, middle, input_tokens, output_tokens, decode=decode)
        if point.stable:
            low = middle
        else:
            high = middle
    return low


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "load"),
    [(1000, 200, 0.7), (8000, 200, 0.5), (8000, 200, 0.7)],
)
def test_open_loop_latency_agrees_with_the_scheduler_under_poisson_arrivals(
    input_tokens: int, output_tokens: int, load: float
) -> None:
    rate = load * _saturation_rate(input_tokens, output_tokens)
    point = operating_point(LLAMA_8B, rate, input_tokens, output_tokens)
    mean, p95, tpot, _ = _emulated(rate, input_tokens, output_tokens)
    assert point.ttft_mean_s == pytest.approx(mean, rel=0.15)
    assert point.ttft_p95_s == pytest.approx(p95, rel=0.15)
    assert point.ttft_p95_s > point.ttft_mean_s
    assert point.tpot_s == pytest.approx(tpot, rel=0.15)


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "load"), [(1000, 200, 0.9), (2000, 100, 0.7)]
)
def test_the_p95_ttft_near_saturation_counts_the_prompts_sharing_a_step(
    input_tokens: int, output_tokens: int, load: float
) -> None:
    """Prompts that share a step get their first token when it ends; M/D/1 alone, one prompt
    at a time, put these p95s 14% and 18% low. (The mean stays up to 19% low here.)"""
    rate = load * _saturation_rate(input_tokens, output_tokens)
    point = operating_point(LLAMA_8B, rate, input_tokens, output_tokens)
    p95 = _emulated(rate, input_tokens, output_tokens).ttft_p95_s
    assert point.ttft_p95_s == pytest.approx(p95, rel=0.1)


@pytest.mark.parametrize(("input_tokens", "load"), [(1200, 0.75), (1200, 0.85), (500, 0.85)])
def test_a_prefill_replica_p95_counts_the_prompts_that_share_its_step(
    input_tokens: int, load: float
) -> None:
    """A prefill-only replica packs every waiting prompt into a step of up to 8,192 tokens, and
    all of them get their first token when it ends: at 75-85% utilisation the p95 is a third
    longer than one prompt served at a time (M/D/1) gives."""
    rate = load * _saturation_rate(input_tokens, 1, decode=False)
    point = operating_point(LLAMA_8B, rate, input_tokens, 1, decode=False)
    p95 = _emulated(rate, input_tokens, 1, role=Role.PREFILL).ttft_p95_s
    assert point.ttft_p95_s == pytest.approx(p95, rel=0.15)


@pytest.mark.parametrize(
    ("role", "input_tokens", "output_tokens", "load"),
    [
        (Role.PREFILL, 1200, 1, 0.7),
        (Role.PREFILL, 1200, 1, 0.85),
        (Role.AGGREGATED, 1000, 200, 0.5),
        (Role.AGGREGATED, 1000, 200, 0.85),
    ],
)
def test_the_p95_ttft_counts_how_widely_prompt_lengths_spread(
    role: Role, input_tokens: int, output_tokens: int, load: float
) -> None:
    """Prompts of varied lengths (lognormal, cv2 1, as production traces show: the Azure 2023
    conversation and code traces are 0.92 and 0.93) queue longer than fixed ones, and a long
    prompt's own prefill sets the tail. Planned at the mean length, these p95s are 39-52% low."""
    decode = role is not Role.PREFILL
    rate = load * _saturation_rate(input_tokens, output_tokens, decode=decode)
    p95 = _emulated(rate, input_tokens, output_tokens, role=role, input_tokens_cv2=1.0).ttft_p95_s
    spread = operating_point(
        LLAMA_8B, rate, input_tokens, output_tokens, decode=decode, input_tokens_cv2=1.0
    )
    assert spread.ttft_p95_s == pytest.approx(p95, rel=0.15)
    fixed = operating_point(LLAMA_8B, rate, input_tokens, output_tokens, decode=decode)
    assert fixed.ttft_p95_s < 0.65 * p95


def test_the_spread_of_prompt_lengths_leaves_decoding_alone() -> None:
    fixed = operating_point(LLAMA_8B, 20.0, 1000, 200)
    spread = operating_point(LLAMA_8B, 20.0, 1000, 200, input_tokens_cv2=1.0)
    assert spread.tpot_s == fixed.tpot_s
    assert spread.ttft_mean_s > fixed.ttft_mean_s
    with pytest.raises(ValueError, match="input_tokens_cv2"):
        operating_point(LLAMA_8B, 20.0, 1000, 200, input_tokens_cv2=-0.1)


def test_requests_live_longer_steps_than_the_mean_under_poisson_arrivals() -> None:
    """Prompts bunch, and the batch grows while they are prefilled back to back: a decoding
    request spends more of its steps in the long ones. Closed-loop clients do not bunch."""
    point = operating_point(LLAMA_8B, 3.5, 8000, 200)
    assert point.tpot_s > 1.05 * point.step_s
    quiet = operating_point(LLAMA_8B, 0.2, 8000, 200)
    assert quiet.tpot_s == pytest.approx(quiet.step_s, rel=0.01)
    closed = closed_loop_point(LLAMA_8B, 16, 8000, 200)
    assert closed.tpot_s == closed.step_s


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "load"),
    [(1000, 200, 0.3), (1000, 200, 0.5), (1000, 200, 0.7), (2000, 100, 0.5)],
)
def test_the_p95_tpot_counts_the_requests_whose_few_steps_carry_prompt_chunks(
    input_tokens: int, output_tokens: int, load: float
) -> None:
    """Prompts and outputs of varied lengths (lognormal, cv2 1): a request decoding a few tokens
    lives through a few steps, and whether prompt chunks fall in them sets its TPOT, so the p95
    over requests is well above the mean. The planner's p95 is within 22% of the emulator's
    here (4-21% low; 24% at 2000/100, where its mean TPOT is already 9% low); the mean taken
    as the p95, as the planner did, was 18-49% low."""
    rate = load * _saturation_rate(input_tokens, output_tokens)
    emulated = _emulated(
        rate, input_tokens, output_tokens, input_tokens_cv2=1.0, output_tokens_cv2=1.0
    )
    point = operating_point(LLAMA_8B, rate, input_tokens, output_tokens, input_tokens_cv2=1.0)
    error = abs(point.tpot_p95_s / emulated.tpot_p95_s - 1)
    assert error < (0.3 if input_tokens == 2000 else 0.22)
    assert error < 0.6 * abs(point.tpot_s / emulated.tpot_p95_s - 1)


def test_a_decode_pool_without_prompt_chunks_holds_its_p95_tpot_at_the_mean() -> None:
    """A disaggregated decode replica prefills nothing here: every step is alike."""
    point = operating_point(LLAMA_8B, 10.0, 1000, 200, prefill=False, input_tokens_cv2=1.0)
    assert point.tpot_p95_s == point.tpot_s
    prefill_only = operating_point(LLAMA_8B, 10.0, 1000, 1, decode=False)
    assert prefill_only.tpot_p95_s == prefill_only.tpot_s == 0.0


def test_arrivals_wait_for_a_sequence_slot_as_the_kv_cache_fills() -> None:
    """Below a full cache on average, Poisson arrivals still find it full part of the time and
    wait for a sequence to finish: the knee the emulated engine shows, which the mean batch
    alone misses (p95 TTFT stayed under 0.7 s right up to the cache's limit)."""
    quiet = operating_point(LLAMA_8B_L4, 0.5, 1000, 200)
    near_full = operating_point(LLAMA_8B_L4, 0.9, 1000, 200)
    emulated_quiet = _emulated(0.5, 1000, 200, LLAMA_8B_L4).ttft_p95_s
    emulated_near_full = _emulated(0.9, 1000, 200, LLAMA_8B_L4).ttft_p95_s
    assert emulated_near_full > 4 * emulated_quiet
    assert near_full.ttft_p95_s > 4 * quiet.ttft_p95_s
    assert quiet.ttft_p95_s == pytest.approx(emulated_quiet, rel=0.15)
    # Lifetimes taken as exponential (M/M/c): fixed-length requests wait less than that.
    assert emulated_near_full < near_full.ttft_p95_s < 1.5 * emulated_near_full
    assert near_full.stable
    assert not operating_point(LLAMA_8B_L4, 1.2, 1000, 200).stable
