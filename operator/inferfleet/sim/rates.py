"""What the fleet simulator's queries compute from its scraped samples, as Prometheus does:
the samples a rate window holds, cumulative bucket counts, and `histogram_quantile`."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol


class _Timed(Protocol):
    @property
    def time_s(self) -> float: ...


def histogram_quantile(
    quantile: float, bounds: Sequence[float], cumulative: Sequence[float]
) -> float | None:
    """Prometheus' `histogram_quantile`: `cumulative[i]` counts observations <= `bounds[i]`,
    and its last entry (one more than `bounds`) counts all of them (+Inf). Linear within the
    bucket; in the +Inf bucket, the highest finite bound. None without observations."""
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = quantile * total
    index = bisect.bisect_left(cumulative, rank)
    if index >= len(bounds):
        return bounds[-1]
    upper = bounds[index]
    lower = bounds[index - 1] if index > 0 else 0.0
    below = cumulative[index - 1] if index > 0 else 0.0
    inside = cumulative[index] - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside


def first_within(samples: Sequence[_Timed], last: int, after_s: float) -> int:
    """The oldest of `samples[: last + 1]` taken after `after_s` (a rate window's first)."""
    first = last
    while first > 0 and samples[first - 1].time_s > after_s:
        first -= 1
    return first


def cumulative(counts: Sequence[int]) -> list[int]:
    total = 0
    out: list[int] = []
    for count in counts:
        total += count
        out.append(total)
    return out
