"""The engine scheduler core: batching, KV cache, prefix caching, roles and timing."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet.api.model_deployment import Role
from inferfleet.planning.capacity import KV_TRANSFER_BYTES_PER_S
from inferfleet.planning.load import operating_point
from inferfleet.planning.memory import (
    KV_BLOCK_TOKENS,
    kv_bytes_per_token,
    kv_bytes_per_token_replica,
    plan_memory,
)
from inferfleet.planning.performance import (
    StepLoad,
    decode_step_seconds,
    max_throughput,
    prefill_seconds,
    queued_run_throughput,
    saturated_batch,
    step_time,
)
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.scheduler import (
    EngineCore,
    EngineEvent,
    EngineRequest,
    EventKind,
    KvHandoff,
    RequestRejectedError,
    StepResult,
)
from tests.unit.planning_fixtures import replica

Arrival = tuple[float, EngineRequest]


@dataclass
class Run:
    """What a driven core produced, by request."""

    arrival: dict[str, float] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=dict)
    first_token: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    handoffs: dict[str, tuple[float, KvHandoff]] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)
    running_after_step: list[int] = field(default_factory=list)

    @property
    def events(self) -> list[EngineEvent]:
        return [event for step in self.steps for event in step.events()]

    def ttft(self, request_id: str) -> float:
        return self.first_token[request_id] - self.arrival[request_id]

    def tpot(self, request_id: str) -> float:
        times = self.token_times[request_id]
        return (times[-1] - times[0]) / (len(times) - 1)


def drive(core: EngineCore, arrivals: list[Arrival], start: float = 0.0) -> Run:
    """A discrete-event loop: add arrivals as the clock passes them, step, jump the clock."""
    pending = sorted(arrivals, key=lambda arrival: arrival[0])
    run = Run()
    now = start
    index = 0
    while index < len(pending) or core.has_work:
        while index < len(pending) and pending[index][0] <= now:
            at, request = pending[index]
            core.add_request(request)
            run.arrival[request.request_id] = at
            index += 1
        result = core.step(now)
        if result.idle:
            wakes = [core.next_wake_s] + ([pending[index][0]] if index < len(pending) else [])
            upcoming = [t for t in wakes if t is not None]
            assert upcoming, "the core has work but can never run it"
            now = max(now, min(upcoming))
            continue
        now = result.end_s
        run.steps.append(result)
        run.running_after_step.append(core.num_running)
        for request_id in result.tokens:
            run.token_times.setdefault(request_id, []).append(now)
        for request_id in result.first_tokens:
            run.first_token[request_id] = now
        for request_id in result.finished:
            run.finished[request_id] = now
        for handoff in result.handoffs:
            run.handoffs[handoff.request_id] = (now, handoff)
    return run


def request(
    request_id: str, prompt: int, output: int, hashes: tuple[int, ...] = (), per_hash: int = 512
) -> EngineRequest:
    return EngineRequest(request_id, prompt, output, hashes, per_hash)


def seconds(config: ReplicaConfig, load: StepLoad) -> float:
    return step_time(config, load).total_s


@pytest.mark.parametrize("prompt", [3000, 20_000])
def test_idle_request_gets_the_planner_prefill_time_then_single_decode_steps(prompt: int) -> None:
    config = replica()
    run = drive(EngineCore(config), [(0.0, request("a", prompt, 6))])

    assert run.ttft("a") == pytest.approx(prefill_seconds(config, prompt), abs=1e-9)
    gaps = [b - a for a, b in zip(run.token_times["a"], run.token_times["a"][1:], strict=False)]
    # The k-th decode computes the token at position prompt + k - 1, attending to prompt + k.
    expected = [decode_step_seconds(config, 1, prompt + k) for k in range(1, 6)]
    assert gaps == pytest.approx(expected, abs=1e-12)
    assert len(run.token_times["a"]) == 6


@pytest.mark.parametrize("chunked", [True, False])
def test_budget_and_sequence_cap_hold_in_every_step(chunked: bool) -> None:
    config = replica(max_sequences=32, max_batched_tokens=2048, chunked_prefill=chunked)
    draw = random.Random(7)
    arrivals = [
        (draw.uniform(0, 2), request(f"r{i}", draw.randint(1, 2000), draw.randint(1, 64)))
        for i in range(300)
    ]
    core = EngineCore(config)
    run = drive(core, arrivals)

    assert all(step.load.tokens <= 2048 for step in run.steps)
    assert all(step.sequences <= 32 for step in run.steps)
    assert max(run.running_after_step) <= 32
    assert max(step.sequences for step in run.steps) == 32  # the cap was reached, not avoided
    outputs = {r.request_id: r.max_output_tokens for _, r in arrivals}
    assert {rid: len(times) for rid, times in run.token_times.items()} == outputs
    assert core.stats().generation_tokens == sum(outputs.values())
    assert core.stats().prompt_tokens == sum(r.prompt_tokens for _, r in arrivals)
    assert not core.has_work
    assert core.kv_usage == 0.0


def test_chunked_prefill_keeps_running_decodes_flowing() -> None:
    config = replica()  # budget 8192
    core = EngineCore(config)
    core.add_request(request("short", 100, 1000))
    now = core.step(0.0).end_s  # "short" is now decoding
    core.add_request(request("long", 20_000, 2))

    steps: list[StepResult] = []
    while "long" not in (steps[-1].first_tokens if steps else []):
        steps.append(core.step(now))
        now = steps[-1].end_s

    # The decode takes one token of each step's budget: chunks of 8191, 8191 and 3618.
    assert len(steps) == 3
    assert [s.load.prefill_tokens for s in steps] == [8191, 8191, 3618]
    assert all(s.tokens[0] == "short" for s in steps)
    worst_chunk = StepLoad(
        decode_sequences=1,
        decode_context_tokens=100 + 4,
        prefill_tokens=8191,
        prefill_attention_pairs=8191 * (8191 + 8191 / 2),
    )
    assert max(s.duration_s for s in steps) <= seconds(config, worst_chunk) + 1e-12


def test_without_chunked_prefill_a_prompt_runs_whole_or_not_at_all() -> None:
    config = replica(chunked_prefill=False)  # budget 8192
    core = EngineCore(config)
    with pytest.raises(RequestRejectedError, match="never fits the step budget"):
        core.add_request(request("huge", 20_000, 10))

    # 150 decodes leave 8042 tokens of budget: an 8100-token prompt waits for some to finish,
    # and a short prompt behind it goes first.
    arrivals = [(0.0, request(f"d{i}", 16, 20 + i)) for i in range(150)]
    arrivals += [(0.05, request("big", 8100, 5)), (0.05, request("small", 100, 5))]
    run = drive(core, arrivals)

    big_step = next(i for i, s in enumerate(run.steps) if "big" in s.started)
    assert "big" in run.steps[big_step].first_tokens
    assert run.steps[big_step].load.prefill_tokens >= 8100
    assert run.steps[big_step].load.decode_sequences <= 8192 - 8100
    waited = [s for s in run.steps[:big_step] if s.start_s >= 0.05]
    assert waited
    assert all(s.load.decode_sequences > 8192 - 8100 for s in waited)
    assert run.first_token["small"] < run.first_token["big"]


@settings(max_examples=40, deadline=None)
@given(
    role=st.sampled_from([Role.AGGREGATED, Role.DECODE]),
    chunked=st.booleans(),
    budget=st.sampled_from([512, 2048]),
    max_sequences=st.integers(1, 16),
    blocks=st.integers(40, 400),
    caching=st.booleans(),
    shapes=st.lists(
        st.tuples(st.floats(0, 1), st.integers(1, 400), st.integers(1, 200), st.integers(0, 3)),
        min_size=1,
        max_size=40,
    ),
)
def test_any_workload_finishes_every_request_within_every_limit(
    *,
    role: Role,
    chunked: bool,
    budget: int,
    max_sequences: int,
    blocks: int,
    caching: bool,
    shapes: list[tuple[float, int, int, int]],
) -> None:
    config = replica(
        chunked_prefill=chunked, max_batched_tokens=budget, max_sequences=max_sequences
    )
    core = EngineCore(config, role, prefix_caching=caching, kv_capacity_blocks=blocks)
    arrivals = [
        (at, request(f"r{i}", prompt, output, tuple(range(family, family + 4)), per_hash=64))
        for i, (at, prompt, output, family) in enumerate(shapes)
    ]
    run = drive(core, arrivals)

    assert all(s.load.tokens <= budget and s.sequences <= max_sequences for s in run.steps)
    assert {rid: len(t) for rid, t in run.token_times.items()} == {
        r.request_id: r.max_output_tokens for _, r in arrivals
    }
    assert core.stats().prefix_cache_hits <= core.stats().prefix_cache_queries
    assert core.kv_usage == 0.0


def test_kv_exhaustion_preempts_and_the_victim_resumes_without_losing_tokens() -> None:
    config = replica()
    core = EngineCore(config, prefix_caching=False, kv_capacity_blocks=64)  # 1024 tokens
    prompts = {"a": 200, "b": 200, "c": 200, "d": 200}
    arrivals = [(0.001 * i, request(rid, p, 300)) for i, (rid, p) in enumerate(prompts.items())]
    run = drive(core, arrivals)

    assert core.stats().preemptions > 0
    preempted = [e for e in run.events if e.kind is EventKind.PREEMPTED]
    assert preempted[0].request_id == "d"  # the last admitted goes first
    counts = Counter((e.request_id, e.kind) for e in run.events)
    for rid in prompts:
        assert counts[rid, EventKind.FIRST_TOKEN] == 1
        assert counts[rid, EventKind.FIRST_TOKEN] + counts[rid, EventKind.TOKEN] == 300
        assert counts[rid, EventKind.FINISHED] == 1
    # Recompute: every preemption throws away the victim's KV (prompt + emitted - 1 tokens),
    # and all of it is computed again.
    emitted: Counter[str] = Counter()
    lost = 0
    for event in run.events:
        if event.kind in (EventKind.FIRST_TOKEN, EventKind.TOKEN):
            emitted[event.request_id] += 1
        elif event.kind is EventKind.PREEMPTED:
            lost += prompts[event.request_id] + emitted[event.request_id] - 1
    computed = sum(s.load.tokens for s in run.steps)
    assert computed == sum(p + 300 - 1 for p in prompts.values()) + lost
    assert core.kv_usage == 0.0


def test_prefix_cache_hits_skip_prefill_and_are_counted_in_tokens() -> None:
    config = replica()
    core = EngineCore(config)
    prefix = tuple(range(100, 108))  # 8 hash blocks of 512 tokens: a 4096-token prompt
    first = drive(core, [(0.0, request("a", 4096, 2, prefix))])
    assert core.stats().prefix_cache_queries == 4096
    assert core.stats().prefix_cache_hits == 0

    shared = drive(core, [(10.0, request("b", 4096, 2, (*prefix[:6], 900, 901)))])
    assert core.stats().prefix_cache_hits == 6 * 512
    assert shared.ttft("b") == pytest.approx(
        seconds(config, StepLoad.prefill_chunk(1024, 3072)), abs=1e-12
    )
    assert shared.ttft("b") < 0.4 * first.ttft("a")

    # A full hit still computes the last block: the last token's logits give the first token.
    again = drive(core, [(20.0, request("c", 4096, 2, prefix))])
    assert core.stats().prefix_cache_hits == 6 * 512 + 4096 - KV_BLOCK_TOKENS
    assert again.ttft("c") == pytest.approx(
        seconds(config, StepLoad.prefill_chunk(16, 4080)), abs=1e-12
    )

    unhashed = drive(core, [(30.0, request("d", 4096, 2))])
    assert core.stats().prefix_cache_queries == 4 * 4096
    assert core.stats().prefix_cache_hits == 6 * 512 + 4096 - KV_BLOCK_TOKENS
    assert unhashed.ttft("d") == pytest.approx(first.ttft("a"), abs=1e-12)


def test_hashes_describe_their_own_block_size() -> None:
    config = replica()
    core = EngineCore(config)
    drive(core, [(0.0, request("a", 640, 1, (1, 2, 3, 4, 5), per_hash=128))])
    # Three shared 128-token hash blocks: 384 tokens, 24 of our blocks.
    drive(core, [(1.0, request("b", 640, 1, (1, 2, 3, 9, 9), per_hash=128))])
    assert core.stats().prefix_cache_hits == 384
    # Equal ids after a different one do not match: the hashes are chained.
    drive(core, [(2.0, request("c", 640, 1, (7, 2, 3, 4, 5), per_hash=128))])
    assert core.stats().prefix_cache_hits == 384


def test_cached_blocks_are_evicted_only_when_their_space_is_needed() -> None:
    config = replica()
    core = EngineCore(config, kv_capacity_blocks=100)  # 1600 tokens
    prefix = (1, 2)
    drive(core, [(0.0, request("a", 1024, 1, prefix))])
    assert core.kv_usage == 0.0  # freed, yet still cached:
    drive(core, [(1.0, request("b", 1024, 1, prefix))])
    assert core.stats().prefix_cache_hits == 1024 - KV_BLOCK_TOKENS

    # 94 blocks for the filler: 36 never used, then 58 cached ones, the prefix's tail first,
    # so its first 6 blocks survive.
    drive(core, [(2.0, request("filler", 1500, 1))])
    drive(core, [(3.0, request("c", 1024, 1, prefix))])
    assert core.stats().prefix_cache_hits == 1024 - KV_BLOCK_TOKENS + 6 * KV_BLOCK_TOKENS


def test_prefill_role_hands_off_the_kv_and_emits_no_tokens() -> None:
    config = replica()
    core = EngineCore(config, Role.PREFILL)
    run = drive(core, [(0.0, request("a", 3000, 100))])

    at, handoff = run.handoffs["a"]
    assert handoff == KvHandoff("a", 3000, 3000 * kv_bytes_per_token_replica(config))
    assert at == pytest.approx(prefill_seconds(config, 3000), abs=1e-9)
    assert not run.token_times
    assert [e.kind for e in run.events] == [EventKind.PREFILL_COMPLETE]
    assert core.stats().generation_tokens == 0
    assert core.stats().prompt_tokens == 3000
    assert not core.has_work


def test_decode_role_waits_for_the_kv_transfer_before_the_first_token() -> None:
    config = replica("llama-3.1-8b", tensor=2)
    core = EngineCore(config, Role.DECODE)
    core.add_request(request("a", 3000, 4))
    # The step at arrival gives the prompt its blocks and starts the transfer; nothing to run.
    assert core.step(1.0).idle
    assert core.kv_usage == pytest.approx(math.ceil(3000 / 16) / core.kv_capacity_blocks)
    assert core.num_waiting == 1
    # Each GPU moves its own shard over its own NIC: the planner's per-GPU transfer time.
    transfer_s = 3000 * kv_bytes_per_token(config) / KV_TRANSFER_BYTES_PER_S
    assert core.next_wake_s == pytest.approx(1.0 + transfer_s, rel=1e-12)

    run = drive(core, [], start=1.0)
    first_decode = decode_step_seconds(config, 1, 3000)
    assert run.first_token["a"] == pytest.approx(1.0 + transfer_s + first_decode, abs=1e-9)
    assert len(run.token_times["a"]) == 4
    assert run.steps[0].load == StepLoad(decode_sequences=1, decode_context_tokens=3000)


def test_disaggregated_pools_serve_every_token_under_decode_kv_pressure() -> None:
    config = replica()
    draw = random.Random(5)
    arrivals = [
        (draw.uniform(0, 0.5), request(f"r{i}", draw.randint(100, 1500), draw.randint(50, 300)))
        for i in range(120)
    ]
    prefill = drive(EngineCore(config, Role.PREFILL), arrivals)
    handed_off = {rid: at for rid, (at, _) in prefill.handoffs.items()}
    requests = {r.request_id: r for _, r in arrivals}
    decode_core = EngineCore(config, Role.DECODE, kv_capacity_blocks=2000)
    decode = drive(decode_core, [(at, requests[rid]) for rid, at in handed_off.items()])

    assert decode_core.stats().preemptions > 0
    assert {rid: len(t) for rid, t in decode.token_times.items()} == {
        rid: r.max_output_tokens for rid, r in requests.items()
    }
    assert all(decode.first_token[rid] > handed_off[rid] for rid in requests)
    assert decode_core.kv_usage == 0.0


def test_a_decode_replica_whose_running_requests_all_get_preempted_runs_landed_kv() -> None:
    # Nine blocks: at some step the only running request needs a block that landed KV holds,
    # and preempts itself. The landed request must run in that same call, or nothing ever
    # would: no step would be left to run and no transfer to wait for.
    core = EngineCore(replica(), Role.DECODE, prefix_caching=False, kv_capacity_blocks=9)
    shapes = {
        "a": (0.001, 40, 22),
        "b": (0.006, 89, 36),
        "c": (0.014, 37, 84),
        "d": (0.037, 19, 31),
    }
    run = drive(core, [(at, request(rid, p, out)) for rid, (at, p, out) in shapes.items()])

    assert core.stats().preemptions > 0
    assert {rid: len(t) for rid, t in run.token_times.items()} == {
        rid: out for rid, (_, _, out) in shapes.items()
    }


def test_abort_frees_the_request_wherever_it_is() -> None:
    core = EngineCore(replica())
    core.add_request(request("a", 500, 50))
    core.add_request(request("b", 500, 50))
    now = core.step(0.0).end_s
    assert core.num_running == 2
    assert core.abort("a")
    assert not core.abort("a")
    assert core.num_running == 1
    run = drive(core, [], start=now)
    assert set(run.token_times) == {"b"}
    assert core.kv_usage == 0.0


def test_requests_that_can_never_run_are_rejected() -> None:
    config = replica(max_model_length=4096)
    core = EngineCore(config, kv_capacity_blocks=128)
    with pytest.raises(RequestRejectedError, match="maximum model length"):
        core.add_request(request("a", 4000, 100))
    with pytest.raises(RequestRejectedError, match="exceed the KV cache"):
        core.add_request(request("b", 2000, 100))
    core.add_request(request("c", 100, 10))
    with pytest.raises(ValueError, match="already in the engine"):
        core.add_request(request("c", 100, 10))
    with pytest.raises(ValueError, match="must be >= 1"):
        request("d", 0, 10)


def test_identical_runs_give_identical_event_streams() -> None:
    def once() -> list[EngineEvent]:
        draw = random.Random(11)
        arrivals = [
            (
                draw.uniform(0, 1),
                request(f"r{i}", draw.randint(16, 3000), draw.randint(1, 200), (i % 3, i % 5)),
            )
            for i in range(150)
        ]
        core = EngineCore(replace(replica(), max_batched_tokens=2048), kv_capacity_blocks=800)
        return drive(core, arrivals).events

    first, second = once(), once()
    assert any(e.kind is EventKind.PREEMPTED for e in first)
    assert first == second


@pytest.mark.parametrize(
    ("prompt", "output", "waves"), [(1000, 200, 3.5), (128, 500, 3.3), (5000, 300, 2.2)]
)
def test_a_queued_run_of_identical_requests_agrees_with_the_planner(
    prompt: int, output: int, waves: float
) -> None:
    """An offline benchmark's run: every request queued at once, fixed lengths, several waves of
    the batch and a partial last one. The scheduler's output tokens over the run's length are
    what `queued_run_throughput` predicts (the steady state is up to 9% high here)."""
    config = replica()
    capacity = plan_memory(config).kv_capacity_tokens
    count = int(saturated_batch(config, prompt, output, capacity) * waves)
    run = drive(EngineCore(config), [(0.0, request(f"r{i}", prompt, output)) for i in range(count)])
    measured = count * output / max(run.finished.values())
    predicted = queued_run_throughput(config, prompt, output, capacity, requests=count)
    assert predicted == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize(
    ("load", "tpot_tolerance", "ttft_tolerance"), [(0.2, 0.05, 0.05), (0.5, 0.06, 0.12)]
)
def test_open_loop_steady_state_agrees_with_the_planner(
    load: float, tpot_tolerance: float, ttft_tolerance: float
) -> None:
    """Poisson arrivals (what the planner's queueing assumes), seeded: the planner's mean TPOT
    and TTFT match what the scheduler produces step by step."""
    config = replica()
    prompt, output = 1000, 200
    saturated = max_throughput(config, prompt, output, plan_memory(config).kv_capacity_tokens)
    rate = load * saturated.output_tokens_per_s / output
    point = operating_point(config, rate, prompt, output)
    draw = random.Random(7)
    arrivals = []
    now = 0.0
    for i in range(int(rate * 120)):
        now += draw.expovariate(rate)
        arrivals.append((now, request(f"r{i}", prompt, output)))
    run = drive(EngineCore(config), arrivals)

    measured = [rid for rid, at in run.arrival.items() if at >= 20.0]  # past the warm-up
    ttft = sum(run.ttft(rid) for rid in measured) / len(measured)
    tpot = sum(run.tpot(rid) for rid in measured) / len(measured)
    assert tpot == pytest.approx(point.tpot_s, rel=tpot_tolerance)
    assert ttft == pytest.approx(point.ttft_mean_s, rel=ttft_tolerance)
