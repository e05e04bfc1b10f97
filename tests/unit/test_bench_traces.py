"""Benchmark schedules: the shared production traces, malformed files, reshaping and the
synthetic load patterns."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from inferfleet.bench.traces import (
    CHAT_RATE_PROFILE,
    Empirical,
    Exponential,
    Fixed,
    LogNormal,
    Pattern,
    TraceFormatError,
    Uniform,
    builtin_chat,
    burst,
    burst_segments,
    linear_segments,
    load_azure_csv,
    load_mooncake_jsonl,
    load_trace,
    mix_shift,
    parse_lengths,
    poisson,
    requests_from_trace,
    scaled,
    session_segments,
    sessions,
    step,
    summarize,
    synthetic,
    window,
)
from inferfleet.sim.workload import TraceRequest

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no shared traces at {TRACES}")


# The shared traces, as their README describes them.


@needs_traces
@pytest.mark.parametrize(
    ("name", "rows", "span_min", "input_mean"),
    [("azure2023_code.csv", 8_819, 57, 2048), ("azure2023_conv.csv", 19_366, 59, 1155)],
)
def test_azure_traces_load_with_their_published_shape(
    name: str, rows: int, span_min: float, input_mean: float
) -> None:
    requests = load_trace(TRACES / name)
    shape = summarize(requests)
    assert shape.requests == rows
    assert requests[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(requests))
    assert shape.span_s / 60 == pytest.approx(span_min, abs=1.5)
    assert shape.input_mean == pytest.approx(input_mean, abs=1)
    assert all(r.input_tokens >= 1 and r.output_tokens >= 1 for r in requests)
    assert all(r.prefix_hashes == () for r in requests)


@needs_traces
def test_azure_shapes_match_the_readme() -> None:
    code = summarize(load_trace(TRACES / "azure2023_code.csv"))
    conv = summarize(load_trace(TRACES / "azure2023_conv.csv"))
    assert (code.input_p50, round(code.output_mean), code.output_p50) == (1469, 28, 13)
    assert (conv.input_p50, round(conv.output_mean), conv.output_p50) == (1020, 211, 129)
    assert conv.rate == pytest.approx(5.5, abs=0.1)


@needs_traces
def test_mooncake_trace_loads_with_prefix_hashes_in_512_token_blocks() -> None:
    requests = load_trace(TRACES / "mooncake_synthetic.jsonl")
    assert len(requests) == 3_993
    assert requests[0].arrival_s == 0.0
    # Timestamps are in ms: the last request arrives about 17 minutes in.
    assert requests[-1].arrival_s == pytest.approx(1022.025)
    assert all(r.hash_block_tokens == 512 for r in requests)
    assert all(len(r.prefix_hashes) == math.ceil(r.input_tokens / 512) for r in requests)
    assert summarize(requests).input_mean > 10_000  # long prompts
    # Shared prefixes: many block ids recur across requests.
    blocks = [block for r in requests for block in r.prefix_hashes]
    assert len(set(blocks)) < 0.5 * len(blocks)


# Parsing small files, and the errors for malformed ones.


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_arrivals_count_from_the_earliest_row_in_time_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.csv",
        AZURE_HEADER
        + "2023-11-16 18:00:01.5000000,100,10\n"
        + "2023-11-16 18:00:00.2500000,200,20\n"
        + "\n"
        + "2023-11-16 18:01:00.2500001,300,30\n",
    )
    requests = load_azure_csv(path)
    assert [r.input_tokens for r in requests] == [200, 100, 300]
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 1.25, 60.0])
    assert requests[1] == TraceRequest(1.25, 100, 10)


def test_azure_columns_may_come_in_any_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.csv",
        "GeneratedTokens,TIMESTAMP,ContextTokens\n7,2023-11-16 18:00:00,5\n",
    )
    assert load_trace(path) == [TraceRequest(0.0, 5, 7)]


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("", ":1:", "empty file"),
        ("TIMESTAMP,ContextTokens\n", ":1:", "missing column(s) GeneratedTokens"),
        (AZURE_HEADER + "2023-11-16 18:00:00,1,1\nyesterday,1,1\n", ":3:", "not a date"),
        (AZURE_HEADER + "2023-11-16 18:00:00,1\n", ":2:", "expected 3 fields, got 2"),
        (AZURE_HEADER + "\n2023-11-16 18:00:00,1.5,1\n", ":3:", "ContextTokens '1.5'"),
        (AZURE_HEADER + "2023-11-16 18:00:00,4,0\n", ":2:", "GeneratedTokens must be at least 1"),
        (AZURE_HEADER, "", "no requests"),
    ],
)
def test_malformed_azure_rows_are_named_by_file_and_line(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}{where}")
    assert message in str(caught.value)


def test_mooncake_parses_ms_and_hashes_with_blank_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [4, 5]}\n'
        "\n"
        '{"timestamp": 500, "input_length": 10, "output_length": 1}\n',
    )
    requests = load_mooncake_jsonl(path, hash_block_tokens=256)
    assert requests == [
        TraceRequest(0.0, 10, 1, (), 256),
        TraceRequest(1.0, 600, 3, (4, 5), 256),
    ]


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{nope\n', ":2:", "not JSON"),
        ("[1, 2]\n", ":1:", "expected a JSON object"),
        ('\n{"timestamp": 0, "input_length": 1}\n', ":2:", "missing 'output_length'"),
        ('{"timestamp": -1, "input_length": 1, "output_length": 1}\n', ":1:", "timestamp -1"),
        ('{"timestamp": "0", "input_length": 1, "output_length": 1}\n', ":1:", "timestamp '0'"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}\n', ":1:", "input_length must"),
        ('{"timestamp": 0, "input_length": 2.5, "output_length": 1}\n', ":1:", "not an integer"),
        (
            '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}\n',
            ":1:",
            "hash_ids must be a list of integers",
        ),
    ],
)
def test_malformed_mooncake_lines_are_named_by_file_and_line(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}{where} ")
    assert message in str(caught.value)


def test_an_unknown_suffix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        load_trace(write(tmp_path, "t.txt", "x"))


# Reshaping.


def schedule(*arrivals: float) -> list[TraceRequest]:
    return [TraceRequest(arrival, 10 + index, 5) for index, arrival in enumerate(arrivals)]


def test_scaling_divides_every_arrival_and_keeps_lengths() -> None:
    faster = scaled(schedule(0.0, 1.0, 3.0, 7.0), 4.0)
    assert [r.arrival_s for r in faster] == [0.0, 0.25, 0.75, 1.75]
    assert [r.input_tokens for r in faster] == [10, 11, 12, 13]
    slower = scaled(schedule(0.0, 1.0), 0.5)
    assert [r.arrival_s for r in slower] == [0.0, 2.0]
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="rate_multiplier"):
            scaled(schedule(0.0), bad)


def test_window_keeps_start_inclusive_end_exclusive_and_rebases() -> None:
    requests = schedule(0.0, 9.5, 10.0, 12.0, 20.0, 25.0)
    picked = window(requests, 10.0, 10.0)
    assert [(r.arrival_s, r.input_tokens) for r in picked] == [(0.0, 12), (2.0, 13)]
    assert [r.arrival_s for r in window(requests, 9.0)] == [0.5, 1.0, 3.0, 11.0, 16.0]
    assert window(requests, 100.0, 5.0) == []
    with pytest.raises(ValueError, match="start_s"):
        window(requests, -1.0)
    with pytest.raises(ValueError, match="duration_s"):
        window(requests, 0.0, 0.0)


def test_requests_from_trace_windows_recorded_time_then_scales(tmp_path: Path) -> None:
    rows = "".join(
        f"2023-11-16 18:00:{second:02d},{100 + second},5\n" for second in range(0, 60, 3)
    )
    path = write(tmp_path, "t.csv", AZURE_HEADER + rows)
    requests = requests_from_trace(path, rate_multiplier=2.0, start_s=10.0, duration_s=20.0)
    # Rows at 12, 15, ..., 27 s of the trace, 2 s after the window start, at twice the rate.
    assert [r.input_tokens for r in requests] == [112, 115, 118, 121, 124, 127]
    assert [r.arrival_s for r in requests] == pytest.approx([1.0, 2.5, 4.0, 5.5, 7.0, 8.5])


# Synthetic patterns.


def test_poisson_is_deterministic_under_a_seed_and_hits_its_rate() -> None:
    first = poisson(20.0, 500.0, input_tokens=Uniform(10, 20), output_tokens=7, seed=3)
    assert first == poisson(20.0, 500.0, input_tokens=Uniform(10, 20), output_tokens=7, seed=3)
    assert first != poisson(20.0, 500.0, input_tokens=Uniform(10, 20), output_tokens=7, seed=4)
    # 10,000 expected, standard deviation 100: four of them either way.
    assert abs(len(first) - 10_000) < 400
    arrivals = [r.arrival_s for r in first]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] > 0
    assert arrivals[-1] < 500.0
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 20, rel=0.05)
    # Exponential gaps: their standard deviation equals their mean.
    mean = sum(gaps) / len(gaps)
    deviation = math.sqrt(sum((gap - mean) ** 2 for gap in gaps) / len(gaps))
    assert deviation == pytest.approx(mean, rel=0.1)
    assert {r.output_tokens for r in first} == {7}
    assert {r.input_tokens for r in first} == set(range(10, 21))


def test_arrivals_do_not_depend_on_the_lengths_drawn() -> None:
    short = poisson(5.0, 60.0, input_tokens=10, output_tokens=10, seed=1)
    long = poisson(
        5.0, 60.0, input_tokens=LogNormal(2000, 1.0), output_tokens=Uniform(1, 9), seed=1
    )
    assert [r.arrival_s for r in short] == [r.arrival_s for r in long]


def test_step_changes_the_rate_at_the_switch() -> None:
    requests = step(5.0, 20.0, 400.0, switch_s=100.0, input_tokens=10, output_tokens=10, seed=2)
    before = sum(1 for r in requests if r.arrival_s < 100.0)
    after = len(requests) - before
    assert abs(before - 500) < 4 * math.sqrt(500)
    assert abs(after - 6000) < 4 * math.sqrt(6000)
    halfway = step(5.0, 20.0, 100.0, input_tokens=10, output_tokens=10)
    assert sum(1 for r in halfway if r.arrival_s < 50.0) < sum(
        1 for r in halfway if r.arrival_s >= 50.0
    )


def test_burst_segments_and_rates() -> None:
    assert burst_segments(1.0, 9.0, 50.0, burst_every_s=20.0, burst_s=5.0) == [
        (0.0, 20.0, 1.0),
        (20.0, 25.0, 9.0),
        (25.0, 40.0, 1.0),
        (40.0, 45.0, 9.0),
        (45.0, 50.0, 1.0),
    ]
    requests = burst(
        2.0, 40.0, 600.0, burst_every_s=60.0, burst_s=10.0, input_tokens=5, output_tokens=5
    )
    in_burst = sum(1 for r in requests if r.arrival_s >= 60 and r.arrival_s % 60.0 < 10.0)
    # 9 bursts of 10 s at 40/s; 510 s at 2/s outside them.
    assert abs(in_burst - 3600) < 4 * math.sqrt(3600)
    assert abs(len(requests) - in_burst - 1020) < 4 * math.sqrt(1020)
    with pytest.raises(ValueError, match="burst_s"):
        burst_segments(1.0, 2.0, 10.0, burst_every_s=5.0, burst_s=6.0)


def test_sessions_come_apart_at_random_and_nothing_arrives_between_them() -> None:
    segments = session_segments(
        2.0, 200_000.0, session_every_s=2700.0, session_s=600.0, rng=random.Random(3)
    )
    assert all(rate == 2.0 for _, _, rate in segments)
    assert all(end - start == pytest.approx(600.0) for start, end, _ in segments[:-1])
    gaps = [later[0] - earlier[1] for earlier, later in itertools.pairwise(segments)]
    assert all(gap > 0 for gap in gaps)
    # Exponential gaps: their mean near the one asked for, and as spread as the mean.
    mean = statistics.fmean(gaps)
    assert abs(mean - 2700.0) < 4 * 2700.0 / math.sqrt(len(gaps))
    assert statistics.stdev(gaps) > 0.5 * mean
    requests = sessions(
        0.5, 36_000.0, session_every_s=2700.0, session_s=600.0,
        input_tokens=5, output_tokens=5, seed=1,
    )  # fmt: skip
    assert requests == sessions(
        0.5, 36_000.0, session_every_s=2700.0, session_s=600.0,
        input_tokens=5, output_tokens=5, seed=1,
    )  # fmt: skip
    # Nothing arrives between sessions: arrivals come in clusters under 600 s long.
    arrivals = [r.arrival_s for r in requests]
    starts = [arrivals[0]] + [b for a, b in itertools.pairwise(arrivals) if b - a > 600.0]
    assert 5 <= len(starts) <= 25
    for first, last in itertools.pairwise(starts):
        assert max(t for t in arrivals if first <= t < last) - first < 600.0
    with pytest.raises(ValueError, match="session_s"):
        session_segments(1.0, 10.0, session_every_s=0.0, session_s=5.0, rng=random.Random(0))


def test_mix_shift_keeps_the_rate_and_switches_lengths() -> None:
    requests = mix_shift(
        10.0,
        200.0,
        switch_s=50.0,
        input_tokens=100,
        output_tokens=500,
        input_tokens_after=Uniform(3000, 4000),
        seed=5,
    )
    for r in requests:
        if r.arrival_s < 50.0:
            assert (r.input_tokens, r.output_tokens) == (100, 500)
        else:
            assert 3000 <= r.input_tokens <= 4000
            assert r.output_tokens == 500
    assert abs(len(requests) - 2000) < 4 * math.sqrt(2000)


def test_synthetic_dispatches_by_pattern_name_and_checks_options() -> None:
    common: dict[str, Any] = {
        "rate": 4.0,
        "duration_s": 30.0,
        "input_tokens": 50,
        "output_tokens": 20,
        "seed": 9,
    }
    assert synthetic("poisson", **common) == poisson(
        4.0, 30.0, input_tokens=50, output_tokens=20, seed=9
    )
    assert synthetic(Pattern.STEP, rate_after=8.0, switch_s=10.0, **common) == step(
        4.0, 8.0, 30.0, switch_s=10.0, input_tokens=50, output_tokens=20, seed=9
    )
    assert synthetic("burst", burst_rate=30.0, burst_every_s=10.0, burst_s=2.0, **common) == burst(
        4.0, 30.0, 30.0, burst_every_s=10.0, burst_s=2.0, input_tokens=50, output_tokens=20, seed=9
    )
    assert synthetic("sessions", session_every_s=5.0, session_s=3.0, **common) == sessions(
        4.0, 30.0, session_every_s=5.0, session_s=3.0, input_tokens=50, output_tokens=20, seed=9
    )
    shifted = synthetic("mix-shift", output_tokens_after=99, **common)
    assert {r.output_tokens for r in shifted if r.arrival_s >= 15.0} == {99}
    assert {r.input_tokens for r in shifted} == {50}
    for pattern, message in [
        ("step", "rate_after"),
        ("burst", "burst_rate"),
        ("mix-shift", "input_tokens_after"),
    ]:
        with pytest.raises(ValueError, match=message):
            synthetic(pattern, **common)
    with pytest.raises(ValueError, match="not a valid Pattern"):
        synthetic("sawtooth", **common)
    with pytest.raises(ValueError, match="switch_s"):
        step(1.0, 2.0, 10.0, switch_s=11.0, input_tokens=1, output_tokens=1)
    with pytest.raises(ValueError, match="duration_s"):
        poisson(1.0, 0.0, input_tokens=1, output_tokens=1)
    with pytest.raises(ValueError, match="rates"):
        poisson(-1.0, 10.0, input_tokens=1, output_tokens=1)


def test_length_distributions_and_their_command_line_forms() -> None:
    rng = random.Random(0)
    assert parse_lengths("128") == Fixed(128)
    assert parse_lengths("uniform:1:4") == Uniform(1, 4)
    assert parse_lengths("exp:200") == Exponential(200.0)
    assert parse_lengths("exp:200:1000") == Exponential(200.0, 1000)
    assert parse_lengths(" lognormal:1000:0.8:8000 ") == LogNormal(1000.0, 0.8, 8000)
    for bad in ("", "0", "uniform:5", "uniform:5:2", "gamma:1:2", "exp:x", "lognormal:-1:1"):
        with pytest.raises(ValueError, match="lengths"):
            parse_lengths(bad)
    draws = [LogNormal(1000.0, 0.8).sample(rng) for _ in range(20_000)]
    assert sum(draws) / len(draws) == pytest.approx(1000, rel=0.05)
    assert min(draws) >= 1
    capped = [LogNormal(1000.0, 2.0, high=1500).sample(rng) for _ in range(2_000)]
    assert max(capped) == 1500
    draws = [Exponential(50.0).sample(rng) for _ in range(20_000)]
    assert sum(draws) / len(draws) == pytest.approx(50, rel=0.05)
    assert {Uniform(3, 5).sample(rng) for _ in range(200)} == {3, 4, 5}
    assert {Empirical((7, 9)).sample(rng) for _ in range(100)} == {7, 9}
    with pytest.raises(ValueError, match="at least 1"):
        Empirical(())


def test_a_linear_rate_is_sliced_at_midpoint_rates() -> None:
    segments = linear_segments([(0.0, 1.0), (10.0, 1.0), (14.0, 3.0)], slice_s=1.0)
    assert segments == [
        (0.0, 10.0, 1.0),
        (10.0, 11.0, 1.25),
        (11.0, 12.0, 1.75),
        (12.0, 13.0, 2.25),
        (13.0, 14.0, 2.75),
    ]
    with pytest.raises(ValueError, match="time order"):
        linear_segments([(5.0, 1.0), (4.0, 1.0)])


def test_the_builtin_chat_load_follows_its_profile_and_chat_lengths() -> None:
    duration = 2000.0
    requests = builtin_chat(duration, rate_multiplier=2.0, seed=3)
    for (start, low), (end, high) in itertools.pairwise(CHAT_RATE_PROFILE):
        count = sum(1 for r in requests if start * duration <= r.arrival_s < end * duration)
        expected = 2.0 * (low + high) / 2 * (end - start) * duration
        assert count == pytest.approx(expected, rel=0.1)
    # The rise is gradual: its first half carries less than its second.
    (_, _), (rise_start, _), (rise_end, _) = CHAT_RATE_PROFILE[:3]
    middle = (rise_start + rise_end) / 2 * duration
    first = sum(1 for r in requests if rise_start * duration <= r.arrival_s < middle)
    second = sum(1 for r in requests if middle <= r.arrival_s < rise_end * duration)
    assert second > 1.3 * first
    inputs = sorted(r.input_tokens for r in requests)
    outputs = sorted(r.output_tokens for r in requests)
    assert 800 < inputs[len(inputs) // 2] < 1300
    assert 80 < outputs[len(outputs) // 2] < 200
    assert max(i + o for i, o in zip(inputs, outputs, strict=True)) <= 8192
    assert builtin_chat(duration, rate_multiplier=2.0, seed=3) == requests
    with pytest.raises(ValueError, match="rate_multiplier"):
        builtin_chat(60.0, rate_multiplier=0.0)
