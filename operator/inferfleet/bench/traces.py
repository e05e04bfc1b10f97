"""Request schedules for serving benchmarks: recorded traces and synthetic load patterns.

Pure: parsing and generation only, no I/O beyond reading the trace file given.

Two trace formats are read (see `load_trace`):
* Azure LLM inference trace 2023 (CSV): `TIMESTAMP,ContextTokens,GeneratedTokens`, one row per
  request, timestamps as `2023-11-16 18:17:03.9799600`;
* Mooncake (JSON lines): `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`,
  where `hash_ids` name the prompt's consecutive 512-token blocks (equal ids = shared prefix).

Arrivals are seconds from the trace's first request. `scaled` and `window` reshape a schedule;
`poisson`, `step`, `burst` and `mix_shift` (or `synthetic` by pattern name) generate one from a
seed, deterministically: the same arguments give the same requests on every run and platform
(`random.Random` seeded from a string, whose `random()` stream Python keeps stable).
"""

from __future__ import annotations

import csv
import enum
import itertools
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from inferfleet.sim.workload import DEFAULT_HASH_BLOCK_TOKENS, TraceRequest

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message starts with `file:line:`."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = Path(path)
        self.line = line


# Loading.


def load_trace(
    path: Path | str, *, hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
) -> list[TraceRequest]:
    """Read a trace, choosing the format by suffix: `.csv` (Azure) or `.jsonl` (Mooncake)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_azure_csv(path)
    if suffix in {".jsonl", ".ndjson", ".json"}:
        return load_mooncake_jsonl(path, hash_block_tokens=hash_block_tokens)
    raise TraceFormatError(
        path, None, "unknown trace format: expected .csv (Azure) or .jsonl (Mooncake)"
    )


def _positive_int(value: object, path: Path, line: int, name: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise TraceFormatError(path, line, f"{name} {value!r} is not an integer") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceFormatError(path, line, f"{name} {value!r} is not an integer")
    if value < 1:
        raise TraceFormatError(path, line, f"{name} must be at least 1, got {value}")
    return value


def _rebased(
    path: Path, stamps: list[float], rows: list[TraceRequest], unit_s: float
) -> list[TraceRequest]:
    """Arrivals from the earliest request, in seconds (`stamps` count units of `unit_s`), in
    time order (ties keep file order)."""
    if not rows:
        raise TraceFormatError(path, None, "the trace has no requests")
    first = min(stamps)
    order = sorted(range(len(rows)), key=stamps.__getitem__)
    return [
        TraceRequest(
            (stamps[index] - first) * unit_s,
            rows[index].input_tokens,
            rows[index].output_tokens,
            rows[index].prefix_hashes,
            rows[index].hash_block_tokens,
        )
        for index in order
    ]


def load_azure_csv(path: Path | str) -> list[TraceRequest]:
    """Read an Azure LLM inference trace (CSV with `TIMESTAMP,ContextTokens,GeneratedTokens`)."""
    path = Path(path)
    stamps: list[float] = []
    rows: list[TraceRequest] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(
                path, 1, "empty file: expected a header " + ",".join(AZURE_COLUMNS)
            )
        names = [name.strip() for name in header]
        missing = [column for column in AZURE_COLUMNS if column not in names]
        if missing:
            raise TraceFormatError(
                path, 1, f"missing column(s) {', '.join(missing)} in header {','.join(names)}"
            )
        at, inputs, outputs = (names.index(column) for column in AZURE_COLUMNS)
        width = len(names)
        for fields in reader:
            line = reader.line_num
            if not fields or all(not field.strip() for field in fields):
                continue
            if len(fields) != width:
                raise TraceFormatError(path, line, f"expected {width} fields, got {len(fields)}")
            text = fields[at].strip()
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise TraceFormatError(
                    path, line, f"TIMESTAMP {text!r} is not a date and time"
                ) from None
            if moment.tzinfo is not None:
                moment = moment.astimezone(UTC).replace(tzinfo=None)
            # Whole microseconds from a naive epoch: exact, and blind to the local zone.
            stamp = (moment - _EPOCH) // _MICROSECOND
            stamps.append(stamp)
            rows.append(
                TraceRequest(
                    0.0,
                    _positive_int(fields[inputs], path, line, "ContextTokens"),
                    _positive_int(fields[outputs], path, line, "GeneratedTokens"),
                )
            )
    return _rebased(path, stamps, rows, 1e-6)


def load_mooncake_jsonl(
    path: Path | str, *, hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
) -> list[TraceRequest]:
    """Read a Mooncake trace: one JSON object per line with `timestamp` (ms), `input_length`,
    `output_length` and optional `hash_ids`."""
    path = Path(path)
    stamps: list[float] = []
    rows: list[TraceRequest] = []
    with path.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise TraceFormatError(path, line, f"not JSON: {error.msg}") from None
            if not isinstance(record, dict):
                raise TraceFormatError(path, line, "expected a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in record:
                    raise TraceFormatError(path, line, f"missing {key!r}")
            stamp = record["timestamp"]
            if (
                not isinstance(stamp, int | float)
                or isinstance(stamp, bool)
                or not math.isfinite(stamp)
                or stamp < 0
            ):
                raise TraceFormatError(
                    path, line, f"timestamp {stamp!r} is not a non-negative number of ms"
                )
            hashes = record.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(
                isinstance(value, int) and not isinstance(value, bool) for value in hashes
            ):
                raise TraceFormatError(path, line, "hash_ids must be a list of integers")
            stamps.append(stamp)
            rows.append(
                TraceRequest(
                    0.0,
                    _positive_int(record["input_length"], path, line, "input_length"),
                    _positive_int(record["output_length"], path, line, "output_length"),
                    tuple(hashes),
                    hash_block_tokens,
                )
            )
    return _rebased(path, stamps, rows, 1e-3)


# Reshaping.


def scaled(requests: Iterable[TraceRequest], rate_multiplier: float) -> list[TraceRequest]:
    """The schedule replayed at `rate_multiplier` times its rate: every arrival (so every
    inter-arrival time) divided by it. Lengths are unchanged."""
    if not math.isfinite(rate_multiplier) or rate_multiplier <= 0:
        raise ValueError(f"rate_multiplier must be a positive number, got {rate_multiplier}")
    return [
        TraceRequest(
            request.arrival_s / rate_multiplier,
            request.input_tokens,
            request.output_tokens,
            request.prefix_hashes,
            request.hash_block_tokens,
        )
        for request in requests
    ]


def window(
    requests: Iterable[TraceRequest], start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """The requests arriving in [start_s, start_s + duration_s), with arrivals counted from
    `start_s` (so the first keeps its offset into the window). No duration: to the end."""
    if not math.isfinite(start_s) or start_s < 0:
        raise ValueError(f"start_s must be a non-negative number, got {start_s}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a positive number, got {duration_s}")
    end = math.inf if duration_s is None else start_s + duration_s
    return [
        TraceRequest(
            request.arrival_s - start_s,
            request.input_tokens,
            request.output_tokens,
            request.prefix_hashes,
            request.hash_block_tokens,
        )
        for request in requests
        if start_s <= request.arrival_s < end
    ]


def requests_from_trace(
    path: Path | str,
    *,
    rate_multiplier: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
) -> list[TraceRequest]:
    """A trace's window [start_s, start_s + duration_s) of recorded time, replayed at
    `rate_multiplier` times the recorded rate (so it lasts `duration_s / rate_multiplier`)."""
    return scaled(window(load_trace(path), start_s, duration_s), rate_multiplier)


@dataclass(frozen=True, slots=True)
class ScheduleSummary:
    """The shape of a schedule, for printing before a run."""

    requests: int
    span_s: float
    """From 0 to the last arrival."""
    rate: float
    """Requests per second over the span."""
    input_mean: float
    input_p50: float
    output_mean: float
    output_p50: float


def _median(values: Sequence[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2


def summarize(requests: Sequence[TraceRequest]) -> ScheduleSummary:
    if not requests:
        return ScheduleSummary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    span = max(request.arrival_s for request in requests)
    inputs = [request.input_tokens for request in requests]
    outputs = [request.output_tokens for request in requests]
    return ScheduleSummary(
        requests=len(requests),
        span_s=span,
        rate=len(requests) / span if span > 0 else math.inf,
        input_mean=sum(inputs) / len(inputs),
        input_p50=_median(inputs),
        output_mean=sum(outputs) / len(outputs),
        output_p50=_median(outputs),
    )


# Length distributions.


class LengthDistribution(Protocol):
    """Token lengths drawn from a seeded generator; every draw is at least 1."""

    def sample(self, rng: random.Random) -> int: ...


@dataclass(frozen=True, slots=True)
class Fixed:
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"a fixed length must be at least 1, got {self.tokens}")

    def sample(self, rng: random.Random) -> int:
        del rng
        return self.tokens


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers in [low, high], both included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"uniform lengths need 1 <= low <= high, got {self.low}, {self.high}")

    def sample(self, rng: random.Random) -> int:
        return self.low + int(rng.random() * (self.high - self.low + 1))


@dataclass(frozen=True, slots=True)
class Exponential:
    """Exponential with the given mean, rounded, at least 1 and at most `high`."""

    mean: float
    high: int | None = None

    def __post_init__(self) -> None:
        if not self.mean > 0:
            raise ValueError(f"an exponential mean must be positive, got {self.mean}")

    def sample(self, rng: random.Random) -> int:
        return _clamp(rng.expovariate(1.0 / self.mean), self.high)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal with the given mean (not median) and shape `sigma`, rounded, at least 1 and
    at most `high`: the long tail of real prompt and output lengths."""

    mean: float
    sigma: float
    high: int | None = None

    def __post_init__(self) -> None:
        if not (self.mean > 0 and self.sigma >= 0):
            raise ValueError(f"log-normal needs mean > 0 and sigma >= 0, got {self}")

    def sample(self, rng: random.Random) -> int:
        mu = math.log(self.mean) - self.sigma**2 / 2
        return _clamp(rng.lognormvariate(mu, self.sigma), self.high)


@dataclass(frozen=True, slots=True)
class Empirical:
    """Lengths drawn uniformly from observed values (e.g. a trace's input lengths)."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.values or min(self.values) < 1:
            raise ValueError("empirical lengths need at least one value, all at least 1")

    def sample(self, rng: random.Random) -> int:
        return self.values[int(rng.random() * len(self.values))]


def _clamp(value: float, high: int | None) -> int:
    tokens = max(1, round(value))
    return tokens if high is None else min(tokens, high)


Lengths = int | LengthDistribution
"""A fixed length, or a distribution."""


def parse_lengths(text: str) -> LengthDistribution:
    """A length distribution from a command-line value: `N` (fixed), `uniform:LOW:HIGH`,
    `exp:MEAN[:MAX]` or `lognormal:MEAN:SIGMA[:MAX]`."""
    forms = "N, uniform:LOW:HIGH, exp:MEAN[:MAX] or lognormal:MEAN:SIGMA[:MAX]"
    kind, *args = text.strip().split(":")
    try:
        if not args:
            return Fixed(int(kind))
        if kind == "uniform" and len(args) == 2:
            return Uniform(int(args[0]), int(args[1]))
        if kind == "exp" and len(args) in (1, 2):
            return Exponential(float(args[0]), int(args[1]) if len(args) == 2 else None)
        if kind == "lognormal" and len(args) in (2, 3):
            high = int(args[2]) if len(args) == 3 else None
            return LogNormal(float(args[0]), float(args[1]), high)
    except ValueError as error:
        raise ValueError(f"bad lengths {text!r} ({error}); expected {forms}") from None
    raise ValueError(f"bad lengths {text!r}; expected {forms}")


def _distribution(lengths: Lengths) -> LengthDistribution:
    return Fixed(lengths) if isinstance(lengths, int) else lengths


# Synthetic patterns.


class Pattern(enum.StrEnum):
    POISSON = "poisson"
    STEP = "step"
    BURST = "burst"
    MIX_SHIFT = "mix-shift"
    SESSIONS = "sessions"


Segment = tuple[float, float, float]
"""(start_s, end_s, rate): a stretch of constant Poisson rate."""


def _rngs(seed: int) -> tuple[random.Random, random.Random]:
    # Separate streams: the arrivals of a seed stay the same whatever the lengths drawn.
    return random.Random(f"inferfleet-arrivals-{seed}"), random.Random(f"inferfleet-lengths-{seed}")


def _arrivals(segments: Iterable[Segment], rng: random.Random) -> list[float]:
    """A Poisson process with a piecewise-constant rate: memoryless, so each segment can be
    drawn on its own, starting at its beginning."""
    arrivals: list[float] = []
    for start, end, rate in segments:
        if rate < 0 or not math.isfinite(rate):
            raise ValueError(f"rates must be non-negative numbers, got {rate}")
        if rate == 0:
            continue
        moment = start
        while True:
            moment += rng.expovariate(rate)
            if moment >= end:
                break
            arrivals.append(moment)
    return arrivals


def _check_duration(duration_s: float) -> None:
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a positive number, got {duration_s}")


def _switch(switch_s: float | None, duration_s: float) -> float:
    moment = duration_s / 2 if switch_s is None else switch_s
    if not 0 <= moment <= duration_s:
        raise ValueError(f"switch_s must lie in [0, duration_s], got {moment}")
    return moment


def _build(
    arrivals: Sequence[float],
    rng: random.Random,
    lengths: Sequence[tuple[float, LengthDistribution, LengthDistribution]],
) -> list[TraceRequest]:
    """Requests at `arrivals`; each takes its lengths from the last entry of `lengths`
    (sorted by start time) that started at or before it."""
    requests: list[TraceRequest] = []
    for moment in arrivals:
        _, inputs, outputs = next(item for item in reversed(lengths) if item[0] <= moment)
        requests.append(TraceRequest(moment, inputs.sample(rng), outputs.sample(rng)))
    return requests


def poisson(
    rate: float,
    duration_s: float,
    *,
    input_tokens: Lengths,
    output_tokens: Lengths,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at `rate` requests/s for `duration_s`."""
    _check_duration(duration_s)
    arrivals_rng, lengths_rng = _rngs(seed)
    arrivals = _arrivals([(0.0, duration_s, rate)], arrivals_rng)
    sizes = [(0.0, _distribution(input_tokens), _distribution(output_tokens))]
    return _build(arrivals, lengths_rng, sizes)


def step(
    rate_before: float,
    rate_after: float,
    duration_s: float,
    *,
    switch_s: float | None = None,
    input_tokens: Lengths,
    output_tokens: Lengths,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at `rate_before` until `switch_s` (default: half way), then at
    `rate_after`."""
    _check_duration(duration_s)
    moment = _switch(switch_s, duration_s)
    arrivals_rng, lengths_rng = _rngs(seed)
    arrivals = _arrivals(
        [(0.0, moment, rate_before), (moment, duration_s, rate_after)], arrivals_rng
    )
    sizes = [(0.0, _distribution(input_tokens), _distribution(output_tokens))]
    return _build(arrivals, lengths_rng, sizes)


CHAT_INPUT_TOKENS = LogNormal(1150, 0.5, 7000)
CHAT_OUTPUT_TOKENS = LogNormal(210, 1.0, 1000)
"""Chat-shaped lengths: prompts of about a thousand tokens and answers of a couple of hundred
with a long tail, as published for production chat traffic (Patel et al., Splitwise, ISCA
2024: conversation prompts median 1020 tokens, outputs median 129); capped to fit an 8k
context."""
CHAT_RATE_PROFILE: tuple[tuple[float, float], ...] = (
    (0.0, 1.0),
    (0.125, 1.0),
    (0.375, 3.0),
    (0.6875, 3.0),
    (0.8125, 1.5),
    (1.0, 1.5),
)
"""(moment as a fraction of the duration, requests/s), the rate linear in between: quiet, a
rise to a peak at three times that, an ebb to half the peak: the shape of a day of chat
traffic, compressed into minutes. A day's rise takes hours, far longer than a cold start;
compressed, it still takes a quarter of the duration (the `step` benchmark scenario is the
load that jumps at once)."""


def linear_segments(knots: Sequence[tuple[float, float]], slice_s: float = 1.0) -> list[Segment]:
    """A rate linear between (moment_s, rate) knots, as constant segments: one per flat stretch,
    and slices of at most `slice_s` at their midpoint rate where it changes."""
    segments: list[Segment] = []
    for (start, low), (end, high) in itertools.pairwise(knots):
        if end < start:
            raise ValueError(f"knots must be in time order, got {start} before {end}")
        slices = 1 if low == high else max(1, math.ceil((end - start) / slice_s))
        width = (end - start) / slices
        segments.extend(
            (
                start + index * width,
                start + (index + 1) * width,
                low + (high - low) * (index + 0.5) / slices,
            )
            for index in range(slices)
        )
    return segments


def builtin_chat(
    duration_s: float, *, rate_multiplier: float = 1.0, seed: int = 0
) -> list[TraceRequest]:
    """A built-in chat load for demos and machines without the public traces: Poisson
    arrivals following `CHAT_RATE_PROFILE` (times `rate_multiplier`), chat-shaped lengths."""
    _check_duration(duration_s)
    if not rate_multiplier > 0:
        raise ValueError(f"rate_multiplier must be positive, got {rate_multiplier}")
    arrivals_rng, lengths_rng = _rngs(seed)
    knots = [(moment * duration_s, rate * rate_multiplier) for moment, rate in CHAT_RATE_PROFILE]
    arrivals = _arrivals(linear_segments(knots), arrivals_rng)
    return _build(arrivals, lengths_rng, [(0.0, CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS)])


def burst_segments(
    base_rate: float,
    burst_rate: float,
    duration_s: float,
    *,
    burst_every_s: float,
    burst_s: float,
) -> list[Segment]:
    """Base rate, with bursts of `burst_s` at `burst_rate` starting every `burst_every_s`
    (the first one `burst_every_s` in)."""
    if not 0 < burst_s <= burst_every_s:
        raise ValueError(f"need 0 < burst_s <= burst_every_s, got {burst_s}, {burst_every_s}")
    segments: list[Segment] = []
    moment = 0.0
    index = 1
    while moment < duration_s:
        burst_start = min(index * burst_every_s, duration_s)
        burst_end = min(burst_start + burst_s, duration_s)
        segments.append((moment, burst_start, base_rate))
        if burst_end > burst_start:
            segments.append((burst_start, burst_end, burst_rate))
        moment = burst_end
        index += 1
    return segments


def burst(
    base_rate: float,
    burst_rate: float,
    duration_s: float,
    *,
    burst_every_s: float = 60.0,
    burst_s: float = 10.0,
    input_tokens: Lengths,
    output_tokens: Lengths,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at `base_rate`, with `burst_s`-long bursts at `burst_rate` every
    `burst_every_s` (see `burst_segments`)."""
    _check_duration(duration_s)
    arrivals_rng, lengths_rng = _rngs(seed)
    segments = burst_segments(
        base_rate, burst_rate, duration_s, burst_every_s=burst_every_s, burst_s=burst_s
    )
    arrivals = _arrivals(segments, arrivals_rng)
    sizes = [(0.0, _distribution(input_tokens), _distribution(output_tokens))]
    return _build(arrivals, lengths_rng, sizes)


def session_segments(
    rate: float,
    duration_s: float,
    *,
    session_every_s: float,
    session_s: float,
    rng: random.Random,
) -> list[Segment]:
    """Sessions of `session_s` at `rate` with nothing between them: each starts an
    exponentially distributed gap (mean `session_every_s`) after the last one ended, the first
    after such a gap from the start; a service idle most of the time, used now and then."""
    if not (session_s > 0 and session_every_s > 0):
        raise ValueError(
            f"need session_s > 0 and session_every_s > 0, got {session_s}, {session_every_s}"
        )
    segments: list[Segment] = []
    moment = rng.expovariate(1 / session_every_s)
    while moment < duration_s:
        end = min(moment + session_s, duration_s)
        segments.append((moment, end, rate))
        moment = end + rng.expovariate(1 / session_every_s)
    return segments


def sessions(
    rate: float,
    duration_s: float,
    *,
    session_every_s: float = 3600.0,
    session_s: float = 300.0,
    input_tokens: Lengths,
    output_tokens: Lengths,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at `rate` within sessions (`session_segments`), none between them."""
    _check_duration(duration_s)
    arrivals_rng, lengths_rng = _rngs(seed)
    segments = session_segments(
        rate, duration_s, session_every_s=session_every_s, session_s=session_s, rng=arrivals_rng
    )
    arrivals = _arrivals(segments, arrivals_rng)
    sizes = [(0.0, _distribution(input_tokens), _distribution(output_tokens))]
    return _build(arrivals, lengths_rng, sizes)


def mix_shift(
    rate: float,
    duration_s: float,
    *,
    switch_s: float | None = None,
    input_tokens: Lengths,
    output_tokens: Lengths,
    input_tokens_after: Lengths,
    output_tokens_after: Lengths | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at a constant `rate` whose lengths change at `switch_s` (default: half
    way) from (input_tokens, output_tokens) to (input_tokens_after, output_tokens_after)."""
    _check_duration(duration_s)
    moment = _switch(switch_s, duration_s)
    arrivals_rng, lengths_rng = _rngs(seed)
    arrivals = _arrivals([(0.0, duration_s, rate)], arrivals_rng)
    after_outputs = output_tokens if output_tokens_after is None else output_tokens_after
    sizes = [
        (0.0, _distribution(input_tokens), _distribution(output_tokens)),
        (moment, _distribution(input_tokens_after), _distribution(after_outputs)),
    ]
    return _build(arrivals, lengths_rng, sizes)


def synthetic(
    pattern: Pattern | str,
    *,
    rate: float,
    duration_s: float,
    input_tokens: Lengths,
    output_tokens: Lengths,
    seed: int = 0,
    switch_s: float | None = None,
    rate_after: float | None = None,
    burst_rate: float | None = None,
    burst_every_s: float = 60.0,
    burst_s: float = 10.0,
    input_tokens_after: Lengths | None = None,
    output_tokens_after: Lengths | None = None,
    session_every_s: float = 3600.0,
    session_s: float = 300.0,
) -> list[TraceRequest]:
    """One of the patterns by name, with one flat set of options (a command line's):
    * poisson: `rate`;
    * step: `rate`, then `rate_after` from `switch_s`;
    * burst: `rate`, with bursts at `burst_rate` for `burst_s` every `burst_every_s`;
    * mix-shift: `rate`; lengths switch to `input_tokens_after` (and `output_tokens_after`,
      if given) at `switch_s`;
    * sessions: `rate` within sessions of `session_s`, a mean `session_every_s` apart."""
    kind = Pattern(pattern)
    if kind is Pattern.POISSON:
        return poisson(
            rate, duration_s, input_tokens=input_tokens, output_tokens=output_tokens, seed=seed
        )
    if kind is Pattern.STEP:
        if rate_after is None:
            raise ValueError("the step pattern needs rate_after (the rate after the switch)")
        return step(
            rate,
            rate_after,
            duration_s,
            switch_s=switch_s,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seed=seed,
        )
    if kind is Pattern.BURST:
        if burst_rate is None:
            raise ValueError("the burst pattern needs burst_rate")
        return burst(
            rate,
            burst_rate,
            duration_s,
            burst_every_s=burst_every_s,
            burst_s=burst_s,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seed=seed,
        )
    if kind is Pattern.SESSIONS:
        return sessions(
            rate,
            duration_s,
            session_every_s=session_every_s,
            session_s=session_s,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seed=seed,
        )
    if input_tokens_after is None and output_tokens_after is None:
        raise ValueError(
            "the mix-shift pattern needs input_tokens_after and/or output_tokens_after"
        )
    return mix_shift(
        rate,
        duration_s,
        switch_s=switch_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        input_tokens_after=input_tokens if input_tokens_after is None else input_tokens_after,
        output_tokens_after=output_tokens_after,
        seed=seed,
    )
