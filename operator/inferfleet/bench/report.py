"""Serving benchmark statistics: latency percentiles, throughput, SLO attainment and goodput.

Pure, apart from `plot` (which imports matplotlib when called, so that importing this module
never loads it).

Definitions, per request, all measured at the client:
* TTFT: from sending the request to the first content chunk;
* TPOT: (last token - first token) / (tokens - 1); undefined for a one-token answer;
* ITL: each gap between consecutive content chunks (tokens that arrive in one read count as
  gaps of zero, as a client sees them);
* e2e: from sending to the end of the stream.

SLO outcome, per request (as the router counts it): a request is good when it succeeded and
met every target set (a one-token answer has no TPOT to judge). Attainment is good requests
over all requests of the run, failed ones included (a failure, a client-side drop or a request
cut off at the end is a miss); goodput is good requests per second of the run.

Percentiles interpolate linearly between closest ranks (numpy's default): for n sorted values
the q-th percentile sits at rank (n - 1) q / 100.
"""

from __future__ import annotations

import bisect
import json
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferfleet.slo import Outcome, Slo

PERCENTILES = (50.0, 90.0, 95.0, 99.0)

# Error kinds of a request (`RequestResult.error`); HTTP errors are `http_<status>`.
ERROR_TIMEOUT = "timeout"
"""No complete answer within the request timeout."""
ERROR_CONNECT = "connect_error"
"""The connection could not be opened."""
ERROR_CONNECTION = "connection_error"
"""The connection broke or the server broke HTTP during the answer."""
ERROR_STREAM = "stream_error"
"""The server sent an error event in the stream (vLLM's way to fail a started stream)."""
ERROR_INCOMPLETE = "incomplete_stream"
"""The stream ended without `data: [DONE]`."""
ERROR_DROPPED = "client_dropped"
"""Not sent: the client's max in-flight cap was reached (the client, not the server, shed it)."""
ERROR_UNFINISHED = "unfinished"
"""Still running when the benchmark's time ran out, and abandoned."""
ERROR_CLIENT = "client_error"
"""Anything else that went wrong in the client."""


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times are seconds from the start of the run."""

    index: int
    scheduled_s: float
    """When the schedule said to send it."""
    input_tokens: int
    output_tokens: int
    """Requested (`max_tokens`)."""
    sent_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    tokens: int = 0
    """Output tokens received: the usage chunk's count, else the content chunks counted."""
    chunks: int = 0
    """Content chunks received."""
    gaps: array[float] = field(default_factory=lambda: array("d"))
    """Seconds between consecutive content chunks."""
    http_status: int | None = None
    error: str | None = None
    """None when the request succeeded, else its kind (see the ERROR_ constants)."""
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None or self.sent_s is None:
            return None
        return self.first_token_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.last_token_s is None or self.tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        if self.end_s is None or self.sent_s is None:
            return None
        return self.end_s - self.sent_s

    @property
    def send_lag_s(self) -> float | None:
        """How late the client sent it against the schedule (open-loop fidelity)."""
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, without the per-chunk gaps."""
        return {
            "index": self.index,
            "scheduled_s": self.scheduled_s,
            "sent_s": self.sent_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokens": self.tokens,
            "ttft_ms": _ms(self.ttft_s),
            "tpot_ms": _ms(self.tpot_s),
            "e2e_ms": _ms(self.e2e_s),
            "http_status": self.http_status,
            "error": self.error,
            "error_detail": self.error_detail,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def met_slo(slo: Slo, result: RequestResult) -> bool:
    """Whether one request met every target of `slo`."""
    outcome = slo.outcome(ok=result.ok, ttft_s=result.ttft_s, tpot_s=result.tpot_s)
    return outcome is Outcome.MET


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, sorted ascending, by linear interpolation."""
    if not values:
        raise ValueError("the percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    rank = (len(values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a sample, in the unit it was given in."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution | None:
        ordered = sorted(values)
        if not ordered:
            return None
        p50, p90, p95, p99 = (percentile(ordered, q) for q in PERCENTILES)
        return cls(len(ordered), math.fsum(ordered) / len(ordered), p50, p90, p95, p99, ordered[-1])


@dataclass(frozen=True, slots=True)
class ClientStats:
    """What running the load cost the client, to tell a client bottleneck from a server one."""

    cpu_s: float
    """CPU time of the client process over the run (with anything else it hosts)."""
    cpu_utilisation: float
    """`cpu_s` over the run's wall time: near 1.0 means the one event-loop core is saturated
    and latencies include the client's own queueing."""
    peak_in_flight: int
    max_in_flight: int
    """The cap; requests past it are dropped (`client_dropped`)."""
    http_clients: int
    """Connection pools the streams are spread over."""


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of one benchmark run. Latencies in ms, rates per second of the run."""

    requests: int
    """Requests scheduled in the run."""
    completed: int
    failed: int
    """Requests that did not succeed, dropped and unfinished ones included."""
    errors: dict[str, int]
    """Failed requests by kind."""
    duration_s: float
    """Wall time of the run, from its start to the last answer."""
    schedule_span_s: float
    """From the start to the last scheduled arrival."""
    offered_rps: float
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    itl_ms: Distribution | None
    e2e_ms: Distribution | None
    input_tokens: int
    """Prompt tokens of the completed requests."""
    output_tokens: int
    """Output tokens received (from completed and failed requests)."""
    requests_per_s: float
    """Completed requests per second."""
    output_tokens_per_s: float
    input_tokens_per_s: float
    send_lag_ms: Distribution | None
    """Actual minus scheduled send time: how faithfully the load was open-loop."""
    slo: Slo | None = None
    good_requests: int | None = None
    attainment: float | None = None
    goodput_rps: float | None = None
    slo_met: bool | None = None
    """Attainment reached the SLO's attainment target."""
    client: ClientStats | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """Warnings a reader of the numbers needs (client drops, a saturated client)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def to_text(self) -> str:
        """A few lines for a terminal."""
        lines = [
            f"requests: {self.requests} scheduled over {self.schedule_span_s:.1f} s "
            f"({self.offered_rps:.2f}/s offered), {self.completed} completed, "
            f"{self.failed} failed, run took {self.duration_s:.1f} s",
        ]
        if self.errors:
            kinds = ", ".join(f"{kind}={count}" for kind, count in sorted(self.errors.items()))
            lines.append(f"errors: {kinds}")
        for name, dist in (
            ("TTFT", self.ttft_ms),
            ("TPOT", self.tpot_ms),
            ("ITL", self.itl_ms),
            ("e2e", self.e2e_ms),
        ):
            if dist is not None:
                lines.append(
                    f"{name:<4} ms: p50 {dist.p50:.1f}  p90 {dist.p90:.1f}  p95 {dist.p95:.1f}  "
                    f"p99 {dist.p99:.1f}  max {dist.max:.1f}  (n={dist.count})"
                )
        lines.append(
            f"throughput: {self.output_tokens_per_s:.1f} output tok/s, "
            f"{self.input_tokens_per_s:.1f} input tok/s, {self.requests_per_s:.2f} req/s"
        )
        if self.slo is not None and self.attainment is not None:
            targets = ", ".join(
                f"{name} <= {value:g} ms"
                for name, value in (("TTFT", self.slo.ttft_p95_ms), ("TPOT", self.slo.tpot_p95_ms))
                if value is not None
            )
            verdict = "met" if self.slo_met else "missed"
            lines.append(
                f"SLO ({targets}): attainment {self.attainment:.4f} "
                f"(target {self.slo.attainment_target:g}, {verdict}), "
                f"goodput {self.goodput_rps:.2f} req/s"
            )
        if self.send_lag_ms is not None:
            lines.append(
                f"open loop: send lag p50 {self.send_lag_ms.p50:.2f} ms, "
                f"p99 {self.send_lag_ms.p99:.2f} ms, max {self.send_lag_ms.max:.2f} ms"
            )
        if self.client is not None:
            lines.append(
                f"client: {self.client.cpu_s:.1f} CPU s ({self.client.cpu_utilisation:.0%} of a "
                f"core), peak {self.client.peak_in_flight} in flight"
            )
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


CLIENT_SATURATED = 0.9
"""Client CPU utilisation above which the report warns that the client may be the bottleneck."""


def summarize(
    results: Sequence[RequestResult],
    *,
    slo: Slo | None = None,
    duration_s: float | None = None,
    client: ClientStats | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Report:
    """The report of a run. `duration_s` defaults to the last answer's end (the run starts at
    0); throughput, goodput and request rates are per second of it."""
    ends = [result.end_s for result in results if result.end_s is not None]
    sends = [result.sent_s for result in results if result.sent_s is not None]
    if duration_s is None:
        duration_s = max([*ends, *sends, 0.0])
    span = max((result.scheduled_s for result in results), default=0.0)
    completed = [result for result in results if result.ok]
    errors = Counter(result.error or ERROR_CLIENT for result in results if not result.ok)

    def rate(count: float) -> float:
        return count / duration_s if duration_s > 0 else 0.0

    input_tokens = sum(result.input_tokens for result in completed)
    output_tokens = sum(result.tokens for result in results)
    good: int | None = None
    attainment: float | None = None
    if slo is not None:
        good = sum(1 for result in completed if met_slo(slo, result))
        attainment = good / len(results) if results else 0.0

    notes: list[str] = []
    dropped = errors.get(ERROR_DROPPED, 0)
    if client is not None and dropped:
        notes.append(
            f"{dropped} requests were dropped by the client (its max in-flight cap of "
            f"{client.max_in_flight} was reached): client-side, not server errors"
        )
    if client is not None and client.cpu_utilisation > CLIENT_SATURATED:
        notes.append(
            f"the client used {client.cpu_utilisation:.0%} of a core: latencies may include "
            "client-side queueing"
        )

    return Report(
        requests=len(results),
        completed=len(completed),
        failed=len(results) - len(completed),
        errors=dict(sorted(errors.items())),
        duration_s=duration_s,
        schedule_span_s=span,
        offered_rps=len(results) / span if span > 0 else 0.0,
        ttft_ms=Distribution.of(_collect_ms(result.ttft_s for result in completed)),
        tpot_ms=Distribution.of(_collect_ms(result.tpot_s for result in completed)),
        itl_ms=Distribution.of(gap * 1000.0 for result in completed for gap in result.gaps),
        e2e_ms=Distribution.of(_collect_ms(result.e2e_s for result in completed)),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        requests_per_s=rate(len(completed)),
        output_tokens_per_s=rate(output_tokens),
        input_tokens_per_s=rate(input_tokens),
        send_lag_ms=Distribution.of(_collect_ms(result.send_lag_s for result in results)),
        slo=slo,
        good_requests=good,
        attainment=attainment,
        goodput_rps=None if good is None else rate(good),
        slo_met=None if slo is None or attainment is None else attainment >= slo.attainment_target,
        client=client,
        metadata=dict(metadata or {}),
        notes=tuple(notes),
    )


def _collect_ms(values: Iterable[float | None]) -> list[float]:
    return [value * 1000.0 for value in values if value is not None]


def rolling_percentile(
    points: Iterable[tuple[float, float]], window_s: float, q: float = 95.0
) -> list[tuple[float, float]]:
    """For each (time, value) point in time order, the q-th percentile of the values in the
    trailing window (time - window_s, time]."""
    ordered = sorted(points)
    current: list[float] = []
    rolled: list[tuple[float, float]] = []
    oldest = 0
    for moment, value in ordered:
        bisect.insort(current, value)
        while ordered[oldest][0] <= moment - window_s:
            current.pop(bisect.bisect_left(current, ordered[oldest][1]))
            oldest += 1
        rolled.append((moment, percentile(current, q)))
    return rolled


def plot(
    results: Sequence[RequestResult], path_prefix: Path | str, *, slo: Slo | None = None
) -> tuple[Path, Path]:
    """Write `<prefix>_latency.png` (TTFT and TPOT of each request by send time, with a
    rolling p95) and `<prefix>_cdf.png` (their CDFs, with the SLO targets); the two paths."""
    # Imported here: the operator's import path must not load matplotlib.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    prefix = str(path_prefix)
    latency_path = Path(prefix + "_latency.png")
    cdf_path = Path(prefix + "_cdf.png")
    latency_path.parent.mkdir(parents=True, exist_ok=True)
    completed = [result for result in results if result.ok and result.sent_s is not None]
    failed = [result.scheduled_s for result in results if not result.ok]
    end = max([result.end_s or result.scheduled_s for result in results] + [1.0])
    window = max(end / 50.0, 1.0)
    series = (
        (
            "TTFT",
            [(r.sent_s or 0.0, r.ttft_s) for r in completed],
            slo.ttft_p95_ms if slo else None,
        ),
        (
            "TPOT",
            [(r.sent_s or 0.0, r.tpot_s) for r in completed],
            slo.tpot_p95_ms if slo else None,
        ),
    )

    figure, axes = pyplot.subplots(2, 1, figsize=(11, 7), sharex=True)
    for axis, (name, pairs, target) in zip(axes, series, strict=True):
        points = [(moment, value * 1000.0) for moment, value in pairs if value is not None]
        if points:
            axis.scatter(*zip(*points, strict=True), s=4, alpha=0.35, label=f"{name} per request")
            rolled = rolling_percentile(points, window)
            axis.plot(*zip(*rolled, strict=True), color="C1", label=f"rolling p95 ({window:.0f} s)")
            if max(value for _, value in points) > 100 * max(
                min(value for _, value in points), 1e-3
            ):
                axis.set_yscale("log")
        if target:
            axis.axhline(target, color="C3", linestyle="--", label=f"SLO {target:g} ms")
        if failed:
            axis.plot(
                failed,
                [0.02] * len(failed),
                "x",
                color="C3",
                transform=axis.get_xaxis_transform(),
                label=f"failed ({len(failed)})",
            )
        axis.set_ylabel(f"{name} (ms)")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="upper left", fontsize="small")
    axes[-1].set_xlabel("send time (s)")
    axes[0].set_title(f"Latency over time ({len(completed)} completed, {len(failed)} failed)")
    figure.tight_layout()
    figure.savefig(latency_path, dpi=110)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(1, 2, figsize=(11, 4.5))
    for axis, (name, pairs, target) in zip(axes, series, strict=True):
        values = sorted(value * 1000.0 for _, value in pairs if value is not None)
        if values:
            fractions = [(rank + 1) / len(values) for rank in range(len(values))]
            axis.step(values, fractions, where="post", label=name)
            axis.axhline(0.95, color="grey", linestyle=":", linewidth=1, label="p95")
        if target:
            met = sum(1 for value in values if value <= target) / len(values) if values else 0.0
            axis.axvline(
                target, color="C3", linestyle="--", label=f"SLO {target:g} ms ({met:.1%} meet)"
            )
        axis.set_xlabel(f"{name} (ms)")
        axis.set_ylabel("fraction of completed requests")
        axis.set_ylim(0, 1.02)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(cdf_path, dpi=110)
    pyplot.close(figure)
    return latency_path, cdf_path
