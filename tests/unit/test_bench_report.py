"""Benchmark statistics on small hand-computed runs: percentiles, per-request TTFT and TPOT,
SLO attainment and goodput (failures are misses), the JSON and the plots."""

from __future__ import annotations

import json
import subprocess
import sys
from array import array
from pathlib import Path
from typing import cast

import pytest

from inferfleet.api.inference_service import SloSpec
from inferfleet.bench.report import (
    ERROR_DROPPED,
    ClientStats,
    Distribution,
    RequestResult,
    percentile,
    plot,
    rolling_percentile,
    summarize,
)
from inferfleet.slo import Slo


def test_percentiles_interpolate_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q must be"):
        percentile(values, 101)
    assert Distribution.of([]) is None
    # The approximate value stands in for the float it compares equal to.
    p95 = cast(float, pytest.approx(2.9))
    assert Distribution.of([3.0, 1.0, 2.0]) == Distribution(
        count=3, mean=2.0, p50=2.0, p90=2.8, p95=p95, p99=2.98, max=3.0
    )


def done(
    index: int,
    sent: float,
    ttft: float,
    tokens: int,
    gap: float,
    *,
    input_tokens: int = 100,
    lag: float = 0.0,
) -> RequestResult:
    """A request that completed: first token `ttft` after sending, then a token every `gap`."""
    first = sent + ttft
    last = first + gap * (tokens - 1)
    return RequestResult(
        index=index,
        scheduled_s=sent - lag,
        input_tokens=input_tokens,
        output_tokens=tokens,
        sent_s=sent,
        first_token_s=first,
        last_token_s=last,
        end_s=last + 0.01,
        tokens=tokens,
        chunks=tokens,
        gaps=array("d", [gap] * (tokens - 1)),
        http_status=200,
    )


def failed(index: int, at: float, kind: str, *, sent: bool = True) -> RequestResult:
    return RequestResult(
        index=index,
        scheduled_s=at,
        input_tokens=400,
        output_tokens=10,
        sent_s=at if sent else None,
        end_s=at + 0.02 if sent else None,
        http_status=500 if kind == "http_500" else None,
        error=kind,
    )


def small_run() -> list[RequestResult]:
    return [
        done(0, 0.0, 0.100, 10, 0.010, input_tokens=100),  # TTFT 100 ms, TPOT 10 ms
        done(1, 0.5, 0.300, 5, 0.020, input_tokens=200),  # TTFT 300 ms, TPOT 20 ms
        done(2, 1.001, 0.050, 1, 0.0, input_tokens=300, lag=0.001),  # one token: no TPOT
        failed(3, 1.5, "http_500"),
    ]


def test_per_request_ttft_tpot_and_e2e() -> None:
    first, second, single, failure = small_run()
    assert first.ttft_s == pytest.approx(0.1)
    assert first.tpot_s == pytest.approx(0.01)  # (last - first) / (tokens - 1)
    assert second.tpot_s == pytest.approx(0.02)
    assert second.e2e_s == pytest.approx(0.39)
    assert single.tpot_s is None
    assert single.send_lag_s == pytest.approx(0.001)
    assert failure.ttft_s is None
    assert not failure.ok
    assert first.ok


def test_report_statistics_attainment_and_goodput_by_hand() -> None:
    slo = Slo(ttft_p95_ms=200.0, tpot_p95_ms=15.0, attainment_target=0.9)
    report = summarize(small_run(), slo=slo, duration_s=2.0)
    assert (report.requests, report.completed, report.failed) == (4, 3, 1)
    assert report.errors == {"http_500": 1}
    ttft = report.ttft_ms
    assert ttft is not None
    assert ttft.count == 3
    assert ttft.p50 == pytest.approx(100.0)  # of 50, 100, 300
    assert ttft.p90 == pytest.approx(260.0)
    assert ttft.p95 == pytest.approx(280.0)
    assert ttft.p99 == pytest.approx(296.0)
    assert ttft.mean == pytest.approx(150.0)
    tpot = report.tpot_ms
    assert tpot is not None
    assert (tpot.count, tpot.p50, tpot.p90, tpot.p99) == pytest.approx((2, 15.0, 19.0, 19.9))
    itl = report.itl_ms
    assert itl is not None
    assert itl.count == 9 + 4
    assert itl.p50 == pytest.approx(10.0)
    assert itl.max == pytest.approx(20.0)
    e2e = report.e2e_ms
    assert e2e is not None
    assert e2e.p50 == pytest.approx(200.0)  # of 60, 200, 400
    # Throughput over the 2 s run.
    assert report.output_tokens == 16
    assert report.output_tokens_per_s == pytest.approx(8.0)
    assert report.input_tokens == 600  # completed requests only
    assert report.input_tokens_per_s == pytest.approx(300.0)
    assert report.requests_per_s == pytest.approx(1.5)
    # Good: the first (100 ms, 10 ms) and the one-token answer (50 ms); the second misses
    # TTFT, the failure misses everything. Attainment is over all four requests.
    assert report.good_requests == 2
    assert report.attainment == pytest.approx(0.5)
    assert report.goodput_rps == pytest.approx(1.0)
    assert report.slo_met is False
    assert report.schedule_span_s == 1.5
    lag = report.send_lag_ms
    assert lag is not None
    assert lag.max == pytest.approx(1.0)


def test_each_target_alone_and_no_slo() -> None:
    run = small_run()
    assert summarize(run, slo=Slo(ttft_p95_ms=1000.0)).attainment == pytest.approx(0.75)
    assert summarize(run, slo=Slo(tpot_p95_ms=12.0)).attainment == pytest.approx(0.5)
    plain = summarize(run)
    assert plain.attainment is None
    assert plain.goodput_rps is None
    assert plain.slo_met is None
    # Without a given duration the run lasts until its last answer.
    assert plain.duration_s == pytest.approx(1.52)


def test_client_drops_count_as_misses_and_are_called_out() -> None:
    run = [*small_run(), failed(4, 1.6, ERROR_DROPPED, sent=False)]
    client = ClientStats(
        cpu_s=1.9, cpu_utilisation=0.95, peak_in_flight=1, max_in_flight=1, http_clients=1
    )
    report = summarize(run, slo=Slo(ttft_p95_ms=1000.0), duration_s=2.0, client=client)
    assert report.errors == {ERROR_DROPPED: 1, "http_500": 1}
    assert report.attainment == pytest.approx(3 / 5)
    assert any("dropped by the client" in note for note in report.notes)
    assert any("95% of a core" in note for note in report.notes)
    text = report.to_text()
    assert "client_dropped=1" in text
    assert "attainment 0.6000" in text


def test_report_json_round_trips() -> None:
    slo = Slo(ttft_p95_ms=200.0, tpot_p95_ms=15.0)
    report = summarize(small_run(), slo=slo, duration_s=2.0, metadata={"trace": "x.csv"})
    data = json.loads(report.to_json())
    assert data["attainment"] == pytest.approx(0.5)
    assert data["slo"] == {"ttft_p95_ms": 200.0, "tpot_p95_ms": 15.0, "attainment_target": 0.99}
    assert data["ttft_ms"]["p95"] == pytest.approx(280.0)
    assert data["errors"] == {"http_500": 1}
    assert data["metadata"] == {"trace": "x.csv"}
    assert data["client"] is None
    empty = json.loads(summarize([]).to_json())
    assert (empty["requests"], empty["ttft_ms"], empty["requests_per_s"]) == (0, None, 0.0)


def test_slo_validation_and_from_an_inference_service() -> None:
    spec = SloSpec(ttft_p95_ms=500.0, tpot_p95_ms=50.0, attainment_target=0.95)
    assert Slo.from_spec(spec) == Slo(500.0, 50.0, 0.95)
    with pytest.raises(ValueError, match="ttft_p95_ms"):
        Slo(ttft_p95_ms=0.0)
    with pytest.raises(ValueError, match="attainment_target"):
        Slo(attainment_target=1.5)


def test_rolling_percentile_over_a_trailing_window() -> None:
    points = [(0.0, 10.0), (1.0, 20.0), (2.0, 30.0), (3.5, 40.0), (3.0, 5.0)]
    rolled = rolling_percentile(points, window_s=2.0, q=50)
    # Windows (t - 2, t]: {10}, {10, 20}, {20, 30}, {30, 5}, {30, 5, 40}.
    assert rolled == [(0.0, 10.0), (1.0, 15.0), (2.0, 25.0), (3.0, 17.5), (3.5, 30.0)]


def test_plots_are_written_as_pngs(tmp_path: Path) -> None:
    latency, cdf = plot(small_run(), tmp_path / "out" / "bench", slo=Slo(200.0, 15.0))
    assert latency == tmp_path / "out" / "bench_latency.png"
    assert cdf == tmp_path / "out" / "bench_cdf.png"
    for path in (latency, cdf):
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # Nothing completed, no SLO: still two (empty) charts.
    nothing = plot([failed(0, 0.0, "timeout")], tmp_path / "empty")
    assert all(path.stat().st_size > 0 for path in nothing)


def test_importing_the_benchmark_does_not_load_matplotlib() -> None:
    code = (
        "import sys, inferfleet.bench.report, inferfleet.bench.loadgen, inferfleet.bench.traces;"
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
