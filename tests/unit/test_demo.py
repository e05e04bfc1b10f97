"""What the demo's summary says about cost: the GPU-seconds held against a static fleet."""

from __future__ import annotations

import pytest

from inferfleet.demo import GpuTime


def test_gpu_seconds_are_held_gpus_over_time_against_a_static_fleet_at_the_peak() -> None:
    held = GpuTime(gpus_per_replica=2)
    held.sample(0.0, {"aggregated": 1})
    held.sample(10.0, {"aggregated": 3})
    held.sample(20.0, {"aggregated": 2})
    held.sample(30.0, {"aggregated": 2})
    # 2 GPUs for 10 s, 6 for 10 s, 4 for 10 s; a static fleet holds 6 for all 30 s.
    assert held.gpu_seconds == pytest.approx(120.0)
    assert held.peak_gpus == 6
    assert "GPU-seconds: 120 over 30 s" in held.to_text()
    assert "static fleet at the peak of 6 GPUs: 180 (0.67x)" in held.to_text()


def test_no_samples_say_so() -> None:
    assert GpuTime(gpus_per_replica=1).to_text() == "GPU-seconds: not sampled"
